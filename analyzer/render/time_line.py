"""The summary's ``time`` line (analyzer/render/summary.py): the estimate a device profile or
a GPU's datasheet gives (passes/device/time_estimate.py), with its band and where both come
from, a step's throughput and a training run's cost, then (not brief) what it is made of, and
the nodes nothing priced."""
from __future__ import annotations

from ...passes.device.gpu_engine import MIN_BAND
from ..app.report import Report
from ..app.units import human, human_time


def time_entries(r: Report, brief: bool) -> list[tuple[str, list[str]]]:
    """The time estimate (a device profile, or a GPU's datasheet): the figure with its band,
    a parallel step's throughput, then what it is made of; what no rule priced is said."""
    t = r.time
    if t is None:
        return []
    per = " per step" if r.training else " per forward"
    band = f" ± {t.band:.0%}" if t.band is not None else ""
    head = f"≈ {human_time(t.seconds)}{band}{per}"
    if brief and r.roofline is not None:   # (the roofline's line is left out: its bound here)
        # (a pipeline's roofline is the whole model's at one micro-batch: not this step's)
        bound = "" if r.pipeline else f"; lower bound {human_time(r.roofline.total_seconds)}"
        return [("time", [head, f"(estimate{bound})" + (";" if t.mfu else ""),
                          *_throughput(t, brief)])] + _run(t)
    out = [("time", [head, *_source(t)])]
    rate = _throughput(t, brief)
    if rate:
        out.append(("", rate))
    if not brief:
        out.append(("", _parts(t)))
    out += _run(t)
    if t.unpriced:
        n = sum(t.unpriced.values())
        out.append(("", [f"{n} node(s) with no cost (no rule or no shape) priced at a launch:",
                         ", ".join(sorted(t.unpriced))]))
    return out


def _source(t) -> list[str]:
    engine = ENGINE_WORDS.get(t.engine, t.engine)
    if t.basis == "datasheet":
        return ["(estimate: datasheet rates × published kernel shares,", f"{engine};",
                f"band from {t.runs} published runs, at least {MIN_BAND:.0%})"]
    return [f"(estimate: {t.profile}, {engine};",
            f"band from {t.runs} validated runs)" if t.band is not None
            else "no band: the profile was not validated)"]


def _throughput(t, brief: bool) -> list[str]:
    where = " per GPU" if t.basis == "datasheet" or t.gpus > 1 else ""
    parts = [f"{t.tokens_per_second:,.0f} tokens/s{where}"] if t.tokens_per_second else []
    if t.mfu and t.hfu:
        parts.append(f"MFU {t.mfu:.0%}" if brief else
                     f"MFU {t.mfu:.0%} (with recompute {t.hfu:.0%})")
    if not brief and (t.communication_seconds or t.overlapped_seconds):
        parts.append(f"collectives {human_time(t.communication_seconds)} exposed, "
                     f"{human_time(t.overlapped_seconds)} under compute")
    return [p + ("," if i < len(parts) - 1 else "") for i, p in enumerate(parts)]


def _run(t) -> list[tuple[str, list[str]]]:
    """A training run's days, GPU-hours and cost at the estimated pace, with the band."""
    if t.days is None or t.gpu_hours is None or t.run_tokens is None:
        return []
    band = f" (± {t.band:.0%})" if t.band is not None else ""
    items = [f"{human(t.run_tokens)} tokens: {t.days:,.1f} days on {t.gpus:,} GPU(s),",
             f"{t.gpu_hours:,.0f} GPU-hours" + ("," if t.cost is not None else band)]
    if t.cost is not None:
        items.append(f"${t.cost:,.0f} at ${t.price:,.2f} a GPU-hour{band}")
    return [("run", items)]


def _parts(t) -> list[str]:
    parts = [f"arithmetic {human_time(t.arithmetic_seconds)}",
             f"memory {human_time(t.memory_seconds)}",
             f"launches {human_time(t.launch_seconds)} ({t.kernels:,} calls)"]
    if t.host_bound:
        parts.append(f"host {human_time(t.host_seconds)} (eager PyTorch's: the GPU waits "
                     "on it)")
    parts += [f"optimizer {human_time(t.optimizer_seconds)}"] if t.optimizer_seconds else []
    parts += [f"recompute {human_time(t.recompute_seconds)}"] if t.recompute_seconds else []
    parts += [f"pipeline bubble {human_time(t.bubble_seconds)}"] if t.bubble_seconds else []
    return [p + ("," if i < len(parts) - 1 else "") for i, p in enumerate(parts)]


ENGINE_WORDS = {"torch": "eager PyTorch", "onnxruntime": "ONNX Runtime",
                "torch.compile": "torch.compile's kernels"}
