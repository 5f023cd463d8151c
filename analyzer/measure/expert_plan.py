"""Expert parallelism as a real measurement runs it (analyzer/measure/parallel.py, Case.ep):
torchtitan's ``AllToAllTokenDispatcher`` (torchtitan/models/common/token_dispatcher.py,
0.3.0) around a transformers MoE layer's experts, with gloo's all-to-all.

Each of the ``ep`` ranks keeps its slice of the experts (dim 0 of ``gate_up_proj`` and
``down_proj``, ``Shard(0)`` as torchtitan places them) and its own tokens. A layer's forward:
sort the token–expert pairs by expert and gather their rows (``_local_reorder``); exchange the
counts per expert (all-to-all, no gradient); send each rank the rows for its experts
(all-to-all with the counts as splits, autograd's: its backward is the reverse all-to-all);
reorder the received rows rank-major to expert-major (``_permute``); the local experts' grouped
matmuls; back to rank-major (``_unpermute``), the reverse all-to-all, scaled by the routing
scores in fp32 and scatter-added onto the tokens (``combine``). Llama 4's blocks, which
transformers runs densely, are first routed as torchtitan's Llama 4 runs them
(frontends/torch/routed_llama4.py, checked equal to transformers' block in
tests/test_llama4_routed.py): its scores scale the rows before they are sent
(``score_before_experts``), nothing after.

Beside tensor parallelism (``tp_group``): torchtitan's MoE sharding without sequence
parallelism (models/common/moe_sharding.py) — the rank takes its share of the replicated
tokens (their gradient, partial on each rank, all-reduced: ``_GradSummed``), dispatches them
and all-reduces the zero-padded result (``_Summed``), with functional collectives, as
DTensor's redistributions run them.

What graphcost traces for such a rank is its own rewrite (analyzer/frontends/torch/
expert_parallel.py, balanced counts): this module is what it is measured against.
"""
from __future__ import annotations

import torch

from ..frontends.torch.grouped_experts import (
    grouped_experts,
    hold_experts,
    scaled_rows,
    sorted_by_expert,
    stacked_experts,
)
from ..frontends.torch.routed_llama4 import routed


class DispatchedExperts(torch.nn.Module):
    """A transformers experts module's rank under expert parallelism over ``group``."""

    def __init__(self, experts: torch.nn.Module, group, tp_group=None) -> None:
        super().__init__()
        import torch.distributed as dist
        ep, rank = dist.get_world_size(group), dist.get_rank(group)
        self.num_experts: int = getattr(experts, "num_experts")
        local = self.num_experts // ep
        part = slice(rank * local, (rank + 1) * local)
        hold_experts(self, experts, part)
        self.group, self.ep, self.tp_group = group, ep, tp_group

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        if self.tp_group is None:
            return self._dispatched(x, top_k_index, top_k_weights)
        import torch.distributed as dist
        share = x.shape[0] // dist.get_world_size(self.tp_group)
        mine = slice(dist.get_rank(self.tp_group) * share,
                     (dist.get_rank(self.tp_group) + 1) * share)
        x = _GradSummed.apply(x, self.tp_group)
        weights = _GradSummed.apply(top_k_weights, self.tp_group)
        out = self._dispatched(x[mine], top_k_index[mine], weights[mine])
        partial = torch.cat([out.new_zeros(mine.start, out.shape[-1]), out,
                             out.new_zeros(x.shape[0] - mine.stop, out.shape[-1])])
        return _Summed.apply(partial, self.tp_group)

    def _dispatched(self, x: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
        _, scores, tokens = sorted_by_expert(top_k_index, top_k_weights)
        before = getattr(self.__dict__["layout"], "score_before_experts", False)
        routed = scaled_rows(x[tokens], scores) if before else x[tokens]
        counts = torch.bincount(top_k_index.reshape(-1), minlength=self.num_experts)
        got, send, recv = self._exchange_counts(counts)
        received = self._all_to_all(routed, recv, send)
        permuted, where, per_expert = _permute(received, got, self.ep)
        expert_of_row = torch.arange(per_expert.shape[0]).repeat_interleave(per_expert)
        out = grouped_experts(self, permuted, torch.cumsum(per_expert, 0, dtype=torch.int32),
                              expert_of_row)
        back = out.new_empty(received.shape)
        back[where] = out
        returned = self._all_to_all(back, send, recv)
        returned = returned if before else scaled_rows(returned, scores)
        index = tokens.reshape(-1, 1).expand(-1, x.shape[-1])
        return torch.zeros_like(x).scatter_add(0, index, returned)

    def _exchange_counts(self, counts: torch.Tensor):
        """(rows each rank sends for each local expert as (ep, local), rows sent to each
        rank, rows received from each)."""
        import torch.distributed as dist
        got = torch.empty_like(counts)
        with torch.no_grad():
            dist.all_to_all_single(got, counts, group=self.group)
        got = got.view(self.ep, -1)
        send = counts.view(self.ep, -1).sum(1).tolist()
        return got, send, got.sum(1).tolist()

    def _all_to_all(self, rows: torch.Tensor, out_splits: list, in_splits: list):
        from torch.distributed._functional_collectives import all_to_all_single_autograd
        out = all_to_all_single_autograd(rows, out_splits, in_splits, self.group)
        return torch.ops._c10d_functional.wait_tensor(out)


def _permute(received: torch.Tensor, got: torch.Tensor, ep: int):
    """Rows rank-major ((e0,r0), (e1,r0), …) reordered expert-major ((e0,r0), (e0,r1), …):
    (the rows, the input row of each, the rows per local expert) — torchtitan's ``_permute``."""
    starts = (got.reshape(-1).cumsum(0) - got.reshape(-1)).view(ep, -1).t().reshape(-1)
    lengths = got.t().reshape(-1)
    segment = torch.arange(lengths.shape[0]).repeat_interleave(lengths)
    out_starts = lengths.cumsum(0) - lengths
    where = starts[segment] + torch.arange(segment.shape[0]) - out_starts[segment]
    return received[where], where, got.sum(0)


def _all_reduced(x: torch.Tensor, group) -> torch.Tensor:
    """The sum over ``group``, a new tensor (a functional collective, as DTensor's)."""
    from torch.distributed._functional_collectives import all_reduce, wait_tensor
    return wait_tensor(all_reduce(x, "sum", group))


class _GradSummed(torch.autograd.Function):
    """The replicated tensor itself forward; its gradient, each rank's part, summed over the
    tensor-parallel group backward (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx, x, group):  # pyright: ignore[reportIncompatibleMethodOverride]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # pyright: ignore[reportIncompatibleMethodOverride]
        return _all_reduced(grad, ctx.group), None


class _Summed(torch.autograd.Function):
    """A partial result summed over the tensor-parallel group forward; its gradient passed
    through backward (Megatron's ``g``)."""

    @staticmethod
    def forward(ctx, x, group):  # pyright: ignore[reportIncompatibleMethodOverride]
        return _all_reduced(x, group)

    @staticmethod
    def backward(ctx, grad):  # pyright: ignore[reportIncompatibleMethodOverride]
        return grad, None


def apply_expert_parallel(model: torch.nn.Module, group,
                          tp_group=None) -> list[torch.nn.Module]:
    """Every transformers experts module of ``model`` (grouped_experts.stacked_experts)
    replaced by its rank over ``group`` (beside ``tp_group``'s tensor parallelism: on the
    rank's share of the tokens); the new modules."""
    routed(model)   # (Llama 4's blocks as torchtitan runs them: routed, scored before)
    ranks = []
    for name, m in stacked_experts(model):
        parent, _, leaf = name.rpartition(".")
        ranks.append(DispatchedExperts(m, group, tp_group))
        setattr(model.get_submodule(parent), leaf, ranks[-1])
    return ranks
