"""transformers' stacked experts as the parallel layouts cut them: which modules they are, a
rank's share of them, and their grouped computation on rows already sorted by expert.

transformers (5.x, ``integrations/moe.py``) stacks a mixture of experts' weights along a
leading experts dim and describes each layout with flags its ``use_experts_implementation``
decorator sets: ``has_gate`` (a fused ``gate_up_proj``, else ``up_proj`` and an activation),
``is_transposed`` (weights (experts, in, out) as gpt-oss holds them, else (experts, out, in)
as Mixtral, Qwen-MoE and DeepSeek do), ``has_bias`` (per-expert biases: gpt-oss),
``is_concatenated`` (gate then up, else interleaved gate/up columns: gpt-oss) and
``has_post_expert_norm``; the gate itself is the class's ``_apply_gate`` (gpt-oss's clamped
SwiGLU; by default ``act_fn(gate) * up``). Everything here reads those flags, so a layout is
cut and run as transformers' own grouped path (``grouped_mm_experts_forward``) runs it. An
experts module without them (Llama 4's, which runs every expert on every token) is not
"stacked" here, and a layout that needs it is refused by name where it is asked for.
"""
from __future__ import annotations

import copy

import torch


def experts_weight(experts: torch.nn.Module) -> torch.Tensor | None:
    """The first projection's stacked weight: ``gate_up_proj``, or ``up_proj`` without a gate."""
    weight = getattr(experts, "gate_up_proj" if getattr(experts, "has_gate", True) else
                     "up_proj", None)
    return weight if isinstance(weight, torch.Tensor) and weight.dim() == 3 else None


def stacked_experts(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules holding a layer's experts stacked, as transformers' experts interface runs
    them (its flags set, the weights 3-D with the experts first)."""
    return [(name, m) for name, m in model.named_modules()
            if hasattr(m, "has_gate") and experts_weight(m) is not None
            and isinstance(getattr(m, "down_proj", None), torch.Tensor)
            and isinstance(getattr(m, "num_experts", None), int)]


def expert_slices(experts: torch.nn.Module, part: slice) -> dict[str, torch.nn.Parameter]:
    """``experts``' parameters stacked along the experts (weights and biases), each cut to
    the experts of ``part``."""
    count: int = getattr(experts, "num_experts")
    return {name: torch.nn.Parameter(p.detach()[part].clone(), p.requires_grad)
            for name, p in experts.named_parameters(recurse=False)
            if p.dim() > 0 and p.shape[0] == count}


def layout_of(experts: torch.nn.Module) -> torch.nn.Module:
    """``experts`` without its parameters: what its computation reads beside the weights (its
    flags, ``_apply_gate`` and activation)."""
    layout = copy.copy(experts)   # (a parameter table of its own, emptied; the rest shared)
    layout._parameters = {}
    return layout


def grouped_experts(holder: torch.nn.Module, rows: torch.Tensor, offsets: torch.Tensor,
                    expert_of_row: torch.Tensor) -> torch.Tensor:
    """The experts ``holder`` holds (hold_experts: their stacked weights and biases, named as
    transformers names them) run on ``rows`` grouped by expert as their layout says —
    ``offsets``: where each expert's rows end; ``expert_of_row``: each row's expert, which
    picks its biases. transformers' grouped path from its sort on, before the routing
    scores."""
    from transformers.integrations.moe import _grouped_linear
    layout: torch.nn.Module = holder.__dict__["layout"]
    transposed: bool = getattr(layout, "is_transposed", False)

    def bias(name: str) -> torch.Tensor | None:
        return getattr(holder, name)[expert_of_row] if getattr(layout, "has_bias", False) \
            else None
    if getattr(layout, "has_gate", True):
        out = _grouped_linear(rows, getattr(holder, "gate_up_proj"), offsets,
                              bias=bias("gate_up_proj_bias"), is_transposed=transposed)
        out = getattr(layout, "_apply_gate")(out)
    else:
        out = getattr(layout, "act_fn")(_grouped_linear(
            rows, getattr(holder, "up_proj"), offsets, bias=bias("up_proj_bias"),
            is_transposed=transposed))
    out = _grouped_linear(out, getattr(holder, "down_proj"), offsets,
                          bias=bias("down_proj_bias"), is_transposed=transposed)
    if getattr(layout, "has_post_expert_norm", False):
        out = getattr(holder, "post_expert_norm")(out)
    return out


def hold_experts(holder: torch.nn.Module, experts: torch.nn.Module, part: slice) -> None:
    """``holder`` made to hold ``experts``' slice ``part`` as its own parameters (its module
    path stays the experts'), their layout beside them unregistered (its parameters are not
    the rank's), and a post-expert norm as its child."""
    for name, p in expert_slices(experts, part).items():
        holder.register_parameter(name, p)
    holder.__dict__["layout"] = layout_of(experts)   # (not a submodule: no parameters of its own)
    if getattr(experts, "has_post_expert_norm", False):
        holder.add_module("post_expert_norm", getattr(experts, "post_expert_norm"))


def scaled_rows(rows: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Routed rows scaled by their routing scores in fp32, kept in their own dtype (as
    torchtitan scales them: after the experts, or before them with ``score_before_experts``)."""
    return (rows.float() * scores.reshape(-1, 1)).to(rows.dtype)


def sorted_by_expert(top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """The token–expert pairs sorted by expert (a stable sort, as torchtitan's and
    transformers' grouped paths sort them): (each row's expert, its routing score, its
    token)."""
    order = torch.argsort(top_k_index.reshape(-1), stable=True)
    return (top_k_index.reshape(-1)[order], top_k_weights.reshape(-1)[order],
            order // top_k_index.shape[-1])
