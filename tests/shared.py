"""Traces and measurements shared across test files (each is expensive; the suite takes each
once per session). Nothing here computes an expectation: these are the inputs the tests check
graphcost against."""
from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path

from graphcost.analyzer.app.api_checks import check_checkpoint
from graphcost.analyzer.app.pipeline import run_passes
from graphcost.analyzer.app.request import LoadOptions, PassOptions, cast_dtype
from graphcost.analyzer.load.loading import load_graph
from graphcost.analyzer.measure.reference import measure_training

from graphcost import models_zoo

BATCH = 2
# Image models measured at 64×64 instead of 224×224: a real training step is 12× cheaper and the
# comparisons stay as discriminating (every layer, the same schedule, a smaller image).
SIZES = {"resnet18": {"height": 64, "width": 64}, "mobilenet_v2": {"height": 64, "width": 64}}


def inputs(name: str, small: bool = True):
    """zoo:NAME's example inputs at the test sizes (BATCH, and SIZES unless ``small`` is
    False: a checkpoint plan needs activations that outweigh Adam's state)."""
    return models_zoo.example_inputs(name, batch=BATCH, **(SIZES.get(name, {}) if small else {}))


@functools.lru_cache(maxsize=None)
def joint_graph(name: str, small: bool = True, cast: str | None = None):
    """zoo:NAME's joint forward+backward graph at BATCH (traced once; the IR is immutable);
    ``cast``: traced with the module cast to that dtype, as a casting recipe runs it."""
    return load_graph(models_zoo.build_model(name, eval=False),
                      LoadOptions(train=True, cast=cast), inputs(name, small))


def train_report(name: str, optimizer: str, small: bool = True, **kw):
    """One training step's analysis of zoo:NAME from the shared joint graph (traced cast for
    a casting precision recipe, as analyze() traces it); the graph input is left out by
    default, as MemTracker leaves out what exists before the step."""
    kw.setdefault("include_inputs", False)
    if isinstance(kw.get("checkpoint"), dict):  # a plan as analyze() takes it
        kw["checkpoint"] = check_checkpoint(kw["checkpoint"], train=True)
    graph = joint_graph(name, small, cast_dtype(kw.get("precision", "fp32")))
    return run_passes(graph, PassOptions(optimizer=optimizer, **kw))


@functools.lru_cache(maxsize=None)
def measured_step(name: str, optimizer: str) -> int:
    """MemTracker's peak over the second real training step of zoo:NAME (no checkpointing)."""
    return measured_step_peak(name, optimizer)


def measured_step_peak(name: str, optimizer: str, prepare=None, small: bool = True) -> int:
    """MemTracker's peak over the second real training step (analyzer.measure.verify's measurement).
    ``prepare(model)`` may change the model first (wrap blocks in torch.utils.checkpoint)."""
    model = models_zoo.build_model(name, eval=False)
    if prepare is not None:
        prepare(model)
    return measure_training(model, inputs(name, small), optimizer)[0]


def step_flops(model, args: tuple) -> int:
    """FlopCounterMode's count over one training step's forward and backward (graphcost's
    loss: the sum of the floating outputs), the gradients dropped after."""
    from graphcost.analyzer.measure.reference import training_loss_of
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        training_loss_of(model, args, None).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


# the per-rank peaks benchmarks/accuracy_ranks.py measured on more gloo ranks than the suite
# starts
RANKS = Path(__file__).parents[1] / "benchmarks" / "results" / "parallel_ranks.json"


def recorded_peaks(case: str, mesh: str, precision: str = "fp32") -> list[tuple[int, int, int]]:
    """(step, rank, measured peak) of ``case`` in RANKS, checked to be at ``mesh``."""
    run = json.loads(RANKS.read_text(encoding="utf-8"))["cases"][case]
    assert run["mesh"] == mesh, run["mesh"]
    return [(int(step), rank, peak) for step, peaks in run["peaks"][precision].items()
            for rank, peak in enumerate(peaks)]


def recorded_stages(run) -> dict[int, list[list[int]]]:
    """Each stage's ranks' peaks in steps 1 to 4 of ``run`` (a PipelineRun) as
    benchmarks/accuracy_pipelines.py measured them on real pipelined steps."""
    from benchmarks.accuracy_pipelines import RESULTS, key

    runs = json.loads(RESULTS.read_text(encoding="utf-8"))["runs"]
    assert key(run) in runs, f"not recorded: python -m benchmarks.accuracy_pipelines ({run})"
    return {int(stage): peaks for stage, peaks in runs[key(run)].items()}


def assert_ranks_within(p, peaks, step1: float = 0.05, step2: float = 0.05,
                        late: int = 0) -> None:
    """Each (step, rank, measured peak) of ``peaks`` within the tolerance of a parallel
    report's (``p``) figure for that step: step 1 before the optimizer state exists, step 2
    after. ``late``: bytes a measured peak may hold beyond that (a buffer gloo's thread frees
    late on a loaded machine: test_parallel_reality.py)."""
    for step, rank, peak in peaks:
        mine = p.first_step_peak_bytes if step == 1 else p.per_rank_peak_bytes
        tol = step1 if step == 1 else step2
        assert (1 - tol) * (peak - late) <= mine <= (1 + tol) * peak, (step, rank, mine, peak)


def read_in_range(request, values: tuple) -> tuple:
    """``values`` as a module fixture measures or predicts them: all in the main suite; under
    --torch-range (tests/conftest.py: each test's first case) the first alone, the one its
    tests read there (live gloo steps of cases no range test reads cost each range suite
    about 40 worker-seconds)."""
    return values[:1] if request.config.getoption("--torch-range") else values


# Real steps on gloo ranks (or a fake process group), recorded: each call's cases, measured
# by analyzer/measure/parallel.py on torch 2.13, in a file of their own named for what was
# asked. A suite on that torch reads them instead of starting the ranks again (each spawn cost
# 10-45 s of a worker); another torch, or a call not recorded, measures live. Re-measure with
#     GRAPHCOST_RECORD_STEPS=1 python -m pytest tests/test_tensor_parallel.py …  (benchmarks/README.md)
STEPS = Path(__file__).parents[1] / "benchmarks" / "results" / "parallel_steps"
RECORDED_TORCH = "2.13"


def _case_key(case) -> dict:
    """A Case as its record names it: the fields not at their defaults (a field added later
    leaves the records made before it keyed as they were)."""
    import dataclasses

    fields = dataclasses.asdict(case)
    return {f.name: fields[f.name] for f in dataclasses.fields(case)
            if fields[f.name] != f.default}


def measured_steps(cases: list, world: int, **kw) -> list:
    """``measure_parallel(cases, world, **kw)``'s rows, from the record where it has them."""
    import dataclasses
    import hashlib

    import torch
    from graphcost.analyzer.measure.parallel import Case, Measured, measure_parallel

    asked = json.dumps({"cases": [_case_key(c) for c in cases], "world": world,
                        **kw}, sort_keys=True)
    path = STEPS / f"{hashlib.sha1(asked.encode()).hexdigest()[:16]}.json"
    on_record_torch = torch.__version__.startswith(RECORDED_TORCH + ".")
    if os.environ.get("GRAPHCOST_RECORD_STEPS") != "1" and on_record_torch and path.exists():
        record = json.loads(path.read_text(encoding="utf-8"))
        assert record["asked"] == asked, path
        by_case = {json.dumps(_case_key(c), sort_keys=True): c for c in cases}
        return [Measured(**{**row, "case": by_case[row["case"]]}) for row in record["rows"]]
    rows = measure_parallel(cases, world, **kw)
    if os.environ.get("GRAPHCOST_RECORD_STEPS") == "1" and on_record_torch:
        STEPS.mkdir(exist_ok=True)
        path.write_text(json.dumps({
            "torch": torch.__version__, "asked": asked,
            "rows": [{**dataclasses.asdict(m), "case": json.dumps(_case_key(m.case),
                                                                  sort_keys=True)}
                     for m in rows]}, indent=1) + "\n", encoding="utf-8")
    assert all(isinstance(m.case, Case) for m in rows)
    return rows


# transformers' Mixtral plan: from 5.25 on it shards attention alone, the experts and router
# left whole on every rank (frontends/torch/transformers_tp_plan.py); 5.24's (the range's floor)
# named the experts "moe_tp_experts", a style not modelled (refused)
EXPERTS_WHOLE = importlib.util.find_spec("transformers") is not None and not any(
    "experts" in k for k in __import__("transformers").MixtralConfig().base_model_tp_plan)
