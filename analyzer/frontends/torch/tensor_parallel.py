"""One tensor-parallel rank's program: the module rewritten into what the rank runs under the
tensor-parallel plan of a Llama-style decoder, then traced like any module.

PyTorch's own DTensor plan cannot be traced here (``aot_export_module`` refuses tensor
subclasses such as DTensor parameters, and ``torch.export`` cannot carry a DTensorSpec), so
the plan is applied as DTensor applies it to the rank's local tensors (``--parallel tp=T``),
its shards the modules of tp_shards.py, their collectives the ops of tp_collectives.py. Two
plans, each the one its engine runs:

* **torchtitan's** (``parallelize_llama``), for a model that is not transformers': sequence
  parallel. Between blocks the residual stream is sharded on the sequence (dim 1): the token
  embedding's partial output reduce-scattered onto it, the norms run on the shard
  (``SequenceParallel``), an attention or MLP module's input all-gathered once
  (``PrepareModuleInput``: its gradient reduce-scattered in backward), its row-wise output
  reduce-scattered back (``RowwiseParallel(output_layouts=Shard(1))``), the head's input
  all-gathered (``ColwiseParallel(input_layouts=Shard(1))``);
* **transformers'** own plan (``PreTrainedModel.tp_plan``: the config's
  ``base_model_tp_plan`` under the base model's prefix, the embedding ``"embedding_rowwise"``,
  the head ``"colwise_gather_output"``), for a transformers model — the linears it names
  ``"colwise"`` or ``"rowwise"`` sharded so (Llama's q/k/v and gate/up, o and down; Phi's
  fc1, fc2 and dense; GPT-J's fc_in, fc_out and out_proj), or ``"colwise_gather_output"``
  (the output all-gathered: Phi-3's fused qkv_proj and gate_up_proj, every head then run on
  every rank) and ``"rowwise_split_input"`` (the replicated input's slice taken:
  ``tp_split_last``) — and a serving engine's (vLLM's ``ColumnParallelLinear``/
  ``RowParallelLinear``, its logits gathered) for any model served: no sequence
  parallelism; there a linear transformers' plan leaves out but named as Llama's are is
  sharded too, as vLLM shards it (gpt-oss's plan names its embedding alone), an attention
  module's per-head parameter (gpt-oss's ``sinks``) is cut to the rank's heads, a fused
  projection the plan gathers is split by its parts (Phi-3's ``qkv_proj``: vLLM's
  ``QKVParallelLinear``; the attention told the rank's head counts) and a norm over all
  heads gathers its input (OLMo 2's ``q_norm``: vLLM's ``_apply_qk_norm``). A column-wise
  linear's replicated input is the same tensor forward, its gradient all-reduced in backward
  (Megatron's ``f``); a row-wise output and the embedding's are all-reduced (``g``).

In torchtitan's, q/k/v and gate/up are column-wise (the weight's rows and bias sharded), o
and down row-wise (the weight's columns; a bias added after the reduction); in both, the
token embedding
row-wise over its vocabulary (ids outside the rank's rows masked to 0, looked up, those rows
zeroed: DTensor's ``MaskPartial``); the LM head column-wise — torchtitan's logits stay
sharded on the vocabulary for a loss-parallel cross-entropy (``loss_parallel()``,
tp_collectives.tp_cross_entropy), transformers' are all-gathered on the last dim for the
loss; attention's head counts (``n_head``/``n_kv``-style attributes) divided by T, so the
local q/k/v views hold the rank's heads. A head tied to the token embedding shares its
shard (both split the table's rows; torchtitan re-ties them after parallelizing). Refused by
name: a norm over a whole sharded projection (OLMo 2's q_norm) for training, fused q/k/v
(GPT-2's ``c_attn``) and any matrix the plan leaves whole or shards in a style not modelled
(transformers 5.24's ``"moe_tp_experts"``, ``"packed_colwise"``) — but a mixture of experts
transformers' plan leaves out, whole on every rank as it runs (transformers_tp_plan.py). Not
modelled: async TP, the norm weights' gradient all-reduce under sequence parallelism (a few
KiB).

torchao's float8 linears (``--float8 tensorwise``) under torchtitan's plan are its float8
styles: each sharded linear multiplies its shard with torchao's product
(``Float8ColwiseParallel``, ``Float8RowwiseParallel``), and an attention or MLP module's
input is cast to float8 before it is gathered (``PrepareFloat8ModuleInput``: the gather moves
float8, the products find their input cast already and save it so). Not modelled: the
amax all-reduce each cast of a sharded tensor makes for its tensorwise scale (one scalar).
"""
from __future__ import annotations

import copy
from typing import Callable, Collection

import torch

from ....passes.errors import GraphcostError, opt
from .float8_linears import float8_spec, gather_seq_in_float8
from .serving_experts import is_router, shard_experts
from .tp_collectives import tp_gather_seq
from .tp_shards import ColwiseLinear, RowwiseLinear, VocabEmbedding, WholeNorm
from .transformers_tp_plan import (
    beside_expert_parallel,
    planned,
    planned_style,
    replicated_experts,
    replicated_note,
)
from .vocab_layers import is_tied, vocab_layers

COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE = ("o_proj", "down_proj")
# fused projections vLLM splits by their parts (QKVParallelLinear: the rank's query heads, then
# its key and value heads; MergedColumnParallelLinear: its gate rows, then its up rows)
FUSED = ("qkv_proj", "gate_up_proj")
# multi-head latent attention's down-projections (DeepSeek-V2/V3, Kimi K2), whole on every
# rank of vLLM's (ReplicatedLinear); its up-projections q_b_proj and kv_b_proj split by head
LATENT = ("q_a_proj", "kv_a_proj_with_mqa")
HEAD_COUNTS = ("n_head", "n_kv", "n_heads", "n_kv_heads", "num_heads", "num_key_value_heads")


def _what_is_sharded(model: torch.nn.Module) -> str:
    """The linears the plan for ``model`` shards, in words (for its refusal)."""
    llama = f"Llama-style blocks ({', '.join(COLWISE + ROWWISE)} linears"
    if planned(model):
        return "the linears transformers' plan for it shards colwise or rowwise"
    if is_transformers(model):   # (T5, GPT-2, BERT: it said "as torchtitan's plan names them")
        config = type(getattr(model, "config", None)).__name__
        return (f"a transformers model's linears as its tensor-parallel plan names them "
                f"({config} gives none: no base_model_tp_plan), else {llama})")
    return f"{llama}, as torchtitan's plan names them)"


def is_transformers(model: torch.nn.Module) -> bool:
    """Whether ``model`` is (or wraps) a transformers model: its engine's plan has no
    sequence parallelism."""
    return any(type(m).__module__.startswith("transformers.") for m in model.modules())


def tensor_parallel(module: torch.nn.Module, group: int, *,
                    sequence: bool | None = None) -> tuple[torch.nn.Module, tuple[str, ...]]:
    """(a copy of ``module`` as one of ``group`` tensor-parallel ranks runs it — checked: a
    Llama-style decoder whose sharded sizes divide —, the report's notes: a mixture of
    experts transformers' plan leaves whole), under its engine's plan (``sequence``
    None) or, False, the plan without sequence parallelism whatever the model: a serving
    engine's (vLLM's column- and row-parallel linears all-reduce, its vocabulary-parallel
    embedding too, its logits gathered), whose one-token decode step has no sequence to
    shard."""
    model = copy.deepcopy(module)
    serving = sequence is False   # (a serving engine's plan: no gathered projections)
    if sequence is None:
        sequence = not is_transformers(model)
    tokens, head = vocab_layers(model)
    tied = is_tied(tokens, head)
    if not sequence and any(float8_spec(m) for m in model.modules()):
        raise GraphcostError(f"{opt('float8')} beside {opt('parallel', value=f'tp={group}')}: "
                             "modelled for torchtitan's sequence-parallel plan (its float8 "
                             "styles), not transformers' plan or a serving engine's")
    if serving:   # (vLLM's FusedMoE: each expert's intermediate split, the output summed)
        shard_experts(model, group)
    parents, whole_heads = _shard_blocks(model, group, sequence, not serving, (tokens, head))
    _whole_norms(model, parents, group, gathered=serving)
    _local_configs(parents, group)
    blocks = any(isinstance(m, (ColwiseLinear, RowwiseLinear)) for m in model.modules())
    # (a pipeline stage of no block, the norm and the head alone, shards its head)
    if not blocks and any(p.dim() >= 2 for m in model.modules() if m not in (tokens, head)
                           for p in m.parameters(recurse=False)):
        raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: graphcost shards "
                             f"{_what_is_sharded(model)}; this model has none")
    for parent in parents if sequence else ():
        # torchtitan's float8 plan gathers a float8 module's input in float8
        # (PrepareFloat8ModuleInput); its colwise linears' product config keys it
        spec = next((c.float8 for c in parent.children()
                     if isinstance(c, ColwiseLinear) and c.float8), None)
        parent.register_forward_pre_hook(_gathering(group, spec), with_kwargs=True)
    names = {id(m): n for n, m in model.named_modules()}
    table = None
    if tokens is not None:
        table = VocabEmbedding(tokens, group, scatter_seq=sequence)
        model.set_submodule(names[id(tokens)], table)
    if head is not None:   # torchtitan: loss parallel; transformers: the logits gathered
        sharded = ColwiseLinear(head, group, copy=not sequence, gather_seq=sequence,
                                gather_out=not sequence)
        sharded.loss_parallel = group if sequence else 0
        model.set_submodule(names[id(head)], sharded)
        if tied and table is not None:   # both shard the table's rows: one shard, re-tied
            sharded.weight = table.weight   # (as torchtitan re-ties them after parallelizing)
    local_head_counts(model, group, whole_heads)
    _local_head_parameters(parents, group)
    kept = _all_sharded(model, group, serving)
    return model, (replicated_note(kept, group),) if kept else ()


SHARDED = (ColwiseLinear, RowwiseLinear, VocabEmbedding)


def _whole_norms(model: torch.nn.Module, parents: list, group: int, *,
                 gathered: bool = False) -> None:
    """A norm over a whole column-wise projection (OLMo 2's ``q_norm``: the normalization of
    all heads' queries at once), which each rank would need whole: ``gathered`` (a serving
    engine's plan), run as vLLM runs OLMo 2's beside its column-parallel q and k (the rank's
    slice all-gathered, normalized whole, its slice taken: tp_shards.WholeNorm); else refused
    — torchtitan shards per-head norms (Qwen 3's ``q_norm`` of ``head_dim``), which run on the
    rank's heads."""
    names = {id(m): n for n, m in model.named_modules()}
    for parent in parents:
        widths = {c.full_out for c in parent.children()
                  if isinstance(c, ColwiseLinear) and not c.gather_out}
        for leaf, child in list(parent.named_children()):
            weight = getattr(child, "weight", None)
            if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or \
                    weight.numel() not in widths or isinstance(child, SHARDED):
                continue
            if gathered:
                parent.set_submodule(leaf, WholeNorm(child, group))
            else:
                raise GraphcostError(
                    f"{opt('parallel', value=f'tp={group}')}: {names[id(child)]} normalizes "
                    f"a whole projection ({weight.numel():,} features), which the plan "
                    f"shards over {group} ranks; a norm across the shards is not modelled")


def _local_configs(parents: list, group: int) -> None:
    """An attention module whose fused ``qkv_proj`` is sharded, and which splits its output by
    its config's head counts (Phi-3's ``query_pos``), given a config of its own that says the
    rank's heads: the rank's rows of the projection are its query heads', then its key and
    value heads' (vLLM's ``QKVParallelLinear``)."""
    for parent in parents:
        qkv, config = getattr(parent, "qkv_proj", None), getattr(parent, "config", None)
        if not isinstance(qkv, ColwiseLinear) or qkv.gather_out or config is None:
            continue
        local = copy.copy(config)
        for attr in ("num_attention_heads", "num_key_value_heads"):
            count = getattr(config, attr, None)
            if isinstance(count, int):
                _divides(f"{attr} of {type(config).__name__}", count, group)
                setattr(local, attr, count // group)
        parent.config = local


def _all_sharded(model: torch.nn.Module, group: int, serving: bool = False,
                 vocab: tuple = ()) -> list[str]:
    """Refuse a model with matrices the plan does not shard (a fused projection, experts in
    a style not modelled): the engines that shard them do it by a plan graphcost does not
    model. A mixture of experts transformers' training plan leaves out stays whole, as it
    runs (transformers_tp_plan.py). ``serving``: a serving engine's plan, which shards
    transformers' gathered projections its own way (refused) and the experts as vLLM does,
    the router whole (serving_experts.py); ``vocab``: the embedding and the head, left out
    (not sharded yet). Returns the mixture of experts kept whole for training."""
    style = planned_style(model)
    whole = _unsharded(model, vocab)
    kept = replicated_experts(model, whole, style) if not serving and planned(model) else []
    if serving:   # (a router vLLM keeps whole beside its experts' slices, MLA's latent
        # down-projections whole beside its heads' up-projections: ReplicatedLinear)
        kept = [w for w in whole if is_router(model, w) or w.rsplit(".", 1)[-1] in LATENT]
    whole = [w for w in whole if w not in kept]
    if not whole:   # (no note of a router beside expert-parallel experts: they are split)
        return [] if serving else [k for k in kept if not beside_expert_parallel(model, k)]
    said = [f"{w} ({style(w)!r} in transformers' plan)" if style(w) else w for w in whole]
    shown = ", ".join(said[:3]) + (f" and {len(said) - 3} more" if len(said) > 3 else "")
    what = opt("parallel", value=f"tp={group}")
    if serving and any(style(w) in GATHERED for w in whole):
        raise GraphcostError(f"{what}: {shown}: a serving engine (vLLM) shards these its own "
                             "way, not as transformers' plan gathers them for training; not "
                             "modelled for serving")
    raise GraphcostError(f"{what}: the plan shards attention and MLP linears, the embedding "
                         f"and the head; {shown} would stay whole on every rank (tensor "
                         "parallelism of them is not modelled)")


def _unsharded(model: torch.nn.Module, vocab: tuple = ()) -> list[str]:
    """The modules whose matrices the plan left whole (``vocab``'s aside). A vector stored
    with dims of one (ERNIE 4.5's (1, experts) routing bias) is no matrix: whole on every
    rank, as a norm's weight."""
    return sorted({name.rsplit(".", 1)[0] for name, p in model.named_parameters()
                   if sum(d > 1 for d in p.shape) >= 2 and not isinstance(
                       m := model.get_submodule(name.rsplit(".", 1)[0]) if "." in name
                       else model, SHARDED) and m not in vocab
                   and not getattr(m, "tp_sharded", False)})


def _shard_blocks(model: torch.nn.Module, group: int, sequence: bool, gathers: bool,
                  vocab: tuple) -> tuple[list, set[str]]:
    """Each linear the plan names (``linear_style``; ``gathers``: its gathered styles too)
    but the embedding's and the head's (``vocab``) replaced by its shard; returns (the
    modules that hold column-wise ones — the attention and MLP modules, whose input sequence
    parallelism gathers —, the names of those whose column-wise outputs are gathered whole:
    their heads stay whole)."""
    parents, sharded, gathered = [], set(), set()
    style = linear_style(model, gathers)
    for name, child in list(model.named_modules()):
        for leaf, linear in list(child.named_children()):
            path = f"{name}.{leaf}" if name else leaf
            if not isinstance(linear, torch.nn.Linear) or linear in vocab:
                continue
            kind = style(path)
            if kind is None:
                continue
            if kind.startswith("colwise"):
                _divides(path, linear.out_features, group)
                gather = kind == "colwise_gather_output"
                rows = 0 if gather else _kv_rows(child, path, linear, group, not gathers)
                child.set_submodule(leaf, ColwiseLinear(linear, group, copy=not sequence,
                                                        gather_out=gather, rows=rows))
                (gathered if gather else sharded).add(name)
                parents += [] if gather or child in parents else [child]
            else:
                _divides(path, linear.in_features, group)
                child.set_submodule(leaf, RowwiseLinear(
                    linear, group, scatter_seq=sequence,
                    split_input=kind == "rowwise_split_input",
                    reduce=not getattr(child, "reduced_with_experts", False)))
    return parents, gathered - sharded


def _kv_rows(attention: torch.nn.Module, path: str, linear: torch.nn.Linear, group: int,
             replicate: bool) -> int:
    """The rank's rows of a key or value projection: 0 for an even split of its heads (the
    rows' own check), its heads checked to divide into the ranks (a split inside a head is
    refused) — but, with ``replicate`` (a serving engine's plan), fewer heads than ranks
    where the ranks divide into them (Qwen3-235B's 4 on 8): vLLM's ``QKVParallelLinear``
    gives each rank one head, each head on group / heads ranks, and the attention pairs the
    rank's query heads with it (``num_key_value_groups``): one head's rows."""
    head_dim = getattr(attention, "head_dim", None)
    if path.rsplit(".", 1)[-1] not in ("k_proj", "v_proj") or not isinstance(head_dim, int) or \
            linear.out_features % head_dim:
        return 0
    heads = linear.out_features // head_dim
    if heads % group == 0:
        return 0
    if not replicate or group % heads:
        _divides(f"{path}'s key/value head count", heads, group)
    query = getattr(attention, "q_proj", None)
    if isinstance(query, torch.nn.Linear):   # (sharded already or not: its whole width)
        full = query.full_out if isinstance(query, ColwiseLinear) else query.out_features
        setattr(attention, "num_key_value_groups", full // head_dim // group)
    for attr in ("n_kv", "n_kv_heads", "num_key_value_heads"):   # (not divided again)
        if getattr(attention, attr, None) == heads:
            setattr(attention, attr, 1)
    return head_dim


def _gathering(group: int, float8: tuple | None = None):
    """A pre-hook gathering a module's first input (or ``hidden_states``) from its sequence
    shards: ``PrepareModuleInput(Shard(1) -> Replicate())``; ``float8`` (a float8 linear's
    config): cast to float8 first, torchao's ``PrepareFloat8ModuleInput``."""
    def gather(x: torch.Tensor) -> torch.Tensor:
        return gather_seq_in_float8(x, group, float8) if float8 else tp_gather_seq(x, group)

    def hook(_module, args, kwargs):
        if args and isinstance(args[0], torch.Tensor):
            return (gather(args[0]), *args[1:]), kwargs
        if isinstance(kwargs.get("hidden_states"), torch.Tensor):
            return args, {**kwargs, "hidden_states": gather(kwargs["hidden_states"])}
        return None
    return hook


def local_head_counts(model: torch.nn.Module, group: int,
                      whole: Collection[str] = ()) -> None:
    """Attention modules that say their head counts (``n_head``, ``num_key_value_heads``, …)
    told the rank's share, as torchtitan once did (``attn.n_heads //= tp``): their q/k/v
    views then shape the local heads; but those ``whole`` names (their q/k/v outputs
    gathered: every rank runs every head)."""
    for name, child in model.named_modules():
        if name in whole:
            continue
        for attr in HEAD_COUNTS:
            count = getattr(child, attr, None)
            if isinstance(count, int) and not isinstance(count, bool) and count > 1:
                _divides(f"{name}.{attr}", count, group)
                setattr(child, attr, count // group)


def _local_head_parameters(parents: list, group: int) -> None:
    """An attention module's parameter of one value per query head (gpt-oss's ``sinks``) cut
    to the rank's heads, as vLLM holds it: the heads its sharded ``q_proj`` computes."""
    for parent in parents:
        q, head_dim = getattr(parent, "q_proj", None), getattr(parent, "head_dim", None)
        if not isinstance(q, ColwiseLinear) or not isinstance(head_dim, int) or q.gather_out:
            continue
        heads = q.full_out // head_dim
        for name, p in list(parent.named_parameters(recurse=False)):
            if p.dim() == 1 and p.numel() == heads:
                setattr(parent, name, torch.nn.Parameter(p.detach()[:heads // group].clone(),
                                                         p.requires_grad))


def _divides(what: str, size: int, group: int) -> None:
    if size % group:
        raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: {what} ({size:,}) does "
                             f"not divide into {group} ranks")


GATHERED = ("colwise_gather_output", "rowwise_split_input")


def linear_style(model: torch.nn.Module, gathers: bool = True) -> Callable[[str], str | None]:
    """The plan's style for a linear of ``model`` by its name: "colwise", "rowwise", with
    ``gathers`` "colwise_gather_output" and "rowwise_split_input" (transformers': the output
    all-gathered, the replicated input's slice taken), or None (not sharded here; the token
    embedding and the head are ``vocab_layers``'). A transformers model with a plan: the
    linears it names so; any other model: torchtitan's names (``COLWISE``, ``ROWWISE``)."""
    plan = planned(model)

    def named(name: str) -> str | None:
        leaf = name.rsplit(".", 1)[-1]
        return "colwise" if leaf in COLWISE else "rowwise" if leaf in ROWWISE else None
    if plan is None:
        return named
    style = planned_style(model, plan)
    kept = ("colwise", "rowwise", *(GATHERED if gathers else ()))

    def serving(name: str) -> str | None:
        # a serving engine's plan: a linear transformers' plan leaves out but named as
        # Llama's are (gpt-oss's plan names its embedding alone) sharded as vLLM does; one it
        # gathers for training (Phi-3's fused qkv_proj, OLMo 2's q_proj) split as vLLM's
        # column- and row-parallel linears split it, where vLLM's layer for it is known
        s, leaf = style(name), name.rsplit(".", 1)[-1]
        if s in GATHERED and leaf in (*COLWISE, *FUSED, *ROWWISE):
            return "rowwise" if s == "rowwise_split_input" else "colwise"
        return named(name) if s is None else s if s in kept else None
    return serving if not gathers else lambda name: s if (s := style(name)) in kept else None
