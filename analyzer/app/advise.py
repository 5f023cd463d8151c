"""``--advise``: what saves most on one training analysis — each single change of its
settings a user can make (the checkpoint plan, the tensor-parallel size at the same GPUs, a
pipeline's other schedules, the caching allocator's expandable segments, torch.compile, half
the batch, the optimizer's for-loop step) analyzed as ``analyze`` would with it, and the three that most reduce the
memory (when the step does not fit) or raise the throughput (when it does), each with its
effect on the other.

The analyses share traces and passes as a plan's do (analyzer/app/settings_analyses.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...passes.errors import GraphcostError, opt
from ...passes.parallel.mesh import parse_mesh
from ...passes.parallel.schedules import Schedule, interleaved
from ..load.progress import Progress
from .plan_settings import CHECKPOINTS
from .report import Report
from .settings_analyses import SettingsAnalyses, collecting_less, step_samples


@dataclass(frozen=True)
class Outcome:
    """One analysis's answers to the two questions: the memory the fit needs (and offers)
    and the throughput (sequences a second over all the GPUs; tokens/s per GPU beside), an
    estimate within ± ``band``."""
    needs: int
    offers: int
    samples_per_second: float
    tokens_per_second: float | None
    band: float | None

    @property
    def fits(self) -> bool:
        return self.needs <= self.offers


@dataclass(frozen=True)
class Change:
    """A change of the settings (``words``: as the command line says it), its analysis."""
    words: str
    kwargs: Mapping[str, Any]
    outcome: Outcome | None = None     # None: refused (``error``)
    error: str = ""


@dataclass(frozen=True)
class Advice:
    now: Outcome
    best: tuple[Change, ...]       # at most three, the most useful first
    tried: tuple[Change, ...]      # every change analyzed


@collecting_less
def advise(model, kwargs: Mapping[str, Any], progress: Progress | None = None) -> Advice:
    """The advice for the analysis ``analyze(model, **kwargs)`` (a training step on a GPU
    device)."""
    if not kwargs.get("train") or kwargs.get("device") is None:
        raise GraphcostError(f"{opt('advise')} weighs changes of a training step by its "
                             f"memory and time: add {opt('train')} and a GPU {opt('device')}")
    analyses = SettingsAnalyses(model, progress)
    now = outcome(analyses(kwargs))   # (refused: its own error, as the analysis alone says)
    tried = []
    for words, change in changes(kwargs):
        if progress:
            progress(f"analyzing {len(tried) + 1}: {words}")
        try:
            tried.append(Change(words, change, outcome(analyses({**kwargs, **change}))))
        except GraphcostError as exc:
            tried.append(Change(words, change, None, str(exc)))
    return Advice(now, _best(now, tried), tuple(tried))


def changes(kwargs: Mapping[str, Any]) -> list[tuple[str, dict]]:
    """The single changes of ``kwargs`` tried, each as (its words, the options marked for
    each face to spell: passes/errors.py ``opt``; analyze's arguments)."""
    out: list[tuple[str, dict]] = []
    current = kwargs.get("checkpoint")
    for name, ckpt in CHECKPOINTS.items():
        if ckpt != current:
            out.append((opt("checkpoint", value=name) if ckpt else "no checkpointing",
                        {"checkpoint": ckpt}))
    out += _tensor_parallel(kwargs)
    out += _schedules(kwargs)
    if "expandable_segments:True" not in str(kwargs.get("allocator") or ""):
        out.append((opt("allocator", value="expandable_segments:True"),
                    {"allocator": "expandable_segments:True"}))
    if not kwargs.get("compile") and kwargs.get("device_profile") is None:
        out.append((opt("compile"), {"compile": True}))
    batch = kwargs.get("batch") or 1
    if batch >= 2:
        out.append((opt("batch", value=batch // 2), {"batch": batch // 2}))
    if kwargs.get("optimizer_impl") != "forloop":
        out.append((opt("optimizer_impl", value="forloop"), {"optimizer_impl": "forloop"}))
    return out


def _tensor_parallel(kwargs: Mapping[str, Any]) -> list[tuple[str, dict]]:
    """Twice and half the tensor-parallel ranks on the same GPUs (the FSDP ranks the other
    way), for a mesh with a dp_shard dimension."""
    parallel = dict(kwargs.get("parallel") or {})
    if "mesh" not in parallel:
        return []
    mesh = parse_mesh(parallel["mesh"])
    tp, shard = mesh.size("tp") or 1, mesh.size("dp_shard") or 1
    out = []
    for new_tp, new_shard in ((tp * 2, shard // 2), (tp // 2, shard * 2)):
        if new_tp < 1 or new_shard < 1 or new_tp * new_shard != tp * shard or new_tp > 8:
            continue
        dims = {**dict(mesh.dims), "dp_shard": new_shard, "tp": new_tp}
        words = ",".join(f"{k}={n}" for k, n in dims.items() if k != "tp" or n > 1)
        out.append((opt("parallel", value=words), {"parallel": {**parallel, "mesh": words}}))
    return out


def _schedules(kwargs: Mapping[str, Any]) -> list[tuple[str, dict]]:
    """A pipeline's other schedules but GPipe (its micro-batches all in flight): 1F1B,
    interleaved 1F1B and the zero-bubble ones (two stages a rank where interleaved, unless the
    analysis gives more)."""
    parallel = dict(kwargs.get("parallel") or {})
    if "mesh" not in parallel or (parse_mesh(parallel["mesh"]).size("pp") or 1) < 2:
        return []
    now = parallel.get("schedule") or Schedule.ONE_F_ONE_B
    out = []
    for s in Schedule.words():
        if s in (now, Schedule.GPIPE):
            continue
        new = {k: v for k, v in parallel.items()
               if k != "stages_per_rank" or (interleaved(s) and s != Schedule.ZBV)}
        out.append((opt("parallel.schedule", value=s), {"parallel": {**new, "schedule": s}}))
    return out


def _best(now: Outcome, tried: list[Change], most: int = 3) -> tuple[Change, ...]:
    """The changes that most reduce the memory (first, when the step does not fit) or raise
    the throughput of a fitting step."""
    done = [(c, c.outcome) for c in tried if c.outcome is not None]
    smaller = [c for c, o in sorted(done, key=lambda d: d[1].needs) if o.needs < now.needs]
    faster = [c for c, o in sorted(done, key=lambda d: -d[1].samples_per_second)
              if o.fits and o.samples_per_second > now.samples_per_second]
    order = smaller + faster if not now.fits else faster + smaller
    out: list[Change] = []
    for c in order:
        if c not in out:
            out.append(c)
    return tuple(out[:most])


def outcome(report: Report) -> Outcome:
    """A report's memory and throughput (a GPU device's: its fit and time estimate)."""
    if report.roofline is None or report.time is None:
        raise GraphcostError(f"{opt('advise')} needs the fit and the time estimate: a GPU "
                             f"{opt('device')} and a traced PyTorch model")
    t = report.time
    return Outcome(report.roofline.fit.needs, report.roofline.fit.offers,
                   step_samples(report) / t.seconds if t.seconds > 0 else 0.0,
                   t.tokens_per_second, t.band)
