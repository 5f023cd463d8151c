"""The summary's device lines (analyzer/render/summary.py): the device and the roofline's
bound, then, last in the view, what the run needs on the device part by part and the
verdict (passes/device/fits.py's Fit)."""
from __future__ import annotations

from ..app.report import Report
from ..app.units import human_bytes, human_time


def fit_words(f) -> list[str]:
    """The one fits sentence (passes/device/fits.py's Fit): the answer, needs against offers with the
    margin, then the parts it adds up (the HTML report's; the text splits it: fit_entries)."""
    return _verdict(f) + ["=", _parts(f)]


def verdict_words(f) -> tuple[str, str]:
    """The answer ("yes", "NO", or a fit that needs the allocator to empty its cache said so
    where the answer is) and what is left: the margin, but for a flushing fit, whose cache
    grows to what the device leaves it before each flush (no room to spare)."""
    if f.fits and f.flushes:
        return "yes, flushing the allocator's cache", "the cache held under it"
    return "yes" if f.fits else "NO", \
        f"{human_bytes(abs(f.margin))} {'to spare' if f.fits else 'short'}"


def _verdict(f, per_rank: bool = False) -> list[str]:
    answer, margin = verdict_words(f)
    who = "each rank needs" if per_rank else "needs"
    return [f"{answer}: {who} {human_bytes(f.needs)} of", f"{human_bytes(f.offers)} ({margin})"]


def _parts(f) -> str:
    return " + ".join(f"{p.what} {human_bytes(p.bytes)}" for p in f.parts)


def fit_entries(r: Report, brief: bool = False) -> list[tuple[str, list[str]]]:
    """With a device, the view's last two lines: what the run needs there, part by part, and
    then the verdict on one line (a rank's under a strategy). Brief: each part without what
    its parentheses say it holds ("NCCL buffers", not "NCCL buffers (24 channels × …)")."""
    ro = r.roofline
    if ro is None:
        return []
    parts = ro.fit.parts
    return [("on device", [f"{_short(p.what) if brief else p.what} {human_bytes(p.bytes)}"
                           + (" +" if i < len(parts) - 1 else "") for i, p in enumerate(parts)]),
            ("fits", _verdict(ro.fit, per_rank=r.parallel is not None))]


def _short(what: str) -> str:
    """A fit part's name without its closing parentheses, unless they are its arithmetic
    ("tensors × (1 + 10%)")."""
    head, paren, _ = what.rpartition(" (")
    return head if paren and what.endswith(")") and not head.endswith("×") else what


def counted_per(r: Report) -> str:
    """What the report's counts are of: a training step, a pipeline's micro-batch (its counts
    are the whole model's at one), or nothing said (an inference run)."""
    return " per micro-batch" if r.pipeline else " per step" if r.training else ""


def device_entries(r: Report, brief: bool) -> list[tuple[str, list[str]]]:
    """The device, and the roofline's time (a serving review prices its phases itself)."""
    ro = r.roofline
    if ro is None:
        return []
    rate = ro.peak_flops["tf32" if ro.tf32 and ro.peak_flops.get("tf32") else "fp32"] or 0
    out = [("device", [f"{ro.label}:", f"{rate / 1e12:.1f} TFLOP/s {'tf32' if ro.tf32 else 'fp32'}",
                       f"{ro.bandwidth / 1e9:,.0f} GB/s", human_bytes(ro.memory_bytes)])]
    if r.serving is None and not (brief and r.time is not None):   # (the time line has it)
        out.append(("roofline", [f"{human_time(ro.total_seconds)} lower bound{counted_per(r)}",
                                 f"(compute-bound nodes {human_time(ro.compute_seconds)},",
                                 f"memory-bound {human_time(ro.memory_seconds)});"]
                    + (["not a benchmark"] if brief else
                       ["max(FLOPs/peak, bytes/bandwidth) per node — not a benchmark"])))
    if ro.fallbacks:
        out.append(("", [f"no fast path for {', '.join(ro.fallbacks)} on {ro.device}:",
                         "those nodes use the fp32 rate"]))
    return out
