"""Memory and FLOPs as functions of the batch size, and the largest batch that fits a device.

Every figure comes from a full analysis at that batch (the passes are re-run; nothing is
extrapolated without being checked, but for the labelled estimate of a graph that grows with
the batch, ``estimate_max_batch``). Memory is affine in the batch as long as the peak stays at
the same place in the schedule: tensors(b) = fixed + per_sample·b, fitted at b = 1 and 2 (or,
when the peak sits where the batch does not reach, as in a small model's optimizer step, at
b = 1 and the first power of two where memory grows) and checked at a third batch; the search
for the largest batch then confirms its answer b* by analyzing b* (fits) and b*+1 (does not),
and falls back to a bisection whenever the fit is off.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...passes.errors import GraphcostError, opt
from .report import Report

Analyze = Callable[[int], Report]   # batch -> report (with a device: report.roofline is set)


@dataclass(frozen=True)
class Affine:
    fixed: float
    per_sample: float

    def __call__(self, b: int) -> float:
        return self.fixed + self.per_sample * b


@dataclass(frozen=True)
class BatchFit:
    memory: Affine               # required bytes (tensors + overhead) on the device
    flops: Affine
    check_batch: int             # the third batch the fit was checked at
    memory_error: float          # (fit − analysis) / analysis at check_batch
    flops_error: float
    fit_batch: int = 2           # the memory fit's second batch
    fit_from: int = 1            # the memory fit's first batch


@dataclass(frozen=True)
class MaxBatch:
    device: str
    memory_bytes: int
    batch: int                   # 0: not even batch 1 fits
    required_bytes: int          # at ``batch`` (at batch 1 when nothing fits)
    next_required_bytes: int     # at batch + 1
    fit: BatchFit
    analyses: int                # how many full analyses the answer took
    train: bool
    traces: int | None = None    # how many model traces they took (None: one per analysis)
    traced_at: int | None = None  # the one trace's marker batch (fake_rerun.py), if one
    parallel: str = ""           # "fsdp over 8 ranks": memory and batch are one rank's
    checkpoint: str = ""         # the checkpoint plan's mode the memory is of ("sqrt", …)
    grows: tuple[int, int] | None = None  # estimated: graph nodes at batch 2 and 3 (below)

    @property
    def at_limit(self) -> bool:
        """The search stopped at its limit with batch + 1 still fitting: a lower bound."""
        return self.batch > 0 and self.next_required_bytes <= self.memory_bytes

    def to_dict(self) -> dict:
        f = self.fit
        return {"device": self.device, "memory_bytes": self.memory_bytes,
                "max_batch": self.batch, "required_bytes": self.required_bytes,
                "next_required_bytes": self.next_required_bytes, "at_limit": self.at_limit,
                "train": self.train,
                "analyses": self.analyses, "traces": self.traces,
                "traced_at": self.traced_at, "estimated": self.grows is not None,
                "graph_nodes_at_2_and_3": list(self.grows) if self.grows else None,
                "parallel": self.parallel or None, "checkpoint": self.checkpoint or None,
                "fit": {"memory_fixed_bytes": f.memory.fixed,
                        "memory_per_sample_bytes": f.memory.per_sample,
                        "flops_fixed": f.flops.fixed, "flops_per_sample": f.flops.per_sample,
                        "check_batch": f.check_batch,
                        "fit_batches": [f.fit_from, f.fit_batch],
                        "memory_error": round(f.memory_error, 6),
                        "flops_error": round(f.flops_error, 6)}}


def required_bytes(r: Report) -> int:
    """What the run needs on the device: the report's one fits answer (passes/device/fits.py; a
    training step with a checkpoint plan as the plan runs it, one data-parallel rank as its
    strategy runs it)."""
    if r.roofline is None:
        raise GraphcostError(f"{opt('max_batch')} needs a device: {opt('device', value='NAME')} or {opt('device_spec')}")
    return r.roofline.fit.needs


def _plan(r: Report):
    """The step's checkpoint plan, if any (the tests' stand-in reports have no training)."""
    return r.training.checkpoint if r.training is not None else None


def _growing(mem: Affine) -> Affine:
    if mem.per_sample <= 0:
        raise GraphcostError("memory does not grow with the batch: is the batch dim bound? "
                             f"({opt('max_batch')} binds axis 0 of the inputs)")
    return mem


def _fit(mem: Affine, flops: Affine, check: int, rc: Report, fit_from: int,
         fit_batch: int) -> BatchFit:
    """The fits with their errors against the analysis ``rc`` at batch ``check``."""
    return BatchFit(mem, flops, check, (mem(check) - required_bytes(rc)) / required_bytes(rc),
                    (flops(check) - _flops(rc)) / max(1, _flops(rc)), fit_batch, fit_from)


def _labels(r: Report) -> dict:
    """What the batch's memory is of: a training step, one rank's, under a plan."""
    p = getattr(r, "parallel", None)
    plan = _plan(r)
    return {"train": r.training is not None,
            "parallel": f"{p.layout} over {p.world_size:,} ranks" if p else "",
            "checkpoint": plan.mode if plan is not None else ""}


def _flops(r: Report) -> int:
    return r.totals.flops


def _affine(b1: int, y1: float, b2: int, y2: float) -> Affine:
    if isinstance(y1, int) and isinstance(y2, int) and max(abs(y1), abs(y2)) > 2 ** 1000:
        k = (y2 - y1) // (b2 - b1)  # FLOPs past a float (nested loops, labelled absurd)
    else:
        k = (y2 - y1) / (b2 - b1)
    return Affine(y1 - k * b1, k)


def max_batch(analyze_at: Analyze, *, limit: int = 1 << 20) -> MaxBatch:
    cache: dict[int, Report] = {}

    def at(b: int) -> Report:
        if b not in cache:
            cache[b] = analyze_at(b)
        return cache[b]

    r1, r2 = at(1), at(2)
    assert r1.roofline is not None  # analyzed with a device: its memory is the capacity
    capacity = r1.roofline.fit.offers
    fits = lambda b: required_bytes(at(b)) <= capacity  # noqa: E731
    second = 2  # the peak may sit where the batch does not reach (a small model's optimizer
    while required_bytes(at(second)) <= required_bytes(r1) and fits(second) and second < limit:
        second *= 2  # step at small batches): fit where memory grows
    mem = _growing(_affine(1, required_bytes(r1), second, required_bytes(at(second))))
    flops = _affine(1, _flops(r1), 2, _flops(r2))
    if not fits(1):
        best = 0
    else:
        # Bracket the answer (lo fits, hi does not) and guess inside it by interpolating the
        # two nearest analyses (regula falsi: exact in one step while memory is affine, and
        # memory is piecewise affine in the batch, so few steps follow).
        lo, hi = 1, None
        guess = int((capacity - mem.fixed) // mem.per_sample)
        while hi is None or hi - lo > 1:
            guess = max(lo + 1, guess if hi is None else min(guess, hi - 1))
            guess = min(guess, limit)
            if guess <= lo:        # at the limit
                hi = lo + 1
                break
            if fits(guess):
                lo = guess
                if hi is None and not fits(guess + 1):
                    hi = guess + 1
            else:
                hi = guess
            if hi is None:         # everything tried fits: aim twice as far
                guess = lo * 2
                continue
            y_lo, y_hi = required_bytes(at(lo)), required_bytes(at(hi))
            step = (y_hi - y_lo) / (hi - lo)
            guess = lo + int((capacity - y_lo) // step) if step > 0 else (lo + hi) // 2
            if not lo < guess < hi:
                guess = (lo + hi) // 2
        best = lo
    check = best if best > 2 else 4
    fit = _fit(mem, flops, check, at(check), 1, second)
    return MaxBatch(r1.roofline.device, capacity, best, required_bytes(at(max(best, 1))),
                    required_bytes(at(best + 1)), fit, len(cache), **_labels(r1))


ESTIMATE_AT = (1, 2, 4, 8)  # the batches a growing graph is analyzed at


def estimate_max_batch(analyze_at: Analyze, grows: tuple[int, int]) -> MaxBatch:
    """The largest batch for a model whose graph grows with the batch (a Python loop over its
    samples, as a detector's post-processing: ``grows`` = its node counts at batches 2 and 3),
    where every trace costs more per sample (a tiny detector: 6 s at batch 2, 94 s at 64) and
    the search would trace thousands of copies. ESTIMATED: memory and FLOPs are fitted through
    the two largest of ESTIMATE_AT (the peak moves away from the weights as the batch grows)
    and extrapolated; the fit's error at the smallest is reported."""
    reports = {b: analyze_at(b) for b in ESTIMATE_AT}
    lo, hi = ESTIMATE_AT[-2], ESTIMATE_AT[-1]
    mem = _growing(_affine(lo, required_bytes(reports[lo]), hi, required_bytes(reports[hi])))
    flops = _affine(lo, _flops(reports[lo]), hi, _flops(reports[hi]))
    r1 = reports[1]
    assert r1.roofline is not None  # analyzed with a device: its memory is the capacity
    capacity = r1.roofline.fit.offers
    fitting = [b for b in ESTIMATE_AT if required_bytes(reports[b]) <= capacity]
    best = max(fitting[-1] if fitting else 0, int((capacity - mem.fixed) // mem.per_sample))
    if len(fitting) < len(ESTIMATE_AT):  # the answer is among the analyzed batches
        best = next(b for b in ESTIMATE_AT if required_bytes(reports[b]) > capacity) - 1 \
            if fitting else 0
        while best > 0 and best not in reports and mem(best) > capacity:
            best -= 1
    check = ESTIMATE_AT[0]
    fit = _fit(mem, flops, check, reports[check], lo, hi)

    def need(b: int) -> int:
        return required_bytes(reports[b]) if b in reports else int(mem(b))
    return MaxBatch(r1.roofline.device, capacity, best, need(max(best, 1)), need(best + 1),
                    fit, len(reports), grows=grows, **_labels(r1))
