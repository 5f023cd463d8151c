"""A mixture of experts as a serving engine's tensor-parallel rank holds it: vLLM's
``FusedMoE`` without expert parallelism (vllm/model_executor/layers/fused_moe/layer.py).

Every rank keeps every expert, each one's intermediate dimension split over the ``group``
ranks: the fused gate and up projection ``w13`` (experts, 2·I/T, H), its gate rows and up
rows the rank's slice of each, and the down projection ``w2`` (experts, H, I/T); the router
stays whole on every rank (``ReplicatedLinear``). Each rank runs its slice on all of its
tokens and the partial outputs are summed across the ranks (``reduce_results``: one
all-reduce of the layer's output, a shared expert's partial sum added before it). Here
transformers' stacked experts (3-D ``gate_up_proj`` and ``down_proj`` in any layout its
experts interface describes: grouped_experts.py) are cut so — gpt-oss's interleaved gate
and up columns in pairs, its gate-and-up biases with them — and their output all-reduced; the routing is traced as transformers' experts run it (the
kernels are vLLM's fused ones, whose scratch graphcost does not model). Derived from vLLM's
code, not measured (vLLM's CUDA build installs on this CPU machine but runs no model here).
"""
from __future__ import annotations

import torch

from ....passes.errors import GraphcostError, opt
from .grouped_experts import stacked_experts
from .tp_collectives import tp_all_reduce


def shard_experts(model: torch.nn.Module, group: int) -> None:
    """``model``'s stacked experts cut to one of ``group`` ranks' slices, in place."""
    for name, experts in stacked_experts(model):
        down: torch.Tensor = getattr(experts, "down_proj")
        transposed = getattr(experts, "is_transposed", False)
        width = down.shape[1 if transposed else 2]   # (the intermediate dimension I)
        if width % group:
            raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: {name}'s experts' "
                                 f"intermediate dimension ({width:,}) does not divide into "
                                 f"{group} ranks")
        first = "gate_up_proj" if getattr(experts, "has_gate", True) else "up_proj"
        columns = _rank_columns(experts, width, width // group)
        _cut(experts, first, 2 if transposed else 1, columns)
        _cut(experts, f"{first}_bias", 1, columns)
        _cut(experts, "down_proj", 1 if transposed else 2, torch.arange(width // group))
        if isinstance(getattr(experts, "intermediate_dim", None), int):
            setattr(experts, "intermediate_dim", width // group)
        setattr(experts, "tp_sharded", True)   # (tensor_parallel's check: not left whole)
        _reduce_once(model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model,
                     experts, group)


def _reduce_once(block: torch.nn.Module, experts: torch.nn.Module, group: int) -> None:
    """The experts' partial output all-reduced — with a shared expert beside them (DeepSeek's
    ``shared_experts``, Qwen-MoE's gated ``shared_expert``), once for both, after the block
    adds them (vLLM builds the shared expert's row-parallel down projection with
    ``reduce_results=False`` and reduces the sum): the shared expert is marked so
    (``reduced_with_experts``) for tensor_parallel.py's row-wise shard to leave its sum
    partial."""
    shared = [m for n, m in block.named_children()
              if n.startswith("shared_expert") and not n.endswith("_gate")]
    for module in shared:
        setattr(module, "reduced_with_experts", True)
    (block if shared else experts).register_forward_hook(
        lambda m, args, out: _reduced_output(out, group))


def _reduced_output(out, group: int):
    """A module's output all-reduced: a tensor, or the first of a tuple (a block that also
    returns its router's logits)."""
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return (tp_all_reduce(out[0], group), *out[1:])
    return tp_all_reduce(out, group) if isinstance(out, torch.Tensor) else out


def _rank_columns(experts: torch.nn.Module, width: int, part: int) -> torch.Tensor:
    """The first rank's columns of the first projection's intermediate axis: its ``part`` of
    the gate's and of the up projection's (gate then up, or interleaved pairs: gpt-oss)."""
    if not getattr(experts, "has_gate", True):
        return torch.arange(part)
    if getattr(experts, "is_concatenated", True):
        return torch.cat([torch.arange(part), torch.arange(width, width + part)])
    return torch.arange(2 * part)


def _cut(experts: torch.nn.Module, name: str, axis: int, index: torch.Tensor) -> None:
    """``experts``' parameter ``name`` (if it has one) cut to ``index`` along ``axis``."""
    p = getattr(experts, name, None)
    if isinstance(p, torch.Tensor):
        cut = p.detach().index_select(axis, index.to(p.device))
        setattr(experts, name, torch.nn.Parameter(cut, p.requires_grad))


def is_router(model: torch.nn.Module, name: str) -> bool:
    """A module of a mixture-of-experts block whose outputs are one per expert or fewer (the
    router, a shared expert's gate): vLLM keeps it whole on every rank."""
    weight = getattr(model.get_submodule(name), "weight", None)
    parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    experts = getattr(parent, "experts", None)
    count = getattr(experts, "num_experts", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 2 and \
        isinstance(count, int) and weight.shape[0] <= count
