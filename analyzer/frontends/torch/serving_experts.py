"""A mixture of experts as a serving engine's tensor-parallel rank holds it: vLLM's
``FusedMoE`` without expert parallelism (vllm/model_executor/layers/fused_moe/layer.py).

Every rank keeps every expert, each one's intermediate dimension split over the ``group``
ranks: the fused gate and up projection ``w13`` (experts, 2·I/T, H), its gate rows and up
rows the rank's slice of each, and the down projection ``w2`` (experts, H, I/T); the router
stays whole on every rank (``ReplicatedLinear``). Each rank runs its slice on all of its
tokens and the partial outputs are summed across the ranks (``reduce_results``: one
all-reduce of the layer's output). Here transformers' stacked experts (3-D ``gate_up_proj``
and ``down_proj``: frontends/torch/expert_parallel.py ``stacked_experts``) are cut so and
their output all-reduced; the routing is traced as transformers' experts run it (the
kernels are vLLM's fused ones, whose scratch graphcost does not model). Derived from vLLM's
code, not measured (vLLM's CUDA build installs on this CPU machine but runs no model here).
"""
from __future__ import annotations

import torch

from ....passes.errors import GraphcostError, opt
from .expert_parallel import stacked_experts
from .tp_collectives import tp_all_reduce


def shard_experts(model: torch.nn.Module, group: int) -> None:
    """``model``'s stacked experts cut to one of ``group`` ranks' slices, in place."""
    for name, experts in stacked_experts(model):
        gate_up: torch.Tensor = getattr(experts, "gate_up_proj")
        down: torch.Tensor = getattr(experts, "down_proj")
        width = down.shape[-1]   # (the intermediate dimension I)
        if width % group or gate_up.shape[1] != 2 * width:
            raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: {name}'s experts' "
                                 f"intermediate dimension ({width:,}) does not divide into "
                                 f"{group} ranks")
        part = width // group
        rows = torch.cat([gate_up.detach()[:, :part], gate_up.detach()[:, width:width + part]],
                         dim=1)
        setattr(experts, "gate_up_proj", torch.nn.Parameter(rows, gate_up.requires_grad))
        setattr(experts, "down_proj", torch.nn.Parameter(down.detach()[..., :part].clone(),
                                                         down.requires_grad))
        if isinstance(getattr(experts, "intermediate_dim", None), int):
            setattr(experts, "intermediate_dim", part)
        setattr(experts, "tp_sharded", True)   # (tensor_parallel's check: not left whole)
        experts.register_forward_hook(lambda m, args, out: tp_all_reduce(out, group))


def is_router(model: torch.nn.Module, name: str) -> bool:
    """A module of a mixture-of-experts block whose outputs are one per expert or fewer (the
    router, a shared expert's gate): vLLM keeps it whole on every rank."""
    weight = getattr(model.get_submodule(name), "weight", None)
    parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
    experts = getattr(parent, "experts", None)
    count = getattr(experts, "num_experts", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 2 and \
        isinstance(count, int) and weight.shape[0] <= count
