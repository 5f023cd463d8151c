"""Traces and measurements shared across test files (each is expensive; the suite takes each
once per session). Nothing here computes an expectation: these are the inputs the tests check
graphcost against."""
from __future__ import annotations

import functools

from graphcost import models_zoo
from graphcost.analyzer.api import load_graph
from graphcost.analyzer.pipeline import run_passes
from graphcost.analyzer.verify import measure_training

BATCH = 2


@functools.lru_cache(maxsize=None)
def joint_graph(name: str):
    """zoo:NAME's joint forward+backward graph at BATCH (traced once; the IR is immutable)."""
    return load_graph(models_zoo.build_model(name, eval=False),
                      models_zoo.example_inputs(name, batch=BATCH), train=True)


def train_report(name: str, optimizer: str, **kw):
    """One training step's analysis of zoo:NAME from the shared joint graph; the graph input is
    left out by default, as MemTracker leaves out what exists before the step."""
    kw.setdefault("include_inputs", False)
    return run_passes(joint_graph(name), optimizer=optimizer, **kw)


@functools.lru_cache(maxsize=None)
def measured_step(name: str, optimizer: str) -> int:
    """MemTracker's peak over the second real training step of zoo:NAME (no checkpointing)."""
    return measured_step_peak(name, optimizer)


def measured_step_peak(name: str, optimizer: str, prepare=None) -> int:
    """MemTracker's peak over the second real training step (analyzer.verify's measurement).
    ``prepare(model)`` may change the model first (wrap blocks in torch.utils.checkpoint)."""
    model = models_zoo.build_model(name, eval=False)
    if prepare is not None:
        prepare(model)
    return measure_training(model, models_zoo.example_inputs(name, batch=BATCH), optimizer)[0]
