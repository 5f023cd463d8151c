"""One expert-parallel rank's program: each mixture-of-experts layer's experts rewritten into
what the rank runs under torchtitan's expert parallelism (``--parallel dp_shard=D,ep=E``),
then traced like any module.

torchtitan (``AllToAllTokenDispatcher``, torchtitan/models/common/token_dispatcher.py,
0.3.0) keeps 1/E of each layer's experts on a rank (``Shard(0)`` of the stacked expert
weights) and moves the tokens to them: the token–expert pairs sorted by expert and their
rows gathered; the rows sent to the ranks that hold their experts (an all-to-all, splits
from the counts); the rows received reordered rank-major to expert-major (an index copy);
the local experts' grouped matmuls; the result put back rank-major (``index_put`` into a new
tensor), returned by the reverse all-to-all, scaled by the routing scores in fp32 and
scatter-added onto the tokens.

How many rows a rank receives depends on the router: the program is traced at **balanced
routing**, each rank receiving as many rows as it sends (tokens · top-k) and each local
expert an equal share — an estimate (passes/graph/moe.py gives the bound: every token routed
to one rank's experts). What this covers: transformers' stacked experts in any layout its
experts interface describes (grouped_experts.py: Mixtral's, Qwen-MoE's and DeepSeek's;
gpt-oss's transposed, interleaved and biased one — each row's biases picked by its expert,
as transformers' grouped path picks them); Llama 4's once routed (routed_llama4.py), its
scores scaling the rows before they are sent (torchtitan's ``score_before_experts``).
Not modelled: shared experts' tensor parallelism, capacity factors and token dropping,
DeepEP/HybridEP kernels.

Beside tensor parallelism (``dp_shard=2,tp=2,ep=2``): torchtitan (0.3.0) carves the ep group
out of dp_shard × cp × tp and, without sequence parallelism, runs a mixture of experts on the
tp rank's share of the tokens (``models/common/moe_sharding.py``: the replicated input
sliced to its ``Shard(1)``, the result made ``Partial`` and all-reduced back to every rank).
graphcost's transformers plan has no sequence parallelism, so a rank here takes its 1/tp of
the (batch · seq) rows transformers' MoE block hands its experts — the rows and the routing
scores through ``tp_copy``, whose backward all-reduces their gradients, a partial one on each
rank — dispatches them, and all-reduces the zero-padded result (``tp_all_reduce``). The router
runs on every token of the rank, as transformers' block computes it before its experts (in
torchtitan, on the rank's share: a (tokens, experts) product more per layer here).
"""
from __future__ import annotations

import copy

import torch

from ....passes.errors import GraphcostError, opt
from .ep_collectives import ep_all_to_all
from .grouped_experts import (
    grouped_experts,
    hold_experts,
    scaled_rows,
    sorted_by_expert,
    stacked_experts,
)
from .tp_collectives import tp_all_reduce, tp_copy


class ExpertParallelRank(torch.nn.Module):
    """One rank's slice of a stacked-experts module (the first ``num_experts / group``) and
    torchtitan's dispatch around it; beside ``tp`` tensor-parallel ranks, on the rank's
    share of the tokens."""

    def __init__(self, experts: torch.nn.Module, group: int, tp: int = 1) -> None:
        super().__init__()
        local: int = getattr(experts, "num_experts") // group
        hold_experts(self, experts, slice(0, local))
        self.group, self.local, self.tp = group, local, tp
        self.tp_sharded = tp > 1   # (tensor parallelism leaves it as it is: its tokens split)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        if self.tp == 1:
            return self._dispatched(hidden_states, top_k_index, top_k_weights)
        rows = hidden_states.shape[0]
        if rows % self.tp:
            raise GraphcostError(f"{opt('parallel', value=f'tp={self.tp}')} beside expert "
                                 f"parallelism: the {rows} tokens a mixture of experts takes "
                                 f"must divide into the {self.tp} tensor-parallel ranks")
        share = rows // self.tp   # (the first rank's: every rank's alike at balance)
        x, weights = tp_copy(hidden_states, self.tp), tp_copy(top_k_weights, self.tp)
        out = self._dispatched(x[:share], top_k_index[:share], weights[:share])
        partial = torch.cat([out, out.new_zeros(rows - share, out.shape[-1])])
        return tp_all_reduce(partial, self.tp)

    def _dispatched(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
        _, scores, token_of_row = sorted_by_expert(top_k_index, top_k_weights)
        before = getattr(self.__dict__["layout"], "score_before_experts", False)
        sent = hidden_states[token_of_row]
        received = ep_all_to_all(scaled_rows(sent, scores) if before else sent, self.group)
        rows = received.shape[0]
        # rank-major to expert-major: a permutation of the rows (the identity at balance)
        where = torch.arange(rows, device=received.device)
        offsets = (torch.arange(1, self.local + 1, device=received.device) * rows
                   // self.local).to(torch.int32)
        out = self._experts(received[where], offsets)
        back = out.new_empty(received.shape)
        back[where] = out
        returned = ep_all_to_all(back, self.group)
        returned = returned if before else scaled_rows(returned, scores)
        index = token_of_row.reshape(-1, 1).expand(-1, hidden_states.shape[-1])
        return torch.zeros_like(hidden_states).scatter_add(0, index, returned)

    def _experts(self, rows: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The local experts on their rows (an equal share each): transformers' grouped path
        (PyTorch's ``_grouped_mm`` where it takes the dtype, else its fallback op)."""
        expert_of_row = torch.arange(rows.shape[0], device=rows.device) * self.local \
            // rows.shape[0]
        return grouped_experts(self, rows, offsets, expert_of_row)


def expert_parallel(module: torch.nn.Module, group: int, tp: int = 1) -> torch.nn.Module:
    """A copy of ``module`` as one of ``group`` expert-parallel ranks runs it (checked: it
    has stacked experts whose count divides into the ranks), beside ``tp`` tensor-parallel
    ranks."""
    what = opt("parallel", value=f"ep={group}")
    model = copy.deepcopy(module)
    found = stacked_experts(model)
    if not found:
        raise GraphcostError(f"{what}: expert parallelism splits a mixture of experts' "
                             "stacked expert weights as transformers' experts interface "
                             "runs them (gate_up_proj or up_proj and down_proj of shape "
                             "(experts, ·, ·), each expert on the tokens routed to it: "
                             "Mixtral, Qwen-MoE, DeepSeek, gpt-oss); this model has none")
    for name, experts in found:
        count: int = getattr(experts, "num_experts")
        if count % group:
            raise GraphcostError(f"{what}: {name} has {count} experts, which do not divide "
                                 f"into {group} ranks")
        model.set_submodule(name, ExpertParallelRank(experts, group, tp))
    return model
