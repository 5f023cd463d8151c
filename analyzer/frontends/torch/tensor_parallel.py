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
  ``tp_split_last``), multi-head latent attention's down-projections whole on every rank
  (``"mla_kv_a_proj"``: tp_heads.mla_rope_reduced) — and a serving engine's (vLLM's
  ``ColumnParallelLinear``/``RowParallelLinear``, its logits gathered) for any model
  served: no sequence parallelism; there a linear transformers' plan leaves out but named as Llama's are is
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
from .serving_towers import Towers, encoder_style, held_whole, tower_plan, whole_towers
from .tp_collectives import tp_gather_seq
from .tp_heads import (
    divides,
    kv_rows,
    local_configs,
    local_head_counts,
    local_head_parameters,
    mla_rope_reduced,
)
from .tp_linear_attention import shard_linear_attention
from .tp_mamba import shard_mamba
from .tp_shards import ColwiseLinear, RowwiseLinear, VocabEmbedding, WholeNorm
from .tp_short_conv import shard_short_conv
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
# a serving engine's names besides (vLLM's LFM2 and Mixtral-style MLPs: w1 and w3 column-, w2
# row-parallel; an attention's out_proj row-parallel after its column-parallel q, k, v)
SERVING_COLWISE, SERVING_ROWWISE = ("w1", "w3"), ("w2", "out_proj")
# multi-head latent attention's down-projections (DeepSeek-V2/V3, Kimi K2), whole on every
# rank — vLLM's ReplicatedLinear; transformers' plan leaves q_a_proj out and names
# kv_a_proj_with_mqa "mla_kv_a_proj" (whole, its rope key's gradient all-reduced:
# mla_rope_reduced) — its up-projections q_b_proj and kv_b_proj split by head
LATENT = ("q_a_proj", "kv_a_proj_with_mqa")
LATENT_UP = ("q_b_proj", "kv_b_proj")


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
    towers = tower_plan(model, planned_style(model)) if serving else None
    held, tower_notes = whole_towers(model, group, towers) if towers else ((), ())
    mixers: set[str] = set()
    if serving:   # (vLLM's FusedMoE: each expert's intermediate split, the output summed;
        shard_experts(model, group)              # its recurrent mixers split by heads)
        shard_linear_attention(model, group)
        mixers = shard_mamba(model, group) | shard_short_conv(model, group)
    parents, whole_heads = _shard_blocks(model, group, sequence, not serving, (tokens, head))
    _whole_norms(model, parents, group, gathered=serving)
    local_configs(parents, group)
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
    local_head_counts(model, group, whole_heads | set(held) | mixers)
    local_head_parameters(parents, group)
    if not serving:
        mla_rope_reduced(model, group)
    kept = _all_sharded(model, group, serving, towers=towers)
    notes = (replicated_note(kept, group),) if kept else ()
    return model, notes + _replicated_heads_note(model, group, mixers) + tower_notes


def _replicated_heads_note(model: torch.nn.Module, group: int,
                           mixers: Collection[str] = ()) -> tuple[str, ...]:
    """The report's line when key/value heads are replicated (tp_heads.kv_rows): fewer of
    them than ranks, each rank holding one. (A Mamba 2 mixer's ``mixers`` replicate their
    groups of B and C, not heads: tp_mamba.py.)"""
    if not any(isinstance(c, ColwiseLinear) and not c.gather_out
               and c.out_features * group > c.full_out
               and not any(n.startswith(m + ".") for m in mixers)
               for n, c in model.named_modules()):
        return ()
    return (f"tp={group}: fewer key/value heads than ranks, replicated as vLLM replicates "
            "them (one a rank): a rank's KV cache holds its one head a layer",)


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
        # (each sharded width, and whether its shards tile it: replicated key/value heads
        # do not, and gathering them would not give the projection back)
        widths = {c.full_out: c.out_features * group == c.full_out for c in parent.children()
                  if isinstance(c, ColwiseLinear) and not c.gather_out}
        for leaf, child in list(parent.named_children()):
            weight = getattr(child, "weight", None)
            if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or \
                    weight.numel() not in widths or isinstance(child, SHARDED):
                continue
            if gathered and widths[weight.numel()]:
                parent.set_submodule(leaf, WholeNorm(child, group))
            else:
                raise GraphcostError(
                    f"{opt('parallel', value=f'tp={group}')}: {names[id(child)]} normalizes "
                    f"a whole projection ({weight.numel():,} features), which the plan "
                    f"shards over {group} ranks; a norm across the shards is not modelled")


def _all_sharded(model: torch.nn.Module, group: int, serving: bool = False,
                 vocab: tuple = (), towers: Towers | None = None) -> list[str]:
    """Refuse a model with matrices the plan does not shard (a fused projection, experts in
    a style not modelled): the engines that shard them do it by a plan graphcost does not
    model. A mixture of experts transformers' training plan leaves out stays whole, as it
    runs (transformers_tp_plan.py). ``serving``: a serving engine's plan, which shards
    transformers' gathered projections its own way (refused where vLLM's split is not
    modelled) and the experts as vLLM does, the router whole (serving_experts.py); ``vocab``:
    the embedding and the head, left out (not sharded yet). Multi-head latent attention's
    down-projections are whole in both (``LATENT``). Returns the mixture of experts kept
    whole for training."""
    style = planned_style(model)
    # (latent attention's down-projections, whole as both engines hold them)
    whole = [w for w in _unsharded(model, vocab) if w.rsplit(".", 1)[-1] not in LATENT]
    kept = replicated_experts(model, whole, style) if not serving and planned(model) else []
    if serving:   # (a router vLLM keeps whole beside its experts' slices; a tower's own
        kept = [w for w in whole if is_router(model, w)                           # tables)
                or towers is not None and held_whole(model, w, towers)]
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
            if not isinstance(linear, torch.nn.Linear) or linear in vocab or \
                    isinstance(linear, SHARDED):   # (sharded already: a gated delta net's)
                continue
            kind = style(path)
            if kind is None:
                continue
            if kind.startswith("colwise"):
                divides(path, linear.out_features, group)
                gather = kind == "colwise_gather_output"
                rows = 0 if gather else kv_rows(child, path, linear, group, not gathers)
                child.set_submodule(leaf, ColwiseLinear(linear, group, copy=not sequence,
                                                        gather_out=gather, rows=rows))
                (gathered if gather else sharded).add(name)
                parents += [] if gather or child in parents else [child]
            else:
                divides(path, linear.in_features, group)
                child.set_submodule(leaf, RowwiseLinear(
                    linear, group, scatter_seq=sequence,
                    split_input=kind == "rowwise_split_input",
                    reduce=not getattr(child, "reduced_with_experts", False)))
    return parents, gathered - sharded


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
    if gathers:   # (a training plan's: transformers' styles as they are)
        return lambda name: s if (s := style(name)) in kept else None
    towers = tower_plan(model, style)

    def serving(name: str) -> str | None:
        # a serving engine's plan: a linear transformers' plan leaves out but named as
        # Llama's are (gpt-oss's plan names its embedding alone) sharded as vLLM does; one it
        # gathers for training (Phi-3's fused qkv_proj, OLMo 2's q_proj) split as vLLM's
        # column- and row-parallel linears split it, where vLLM's layer for it is known
        s, leaf = style(name), name.rsplit(".", 1)[-1]
        if s in GATHERED and leaf in (*COLWISE, *FUSED, *ROWWISE):
            return "rowwise" if s == "rowwise_split_input" else "colwise"
        if s is None and leaf in LATENT_UP:   # (5.24's DeepSeek-V3 plan names no attention)
            return "colwise"
        if towers.outside(name):   # a vision tower and its projector, as vLLM's encoders
            return encoder_style(s, leaf) if towers.sharded else None   # hold them
        if s is None and leaf in (*SERVING_COLWISE, *SERVING_ROWWISE):
            return "colwise" if leaf in SERVING_COLWISE else "rowwise"
        return named(name) if s is None else s if s in kept else None
    return serving
