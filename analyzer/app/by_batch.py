"""One model at many batch sizes (``--max-batch``): trace once, re-bind the rest.

A trace is most of an analysis (a GPT-2 training step: about a second; the passes a
hundredth of that), and the search for the largest batch looks at about twenty batches. A
PyTorch model is traced once, at a marker batch, and re-run on fake tensors at batch 2
(frontends/fake_rerun.py); every other batch is that graph with its dims re-bound on the line
through those two (analyzer/load/rebind.py). Before tracing at the marker, the model's forward
runs on fake tensors at batch 2 and at the marker (fake_rerun.same_path) and must call the
same ATen ops at both: a forward whose Python depends on the batch (a loop over the images of
a detector's post-processing) would unroll a marker's worth of copies into the trace. When
that or the re-run fails, the model is traced at batches 2 and 3 instead (rebind.py's own
family); when those two traces are not one family, every batch is traced, and a graph that
grows with the batch is only estimated (batch_scaling.estimate_max_batch). An ONNX model,
which has no trace, is lowered at each batch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ...passes.errors import GraphcostError, opt
from ..load.loading import load_graph, traced_once
from ..load.progress import Progress
from ..load.rebind import batch_family
from .api import ANALYZE_ARGS, run_request
from .api_checks import check_unknown
from .batch_scaling import MaxBatch, estimate_max_batch, max_batch, required_bytes
from .report import Report
from .request import Request, build_request


@dataclass(frozen=True)
class BatchAnalyses:
    """``b -> the analysis at batch b`` of one model and request. ``rebound``: the graphs are
    re-bound (then ``exact(b)`` analyzes the graph re-run, or traced, at b; ``traces`` counts
    the traces taken; ``traced_at`` is the marker batch, None when traced at 2 and 3). When
    not, ``grows`` holds the graph's node counts at batches 2 and 3 if the graph grows with
    the batch (each trace then costs more per sample: batch_scaling.estimate_max_batch)."""
    at: Callable[[int], Report]
    rebound: bool = False
    exact: Callable[[int], Report] | None = None
    traces: int | None = None
    traced_at: int | None = None
    grows: tuple[int, int] | None = None

    def __call__(self, batch: int) -> Report:
        return self.at(batch)


def analyze_by_batch(model, request: Request,
                     progress: Progress | None = None) -> BatchAnalyses:
    """The analyses of ``model`` at any batch under ``request`` (its own batch ignored); the
    module docstring says how."""
    from .pipeline import run_passes

    def plain(b: int) -> Report:
        return run_request(model, request.at_batch(b), progress=progress)
    load, passes = request.load, request.passes
    family, exact, marker, rerun = None, plain, None, None
    try:
        once = traced_once(model, load, progress)
    except GraphcostError:
        once = None  # (traced at 2 below, which says what fails at a batch the user knows)
    if once is not None:
        graph, rerun = once
        try:
            family = batch_family(rerun(2), 2, graph, graph.batch)
            marker = graph.batch
        except Exception:  # an op refusing a re-bound size: trace at 2 and 3
            family = None
    if family is not None and rerun is not None:
        exact = lambda b: run_passes(rerun(b), passes)  # noqa: E731
    else:
        g2 = load_graph(model, replace(load, batch=2), progress=progress)
        if g2.source != "fx":
            return BatchAnalyses(plain)
        g3 = load_graph(model, replace(load, batch=3), progress=progress)
        family = batch_family(g2, 2, g3, 3)
        if family is None:
            grows = len(g3.nodes) > len(g2.nodes)  # a loop over the samples
            return BatchAnalyses(plain, grows=(len(g2.nodes), len(g3.nodes)) if grows else None)

    def at(b: int) -> Report:
        try:
            graph = family(b)
        except ValueError:  # a size off its line at this batch: trace or re-run it
            return exact(b)
        return run_passes(graph, passes)
    return BatchAnalyses(at, rebound=True, exact=exact, traces=1 if marker else 2,
                         traced_at=marker)


def max_batch_search(model, request: Request, progress: Progress | None = None) -> MaxBatch:
    """The largest batch whose step fits ``request``'s device: searched over re-bound graphs
    (batch_scaling.max_batch) and confirmed at the answer and one above by the graph re-run
    there (or traced there, when the family came from two traces)."""
    passes = request.passes
    if request.load.batch is not None:
        raise GraphcostError(f"{opt('max_batch')} searches the batch: leave out {opt('batch')}")
    if passes.device is None:
        raise GraphcostError(f"{opt('max_batch')} needs {opt('device', value='NAME')} or {opt('device_spec')}")
    if passes.checkpoint is not None and passes.checkpoint.budget is not None:
        raise GraphcostError(f"{opt('max_batch')} with {opt('checkpoint', value='auto')} {opt('checkpoint.budget')}: a budget is a memory "
                             "target of its own; search the batch under a fixed plan "
                             f"({opt('checkpoint', value='sqrt')}, NAMES or {opt('checkpoint.every', value='N')})")
    if passes.parallel is not None and passes.parallel.pp > 1:
        # (its search would run on the whole model: it answered for "ddp over 1 ranks", and
        # 10,880 for zoo:llama_tiny on an RTX 4090, where that pipeline at 10,880 needs 6.69
        # of 23.99 GiB)
        raise GraphcostError(f"{opt('max_batch')} beside pipeline stages: not modelled (a "
                             "stage's batch is its micro-batches'); analyze the batches you "
                             f"consider with {opt('batch')} and {opt('parallel.microbatches')}")
    if passes.parallel is not None and passes.parallel.world_size is None:
        raise GraphcostError(f"{opt('max_batch')} with {opt('parallel.world_size', value='auto')}: fix the world size to search "
                             "the batch (or the batch to search the world size)")
    at = analyze_by_batch(model, replace(request, passes=replace(passes, what_if=False)),
                          progress)
    result = estimate_max_batch(at, at.grows) if at.grows else max_batch(at)
    if at.rebound and at.exact is not None and result.batch > 0:
        real = [required_bytes(at.exact(b)) for b in (result.batch, result.batch + 1)]
        checked = real == [result.required_bytes, result.next_required_bytes]
        if not checked:
            result = max_batch(at.exact)
        if checked or at.traced_at:  # (else: one trace per analysis)
            result = replace(result, traces=(at.traces or 0) + (0 if at.traced_at else 2),
                             traced_at=at.traced_at)
    return result


def find_max_batch(model, *, progress: Progress | None = None, **kwargs) -> MaxBatch:
    """The largest batch whose step fits ``device`` (``--max-batch``): ``kwargs`` are
    analyze's (``device`` required, ``batch`` left out). Each analysis is of re-bound graphs
    (one trace), and the answer is confirmed at it and one above (analyzer/app/by_batch.py)."""
    check_unknown((), {k: v for k, v in kwargs.items() if k not in ANALYZE_ARGS}, ANALYZE_ARGS)
    return max_batch_search(model, build_request(**kwargs), progress)
