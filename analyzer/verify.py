"""``graphcost verify``: run the model for real on this CPU and compare with the prediction.

* ONNX (a file, a ModelProto, or ``zoo:NAME``'s cached export): onnxruntime runs a copy of the
  model whose graph outputs include every intermediate value (graph optimizations off, so no
  value is fused away); every real shape and dtype is checked against graphcost's inferred one.
  A second session (default optimizations, only the real outputs) measures latency, shown
  beside the roofline lower bound for this CPU's measured peak FLOP/s and copy bandwidth.
  onnxruntime's arena exposes no peak, so the activation peak is predicted only.
* PyTorch (``zoo:NAME --fx``, ``file.py:Class``, an nn.Module): one forward under
  torch.no_grad() — or, with ``train``, one steady-state training step — measured by
  torch.distributed._tools.mem_tracker.MemTracker, against graphcost's peak overall and per
  module.

The input model file is only read. Nothing here prints; results are frozen dataclasses.
"""
from __future__ import annotations

import inspect
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from graphcost.analyzer.errors import GraphcostError
from graphcost.analyzer.report import Report

PEAK_NOTE = "not measured: onnxruntime's arena does not expose its peak"


# ----------------------------------------------------------------------------- results

@dataclass(frozen=True)
class ShapeCheck:
    value: str          # the ONNX value name
    node: str           # the node that produces it
    predicted: str      # graphcost's inferred shape and dtype, "2×3 float32"
    measured: str       # onnxruntime's real one


@dataclass(frozen=True)
class CpuSpec:
    """This CPU's achievable rates, measured with numpy (see measure_cpu)."""
    peak_flops: float           # FLOP/s: one thread's float32 matmul rate × cores
    bandwidth: float            # bytes/s (read + written) of one thread's large copy
    memory: int                 # bytes of physical memory
    cores: int
    thread_flops: float         # one thread's float32 matmul FLOP/s


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
    roofline_source: str       # "analyze(device=)" or "verify fallback"
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
                            "roofline_source": self.roofline_source,
                            "ratio": self.ratio, "flops": self.flops,
                            "bytes_moved": self.bytes_moved},
                "cpu": vars(self.cpu),
                "memory": {"predicted_peak_bytes": self.predicted_peak_bytes,
                           "lifetimes": self.lifetimes, "measured_peak_bytes": None,
                           "note": self.peak_note}}


@dataclass(frozen=True)
class ModulePeak:
    path: str                      # "" is the whole model
    type: str
    depth: int
    predicted_bytes: int           # max of the timeline over the module's nodes
    measured_bytes: int | None     # MemTracker's activations at the module's local peak
    calls: int

    @property
    def rel_error(self) -> float | None:
        return _rel(self.predicted_bytes, self.measured_bytes)


@dataclass(frozen=True)
class PeakPart:
    """One category of the training peak, graphcost's breakdown beside MemTracker's."""
    category: str
    predicted_bytes: int
    measured_bytes: int

    @property
    def rel_error(self) -> float | None:
        return _rel(self.predicted_bytes, self.measured_bytes)


# graphcost's training breakdown keys -> MemTracker's reference types. Only parameters,
# buffers and gradients mean the same on both sides; the rest is compared as one sum, since
# the two classify it differently (MemTracker tags the optimizer step's temporaries
# "Optstate" and everything the backward allocates "Temp"; graphcost splits by tensor role).
_PARTS = (("parameters", ("params",), ("Parameter",)),
          ("buffers", ("buffers",), ("Buffer",)),
          ("gradients", ("gradients",), ("Gradient",)),
          ("optimizer state, activations, temporaries",
           ("master_weights", "optimizer_state", "activations", "temporaries"),
           ("Optstate", "Activation", "Temp", "Other")))


@dataclass(frozen=True)
class TorchVerification:
    model: str
    batch: int
    mode: str                      # "inference" or "training"
    optimizer: str | None
    predicted_peak_bytes: int
    measured_peak_bytes: int
    modules: tuple[ModulePeak, ...]
    measured_breakdown: dict[str, int] = field(default_factory=dict)  # MemTracker's at peak
    note: str = ""
    parts: tuple[PeakPart, ...] = ()   # training: the peak by category, both sides

    @property
    def rel_error(self) -> float | None:
        return _rel(self.predicted_peak_bytes, self.measured_peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "torch", "model": self.model, "batch": self.batch, "mode": self.mode,
                "optimizer": self.optimizer,
                "peak": {"predicted_bytes": self.predicted_peak_bytes,
                         "measured_bytes": self.measured_peak_bytes,
                         "rel_error": self.rel_error},
                "measured_breakdown": dict(self.measured_breakdown), "note": self.note,
                "parts": [{"category": p.category, "predicted_bytes": p.predicted_bytes,
                           "measured_bytes": p.measured_bytes, "rel_error": p.rel_error}
                          for p in self.parts],
                "modules": [{"path": m.path, "type": m.type, "depth": m.depth,
                             "calls": m.calls, "predicted_bytes": m.predicted_bytes,
                             "measured_bytes": m.measured_bytes, "rel_error": m.rel_error}
                            for m in self.modules]}


def _rel(predicted: int, measured: int | None) -> float | None:
    return predicted / measured - 1.0 if measured else None


# ----------------------------------------------------------------------------- this CPU

# Run in a child process with single-threaded BLAS: a multi-threaded matmul on a machine
# whose other cores are busy reads 5-40× low (its threads wait on each other), one thread stays
# within ~10% of its idle rate. The best of many short runs is an idle moment's rate.
_MEASURE = r"""
import json, sys, time
import numpy as np
budget = float(sys.argv[1])
def best(fn):
    b, start, runs = float("inf"), time.perf_counter(), 0
    while runs < 3 or time.perf_counter() - start < budget:
        t = time.perf_counter(); fn(); b = min(b, time.perf_counter() - t); runs += 1
    return b
n = 512
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
c = rng.standard_normal((n, n), dtype=np.float32)
a @ c
flops = 2.0 * n ** 3 / best(lambda: a @ c)
src = np.ones(32 << 20, dtype=np.float32)  # 128 MiB: beyond most caches
dst = np.empty_like(src)
np.copyto(dst, src)  # page the destination in
bandwidth = 2.0 * src.nbytes / best(lambda: np.copyto(dst, src))
print(json.dumps({"flops": flops, "bandwidth": bandwidth}))
"""


@lru_cache(maxsize=1)
def measure_cpu(budget: float = 0.3) -> CpuSpec:
    """Achievable (not datasheet) rates of this CPU, ~1 s: the best single-threaded float32
    512³ matmul (2·n³ FLOPs) times the usable cores, and the best single-threaded copy of a
    128 MiB array (bytes read + written), each repeated for ``budget`` seconds."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    try:
        out = subprocess.run([sys.executable, "-c", _MEASURE, str(budget)], env=env,
                             capture_output=True, text=True, timeout=120, check=True).stdout
        rates = json.loads(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        raise GraphcostError(f"measuring this CPU's peak failed ({type(exc).__name__})") \
            from None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        memory = 0
    return CpuSpec(rates["flops"] * cores, rates["bandwidth"], int(memory), cores,
                   rates["flops"])


def cpu_device(cpu: CpuSpec):
    """The integrator's Device for this CPU: one measured fp32 rate for every dtype (no
    tensor cores; numpy measures fp32 only)."""
    from types import MappingProxyType

    from graphcost.analyzer.devices import DTYPES, Device
    label = (f"this CPU (measured: {cpu.peak_flops / 1e9:.1f} GFLOP/s fp32 matmul, "
             f"{cpu.bandwidth / 1e9:.1f} GB/s copy)")
    return Device("this-cpu", label, MappingProxyType({d: cpu.peak_flops for d in DTYPES}),
                  cpu.bandwidth, cpu.memory)


def _analyze_supports_device() -> bool:
    from graphcost.analyzer.api import analyze
    return "device" in inspect.signature(analyze).parameters


def _roofline_seconds(report: Report, cpu: CpuSpec) -> tuple[float, float, float]:
    """(total, compute-bound part, memory-bound part) seconds: Σ per node of max(FLOPs / peak,
    bytes / bandwidth), as passes/roofline.py does; only used when analyze() has no
    ``device=`` (an older analyzer)."""
    compute = memory = 0.0
    for n in report.nodes:
        c = n.flops / cpu.peak_flops
        m = (n.bytes_read + n.bytes_written) / cpu.bandwidth
        if c >= m:
            compute += c
        else:
            memory += m
    return compute + memory, compute, memory


# ----------------------------------------------------------------------------- ONNX

def verify_onnx(model, *, name: str | None = None, repeat: int = 10,
                int_ranges: Mapping[str, tuple[int, int]] | None = None,
                progress: Callable[[str], None] | None = None,
                **analysis: Any) -> OnnxVerification:
    """``model``: an .onnx path or an onnx.ModelProto (never modified; a path is only read).
    ``analysis``: analyze()'s keyword arguments (batch, dims, input_shapes, lifetimes …).
    ``int_ranges``: integer inputs' (low, high) for random ids; default [0, 2)."""
    import numpy as np
    import onnx

    from graphcost.analyzer.api import analyze, load_graph

    note = progress or (lambda _m: None)
    if repeat < 1:
        raise GraphcostError(f"--repeat must be at least 1, got {repeat}")
    bindings = {k: analysis.get(k) for k in ("batch", "dims", "input_shapes")}
    graph = load_graph(model, **bindings)

    note("loading the model with its weights")
    proto = _load_with_weights(model)
    if proto.functions:  # the IR names values of the inlined graph
        import onnx.inliner
        proto = onnx.inliner.inline_local_functions(proto)
    feeds = _random_feeds(proto, graph, int_ranges or {})

    # Session 1: every intermediate a graph output, no optimizations (nothing fused away).
    producer = {}
    for node in graph.nodes:
        for out in node.outputs:
            if out:
                producer.setdefault(out, node.name)
    top_level = [o for n in proto.graph.node for o in n.output if o]
    declared = {o.name for o in proto.graph.output}
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    to_elem = {v: k for k, v in _dtype_names().items()}
    unknown: list[ShapeCheck] = []
    for out in top_level:
        spec = graph.spec(out)
        if out in declared:
            continue
        if spec is None or spec.dtype not in to_elem:  # no type to declare it with
            unknown.append(ShapeCheck(out, producer.get(out, "?"), _spec_text(spec), ""))
            continue
        probe.graph.output.append(onnx.helper.make_tensor_value_info(out, to_elem[spec.dtype],
                                                                     None))
    note("running every node with onnxruntime")
    names = [o.name for o in probe.graph.output]
    real = dict(zip(names, _session(probe, optimize=False).run(names, feeds)))

    matched = 0
    mismatches = []
    for out in names:
        arr, spec = real[out], graph.spec(out)
        measured = f"{'×'.join(map(str, arr.shape)) or 'scalar'} {arr.dtype.name}" \
            if isinstance(arr, np.ndarray) else type(arr).__name__
        predicted = _spec_text(spec)
        if not isinstance(arr, np.ndarray) or spec is None or not spec.known:
            unknown.append(ShapeCheck(out, producer.get(out, "?"), predicted, measured))
            continue
        if tuple(arr.shape) == tuple(spec.shape) and arr.dtype.name == spec.dtype:
            matched += 1
        else:
            mismatches.append(ShapeCheck(out, producer.get(out, "?"), predicted, measured))

    # Session 2: what a user runs — default optimizations, only the model's outputs.
    note(f"timing {repeat} runs")
    fast = _session(proto, optimize=True)
    outputs = [o.name for o in proto.graph.output]
    for _ in range(2):
        fast.run(outputs, feeds)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fast.run(outputs, feeds)
        times.append(time.perf_counter() - t)

    # This CPU's rates, measured right after the timing (the machine's load then is the same).
    note("measuring this CPU's peak FLOP/s and bandwidth")
    cpu = measure_cpu()
    report_kwargs = dict(analysis, progress=progress)
    use_device = _analyze_supports_device()
    if use_device:
        report_kwargs["device"] = cpu_device(cpu)
    report = analyze(model, **report_kwargs)
    if use_device and getattr(report, "roofline", None) is not None:
        rf = report.roofline
        roof = (rf.total_seconds, rf.compute_seconds, rf.memory_seconds)
        source = "analyze(device=)"
    else:
        roof = _roofline_seconds(report, cpu)
        source = "verify fallback"
    return OnnxVerification(
        model=name or report.model, batch=report.batch, dims=dict(report.dims),
        shapes_checked=matched + len(mismatches), shapes_matched=matched,
        shapes_mismatched=len(mismatches), shapes_unknown=len(unknown),
        mismatches=tuple(mismatches), unknown=tuple(unknown),
        latency_seconds=statistics.median(times), latency_min_seconds=min(times),
        repeat=repeat, roofline_seconds=roof[0], roofline_compute_seconds=roof[1],
        roofline_memory_seconds=roof[2], roofline_source=source, cpu=cpu,
        flops=report.totals.flops,
        bytes_moved=report.totals.bytes_read + report.totals.bytes_written,
        predicted_peak_bytes=report.memory.peak_bytes, lifetimes=report.memory.lifetimes)


def _spec_text(spec) -> str:
    return "?" if spec is None else f"{spec.shape_str()} {spec.dtype}"


def _dtype_names() -> dict[int, str]:
    from graphcost.analyzer.frontends.onnx_frontend import DTYPE
    return DTYPE


def _load_with_weights(model):
    """The model WITH its weights (external data read from beside the file), read-only.

    onnxruntime is handed bytes, so any reference left in them would be opened relative to the
    current directory: every external location must resolve inside the model's folder (no
    absolute path, no '..', no symlink out), and nothing external may remain after loading
    (onnx loads initializers and tensor attributes, never sparse tensors)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    if isinstance(model, onnx.ModelProto):
        _refuse_external(model, None)
        return model
    path = Path(os.fspath(model))
    if not path.is_file():
        raise GraphcostError(f"{path}: no such file")
    try:
        proto = onnx.load(str(path), load_external_data=False)
        _refuse_external(proto, path.parent)
        load_external_data_for_model(proto, str(path.parent))
    except GraphcostError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise GraphcostError(f"{path}: cannot load it with its weights "
                             f"({type(exc).__name__}: {first})") from None
    _refuse_external(proto, None)
    return proto


def _refuse_external(proto, folder: Path | None) -> None:
    """``folder`` None: no external reference may remain; else each must stay inside it and
    not be sparse (which onnx would leave for onnxruntime to open from the current
    directory)."""
    from graphcost.analyzer.external import external_refs

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
            raise GraphcostError(f"input {name!r} has no concrete shape: bind it with --batch, "
                                 "--dim or --input-shape")
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
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                             ) from None


# ----------------------------------------------------------------------------- PyTorch

OPTIMIZERS = ("none", "sgd", "momentum", "adam", "adamw")


def verify_torch(module, example_inputs: Sequence[Any] | Mapping[str, Any], *,
                 name: str | None = None, train: bool = False, optimizer: str = "adam",
                 depth: int = 1, lifetimes: str | None = None,
                 progress: Callable[[str], None] | None = None) -> TorchVerification:
    """Measure ``module`` (real weights, CPU) on ``example_inputs`` (positional tuple, or
    keyword inputs by forward argument name) with MemTracker and compare with analyze().

    Inference: activations at the peak of one forward under torch.no_grad(), overall and per
    module down to ``depth`` (0 = overall only). Graph inputs are excluded on both sides (they
    exist before the tracker starts). Training: the peak of the second step (optimizer state
    already allocated; gradients set to None first), as graphcost models a steady-state step.
    The module's weights change in training (two optimizer steps)."""

    from graphcost.analyzer.api import analyze

    if optimizer not in OPTIMIZERS:
        raise GraphcostError(f"optimizer must be one of {', '.join(OPTIMIZERS)}")
    kwargs = dict(example_inputs) if isinstance(example_inputs, Mapping) else {}
    args = () if kwargs else tuple(example_inputs)
    if kwargs:  # analyze() takes positional inputs: forward's order
        order = [p for p in inspect.signature(module.forward).parameters if p in kwargs]
        args, kwargs = tuple(kwargs[p] for p in order), {}
    label = name or type(module).__name__
    batch = next((int(t.shape[0]) for t in args if getattr(t, "ndim", 0)), 1)
    if train:
        was = module.training
        module.train()
        report = analyze(module, args, train=True, optimizer=optimizer, progress=progress)
        measured, breakdown = measure_training(module, args, optimizer)
        module.train(was)
        predicted = report.training.breakdown
        parts = tuple(PeakPart(cat, sum(predicted.get(k, 0) for k in ours),
                               sum(breakdown.get(k, 0) for k in theirs))
                      for cat, ours, theirs in _PARTS)
        return TorchVerification(label, batch, "training", optimizer,
                                 report.training.peak_bytes, measured, (), breakdown,
                                 "one steady-state step (the second); predicted peak in the "
                                 f"{report.training.peak_phase} phase; per-module figures "
                                 "are compared for inference only", parts)
    module.eval()
    report = analyze(module, args, include_inputs=False, lifetimes=lifetimes,
                     progress=progress)
    measured, breakdown, per_module = measure_inference(module, args)
    rows = [_module_peak(m, report, per_module) for m in report.modules if m.depth <= depth]
    return TorchVerification(label, batch, "inference", None, report.memory.peak_bytes,
                             measured, tuple(rows), breakdown,
                             f"activations, {report.memory.lifetimes} lifetimes, graph inputs "
                             "excluded on both sides")


def _snapshot_dict(snap) -> dict[str, int]:
    """MemTracker's {ref type enum: bytes} with readable keys ("Activation", "Total")."""
    return {getattr(k, "value", str(k)): int(v) for k, v in snap.items()}


def measure_inference(module, args):
    """MemTracker over one forward under no_grad: (activation peak, the peak by category,
    per module fqn: (activation bytes at its own peak, calls)). The tests measure with this
    too."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState

    tracker = MemTracker()
    tracker.track_external(module)
    with torch.no_grad(), tracker:
        module(*args)
    peak = _snapshot_dict(next(iter(tracker.get_tracker_snapshot("peak").values()), {}))
    # Per module: the activations live at the module's own peak (whatever was allocated
    # before it and still alive counts too, as in graphcost's timeline), max over its calls.
    per_module: dict[str, tuple[int, int]] = {}
    for stats in tracker.memory_tracking.values():
        fqn = stats.mod_fqn.split(".", 1)[1] if "." in stats.mod_fqn else ""
        snaps = stats.snapshots.get(_ModState.PEAK_FW, [])
        best = max((_snapshot_dict(d).get("Activation", 0) for s in snaps for d in s.values()),
                   default=0)
        per_module[fqn] = (best, len(snaps))
    return peak.get("Activation", 0), peak, per_module


def _module_peak(row, report: Report, measured: Mapping[str, tuple[int, int]]) -> ModulePeak:
    """Predicted: the largest timeline entry over the nodes whose scope is the module or lies
    inside it — bytes live anywhere in the program while one of the module's nodes runs, the
    quantity MemTracker records at the module's local peak."""
    path = row.path
    tl = report.memory.timeline
    inside = [tl[n.index] for n in report.nodes
              if not path or n.scope == path or n.scope.startswith(path + ".")]
    got = measured.get(path)
    return ModulePeak(path, row.type, row.depth, max(inside, default=0),
                      got[0] if got else None, got[1] if got else 0)


def float_output_sum(module, args):
    """graphcost's training loss: the sum of every floating output of ``module(*args)``."""
    import torch

    leaves = [t for t in torch.utils._pytree.tree_leaves(module(*args))
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum(t.sum() for t in leaves)


def measure_training(module, args, optimizer: str):
    """MemTracker's peak over the second training step (optimizer state already allocated,
    gradients freed by zero_grad(set_to_none=True) first), as graphcost models it:
    (total bytes, the peak by category). The tests measure with this too."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    params = list(module.parameters())
    opt = {"none": None,
           "sgd": lambda: torch.optim.SGD(params, lr=0.01),
           "momentum": lambda: torch.optim.SGD(params, lr=0.01, momentum=0.9),
           "adam": lambda: torch.optim.Adam(params),
           "adamw": lambda: torch.optim.AdamW(params)}[optimizer]
    opt = opt() if opt else None

    def step():
        module.zero_grad(set_to_none=True)
        float_output_sum(module, args).backward()
        if opt:
            opt.step()

    step()  # the first step allocates the optimizer state
    tracker = MemTracker()
    tracker.track_external(module, *([opt] if opt else []))
    with tracker:
        step()
    peak = _snapshot_dict(next(iter(tracker.get_tracker_snapshot("peak").values()), {}))
    return peak.get("Total", 0), peak


# ----------------------------------------------------------------------------- dispatch

def verify(model, *, fx: bool = False, batch: int | None = None,
           dims: Mapping[str, int] | None = None,
           input_shapes: Mapping[str, Sequence[int]] | None = None,
           input_dtypes: Mapping[str, Any] | None = None, train: bool = False,
           optimizer: str = "adam", repeat: int = 10, depth: int = 1,
           lifetimes: str | None = None, include_inputs: bool = True, inplace: bool = False,
           progress: Callable[[str], None] | None = None,
           ) -> OnnxVerification | TorchVerification:
    """``model``: an .onnx path or ModelProto, ``zoo:NAME`` (its ONNX export; ``fx=True``: the
    torch module), or ``path/to/file.py:Class`` (built with no arguments, random weights)."""
    import onnx

    if isinstance(model, onnx.ModelProto) or (
            isinstance(model, (str, os.PathLike)) and not os.fspath(model).startswith("zoo:")
            and ".py:" not in os.fspath(model)):
        text = model if isinstance(model, onnx.ModelProto) else os.fspath(model)
        if isinstance(text, str) and text.endswith(".pt2"):
            raise GraphcostError("verify does not run .pt2 programs: graphcost never unpickles "
                                 "their weights; verify the module (file.py:Class) instead")
        if train:
            raise GraphcostError("--train verifies a PyTorch training step: use zoo:NAME --fx "
                                 "or path/to/file.py:Class")
        if isinstance(text, str) and Path(text).is_dir():
            raise GraphcostError(f"{text}: is a directory, not a model file")
        if isinstance(text, str) and not Path(text).is_file():
            raise GraphcostError(f"{text}: no such file")
        return verify_onnx(model, repeat=repeat, progress=progress, batch=batch, dims=dims,
                           input_shapes=input_shapes, lifetimes=lifetimes,
                           include_inputs=include_inputs, inplace=inplace)
    text = os.fspath(model)
    if text.startswith("zoo:"):
        return _verify_zoo(text[4:], fx or train, batch, dict(dims or {}), input_shapes,
                           train, optimizer, repeat, depth, lifetimes, include_inputs, inplace,
                           progress)
    return _verify_file_class(text, batch, input_shapes, input_dtypes, train, optimizer, depth,
                              lifetimes, progress)


def _verify_zoo(name, fx, batch, dims, input_shapes, train, optimizer, repeat, depth,
                lifetimes, include_inputs, inplace, progress):
    from graphcost import models_zoo

    if name not in models_zoo.MODELS:
        raise GraphcostError(f"no zoo model {name!r}; known: "
                             + ", ".join(sorted(models_zoo.MODELS)))
    spec = models_zoo.get(name)
    if spec.meta_only:
        raise GraphcostError(f"zoo:{name} is never materialized (meta device only): verify "
                             "runs the model for real; pick a model that fits in memory")
    int_ranges = {k: tuple(v) for k, v in spec.int_ranges.items()}
    if not fx:
        try:
            path = models_zoo.cached_export(name)
        except models_zoo.ZooExportError as exc:
            raise GraphcostError(str(exc)) from None
        dims = {} if input_shapes else {**models_zoo.default_dims(name), **dims}
        return verify_onnx(path, name=f"zoo:{name}", repeat=repeat, int_ranges=int_ranges,
                           progress=progress, batch=batch, dims=dims,
                           input_shapes=input_shapes, lifetimes=lifetimes,
                           include_inputs=include_inputs, inplace=inplace)
    try:
        shapes = dict(input_shapes or models_zoo.input_shapes(
            name, batch or 1, **{**models_zoo.default_dims(name), **dims}))
    except TypeError as exc:
        raise GraphcostError(str(exc)) from None
    if input_shapes and batch is not None:
        shapes = {k: (batch, *v[1:]) for k, v in shapes.items()}
    module = models_zoo.build_model(name, eval=not train)
    inputs = _real_inputs(shapes, spec.input_dtypes, int_ranges)
    return verify_torch(module, tuple(inputs.values()), name=f"zoo:{name}", train=train,
                        optimizer=optimizer, depth=depth, lifetimes=lifetimes,
                        progress=progress)


def _verify_file_class(spec, batch, input_shapes, input_dtypes, train, optimizer, depth,
                       lifetimes, progress):
    import torch

    from graphcost.analyzer.frontends.torch_capture import fake_inputs, load_class

    if not input_shapes:
        raise GraphcostError(f"{spec}: pass the input sizes, e.g. --input-shape x=1x3x224x224")
    shapes = {k: tuple(v) for k, v in input_shapes.items()}
    if batch is not None:
        shapes = {k: (batch, *v[1:]) if v else v for k, v in shapes.items()}
    cls, cls_name = load_class(spec)
    torch.manual_seed(0)
    try:
        module = cls()
    except Exception as exc:
        raise GraphcostError(f"{cls_name}(): constructing it with no arguments failed "
                             f"({type(exc).__name__}: {exc})") from None
    fakes = fake_inputs(module, shapes, input_dtypes)  # checks the names against forward
    inputs = _real_inputs(shapes, {k: v.dtype for k, v in fakes.items()}, {})
    return verify_torch(module, inputs, name=cls_name, train=train, optimizer=optimizer,
                        depth=depth, lifetimes=lifetimes, progress=progress)


def _real_inputs(shapes: Mapping[str, Sequence[int]], dtypes: Mapping[str, Any],
                 int_ranges: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
    """Seeded random CPU tensors; integer inputs in their range (default [0, 2))."""
    import torch

    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, shape in shapes.items():
        dtype = dtypes.get(name, torch.float32)
        if dtype.is_floating_point:
            out[name] = torch.randn(tuple(shape), generator=gen, dtype=dtype)
        elif dtype == torch.bool:
            out[name] = torch.ones(tuple(shape), dtype=dtype)
        else:
            lo, hi = int_ranges.get(name, (0, 2))
            out[name] = torch.randint(lo, hi, tuple(shape), generator=gen, dtype=dtype)
    return out
