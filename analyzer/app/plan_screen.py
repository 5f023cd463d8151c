"""A plan's screen (analyzer/app/plan.py): the candidates that run a rank program analyzed
already, scaled from that analysis; those the scaled figures prove over the device are not
analyzed.

A rank's program — what its kernels compute — is its trace (the tensor-parallel size and the
batch) under a checkpoint plan. Layouts of one program differ only in how the data ranks
split into fully_shard's shard groups and HSDP's replicas, and that changes two things of the
rank, both scaled here from the analysis of the program under FSDP over every data rank (the
anchor, which the search meets first):

- **its tensors**: the sharded state (parameter and gradient shards, the optimizer's state
  and its step's temporaries, each 1/shard of the model's) grows by ``k`` = the anchor's
  shard group over the candidate's; at each moment the anchor's figures name (its peak, its
  optimizer step, its first step's peak: ``detail_at_*``) the rank then holds the anchor's
  bytes plus (k − 1) × that moment's state, and its peak is the largest: the analysis's own
  figure where the peak stays at one of those moments, less where it moves to another (never
  more, but for fully_shard's padding: ``_padding``);
- **its time**: the same kernels and recompute; the optimizer step over k times the shards
  (its launches as many); the shard group's all-gathers and reduce-scatters over its own ring
  ((n − 1)/n of the same buffers, on the link its group spans), and HSDP's all-reduce of each
  gradient shard across the replicas (passes/parallel/comm.py ``across_replicas``), on the
  step's clock as the analysis places them (passes/parallel/step_time.py).

What the caching allocator reserves for those tensors has no such scaling: the anchor's
reserved bytes grown by the tensors' growth fell 0.5–16% short of the analyses of a 70B's HSDP
layouts (docs/plan.md), the step's larger shards finding fewer cached blocks to reuse. So the screen
decides one thing only: a candidate whose scaled tensors with the runtime's share (at least
what it needs: reserved bytes cover the tensors) exceed the device is over, and is not
analyzed; its needs are the anchor's grown by its tensors' growth, labelled an estimate (so
too its time), its bound ``needs_at_least``; it ranks after the analyzed candidates over the
device, and a plan's table leaves it out (analyzer/render/plan.py: the rows shown are
analyses). A DDP layout of the program is not a scaling of it (whole parameters, DDP's
buckets, no gathered units), but it holds whole what the anchor's rank holds a shard of at its
optimizer step: where that state alone is over the device, so is the layout, screened with
that bound and no estimate (``replicated_candidate``). Every other candidate is analyzed. Not
screened: pipelines, expert or context parallelism, an anchor that flushes the allocator's
cache.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

from ...passes.device.fits import Fit
from ...passes.device.time_estimate import TimeEstimate, optimizer_launch_seconds
from ...passes.errors import GraphcostError
from ...passes.parallel.comm import CommVolume, across_replicas
from ...passes.parallel.step import ParallelMemory
from ...passes.parallel.step_time import rank_step_time
from ...passes.training.precision import master_weights
from ..load.progress import Progress, Step
from .devices import node_links
from .pipeline import engine_of, rank_step
from .plan_candidates import Candidate, candidate
from .plan_settings import Settings
from .report import Report
from .request import PassOptions, build_request
from .settings_analyses import SettingsAnalyses, step_samples

# the rank's sharded state: what grows as its shard group shrinks (passes/parallel/clock.py)
STATE = ("sharded_params", "sharded_grads", "optimizer_state", "step_temporaries")


@dataclass(frozen=True)
class Screened:
    """A candidate's figures scaled from its program's anchor (``anchor``: its words)."""
    needs_bytes: int
    allocated_bytes: int
    time: TimeEstimate
    anchor: str


def program_of(s: Settings) -> tuple | None:
    """The rank program ``s`` runs, where the screen scales its layouts: fully sharded ones
    (None: not screened)."""
    return _program(s) if (s.mesh.size("dp_shard") or 1) > 1 else None


def replicated_of(s: Settings) -> tuple | None:
    """The program a DDP layout's rank runs (its data ranks replicated, tp beside it), whose
    FSDP layout's analysis bounds what it holds (None: not DDP)."""
    if (s.mesh.size("dp_shard") or 1) > 1 or (s.mesh.size("dp_replicate") or 1) < 2:
        return None
    return _program(s)


def _program(s: Settings) -> tuple | None:
    """What a layout's rank computes — its trace (tp size, batch) and checkpoint plan — where
    only its data ranks set it apart (None: pipelines, expert and context parallelism run
    other programs). A mesh's size is 1 where it has no such dimension."""
    if s.pp > 1 or s.ep > 1 or s.cp > 1:
        return None
    return (s.tp, s.batch, s.checkpoint, s.schedule)


@dataclass(frozen=True)
class Anchor:
    """A program's analysis under FSDP over every data rank: its settings, the report (with a
    rank, a fit and a time) and the options it was analyzed with."""
    settings: Settings
    report: Report
    options: PassOptions

    @property
    def parallel(self) -> ParallelMemory:
        assert self.report.parallel is not None
        return self.report.parallel

    @property
    def fit(self) -> Fit:
        assert self.report.roofline is not None and self.report.roofline.fit is not None
        return self.report.roofline.fit

    @property
    def runtime_bytes(self) -> int:
        """What the rank needs of the device beyond what it reserves (the runtime's share)."""
        return self.fit.needs - self.parallel.reserved_peak_bytes


def anchor_of(s: Settings, report: Report, options: PassOptions) -> Anchor | None:
    """``report`` (the analysis of ``s``) as its program's anchor, where it can be one: FSDP
    over every data rank, with a fit and a time, its replay not flushing the cache."""
    p, fit = report.parallel, report.roofline and report.roofline.fit
    if program_of(s) is None or (s.mesh.size("dp_replicate") or 1) > 1:
        return None
    if p is None or fit is None or report.time is None or p.flushing is not None:
        return None
    return Anchor(s, report, options)


def screen(anchor: Anchor, s: Settings, options: PassOptions) -> Screened:
    """``s``'s figures scaled from ``anchor`` (the same program: ``program_of``)."""
    p, estimate = anchor.parallel, anchor.report.time
    assert estimate is not None
    shard = s.mesh.size("dp_shard") or 1
    k = p.mesh["dp_shard"] / shard
    allocated = scaled_peak(p, k)
    needs = anchor.fit.needs + allocated - p.per_rank_peak_bytes
    comm = scaled_comm(p, shard, s.mesh.size("dp_replicate") or 1,
                       master=master_weights(options.precision))
    rank = replace(rank_step(anchor.report, anchor.options), comm=comm, mesh=dict(s.mesh.dims))
    assert options.device is not None and options.parallel is not None
    links = node_links(options.device, options.parallel.interconnect,
                       options.parallel.gpus_per_node)
    step = rank_step_time(_kernels(estimate, k, _launches(p, options)), rank, links)
    return Screened(needs, allocated, step, anchor.settings.words)


def scaled_peak(p: ParallelMemory, k: float) -> int:
    """The rank's tensors at their peak with ``k`` times the anchor's sharded state: the
    largest of the moments the anchor's figures name, each with its state grown."""
    moments: list[tuple[int, Mapping[str, int]]] = [
        (p.per_rank_peak_bytes, p.detail_at_peak),
        (sum(p.detail_at_step.values()), p.detail_at_step),
        (p.first_step_peak_bytes, p.first_step_detail)]
    return max(round(total + (k - 1) * sum(d.get(name, 0) for name in STATE))
               for total, d in moments)


def scaled_comm(p: ParallelMemory, shard: int, replicas: int, master: bool) -> CommVolume:
    """The anchor's collectives with its shard group's ring of ``shard`` ranks, and HSDP's
    all-reduce of the gradient shards across ``replicas``."""
    comm = p.comm
    n = p.mesh["dp_shard"]
    wire = comm.by_dim.get("dp_shard", 0)
    grown = round(wire * (shard - 1) / shard * n / (n - 1)) if n > 1 else 0
    total = comm.wire_bytes - wire + grown
    by_dim = {d: w for d, w in comm.by_dim.items() if d != "dp_shard"}
    if grown:
        by_dim["dp_shard"] = grown
    calls = dict(comm.calls_by_dim)
    if not grown:
        calls.pop("dp_shard", None)
    comm = replace(comm, wire_bytes=total, by_dim=by_dim, calls_by_dim=calls,
                   seconds=total / comm.bandwidth if comm.bandwidth else None)
    grads = (2 if master else 1) * sum(u.grad_padded_bytes // shard for u in p.units)
    return across_replicas(comm, replicas, grads, sum(1 for u in p.units if u.grad_padded_bytes))


# the sharded state a padded byte of a unit can grow (a half weight under a master recipe: its
# fp32 shard 2, its fp32 gradient 2, AdamW's two fp32 moments 4, a foreach step's temporaries)
STATE_PER_BYTE = 12


def _padding(p: ParallelMemory, shard: int) -> int:
    """What the scaled shards may hold beyond the candidate's own: fully_shard pads each
    tensor's rows to a multiple of its group, and the anchor's padding (a larger group's)
    scaled by ``k`` exceeds the candidate's by at most that padding over ``shard``."""
    return STATE_PER_BYTE * sum(u.padded_bytes - u.param_bytes for u in p.units) // shard


def _launches(p: ParallelMemory, o: PassOptions) -> float:
    """The optimizer step's seconds that its tensors' sizes do not change (their Python and
    launches: passes/device/time_estimate.py), over the units' parameter tensors."""
    _, _, engine = engine_of(o, "fx")   # (a plan's programs are traced PyTorch models)
    return engine.scale * optimizer_launch_seconds(engine, o.optimizer,
                                                   sum(u.params for u in p.units))


def _kernels(t: TimeEstimate, k: float, launches: float) -> TimeEstimate:
    """The anchor's kernels (its step less its exposed collectives), its optimizer step over
    ``k`` times the shards (``launches``: the part of it that does not grow)."""
    fixed = min(launches, t.optimizer_seconds)
    optimizer = fixed + (t.optimizer_seconds - fixed) * k
    return replace(t, seconds=t.seconds - t.communication_seconds - t.optimizer_seconds
                   + optimizer, optimizer_seconds=optimizer, communication_seconds=0.0,
                   overlapped_seconds=0.0)


def screened_candidate(s: Settings, anchor: Anchor, options: PassOptions) -> Candidate | None:
    """``s``'s candidate scaled from ``anchor`` where its tensors alone prove it over the
    device (None: it may fit, and is analyzed)."""
    f = screen(anchor, s, options)
    # (less what the anchor's padding may add to the scaled shards)
    at_least = f.allocated_bytes + anchor.runtime_bytes \
        - _padding(anchor.parallel, s.mesh.size("dp_shard") or 1)
    if at_least <= anchor.fit.offers:
        return None
    return Candidate(s, "over", f"screened: scaled from {f.anchor} (an estimate)", None,
                     f.needs_bytes, anchor.fit.offers, f.allocated_bytes, f.time,
                     step_samples(anchor.report), needs_at_least=at_least, screened=f.anchor)


# what a DDP rank holds whole at its optimizer step, of which an FSDP rank holds a shard
WHOLE = ("sharded_params", "sharded_grads", "optimizer_state")


def replicated_candidate(s: Settings, anchor: Anchor) -> Candidate | None:
    """A DDP layout of ``anchor``'s program where the state it holds whole at its optimizer
    step — every parameter, gradient and optimizer state, ``dp_shard`` times what the anchor's
    rank holds of them then, less its padding — with the runtime's share proves it over the
    device (None: it may fit, and is analyzed). No estimate of its figures: its rank (whole
    parameters, DDP's buckets, no gathered units) is not a scaling of FSDP's."""
    p = anchor.parallel
    whole = p.mesh["dp_shard"] * sum(p.detail_at_step.get(d, 0) for d in WHOLE)
    at_least = whole - _padding(p, 1) + anchor.runtime_bytes
    if at_least <= anchor.fit.offers:
        return None
    return Candidate(s, "over", "screened: its whole parameters, gradients and optimizer "
                                f"state (by the analysis of {anchor.settings.words}) are over "
                                "the device", None, None, anchor.fit.offers,
                     samples=step_samples(anchor.report), needs_at_least=at_least,
                     screened=anchor.settings.words)


class ScreeningAnalyses:
    """A plan's settings evaluated (analyzer/app/plan.py): ``exact(s)`` analyzes ``s`` (the
    first analysis of each program that can be one is its anchor); ``s`` called screens it
    from its program's anchor where there is one and it proves ``s`` over, else analyzes it.
    ``screened`` and ``screen_seconds`` count the screen's candidates and the time they took.
    ``progress`` hears each setting, one of ``total``."""

    def __init__(self, analyses: SettingsAnalyses, base: Mapping[str, Any],
                 extra: Mapping[str, Any], progress: Progress | None, total: int) -> None:
        self.analyses, self.base, self.extra = analyses, base, extra
        self.progress, self.total, self.done = progress, total, 0
        self.anchors: dict[tuple, Anchor] = {}
        self.screened, self.screen_seconds = 0, 0.0

    def __call__(self, s: Settings) -> Candidate:
        self.done += 1
        key = program_of(s)
        anchor = self.anchors.get(key or replicated_of(s) or ())
        if anchor is not None:
            start = time.perf_counter()
            c = screened_candidate(s, anchor, self._options(s)) if key \
                else replicated_candidate(s, anchor)
            self.screen_seconds += time.perf_counter() - start
            if c is not None:
                self.screened += 1
                self._say(f"screening {s.words}")
                return c
        self._say(f"analyzing {s.words}")
        return self.exact(s)

    def exact(self, s: Settings) -> Candidate:
        try:
            report = self.analyses(self._kwargs(s))
        except GraphcostError as exc:
            return Candidate(s, "refused", error=exc)
        key = program_of(s)
        if key is not None and key not in self.anchors:
            anchor = anchor_of(s, report, self._options(s))
            if anchor is not None:
                self.anchors[key] = anchor
        return candidate(s, report)

    def _kwargs(self, s: Settings) -> dict:
        return {**self.base, **s.analyze_kwargs(self.extra)}

    def _options(self, s: Settings) -> PassOptions:
        return build_request(**self._kwargs(s)).passes

    def _say(self, what: str) -> None:
        if self.progress:
            self.progress(Step(min(self.done, self.total), self.total, what))
