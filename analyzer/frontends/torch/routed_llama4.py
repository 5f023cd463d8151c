"""Llama 4's mixture of experts as the engines that route it run it: each token through its
top-k experts only.

transformers' ``Llama4TextMoe`` (5.x) runs every expert on every token — the input repeated
once per expert, scaled by a routing score that is sigmoid(-inf) = 0 where the expert was not
chosen, and batched matmuls over all experts (``Llama4TextExperts``): E times the routed
experts' FLOPs and activations (16× on Scout, 128× on Maverick). That is what transformers
computes, and graphcost keeps it where transformers runs the model (a training step, eager
generation). vLLM routes (``Llama4MoE``: ``FusedMoE`` with ``apply_router_weight_on_input``
and Llama 4's routing function, top-k of the router's logits and their sigmoid), and so does
torchtitan (``score_before_experts``: the routed rows scaled by their scores in fp32 before
the experts, nothing after). Here the block is rewritten to that: the router's logits, top-k,
the scores' sigmoid (in fp32, cast back, as ``Llama4Router``); the token–expert pairs sorted
by expert, their rows gathered and scaled, the experts' grouped matmuls on them
(grouped_experts.py: the stacked weights described by transformers' experts-interface flags —
gate and up concatenated, transposed (experts, in, out) as Llama 4 stores them), the results
summed onto their tokens beside the shared expert. The router's logits are returned as
transformers' block returns them. Its experts are then "stacked" for the parallel rewrites
(expert_parallel.py, serving_experts.py) as Mixtral's are.
"""
from __future__ import annotations

import torch

from .grouped_experts import grouped_experts, layout_of, scaled_rows, sorted_by_expert


class RoutedExperts(torch.nn.Module):
    """``Llama4TextExperts``' weights, run on the rows routed to each expert."""

    # transformers' experts-interface flags for Llama 4's layout (grouped_experts.py)
    has_gate, has_bias, has_post_expert_norm = True, False, False
    is_transposed, is_concatenated = True, True
    _is_expert_parallel = False   # (transformers' own expert parallelism: not this)
    score_before_experts = True   # (torchtitan's flag: scores scale the rows going in)

    def __init__(self, experts: torch.nn.Module) -> None:
        super().__init__()
        self.num_experts: int = getattr(experts, "num_experts")
        self.act_fn = getattr(experts, "act_fn")
        self.gate_up_proj = getattr(experts, "gate_up_proj")
        self.down_proj = getattr(experts, "down_proj")
        self.__dict__["layout"] = layout_of(self)   # (what grouped_experts reads beside weights)

    def _apply_gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        from transformers.integrations.moe import _default_apply_gate
        return _default_apply_gate(self, gate_up)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        expert_of_row, scores, token_of_row = sorted_by_expert(top_k_index, top_k_weights)
        rows = scaled_rows(hidden_states[token_of_row], scores)
        counts = torch.histc(expert_of_row.float(), bins=self.num_experts, min=0,
                             max=self.num_experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        out = grouped_experts(self, rows, offsets, expert_of_row)
        index = token_of_row.reshape(-1, 1).expand(-1, hidden_states.shape[-1])
        return torch.zeros_like(hidden_states).scatter_add(0, index, out)


class RoutedMoe(torch.nn.Module):
    """A ``Llama4TextMoe`` block routed: its router, its shared expert and its experts
    (``RoutedExperts``), each token through its top-k."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.top_k: int = getattr(block, "top_k")
        self.hidden_dim: int = getattr(block, "hidden_dim")
        self.router: torch.nn.Linear = getattr(block, "router")
        self.shared_expert: torch.nn.Module = getattr(block, "shared_expert")
        self.experts = RoutedExperts(getattr(block, "experts"))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = hidden_states.reshape(-1, self.hidden_dim)
        logits = torch.nn.functional.linear(x, self.router.weight, self.router.bias)
        top, index = torch.topk(logits, self.top_k, dim=1)
        scores = torch.sigmoid(top.float()).to(top.dtype)
        out = self.shared_expert(x)
        out.add_(self.experts(x, index, scores))
        return out, logits


def dense_blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``model``'s Llama 4 expert blocks that run every expert on every token."""
    return [(name, m) for name, m in model.named_modules()
            if type(m).__name__ == "Llama4TextMoe"
            and type(m).__module__.startswith("transformers.")]


def routed(model: torch.nn.Module) -> int:
    """``model``'s Llama 4 expert blocks rewritten to route, in place; how many."""
    found = dense_blocks(model)
    for name, block in found:
        model.set_submodule(name, RoutedMoe(block))
    return len(found)
