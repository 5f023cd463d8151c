"""The summary's ``checkpoint`` lines (analyzer/render/summary.py): the plan's segments, what
it does to the step's peak and what it recomputes (passes/training/checkpoint_search.py)."""
from __future__ import annotations

from ..app.report import Report
from ..app.units import human, human_bytes
from . import explain


def checkpoint_entries(r: Report, brief: bool) -> list[tuple[str, list[str]]]:
    """The checkpoint plan, if any: its segments and recompute; the one-device peaks with and
    without it but in a brief view beside a parallel rank, whose peak decides."""
    ck = r.training.checkpoint if r.training else None
    if ck is None:
        return []
    recompute = f"recompute {human(ck.recompute_flops)} FLOPs ({ck.recompute_pct:.1f}% of the step)"
    if brief and (r.parallel is not None or r.pipeline is not None):   # (one device's: --details)
        return [("checkpoint", [f"{ck.mode}:", _segments(ck.segments, brief) + ";", recompute])]
    note = explain.checkpoint_note(r)
    return [("checkpoint", [f"{ck.mode}:", _segments(ck.segments, brief)]),
            ("", [f"peak {human_bytes(ck.peak_without_bytes)} → {human_bytes(ck.peak_bytes)}",
                  f"({ck.peak_without_bytes:,} → {ck.peak_bytes:,} B)", recompute]
             + ([f"budget {human_bytes(ck.budget_bytes)}"] if ck.budget_bytes else [])
             + ([f"— {note}"] if note else []))]


def _segments(names: tuple[str, ...], brief: bool) -> str:
    """The plan's segments; in the brief view six at most (an 80-block model's full
    checkpointing named whole would take its screen): the first three, the last, the count."""
    if not names:
        return "none needed"
    if not brief or len(names) <= 6:
        return ", ".join(names)
    return f"{', '.join(names[:3])}, … {names[-1]} ({len(names)} segments)"
