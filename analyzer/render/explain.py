"""Sentences that say what a number includes and why a saver did or did not help.

Shared by every renderer (terminal, Markdown, HTML) so that each says the same thing. They read
pass results only; nothing here computes a cost.
"""
from __future__ import annotations

from ..app.report import Report
from ..app.units import human, human_bytes

# What a training step's phase holds that no activation saver can remove.
_PHASE_HOLDS = {
    "optimizer": "the optimizer step, where parameters, gradients, optimizer state and the "
                 "update's temporaries are live and no activation is",
}


def with_growth(items: list[str], phases) -> list[str]:
    """A reserved line's ``items`` and then, after a ";", where the replay's reserved bytes
    grew: each phase that reserved more (the first its whole figure, then "+" its growth)."""
    grown = _reserved_growth(phases)
    return items[:-1] + [items[-1] + ";"] + grown if grown and items else items


def _reserved_growth(phases) -> list[str]:
    items, before = [], 0
    for p in phases:
        if p.reserved_bytes > before:
            grew = p.reserved_bytes - before
            items.append(f"{p.phase} {'+' if before else ''}{human_bytes(grew)},")
            before = p.reserved_bytes
    if not items:
        return []
    items[-1] = items[-1][:-1]
    return ["grown in:"] + items


def activations_includes(r: Report) -> str:
    m = r.memory
    inputs = "incl. the inputs" if m.include_inputs else "inputs excluded"
    return f"activations {inputs}, {m.lifetimes} lifetimes"


def peak_includes(r: Report) -> str:
    """What Report.peak_bytes adds up."""
    p = r.parallel
    if p is not None:
        return (f"one rank's peak under {p.layout} over {p.world_size:,} ranks (per-rank "
                f"batch {p.per_rank_batch:,}): its parameters, gradients and optimizer state "
                "(as the strategy shards them), activations, communication buffers and "
                "temporaries" + (", host-offloaded bytes excluded" if p.host_bytes else ""))
    if r.training is not None:
        return training_includes(r)
    return f"parameters + buffers + the activation peak ({activations_includes(r)})"


def training_includes(r: Report) -> str:
    """What the (single-device) training step's peak adds up."""
    assert r.training is not None  # a training report's
    inputs = "incl." if r.training.include_inputs else "excl."
    return ("parameters + buffers + gradients + optimizer state + activations "
            f"({inputs} the input batch) + temporaries, at the step's peak")


def first_step(r: Report) -> str | None:
    """The first step's peak beside the steady state's, for stateful optimizers: the
    checkpointed step's under a checkpoint plan (the step that runs)."""
    t = r.training
    if t is None or not t.optimizer_state_bytes:
        return None
    t = t.run
    if t.first_step_peak_bytes == t.peak_bytes:
        return (f"first step the same ({t.optimizer} state is created inside its step(), "
                "where the peak is)")
    return (f"first step {human_bytes(t.first_step_peak_bytes)} (its forward and backward run "
            f"before step() creates the {t.optimizer} state, "
            f"{human_bytes(t.optimizer_state_bytes)})")


def why_no_saving(phase: str, node: str | None, saver: str) -> str:
    """Why ``saver`` leaves the peak where it is (phase and node of the unchanged peak)."""
    if phase in _PHASE_HOLDS:
        return f"the peak is in {_PHASE_HOLDS[phase]}"
    where = f"{phase} at {node}" if node else phase
    if saver == "inplace_activations":
        return (f"the peak is in the {where}, where every live tensor is still needed: an "
                "in-place activation only frees its input while it runs, and none runs with a "
                "dying input at the peak")
    if saver.startswith("checkpoint"):
        return (f"the peak is in the {where}: the tensors live there are not saved inside a "
                "checkpointed segment (or are recomputed by then)")
    return f"the peak is in the {where}"


def what_if_line(r: Report, name: str) -> str:
    t = r.training
    assert t is not None  # a training report's what-if
    w = t.what_if[name]
    saved = t.peak_bytes - w.peak_bytes
    # (as the checkpoint line writes it: the exact count is in the JSON)
    extra = f", recompute {human(w.recompute_flops)} FLOPs" if w.recompute_flops is not None \
        else ""
    if saved > 0:
        change = f"saves {human_bytes(saved)}"
    elif saved < 0:
        change = f"adds {human_bytes(-saved)}"
    else:
        change = "saves nothing: " + why_no_saving(w.peak_phase, w.peak_node, name)
    return f"{name.replace('_', ' ')}: peak {human_bytes(w.peak_bytes)} ({change}{extra})"


def checkpoint_note(r: Report) -> str | None:
    c = r.training.checkpoint if r.training else None
    if c is None or c.peak_bytes < c.peak_without_bytes:
        return None
    if not c.segments:
        return "no plan needed: the step already fits the budget"
    return "the plan saves nothing: " + why_no_saving(c.peak_phase, c.checkpointed.peak_node,
                                                       "checkpoint")
