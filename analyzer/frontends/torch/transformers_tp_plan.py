"""transformers' tensor-parallel plan of a model: its lookup (``planned``, ``planned_style``)
and what it leaves whole on every rank as it runs — a mixture of experts' experts and router
when the plan names none of them (transformers 5.25's Mixtral plan shards attention alone;
5.24's named the experts ``"moe_tp_experts"``, a style graphcost does not model, still
refused). Each rank then holds and runs them whole on the replicated hidden states (after
the attention's row-wise all-reduce): the same products on every rank, their gradients the
same there too, so nothing is reduced for them. torchtitan's plan is another (expert
parallelism for the experts; refused here for a model not transformers')."""
from __future__ import annotations

import re
from typing import Callable, Iterable

import torch


def replicated_experts(model: torch.nn.Module, whole: Iterable[str],
                       style: Callable[[str], str | None]) -> list[str]:
    """Those of ``whole`` (modules a transformers plan leaves unsharded) that are a mixture of
    experts' parts the plan does not name (``style``): a module below one with ``experts``
    (the block: its experts, its router, a shared expert)."""
    return [w for w in whole if style(w) is None and _experts_of(model, w) is not None]


def beside_expert_parallel(model: torch.nn.Module, name: str) -> bool:
    """Whether module ``name`` is in a mixture of experts whose experts expert parallelism
    split over the tensor-parallel ranks' tokens (expert_parallel.py): its router stays
    whole on every rank, as torchtitan keeps it, and the experts are not whole."""
    return getattr(_experts_of(model, name), "tp_sharded", False)


def _experts_of(model: torch.nn.Module, name: str) -> torch.nn.Module | None:
    """The experts of the mixture of experts module ``name`` is in (None: not in one)."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        experts = getattr(model.get_submodule(".".join(parts[:end])), "experts", None)
        if isinstance(experts, torch.nn.Module):
            return experts
    return None


def replicated_note(names: list[str], group: int) -> str:
    """The report's line for the experts a rank holds whole."""
    blocks = sorted({n.rsplit(".", 1)[0] for n in names})
    shown = ", ".join(blocks[:2]) + (f" and {len(blocks) - 2} more" if len(blocks) > 2 else "")
    return (f"tp={group}: transformers' plan leaves the mixture of experts whole on every rank "
            f"({shown}: experts and router, unsharded, run on the replicated hidden states); "
            "counted so")


def planned_style(model: torch.nn.Module,
                  plan: dict[str, str] | None = None) -> Callable[[str], str | None]:
    """transformers' plan of ``model`` (``plan``, if the caller has it) as a lookup: a
    module's name (in ``model``, which may wrap the transformers model or be a pipeline stage
    cut from it) to the style its plan gives it, or None."""
    plan = plan if plan is not None else planned(model) or {}
    patterns = [(re.compile(r"(?:.*\.)?" + re.escape(k).replace(r"\*", r"\d+")), v)
                for k, v in plan.items()]
    return lambda name: next((v for pattern, v in patterns if pattern.fullmatch(name)), None)


def planned(model: torch.nn.Module) -> dict[str, str] | None:
    """The tensor-parallel plan transformers gives ``model`` (``PreTrainedModel.tp_plan``:
    module name patterns, ``*`` for a layer's index, to styles; else its config's
    ``base_model_tp_plan``), or None: not a transformers model, or no plan."""
    for m in model.modules():
        if not type(m).__module__.startswith("transformers."):
            continue
        plan = getattr(m, "tp_plan", None)
        if not isinstance(plan, dict) or not plan:
            plan = getattr(getattr(m, "config", None), "base_model_tp_plan", None)
        return dict(plan) if isinstance(plan, dict) and plan else None
    return None
