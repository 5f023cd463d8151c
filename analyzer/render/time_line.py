"""The summary's ``time`` line (analyzer/render/summary.py): the estimate a device profile
gives (passes/device/time_estimate.py), with its band and where both come from, then (not
brief) what it is made of, and the nodes nothing priced."""
from __future__ import annotations

from ..app.report import Report
from ..app.units import human_time


def time_entries(r: Report, brief: bool) -> list[tuple[str, list[str]]]:
    """The time estimate (a device profile): the figure with its band, then what it is made
    of; what no rule priced is said."""
    t = r.time
    if t is None:
        return []
    per = " per step" if r.training else " per forward"
    band = f" ± {t.band:.0%}" if t.band is not None else ""
    source = (f"(estimate: {t.profile}, {ENGINE_WORDS.get(t.engine, t.engine)};",
              f"band from {t.runs} validated runs)" if t.band is not None
              else "no band: the profile was not validated)")
    out = [("time", [f"≈ {human_time(t.seconds)}{band}{per}", *source])]
    if not brief:
        parts = [f"arithmetic {human_time(t.arithmetic_seconds)}",
                 f"memory {human_time(t.memory_seconds)}",
                 f"launches {human_time(t.launch_seconds)} ({t.kernels:,} calls)"]
        parts += [f"optimizer {human_time(t.optimizer_seconds)}"] if t.optimizer_seconds else []
        parts += [f"recompute {human_time(t.recompute_seconds)}"] if t.recompute_seconds else []
        out.append(("", [p + ("," if i < len(parts) - 1 else "") for i, p in enumerate(parts)]))
    if t.unpriced:
        n = sum(t.unpriced.values())
        out.append(("", [f"{n} node(s) with no cost (no rule or no shape) priced at a launch:",
                         ", ".join(sorted(t.unpriced))]))
    return out


ENGINE_WORDS = {"torch": "eager PyTorch", "onnxruntime": "ONNX Runtime"}
