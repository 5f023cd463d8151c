"""A plan's candidate (analyzer/app/plan.py): a setting and what its analysis — or the screen
that scaled it from an analysis (analyzer/app/plan_screen.py) — said of it, and the order a
plan ranks candidates in."""
from __future__ import annotations

from dataclasses import dataclass

from ...passes.device.time_estimate import TimeEstimate
from ...passes.errors import GraphcostError
from .plan_settings import Settings
from .report import Report
from .settings_analyses import step_samples


@dataclass(frozen=True)
class Candidate:
    """A setting and what its analysis said: ``status`` fits | over (the device's memory) |
    pruned (not analyzed: ``detail`` says why it cannot win) | refused (``error``: what the
    analysis said). ``screened``: its figures are scaled from the analysis of another layout
    of its rank program (that layout's words), an estimate; "" where analyzed."""
    settings: Settings
    status: str
    detail: str = ""
    error: GraphcostError | None = None
    needs_bytes: int | None = None      # the fit's: reserved peak + the runtime's share
    offers_bytes: int | None = None
    allocated_bytes: int | None = None  # the tensors at the peak (the report's peak_bytes)
    time: TimeEstimate | None = None
    samples: int = 0                    # sequences (samples) a step, over every data rank
    # a pruned one's bounds, where what pruned it proves one: the memory it needs at least (a
    # plan that holds less needs that), the step's seconds at least (one with less recompute)
    needs_at_least: int | None = None
    seconds_at_least: float | None = None
    # the allocator's cache flushes its fit counts on (passes/device/fits.py Flushing)
    flushes: int = 0
    screened: str = ""

    @property
    def samples_per_second(self) -> float | None:
        t = self.time
        return self.samples / t.seconds if t is not None and t.seconds > 0 else None


def candidate(s: Settings, report: Report) -> Candidate:
    """The candidate ``report`` (the analysis of ``s``) makes."""
    fit = report.roofline.fit if report.roofline is not None else None
    status = "fits" if fit is not None and fit.fits else "over"
    return Candidate(s, status, "", None, fit and fit.needs, fit and fit.offers,
                     report.peak_bytes, report.time, step_samples(report),
                     flushes=fit.flushes if fit is not None else 0)


def rank_of(c: Candidate) -> tuple:
    """A plan's order: the fitting by throughput (as fast: fewer cache flushes, then less
    memory), then those over the device by what they need (the analyzed, then the screened,
    whose needs are estimates), then the pruned and refused."""
    order = ("fits", "over", "pruned", "refused").index(c.status)
    rate = c.samples_per_second or 0.0
    return (order, bool(c.screened), -rate if c.status == "fits" else (c.needs_bytes or 0),
            c.flushes, c.needs_bytes or 0)
