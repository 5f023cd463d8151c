"""One model at many batch sizes (``--max-batch``): trace once, re-bind the rest.

A trace is most of an analysis (a GPT-2 training step: about a second; the passes a
hundredth of that), and the search for the largest batch looks at about twenty batches. A
PyTorch model is traced once, at a marker batch, and re-run on fake tensors at batch 2
(frontends/fake_rerun.py); every other batch is that graph with its dims re-bound on the line
through those two (analyzer/app/rebind.py). Before tracing at the marker, the model's forward
runs on fake tensors at batch 2 and at the marker (fake_rerun.same_path) and must call the
same ATen ops at both: a forward whose Python depends on the batch (a loop over the images of
a detector's post-processing) would unroll a marker's worth of copies into the trace. When
that or the re-run fails, the model is traced at batches 2 and 3 instead (rebind.py's own
family); when those two traces are not one family, every batch is traced, and a graph that
grows with the batch is only estimated (batch_scaling.estimate_max_batch). An ONNX model,
which has no trace, is lowered at each batch.
"""
from __future__ import annotations

import inspect
from typing import Callable

from .api import (ANALYZE_ARGS, analyze, batch_of, device_of, load_graph, parallel_spec,
    resolve_model, torch_graph)
from .api_checks import check_checkpoint, check_unknown, overhead_of
from ...passes.errors import GraphcostError
from .api_wording import api_wording
from ...passes.ir import Graph
from .report import Report

# analyze's arguments that are load_graph's (but the model and the batch); the rest: the passes'
LOAD_ARGS = tuple(p for p in inspect.signature(load_graph).parameters
                  if p not in ("model", "batch"))


def traced_once(model, load: dict) -> tuple[Graph, Callable[[int], Graph]] | None:
    """``model`` traced at a marker batch, with ``b -> its graph at b`` (the trace re-run on
    fake tensors); None for a model that is not a PyTorch module with a batch of its own, whose
    forward takes another path at the marker, or whose trace has sizes the data decides."""
    from ..frontends.torch.fake_rerun import FIRST, marker_batch, model_sizes, same_path

    def at(b: int):
        return resolve_model(model, batch=b, **load)
    r = at(FIRST)
    if r.kind != "torch":
        return None
    marker = marker_batch(model_sizes(r.module, (*r.inputs, *r.kwargs.values())))
    if marker != FIRST:
        r = at(marker)
    small = at(2)
    if batch_of((*r.inputs, *r.kwargs.values())) != marker or \
            not same_path(r, small, train=load.get("train", False)):
        return None
    rebind: list = []
    note = load.get("progress") or (lambda _msg: None)
    graph = torch_graph(r, note, load.get("train", False), load.get("all_layers", False),
                        rebind)
    return (graph, rebind[0]) if rebind else None


def analyze_by_batch(model, *, _cli: bool = False, **kwargs) -> Callable[[int], Report]:
    """``b -> analyze(model, batch=b, **kwargs)``, for analyzing many batches of one model
    (the module docstring says how). The function has ``rebound`` True when it re-binds
    graphs; then ``exact(b)`` analyzes the graph re-run (or traced) at b, ``traces`` counts the
    traces taken and ``traced_at`` is the marker batch (None when traced at 2 and 3). When it
    does not, ``grows`` is the graph's node counts at batches 2 and 3 if the graph grows with
    the batch (each trace then costs more per sample: batch_scaling.estimate_max_batch)."""
    from .pipeline import run_passes
    from .rebind import batch_family

    def plain(b: int) -> Report:
        return analyze(model, batch=b, _cli=_cli, **kwargs)
    plain.rebound, plain.grows = False, None  # type: ignore[attr-defined]
    load = {k: kwargs[k] for k in LOAD_ARGS if k in kwargs}
    passes = {k: v for k, v in kwargs.items() if k not in LOAD_ARGS}
    train = load.get("train", False)
    try:
        from .devices import default_optimizer_impl
        check_unknown((), {k: v for k, v in kwargs.items() if k not in ANALYZE_ARGS},
                      ANALYZE_ARGS)
        passes["device"] = device_of(passes.get("device"))
        passes["overhead"] = overhead_of(passes.get("overhead"))
        passes["checkpoint"] = check_checkpoint(passes.get("checkpoint"), train)
        # the passes' arguments as analyze makes them (device's optimizer impl, checked spec)
        passes["optimizer_impl"] = passes.get("optimizer_impl") or \
            default_optimizer_impl(passes["device"])
        passes["parallel"] = parallel_spec(passes.get("parallel"), train,
                                            passes.get("precision", "fp32"))
        if passes["parallel"] is not None:
            passes["what_if"] = False
        family, exact, marker = None, plain, None
        try:
            once = traced_once(model, load)
        except GraphcostError:
            once = None  # (traced at 2 below, which says what fails at a batch the user knows)
        if once is not None:
            graph, rerun = once
            try:
                family = batch_family(rerun(2), 2, graph, graph.batch)
                marker = graph.batch
            except Exception:  # an op refusing a re-bound size: trace at 2 and 3
                family = None
        if family is not None:
            exact = lambda b: run_passes(rerun(b), **passes)  # noqa: E731
        else:
            g2 = load_graph(model, batch=2, **load)
            if g2.source != "fx":
                return plain
            g3 = load_graph(model, batch=3, **load)
            family = batch_family(g2, 2, g3, 3)
            if family is None and len(g3.nodes) > len(g2.nodes):  # a loop over the samples
                plain.grows = (len(g2.nodes), len(g3.nodes))  # type: ignore[attr-defined]
    except GraphcostError as exc:
        if _cli:
            raise
        raise GraphcostError(api_wording(str(exc))) from None
    if family is None:
        return plain
    passes["optimizer"] = passes.get("optimizer", "adam") if train else None

    def at(b: int) -> Report:
        try:
            graph = family(b)
        except ValueError:  # a size off its line at this batch: trace or re-run it
            return exact(b)
        return run_passes(graph, **passes)
    at.rebound, at.grows = True, None  # type: ignore[attr-defined]
    at.exact, at.traced_at = exact, marker  # type: ignore[attr-defined]
    at.traces = 1 if marker else 2  # type: ignore[attr-defined]
    return at
