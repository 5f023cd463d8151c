"""Analyses of one model under several settings — a plan's candidates (analyzer/app/plan.py),
the changes ``--advise`` weighs (analyzer/app/advise.py) — each what ``analyze`` with those
settings gives: one trace per distinct load (the first kept, and the last: the settings come
grouped by their load), and over one traced graph the passes' layout-free results shared
(analyzer/app/pipeline.py ``PassMemo``); a pipeline's programs, every one traced, kept
(analyzer/app/pipeline_stages.py ``StageTraces``)."""
from __future__ import annotations

import functools
import gc
from typing import Any, Callable, Mapping, TypeVar

from ..load.loading import load
from ..load.options import LoadOptions
from ..load.progress import Progress
from .pipeline import PassMemo, run_passes
from .pipeline_stages import StageTraces, run_pipeline
from .report import Report
from .request import build_request

F = TypeVar("F", bound=Callable[..., Any])


def collecting_less(search: F) -> F:
    """``search`` run with Python's cyclic collector called less often (each generation's
    threshold raised, put back after): a search's replays allocate millions of short-lived
    objects beside the traced graphs, and each full collection walks those graphs again.
    Cycles are still collected (the allocator replay's linked blocks are some). Measured: a 70B
    plan on 64 GPUs spent 6.8 s of 36 in 25 full collections, 1.1 s in none."""
    @functools.wraps(search)
    def run(*args, **kwargs):
        old = gc.get_threshold()
        gc.set_threshold(20_000, 20, 20)
        try:
            return search(*args, **kwargs)
        finally:
            gc.set_threshold(*old)
    return run  # type: ignore[return-value]


class SettingsAnalyses:
    """``analyses(kwargs)``: the report of ``analyze(model, **kwargs)``."""

    def __init__(self, model, progress: Progress | None = None) -> None:
        self.model, self.progress = model, progress
        self.traced: list[tuple[LoadOptions, Any, PassMemo]] = []   # (load, graph, memo)
        self.stages = StageTraces(model, progress=progress)   # (pipelines' programs)

    def __call__(self, kwargs: Mapping[str, Any]) -> Report:
        request = build_request(**kwargs)
        spec = request.passes.parallel
        if spec is not None and spec.pp > 1:
            return run_pipeline(self.model, request, spec, progress=self.progress,
                                traces=self.stages)
        found = next((t for t in self.traced if t[0] == request.load), None)
        if found is None:
            graph = load(self.model, request.load, progress=self.progress).graph
            found = (request.load, graph, PassMemo())
            self.traced = [*self.traced[:1], found]
        return run_passes(found[1], request.passes, memo=found[2])


def step_samples(report: Report) -> int:
    """The sequences (samples) a step takes over every data-parallel rank."""
    p, pipe = report.parallel, report.pipeline
    if pipe is not None:   # (each data rank's pipeline takes its batch)
        return pipe.per_rank_batch * pipe.mesh.get("dp_shard", 1) * \
            pipe.mesh.get("dp_replicate", 1)
    return p.global_batch if p is not None else report.batch
