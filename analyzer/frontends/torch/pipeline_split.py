"""A pipeline stage of a model graphcost does not cut by name (GPT-2, GPT-J, Bloom, Falcon,
OPT, GPT-NeoX … in transformers: their blocks under ``transformer.h`` and the like), split as
PyTorch splits any model: its tracer frontend, ``torch.distributed.pipelining.pipeline``
(PiPPy's way), at the first block of each stage (``SplitPoint.BEGINNING``), the blocks shared
as torchtitan shares them (passes/parallel/schedules.py ``stage_layers``).

The stage is what ``pipe.build_stage`` runs: a graph module of the stage's part of the
exported model, its inputs whatever crosses into it — the hidden states and, for GPT-2, the
attention mask the first stage made — in the shapes the tracer recorded at the micro-batch.
A weight two stages use (a head tied to the token embedding) is copied into both, as the
tracer does (``MultiUseParameterConfig.REPLICATE``).
"""
from __future__ import annotations

import copy

import torch

from ....passes.errors import GraphcostError, first_line, opt
from ....passes.parallel.schedules import stage_layers
from .optional_imports import transformers_model


class _Logits(torch.nn.Module):
    """The model as a pipeline runs it: token ids in, the logits out (a transformers model's
    ``logits``)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids) if transformers_model(self.model) else self.model(ids)
        return getattr(out, "logits", out)


def has_logits(module: torch.nn.Module) -> bool:
    """Whether the model ends in logits for the schedule's loss: a transformers model with an
    LM head (another module's output is taken for them)."""
    return not transformers_model(module) or \
        getattr(module, "get_output_embeddings")() is not None


def block_list(module: torch.nn.Module) -> tuple[str, int]:
    """The model's repeated blocks: the path of its largest list of modules of one class (by
    parameters), and their number (``("", 0)``: none of two or more)."""
    best, size = ("", 0), 0
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) >= 2 and \
                len({type(b) for b in m}) == 1:
            n = sum(p.numel() for p in m.parameters())
            if n > size:
                best, size = (name, len(m)), n
    return best


def split_points(path: str, n: int, stage: int, stages: int,
                 blocks: int | None) -> tuple[int, list[str]]:
    """(the stage's index among the pieces, the split points that cut it out): at its first
    block and, before the last stage, after its own (its first ``blocks`` of them)."""
    kept = stage_layers(n, stage, stages)
    end = kept.start + min(len(kept), blocks if blocks is not None else len(kept))
    _check_last(n, stages)
    points = [kept.start] if stage > 0 else []
    points += [end] if stage < stages - 1 else []
    return (1 if stage > 0 else 0), [f"model.{path}.{i}" for i in points]


def traced_stage(module: torch.nn.Module, ids: torch.Tensor, stage: int, stages: int,
                 blocks: int | None = None):
    """(the stage's graph module, its inputs at the micro-batch of ``ids``); ``blocks``: the
    stage with only the first that many of its blocks."""
    path, n = block_list(module)
    where = opt("parallel", value=f"pp={stages}")
    if not n:
        raise GraphcostError(f"{where}: a pipeline splits a model at its blocks, and this one "
                             "has no list of two or more like modules")
    if not has_logits(module):
        raise GraphcostError(f"{where}: a pipeline's last stage computes the cross-entropy of "
                             f"the model's logits, and {type(module).__name__} has no LM head "
                             "(a causal or masked LM class of it has)")
    check_one_stack(module, stages)
    index, points = split_points(path, n, stage, stages, blocks)
    whole = module if blocks is None or stage < stages - 1 else \
        _first_blocks(module, path, stage_layers(n, stage, stages).start + blocks)
    pipe = split_pipe(whole, ids, points, stages)
    stage_module = pipe.get_stage_module(index)
    assert isinstance(stage_module, torch.fx.GraphModule)  # (the tracer's stages are)
    inputs = tuple(torch.zeros(v.shape, dtype=v.dtype, device=ids.device)
                   for v in (node.meta["val"] for node in stage_module.graph.nodes
                             if node.op == "placeholder"))
    return stage_module, inputs


def _check_last(n: int, stages: int) -> None:
    """Refused: a split whose last stage holds none of the ``n`` blocks (torchtitan's split
    leaves it the norm and the head), which the tracer cannot cut (it cuts at blocks)."""
    if stage_layers(n, stages - 1, stages).start >= n:
        raise GraphcostError(f"{opt('parallel')}: the last of its {stages} stages would hold "
                             f"no block of the {n} (the tracer's split cuts at blocks): fewer "
                             "stages")


def stage_pipe(module: torch.nn.Module, ids: torch.Tensor, stages: int):
    """PyTorch's ``Pipe`` of ``module`` split into ``stages`` at the micro-batch of ``ids``,
    as a pipeline of them runs it (``pipe.build_stage`` each rank's)."""
    path, n = block_list(module)
    _check_last(n, stages)   # (an interleaved schedule's stages: before the tracer meets it)
    return split_pipe(module, ids, [f"model.{path}.{stage_layers(n, i, stages).start}"
                                    for i in range(1, stages)], stages)


def check_one_stack(module: torch.nn.Module, stages: int) -> None:
    """Refused: an encoder-decoder (T5, BART). Its decoder takes the encoder's output in
    every block, a skip over the stages between; and the tracer, fed token ids alone, cannot
    run its forward (it failed with T5's "You must specify exactly one of input_ids or
    inputs_embeds")."""
    if getattr(getattr(module, "config", None), "is_encoder_decoder", False):
        raise GraphcostError(f"{opt('parallel', value=f'pp={stages}')}: "
                             f"{type(module).__name__} is an encoder-decoder; a pipeline of "
                             "one stack of blocks (a decoder's or an encoder's) is modelled, "
                             "not of both")


def check_adjacent(pipe, stages: int) -> None:
    """Refused: a stage that takes a tensor made before the stage ahead of it (GPT-2's
    attention mask, made on the first stage, read by every block). PyTorch's pipelining runs
    no backward through such a skip connection (``PipeliningMetadataError``: measured on 2
    gloo ranks, GPT-2 under interleaved 1F1B, 4 stages)."""
    made = {}
    for node in pipe.split_gm.graph.nodes:
        if node.op == "call_module" and node.target.startswith("submod_"):
            made[node] = int(node.target.rsplit("_", 1)[1])
    for node, k in made.items():
        takes = [p for p in pipe.split_gm.get_submodule(node.target).graph.nodes
                 if p.op == "placeholder"]
        for arg, own in zip(node.args, takes):
            src = arg.args[0] if arg.op == "call_function" and arg.args else arg
            j = made.get(src, -1)
            if k > 0 and j != k - 1:
                val = own.meta.get("val")
                what = f"a {str(val.dtype).removeprefix('torch.')} " \
                    f"{'×'.join(map(str, val.shape))} tensor" \
                    if isinstance(val, torch.Tensor) else f"'{arg.name}'"
                raise GraphcostError(
                    f"{opt('parallel')}: in a pipeline of {stages} stages, stage {k} takes "
                    f"{what} made {'by stage ' + str(j) if j >= 0 else 'from the input'}, "
                    "not by the stage before it — a skip connection, which PyTorch's "
                    "pipelining runs no backward through (its tracer splits this model): "
                    "2 stages at most")


def split_pipe(module: torch.nn.Module, ids: torch.Tensor, points: list[str], stages: int):
    """PyTorch's ``Pipe`` of ``module`` (token ids in, logits out) split at ``points`` (for a
    pipeline of ``stages``: the words of its errors)."""
    import warnings

    from torch.distributed.pipelining import SplitPoint, pipeline
    was_training = module.training
    module.train()   # (a training step's program: its dropout drops; the mode put back)
    # (the tracer marks a split by replacing the block's forward in place — "TODO: make
    # this implementation out-of-place?" — so each block's own is put back after)
    blocks = [module.get_submodule(p.removeprefix("model.")) for p in points]
    own = [dict(vars(b)) for b in blocks]
    try:
        with warnings.catch_warnings():   # (the tracer's own deprecation warnings)
            warnings.simplefilter("ignore")
            pipe = pipeline(_Logits(module), mb_args=(ids,),
                            split_spec={p: SplitPoint.BEGINNING for p in points})
    except Exception as exc:   # (the tracer's own errors: export's, its split's)
        cause = exc.__cause__ or exc   # (export's own words, under the tracer's generic ones)
        raise GraphcostError(f"{opt('parallel', value=f'pp={stages}')}: PyTorch's pipeline "
                             "tracer could not split the model: "
                             f"{first_line(cause, 200) or type(cause).__name__}") \
            from exc
    finally:
        module.train(was_training)
        for block, attrs in zip(blocks, own):
            for name in ("forward", "_orig_forward"):
                if name in attrs:
                    setattr(block, name, attrs[name])
                else:
                    vars(block).pop(name, None)
    if pipe.num_stages != len(points) + 1:   # (a split point the token ids never reach)
        raise GraphcostError(f"{opt('parallel', value=f'pp={stages}')}: PyTorch's pipeline "
                             f"tracer cut {pipe.num_stages} piece(s) where it was asked for "
                             f"{len(points) + 1}: the blocks it splits at "
                             f"({points[0].removeprefix('model.').rsplit('.', 1)[0]}, the "
                             "largest list of like modules) do not run on token ids alone")
    return pipe


def _first_blocks(module: torch.nn.Module, path: str, count: int) -> torch.nn.Module:
    """A copy of ``module`` whose block list at ``path`` keeps its first ``count`` blocks
    (the submodules and parameters shared, the caller's model unchanged)."""
    names = path.split(".")
    top = owner = shallow(module)
    for name in names[:-1]:
        child = shallow(getattr(owner, name))
        setattr(owner, name, child)
        owner = child
    setattr(owner, names[-1], torch.nn.ModuleList(list(getattr(owner, names[-1]))[:count]))
    return top


def shallow(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` sharing its submodules and parameters, with a children table of
    its own: a stage replaces children without touching the caller's model, and a 405B model
    is not copied whole for each stage (a deep copy took 3.5 s a stage)."""
    out = copy.copy(module)
    out._modules = dict(module._modules)  # pyright: ignore[reportAttributeAccessIssue]
    return out
