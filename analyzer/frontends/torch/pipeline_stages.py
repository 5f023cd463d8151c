"""One pipeline stage's program: a torchtitan-style decoder cut as torchtitan's
``pipeline_module_split`` cuts it, then traced at the micro-batch like any module.

A decoder of this shape has a token embedding, a list of repeated blocks (``layers``), a
final norm and an output head, and its forward skips a part that is None (torchtitan's
Llama; graphcost's zoo Llama). A transformers causal LM (``model.layers``, ``lm_head``) is cut
the same way, called with ``inputs_embeds`` after the first stage, its norm and head
identities before the last (``TransformersStage``). Stage ``i`` of ``p`` keeps its share of the blocks (torchtitan's
split: passes/parallel/schedules.py ``stage_layers``), the embedding on the first stage, the norm and head on
the last; its input is the token ids (first) or the previous stage's hidden states, its
output the next stage's input or, on the last stage, the logits, whose loss the schedule
computes there (torchtitan's cross-entropy, fp32 logits): ``LastStage`` adds it.

Any other model with a list of blocks is split by PyTorch's own tracer (pipeline_split.py).
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ....passes.errors import GraphcostError, opt
from ....passes.parallel.schedules import fits_stages, stage_layers
from .layer_stack import settable
from .pipeline_split import block_list, has_logits, shallow
from .tp_collectives import tp_cross_entropy

EMBEDDINGS = ("embed_tokens", "tok_embeddings")
HEADS = ("lm_head", "output")


class LastStage(torch.nn.Module):
    """The last stage with the schedule's loss: ``loss_fn(stage(x), labels)``, torchtitan's
    ``cross_entropy_loss`` (under tensor parallelism with sharded logits, ``loss_parallel()``'s
    on each rank's vocabulary slice). The logits are the stage's output (the schedule keeps
    them)."""

    def __init__(self, stage: torch.nn.Module):
        super().__init__()
        self.stage = stage

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        # (the stage's inputs, then the labels: a stage the tracer split may take more than
        # the hidden states, GPT-2's attention mask)
        *received, labels = inputs
        pred = self.stage(*received)
        group = max((getattr(m, "loss_parallel", 0) for m in self.stage.modules()), default=0)
        if group:
            return tp_cross_entropy(pred, labels, group)
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


class TransformersStage(torch.nn.Module):
    """A transformers causal LM cut to a stage, called as a pipeline stage is: the token ids
    (first stage) or the hidden states (``inputs_embeds``) in, its ``logits`` out — the
    next stage's hidden states where the norm and head are cut to identities."""

    def __init__(self, model: torch.nn.Module, first: bool):
        super().__init__()
        self.model, self.first = model, first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=x) if self.first else self.model(inputs_embeds=x)
        return out.logits


def block_count(module: torch.nn.Module) -> int:
    """The blocks a pipeline divides: the ``layers`` list of a torchtitan-style decoder or of
    a transformers causal LM's ``model``, else the list PyTorch's tracer would split
    (pipeline_split.py; 0: none, or no logits for the schedule's loss)."""
    return named_blocks(module) or (block_list(module)[1] if has_logits(module) else 0)


def named_blocks(module: torch.nn.Module) -> int:
    """The blocks of a model graphcost cuts by name (0: not such a model)."""
    for owner in (module, getattr(module, "model", None)):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, torch.nn.ModuleList):
            return len(layers)
    return 0


def pipeline_stage(module: torch.nn.Module, stage: int, stages: int,
                   blocks: int | None = None) -> torch.nn.Module:
    """A copy of ``module`` cut to stage ``stage`` of ``stages`` (checked: a torchtitan-style
    decoder, or a transformers causal LM, with at least one block a stage); ``blocks``: only
    the first that many of its blocks."""
    base = getattr(module, "model", None)
    if isinstance(base, torch.nn.Module) and isinstance(getattr(base, "layers", None),
                                                        torch.nn.ModuleList) \
            and getattr(module, "lm_head", None) is not None:
        return _transformers_stage(module, stage, stages, blocks)
    where = opt("parallel", value=f"pp={stages}")
    layers = getattr(module, "layers", None)
    embed = next((n for n in EMBEDDINGS if getattr(module, n, None) is not None), None)
    head = next((n for n in HEADS if getattr(module, n, None) is not None), None)
    if not isinstance(layers, torch.nn.ModuleList) or embed is None or head is None \
            or getattr(module, "norm", None) is None:
        raise GraphcostError(f"{where}: graphcost cuts torchtitan-style decoders (a token "
                             f"embedding ({'/'.join(EMBEDDINGS)}), a 'layers' ModuleList, "
                             f"'norm' and a head ({'/'.join(HEADS)}) on the model itself, its "
                             "forward skipping a part that is None) and transformers causal "
                             "LMs (model.layers, lm_head); this model is neither")
    if not fits_stages(len(layers), stages):
        raise GraphcostError(f"{where}: {len(layers)} blocks cannot fill {stages} stages "
                             "(torchtitan's split: the embedding and the head a block each)")
    model = shallow(module)
    kept = stage_layers(len(layers), stage, stages)[:blocks]
    setattr(model, "layers", torch.nn.ModuleList([layers[i] for i in kept]))
    if stage > 0:
        setattr(model, embed, None)
    if stage < stages - 1:
        setattr(model, "norm", None)
        setattr(model, head, None)
    return model


def _transformers_stage(module: torch.nn.Module, stage: int, stages: int,
                        blocks: int | None = None) -> torch.nn.Module:
    """A transformers causal LM's stage: its decoder layers cut, the embedding skipped after
    the first stage (the hidden states come in as ``inputs_embeds``), the final norm and the
    head identities before the last."""
    n = block_count(module)
    if not fits_stages(n, stages):
        raise GraphcostError(f"{opt('parallel', value=f'pp={stages}')}: {n} blocks cannot fill "
                             f"{stages} stages (torchtitan's split: the embedding and the head "
                             "a block each)")
    inner = module.model
    assert isinstance(inner, torch.nn.Module)  # (pipeline_stage checked it)
    if getattr(inner, "embed_tokens_per_layer", None) is not None:
        raise GraphcostError(f"{opt('parallel', value=f'pp={stages}')}: "
                             f"{type(module).__name__}'s layers each read an embedding of the "
                             "token ids (embed_tokens_per_layer), which a later stage does not "
                             "receive (it gets the hidden states): not modelled in a pipeline")
    model, base = shallow(module), shallow(inner)
    setattr(model, "model", base)
    layers = getattr(base, "layers")
    kept = stage_layers(n, stage, stages)[:blocks]
    setattr(base, "layers", torch.nn.ModuleList([layers[i] for i in kept]))
    _stage_config(model, base, kept, n)
    if stage > 0:
        setattr(base, "embed_tokens", None)
    if stage < stages - 1:
        setattr(base, "norm", Elsewhere("model.norm", stage, stages))
        setattr(model, "lm_head", Elsewhere("lm_head", stage, stages))
    return TransformersStage(model, stage == 0)


class ReadElsewhere(GraphcostError, AttributeError):
    """A stage's forward read a part another stage holds: refused by name, and still an
    AttributeError to ``getattr(module, name, default)``, which asks whether it is there."""


class Elsewhere(torch.nn.Identity):
    """The final norm or the head on a stage before the last: an identity (the stage's
    hidden states go on); a forward that reads more of it (HY V4's casts its hidden states to
    the head's weight's type) is refused by name, not failed inside PyTorch's trace."""

    def __init__(self, path: str, stage: int, stages: int):
        super().__init__()
        self.path, self.stage, self.stages = path, stage, stages

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            raise ReadElsewhere(
                f"{opt('parallel', value=f'pp={self.stages}')}: stage {self.stage}'s "
                f"forward reads {self.path}.{name}, and torchtitan's split leaves {self.path} "
                "to the last stage alone: a model that reads it on every stage is not "
                "modelled in a pipeline") from None


def _stage_config(model: torch.nn.Module, base: torch.nn.Module, kept: Sequence[int],
                  n: int) -> None:
    """The stage told its layers' count and kinds (each per-layer list of the config's, of
    ``n`` entries, cut to ``kept``) on a copy of the config, the caller's model keeping its
    own: transformers' forwards read ``config.layer_types`` by a layer's place in ``layers`` —
    Ergo zips them, strictly (it failed beside a pipeline); Jamba, Qwen 2.5-VL and others pick
    each layer's mask by it (``layer_rope_theta`` its rotary base), which a later stage read
    off the first layers'."""
    config = getattr(base, "config", None)
    if config is None or not hasattr(config, "to_dict") or not kept:   # (transformers')
        return
    own = copy.copy(config)
    for name, value in config.to_dict().items():
        if "layer" in name and isinstance(value, (list, tuple)) and len(value) == n and \
                settable(own, name):
            setattr(own, name, [value[i] for i in kept])
    if isinstance(getattr(config, "num_hidden_layers", None), int) and \
            settable(own, "num_hidden_layers"):
        own.num_hidden_layers = len(kept)
    if hasattr(own, "use_cache"):   # a stage hands on hidden states, never a cache (whose
        own.use_cache = False       # layers its global layer indices would not find)
    setattr(base, "config", own)
    if getattr(model, "config", None) is config:
        setattr(model, "config", own)


def stage_inputs(module: torch.nn.Module, ids: torch.Tensor, stage: int,
                 stages: int) -> tuple[torch.Tensor, ...]:
    """The stage's inputs at the micro-batch of ``ids``: the ids (first stage), else the
    hidden states the previous stage sends (its embedding's width and dtype), and on the
    last stage the labels beside them."""
    if stage == 0:
        return (ids,)
    get = getattr(module, "get_input_embeddings", None)
    table = get() if callable(get) else \
        next(getattr(module, n) for n in EMBEDDINGS if getattr(module, n, None) is not None)
    assert isinstance(table, torch.nn.Embedding)  # (pipeline_stage checked the model)
    hidden = ids.new_empty((*ids.shape, table.embedding_dim), dtype=table.weight.dtype)
    return (hidden, torch.empty_like(ids, dtype=torch.int64)) if stage == stages - 1 \
        else (hidden,)


def interleaved_order(ranks: int, per_rank: int, micro: int, rank: int,
                      schedule: str = "interleaved-1f1b") -> list[tuple]:
    """Rank ``rank``'s forwards and backwards under ``ScheduleInterleaved1F1B`` (or a
    zero-bubble schedule's, each backward its input half I and its weight half W:
    "interleaved-zb", ``ScheduleInterleavedZeroBubble``; "zbv", ``ScheduleZBVZeroBubble``,
    rank ``r`` the stages ``r`` and ``2·ranks − 1 − r``) over ``ranks`` ranks of ``per_rank``
    stages each and ``micro`` micro-batches, as PyTorch computes them (its
    ``_calculate_single_rank_operations``, given the figures it reads; the idle slots change
    no rank's order): ``(the rank's local stage, "F", "B", "I" or "W", the micro-batch)``."""
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import (
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
        ScheduleZBVZeroBubble,
    )

    rounds = max(1, micro // ranks)
    state = SimpleNamespace(n_local_stages=per_rank, pp_group_size=ranks, _n_microbatches=micro,
                            microbatches_per_round=micro // rounds, num_stages=ranks * per_rank)
    kind = {"interleaved-zb": ScheduleInterleavedZeroBubble,
            "zbv": ScheduleZBVZeroBubble}.get(schedule, ScheduleInterleaved1F1B)
    actions = kind._calculate_single_rank_operations(
        state, rank)  # pyright: ignore[reportArgumentType]
    kinds = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I",
             "BACKWARD_WEIGHT": "W"}
    local = {rank: 0, 2 * ranks - 1 - rank: 1} if kind is ScheduleZBVZeroBubble else \
        {rank + k * ranks: k for k in range(per_rank)}
    return [(local[a.stage_index], kinds[a.computation_type.name], a.microbatch_index)
            for a in actions if a is not None]


def first_microbatch(example_inputs, micro: int | None) -> tuple[int, int, Any]:
    """The batch of ``example_inputs`` (their tensors' first dimension), the micro-batches
    (``micro``, else one sample each, as torchtitan) and the first of them, split as
    ``torch.distributed.pipelining`` splits a step's inputs by default (each tensor along
    dimension 0, anything else given to every micro-batch: its
    ``split_args_kwargs_into_chunks``). Keyword inputs stay keyword inputs."""
    from torch.distributed.pipelining.microbatch import split_args_kwargs_into_chunks

    keywords = isinstance(example_inputs, Mapping)
    args = () if keywords else tuple(example_inputs) \
        if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    kwargs = dict(example_inputs) if keywords else {}
    sizes = {t.shape[0] for t in (*args, *kwargs.values())
             if isinstance(t, torch.Tensor) and t.dim() > 0}
    if len(sizes) != 1:
        raise GraphcostError(f"{opt('parallel.microbatches', value=micro)}: a pipeline splits "
                             "the example inputs' tensors into micro-batches along their first "
                             f"dimension, which they must share (theirs: {sorted(sizes)})")
    batch = sizes.pop()
    micro = micro or batch
    if batch % micro:
        raise GraphcostError(f"{opt('parallel.microbatches', value=micro)}: the example "
                             f"inputs' batch ({batch}) must divide into that many micro-batches")
    chunks_args, chunks_kwargs = split_args_kwargs_into_chunks(args, kwargs, micro)
    return batch, micro, chunks_kwargs[0] if keywords else chunks_args[0]
