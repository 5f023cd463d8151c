"""``graphcost verify`` for ONNX: run the model with onnxruntime on this CPU and compare.

onnxruntime runs a copy of the model whose graph outputs include every intermediate value
(graph optimizations off, so no value is fused away); every real shape and dtype is checked
against graphcost's inferred one. A second session (default optimizations, only the real
outputs) measures latency, shown beside the roofline lower bound for this CPU's measured peak
FLOP/s and copy bandwidth. onnxruntime's arena exposes no peak, so the activation peak is
predicted only. The model file is only read.
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...passes.errors import GraphcostError, first_line, opt
from ..app.request import PassOptions
from .reference import CpuSpec, cpu_device, measure_cpu

PEAK_NOTE = "not measured: onnxruntime's arena does not expose its peak"


@dataclass(frozen=True)
class ShapeCheck:
    value: str          # the ONNX value name
    node: str           # the node that produces it
    predicted: str      # graphcost's inferred shape and dtype, "2×3 float32"
    measured: str       # onnxruntime's real one



@dataclass(frozen=True)
class OnnxVerification:
    model: str
    batch: int
    dims: dict[str, int]
    shapes_checked: int        # values onnxruntime produced and graphcost predicted
    shapes_matched: int
    shapes_mismatched: int
    shapes_unknown: int        # graphcost has no concrete shape, or the output is no tensor
    mismatches: tuple[ShapeCheck, ...]
    unknown: tuple[ShapeCheck, ...]   # measured "" when onnxruntime could not be asked for it
    latency_seconds: float     # median of ``repeat`` runs after warm-up
    latency_min_seconds: float
    repeat: int
    roofline_seconds: float    # lower bound: Σ nodes max(FLOPs/peak, bytes/bandwidth)
    roofline_compute_seconds: float   # the part spent in compute-bound nodes
    roofline_memory_seconds: float    # ... and in memory-bound ones
    cpu: CpuSpec
    flops: int
    bytes_moved: int
    predicted_peak_bytes: int
    lifetimes: str
    peak_note: str = PEAK_NOTE

    @property
    def ratio(self) -> float:
        """measured / roofline (≥ 1 for a true lower bound; large on CPU)."""
        return self.latency_seconds / self.roofline_seconds if self.roofline_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "onnx", "model": self.model, "batch": self.batch,
                "dims": dict(sorted(self.dims.items())),
                "shapes": {"checked": self.shapes_checked, "matched": self.shapes_matched,
                           "mismatched": self.shapes_mismatched,
                           "unknown": self.shapes_unknown,
                           "mismatches": [vars(m) for m in self.mismatches],
                           "unknown_values": [vars(m) for m in self.unknown]},
                "latency": {"measured_seconds": self.latency_seconds,
                            "measured_min_seconds": self.latency_min_seconds,
                            "repeat": self.repeat, "roofline_seconds": self.roofline_seconds,
                            "roofline_compute_seconds": self.roofline_compute_seconds,
                            "roofline_memory_seconds": self.roofline_memory_seconds,
                            "ratio": self.ratio, "flops": self.flops,
                            "bytes_moved": self.bytes_moved},
                "cpu": vars(self.cpu),
                "memory": {"predicted_peak_bytes": self.predicted_peak_bytes,
                           "lifetimes": self.lifetimes, "measured_peak_bytes": None,
                           "note": self.peak_note}}



def verify_onnx(resolved, batch: int | None = None, *, repeat: int = 10,
                progress: Callable[[str], None] | None = None,
                passes: PassOptions = PassOptions()) -> OnnxVerification:
    """``resolved``: an ONNX model from analyzer.load.resolve (its file is only read; its weights
    are loaded once, here, and the same proto is lowered and run). ``passes``: what the
    passes are asked (its lifetimes, include_inputs and inplace; the device is this CPU)."""
    from ..app.pipeline import run_passes
    from ..frontends.onnx.frontend import lower_onnx

    note = progress or (lambda _m: None)
    if repeat < 1:
        raise GraphcostError(f"{opt('repeat')} must be at least 1, got {repeat}")
    note("loading the model with its weights")
    proto = _load_with_weights(resolved)
    if proto.functions:  # the IR names values of the inlined graph (inlined within budget)
        from ..frontends.onnx.inline import inline_functions
        proto = inline_functions(proto, resolved.name)
    graph = lower_onnx(proto, name=resolved.name, batch=batch, dims=resolved.dims,
                       input_shapes=resolved.input_shapes)
    feeds = _random_feeds(proto, graph, resolved.int_ranges)
    # Session 1: every intermediate a graph output, no optimizations (nothing fused away).
    shapes = _ShapeChecks(graph)
    probe = shapes.probe(proto)
    note("running every node with onnxruntime")
    names = [o.name for o in probe.graph.output]
    shapes.compare(names, dict(zip(names, _session(probe, optimize=False).run(names, feeds))))
    # Session 2: what a user runs — default optimizations, only the model's outputs.
    note(f"timing {repeat} runs")
    times = _timed(proto, feeds, repeat)
    # This CPU's rates, measured right after the timing (the machine's load then is the same).
    note("measuring this CPU's peak FLOP/s and bandwidth")
    cpu = measure_cpu()
    report = run_passes(graph, replace(passes, device=cpu_device(cpu)))
    rf = report.roofline
    assert rf is not None  # (run with this CPU as the device)
    return OnnxVerification(
        model=report.model, batch=report.batch, dims=dict(report.dims),
        shapes_checked=shapes.matched + len(shapes.mismatches), shapes_matched=shapes.matched,
        shapes_mismatched=len(shapes.mismatches), shapes_unknown=len(shapes.unknown),
        mismatches=tuple(shapes.mismatches), unknown=tuple(shapes.unknown),
        latency_seconds=statistics.median(times), latency_min_seconds=min(times),
        repeat=repeat, roofline_seconds=rf.total_seconds,
        roofline_compute_seconds=rf.compute_seconds, roofline_memory_seconds=rf.memory_seconds,
        cpu=cpu,
        flops=report.totals.flops,
        bytes_moved=report.totals.bytes_read + report.totals.bytes_written,
        predicted_peak_bytes=report.memory.peak_bytes, lifetimes=report.memory.lifetimes)


class _ShapeChecks:
    """onnxruntime's real shapes against ``graph``'s, value by value: the probe model that
    outputs every intermediate, and the tallies of its comparison."""

    def __init__(self, graph):
        self.graph = graph
        self.producer: dict[str, str] = {}  # value -> the node that produces it
        for node in graph.nodes:
            for out in node.outputs:
                if out:
                    self.producer.setdefault(out, node.name)
        self.matched = 0
        self.mismatches: list[ShapeCheck] = []
        self.unknown: list[ShapeCheck] = []

    def probe(self, proto):
        """A copy of ``proto`` with every top-level value that has a dtype a graph output;
        one without is unknown."""
        import onnx

        top_level = [o for n in proto.graph.node for o in n.output if o]
        declared = {o.name for o in proto.graph.output}
        probe = onnx.ModelProto()
        probe.CopyFrom(proto)
        to_elem = {v: k for k, v in _dtype_names().items()}
        for out in top_level:
            spec = self.graph.spec(out)
            if out in declared:
                continue
            if spec is None or spec.dtype not in to_elem:  # no type to declare it with
                self.unknown.append(ShapeCheck(out, self.producer.get(out, "?"),
                                               _spec_text(spec), ""))
                continue
            probe.graph.output.append(onnx.helper.make_tensor_value_info(
                out, to_elem[spec.dtype], None))
        return probe

    def compare(self, names: list[str], real: dict[str, Any]) -> None:
        """Tallies each output ``names`` of the probe run (``real``) against the graph's."""
        import numpy as np

        for out in names:
            arr, spec = real[out], self.graph.spec(out)
            measured = f"{'×'.join(map(str, arr.shape)) or 'scalar'} {arr.dtype.name}" \
                if isinstance(arr, np.ndarray) else type(arr).__name__
            check = ShapeCheck(out, self.producer.get(out, "?"), _spec_text(spec), measured)
            if not isinstance(arr, np.ndarray) or spec is None or spec.shape is None or \
                    not spec.known:
                self.unknown.append(check)
            elif tuple(arr.shape) == tuple(spec.shape) and arr.dtype.name == spec.dtype:
                self.matched += 1
            else:
                self.mismatches.append(check)


def _timed(proto, feeds: dict, repeat: int) -> list[float]:
    """Seconds of each of ``repeat`` runs of ``proto``'s optimized session, after two
    warm-up runs."""
    fast = _session(proto, optimize=True)
    outputs = [o.name for o in proto.graph.output]
    for _ in range(2):
        fast.run(outputs, feeds)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fast.run(outputs, feeds)
        times.append(time.perf_counter() - t)
    return times


def _spec_text(spec) -> str:
    return "?" if spec is None else f"{spec.shape_str()} {spec.dtype}"


def _dtype_names() -> dict[int, str]:
    from ..frontends.onnx.frontend import DTYPE
    return DTYPE


def _load_with_weights(resolved):
    """The model WITH its weights (external data read from beside the file), read-only.

    onnxruntime is handed bytes, so any reference left in them would be opened relative to the
    current directory: every external location must resolve inside the model's folder (no
    absolute path, no '..', no symlink out), and nothing external may remain after loading
    (onnx loads initializers and tensor attributes, never sparse tensors)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    if resolved.path is None:
        _refuse_external(resolved.onnx, None)
        return resolved.onnx
    path = resolved.path
    try:
        proto = onnx.load(str(path), load_external_data=False)
        _refuse_external(proto, path.parent)
        load_external_data_for_model(proto, str(path.parent))
    except GraphcostError:
        raise
    except Exception as exc:
        first = first_line(exc)
        raise GraphcostError(f"{path}: cannot load it with its weights "
                             f"({type(exc).__name__}: {first})") from None
    _refuse_external(proto, None)
    return proto


def _refuse_external(proto, folder: Path | None) -> None:
    """``folder`` None: no external reference may remain; else each must stay inside it and
    not be sparse (which onnx would leave for onnxruntime to open from the current
    directory)."""
    from ..frontends.onnx.external_data import external_refs

    for what, location, sparse in external_refs(proto):
        if folder is None or sparse:
            raise GraphcostError(f"{what} references external data {location!r} that onnx does "
                                 "not load for onnxruntime; verify never hands onnxruntime a "
                                 "model that would read files by itself")
        base = os.path.realpath(folder)
        target = os.path.realpath(os.path.join(folder, location))
        if not location or os.path.isabs(location) or \
                os.path.commonpath([base, target]) != base or target == base:
            raise GraphcostError(f"{what}: external data location {location!r} is outside the "
                                 f"model's folder {str(folder)!r}; verify reads nothing beyond it")


def _random_feeds(proto, graph, int_ranges: Mapping[str, tuple[int, int]]) -> dict:
    """Random inputs of the bound shapes and the declared dtypes. Integer inputs get small
    ids (default 0 or 1) so that embedding lookups stay in range."""
    import numpy as np
    from onnx.helper import tensor_dtype_to_np_dtype

    rng = np.random.default_rng(0)
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in proto.graph.input}
    feeds = {}
    for name in graph.inputs:
        spec = graph.spec(name)
        if spec is None or not spec.known:
            raise GraphcostError(f"input {name!r} has no concrete shape: bind it with {opt('batch')}, "
                                 f"{opt('dims')} or {opt('input_shapes')}")
        try:
            dt = np.dtype(tensor_dtype_to_np_dtype(elem[name]))
        except Exception:
            raise GraphcostError(f"input {name!r}: onnxruntime cannot be fed a "
                                 f"{spec.dtype} tensor from numpy") from None
        shape = tuple(spec.shape)
        if dt.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            lo, hi = int_ranges.get(name, (0, 2))
            feeds[name] = rng.integers(lo, hi, shape).astype(dt)
        elif dt.kind == "b":
            feeds[name] = np.ones(shape, dtype=dt)
        else:
            raise GraphcostError(f"input {name!r}: cannot make a random {dt} input")
    return feeds


def _session(proto, *, optimize: bool):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                     else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    opts.log_severity_level = 3  # a declared output shape that is wrong warns on every run
    try:
        return ort.InferenceSession(proto.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise GraphcostError("onnxruntime cannot run the model: "
                             f"{first_line(exc) or type(exc).__name__}"
                             ) from None


# ----------------------------------------------------------------------------- PyTorch
