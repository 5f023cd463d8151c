"""A pipeline-parallel analysis (``--parallel pp=N``): the whole model traced at the
micro-batch for the report's counts, then each distinct stage program traced and laid out by
the schedule (passes/parallel/pipeline.py) into the report's ``pipeline`` section."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from ...passes.device.time_estimate import TimeEstimate
from ...passes.errors import GraphcostError, opt
from ...passes.parallel.pipeline import (
    StageStep,
    check_schedule,
    pipeline_memory,
    stage_layers,
    stage_step,
)
from ...passes.parallel.step import ParallelSpec
from ...passes.parallel.step_time import RankStep, pipeline_step_time
from ..load.loading import load, resolve_model
from ..load.progress import Progress
from ..load.rank_program import pipeline_blocks
from .pipeline import NO_COMM, NO_PARALLEL_TIME, refit, run_passes, step_work, with_run
from .report import Report
from .request import Request


def run_pipeline(model, request: Request, spec: ParallelSpec,
                 example_inputs: Sequence[Any] | None = None,
                 progress: Progress | None = None) -> Report:
    """The report of ``request`` with ``spec``'s pipeline stages."""
    batch = request.load.batch or 1
    micro = spec.microbatches or batch
    if batch % micro:
        raise GraphcostError(f"{opt('parallel.microbatches', value=micro)}: the batch "
                             f"({batch}) must divide into that many micro-batches")
    check_schedule(spec.schedule, micro, spec.pp)   # (before any trace)
    at_micro = replace(request.load, batch=batch // micro)
    passes = replace(request.passes, parallel=None, profile=None)
    whole = load(model, at_micro, example_inputs, progress).graph
    report = run_passes(whole, passes)
    if request.passes.profile is not None:   # (a calibrated profile: no collectives)
        report = replace(report, warnings=(*report.warnings, NO_PARALLEL_TIME))
    report = replace(report, time=None)   # (one micro-batch's kernels are not the step)
    stage_passes = replace(passes, what_if=False, include_inputs=False)
    n_layers = pipeline_blocks(resolve_model(model, at_micro, example_inputs))
    traced: dict[tuple, StageStep] = {}
    clocks: dict[tuple, TimeEstimate] = {}
    steps = []
    for i in range(spec.pp):
        blocks = stage_layers(n_layers, i, spec.pp)
        key = (i == 0, i == spec.pp - 1, len(blocks))
        if key not in traced:   # one trace per distinct stage program
            if progress:
                progress(f"tracing pipeline stage {i + 1} of {spec.pp}")
            graph = load(model, replace(at_micro, pipeline_stage=(i, spec.pp)),
                         example_inputs, progress).graph
            stage = run_passes(graph, stage_passes)
            assert stage.training is not None  # (a training request)
            traced[key] = stage_step(graph, stage.training, i == 0, i == spec.pp - 1)
            if stage.time is not None:
                clocks[key] = stage.time
        steps.append((traced[key], (blocks.start, blocks.stop)))
    report = replace(report, pipeline=pipeline_memory(steps, spec.schedule, micro,
                                                      batch // micro))
    if clocks and request.passes.profile is None:
        report = replace(report, time=with_run(_pipeline_time(
            report, list(clocks.values()), spec, micro, request), request.passes))
    return refit(report, request.passes)   # the worst stage decides it


def _pipeline_time(whole: Report, stages: list[TimeEstimate], spec: ParallelSpec,
                   micro: int, request: Request) -> TimeEstimate:
    """The step's time from each distinct stage's for one micro-batch: ``whole`` is the
    whole model at the micro-batch (its FLOPs, ``micro`` of them a step, over ``spec.pp``
    GPUs)."""
    seq = whole.dims.get("seq")
    flops, recompute, peak = step_work(whole, request.passes.device)
    batch = request.load.batch or 1
    rank = RankStep(NO_COMM, {"pp": spec.pp}, spec.strategy, batch * seq if seq else None,
                    spec.pp, flops * micro // spec.pp, recompute * micro // spec.pp, peak)
    return pipeline_step_time(stages, micro, rank)

