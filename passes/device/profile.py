"""A device profile: what kernels achieve on one machine, measured there by ``graphcost
calibrate`` (analyzer/measure/calibrate.py), and how well the time estimate built on it held
on the models it was checked against there.

The roofline (passes/device/roofline.py) prices a node at the datasheet's peak; a profile
prices it at what the machine was measured to reach for a call of that size:

- ``gemm``, ``conv``, ``grouped_conv``, ``attention``, ``pool``, ``random``, ``batch_norm``:
  achieved FLOP/s against FLOPs per call (a pooling window's compares or adds, dropout's draw
  and scale, a training batch norm's forward and backward together, counted as the rules
  count them), for each dtype measured (a curve: small calls reach a small share of the
  peak); a kind a profile did not measure is priced as its GEMM;
- ``memory``: achieved bytes/s against bytes moved per call (small calls stay in cache);
- ``launch``: seconds one kernel call costs beyond its work (eager PyTorch's dispatch, ONNX
  Runtime's per-node overhead), and ``view`` for a call that moves nothing (a reshape);
- ``python``: what eager PyTorch's forward adds per op beyond the dispatch (the model's
  Python: module calls, hooks, attribute reads), measured per traced node of a small model
  whose kernels do almost no work; a backward runs in autograd's C++ engine without it;
- ``autograd``: what eager autograd adds per node of a training step beyond its kernels'
  dispatch (recording the node in the forward, running it from the backward's engine),
  measured on a chain of tiny multiplies run forward and backward;
- ``optimizer``: what PyTorch's for-loop optimizer step adds per parameter tensor beyond its
  kernels (its Python: the state's lookups, the step count, the bias corrections), for each
  optimizer, measured on steps over many tiny tensors.

A profile holds one such set per engine (``torch``: eager PyTorch; ``onnxruntime``), each with
``validation``: the measured and the estimated wall time of the models calibrate ran. Their
median ratio is the engine's ``scale``, which every estimate is multiplied by (what the
microbenchmarks cannot see in a model: caches cold between layers, the allocator, ONNX
Runtime's fusions), and the runs' errors after it give the estimate's error band (``band``: the
90th percentile of the absolute relative errors; in-sample: benchmarks/time_cpu.py checks
models calibrate never ran). The file is JSON; ``profile_from_json`` checks every field before anything reads it
(analyzer/app/devices.py reads the file, bounded).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..choices import Optimizer
from ..costs.registry import KERNEL_CLASSES
from ..errors import GraphcostError

FORMAT = "graphcost-device-profile"
VERSION = 1
ENGINES = ("torch", "onnxruntime")
# the kinds a curve may be measured for: the GEMM and every kernel class a rule may name
ARITHMETIC = ("gemm", *sorted(k for k in KERNEL_CLASSES if k))
MAX_POINTS = 64          # per curve: a profile is a handful of measurements, not a dataset
MAX_RUNS = 256
# the for-loop steps a profile times: every optimizer graphcost prices
OPTIMIZERS = tuple(o.value for o in Optimizer if o is not Optimizer.NONE)


@dataclass(frozen=True)
class Curve:
    """Achieved rate against the size of a call, both > 0, sizes ascending; read log-log."""
    points: tuple[tuple[float, float], ...]

    def rate(self, size: float) -> float:
        """The rate at ``size``: interpolated log-log between the measured sizes, the end
        points' rates beyond them (never extrapolated)."""
        i = bisect.bisect_left(self.points, size, key=lambda p: p[0])
        if i == 0:
            return self.points[0][1]
        if i == len(self.points):
            return self.points[-1][1]
        (x0, y0), (x1, y1) = self.points[i - 1], self.points[i]
        f = (math.log(size) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))


@dataclass(frozen=True)
class Run:
    """One model calibrate ran: its measured and estimated wall time."""
    model: str
    measured_s: float
    estimated_s: float

    @property
    def error(self) -> float:
        return self.estimated_s / self.measured_s - 1


@dataclass(frozen=True)
class EngineProfile:
    launch_s: float                              # a kernel call's own cost
    view_s: float                                # a call that moves nothing
    arithmetic: Mapping[str, Mapping[str, Curve]]   # kind -> dtype -> FLOP/s curve
    memory: Curve                                # bytes/s
    validation: tuple[Run, ...] = ()
    python_s: float = 0.0                        # eager forward: the Python around an op
    # the median of measured / estimated over the validation runs, which every estimate is
    # multiplied by (what the microbenchmarks miss in a model: cache misses between layers,
    # the allocator, ONNX Runtime's fusions); 1 before validation
    scale: float = 1.0
    # a GPU's host time per op (eager PyTorch's Python, dispatcher and launch call): the GPU
    # runs behind the host, so a step takes the longer of the two; 0: the host runs the
    # kernels itself (a CPU: ``launch_s`` and ``python_s`` already count it)
    host_s: float = 0.0
    # eager autograd per node of a training step: recording it in the forward and running it
    # from the backward's C++ engine, beyond its kernels' dispatch (0: not measured)
    autograd_s: float = 0.0
    # optimizer -> the for-loop step's Python per parameter tensor, beyond its kernels
    optimizer_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def band(self) -> float | None:
        """The 90th percentile of the validation's absolute relative errors (nearest rank);
        None without validation runs."""
        errors = sorted(abs(r.error) for r in self.validation)
        if not errors:
            return None
        return errors[min(len(errors) - 1, math.ceil(0.9 * len(errors)) - 1)]

    def flops_rate(self, kind: str, dtype: str, flops_per_call: float) -> float:
        """Achieved FLOP/s for a call of ``kind`` in ``dtype``: kinds and dtypes not measured
        fall back to the GEMM's, then to fp32."""
        curves = self.arithmetic.get(kind) or self.arithmetic["gemm"]
        used = dtype if dtype in curves else "fp32" if "fp32" in curves else next(iter(curves))
        return curves[used].rate(flops_per_call)


@dataclass(frozen=True)
class DeviceProfile:
    name: str                       # what the report calls it
    measured: Mapping[str, str]     # date, torch, threads, cpu / gpu: where and when
    engines: Mapping[str, EngineProfile] = field(default_factory=dict)

    @property
    def gpu(self) -> str | None:
        """The GPU the profile was measured on (graphcost calibrate --device); None: a CPU's."""
        return self.measured.get("gpu") or None


def _fail(where: str, what: str) -> GraphcostError:
    return GraphcostError(f"device profile: {where}: {what}")


def _number(v: Any, where: str, *, positive: bool = True) -> float:
    ok = (not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
          and (v > 0 if positive else v >= 0))
    if not ok:
        wanted = "a positive number" if positive else "a number ≥ 0"
        raise _fail(where, f"expected {wanted}, got {str(v)[:40]!r}")
    return float(v)


def _curve(v: Any, where: str) -> Curve:
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_POINTS:
        raise _fail(where, f"expected a list of 1 to {MAX_POINTS} [size, rate] pairs")
    points = []
    for i, p in enumerate(v):
        if not isinstance(p, list) or len(p) != 2:
            raise _fail(f"{where}[{i}]", "expected a [size, rate] pair")
        points.append((_number(p[0], f"{where}[{i}][0]"), _number(p[1], f"{where}[{i}][1]")))
    if any(b[0] <= a[0] for a, b in zip(points, points[1:])):
        raise _fail(where, "sizes must ascend")
    return Curve(tuple(points))


def _mapping(v: Any, where: str, keys: tuple[str, ...] | None = None) -> dict:
    if not isinstance(v, dict):
        raise _fail(where, "expected an object")
    unknown = [k for k in v if keys is not None and k not in keys]
    if unknown:
        raise _fail(where, f"unknown key {str(unknown[0])[:40]!r}; known: {', '.join(keys or ())}")
    return v


def _text(v: Any, where: str) -> str:
    if not isinstance(v, str) or len(v) > 200:
        raise _fail(where, "expected a string of at most 200 characters")
    return v


def _engine(v: Any, where: str) -> EngineProfile:
    keys = ("launch_s", "view_s", "arithmetic", "memory", "validation", "python_s", "scale",
            "host_s", "autograd_s", "optimizer_s")
    d = _mapping(v, where, keys)
    missing = [k for k in keys[:4] if k not in d]
    if missing:
        raise _fail(where, f"missing {missing[0]!r}")
    arithmetic = {}
    for kind, by_dtype in _mapping(d["arithmetic"], f"{where}.arithmetic", ARITHMETIC).items():
        curves = _mapping(by_dtype, f"{where}.arithmetic.{kind}")
        if not curves:
            raise _fail(f"{where}.arithmetic.{kind}", "no dtype measured")
        arithmetic[kind] = {_text(dt, f"{where}.arithmetic.{kind}"):
                            _curve(c, f"{where}.arithmetic.{kind}.{dt}")
                            for dt, c in curves.items()}
    if "gemm" not in arithmetic:
        raise _fail(f"{where}.arithmetic", "missing 'gemm'")
    runs = d.get("validation", [])
    if not isinstance(runs, list) or len(runs) > MAX_RUNS:
        raise _fail(f"{where}.validation", f"expected a list of at most {MAX_RUNS} runs")
    return EngineProfile(
        _number(d["launch_s"], f"{where}.launch_s", positive=False),
        _number(d["view_s"], f"{where}.view_s", positive=False), arithmetic,
        _curve(d["memory"], f"{where}.memory"),
        tuple(_run(r, f"{where}.validation[{i}]") for i, r in enumerate(runs)),
        _number(d.get("python_s", 0.0), f"{where}.python_s", positive=False),
        _number(d.get("scale", 1.0), f"{where}.scale"),
        _number(d.get("host_s", 0.0), f"{where}.host_s", positive=False),
        _number(d.get("autograd_s", 0.0), f"{where}.autograd_s", positive=False),
        {name: _number(v, f"{where}.optimizer_s.{name}", positive=False)
         for name, v in _mapping(d.get("optimizer_s", {}), f"{where}.optimizer_s",
                                 OPTIMIZERS).items()})


def _run(v: Any, where: str) -> Run:
    d = _mapping(v, where, ("model", "measured_s", "estimated_s"))
    return Run(_text(d.get("model"), f"{where}.model"),
               _number(d.get("measured_s"), f"{where}.measured_s"),
               _number(d.get("estimated_s"), f"{where}.estimated_s"))


def profile_from_json(data: Any) -> DeviceProfile:
    """The profile a parsed JSON document holds, every field checked: a GraphcostError naming
    the first field that is not what it should be."""
    d = _mapping(data, "the file", ("format", "version", "name", "measured", "engines"))
    if d.get("format") != FORMAT:
        raise _fail("format", f"expected {FORMAT!r} (a file graphcost calibrate wrote)")
    if d.get("version") != VERSION:
        raise _fail("version", f"expected {VERSION}, got {str(d.get('version'))[:20]!r}")
    measured = _mapping(d.get("measured", {}), "measured")
    engines = _mapping(d.get("engines"), "engines", ENGINES)
    if not engines:
        raise _fail("engines", "no engine measured")
    return DeviceProfile(_text(d.get("name"), "name"),
                         {_text(k, "measured"): _text(v, f"measured.{k}")
                          for k, v in measured.items()},
                         {k: _engine(v, f"engines.{k}") for k, v in engines.items()})


def profile_to_json(profile: DeviceProfile) -> dict:
    """The JSON document ``profile_from_json`` reads back."""
    def engine(e: EngineProfile) -> dict:
        return {"launch_s": e.launch_s, "view_s": e.view_s, "python_s": e.python_s,
                "scale": e.scale, **({"host_s": e.host_s} if e.host_s else {}),
                **({"autograd_s": e.autograd_s} if e.autograd_s else {}),
                **({"optimizer_s": dict(e.optimizer_s)} if e.optimizer_s else {}),
                "arithmetic": {k: {dt: [list(p) for p in c.points] for dt, c in by.items()}
                               for k, by in e.arithmetic.items()},
                "memory": [list(p) for p in e.memory.points],
                "validation": [{"model": r.model, "measured_s": r.measured_s,
                                "estimated_s": r.estimated_s} for r in e.validation]}
    return {"format": FORMAT, "version": VERSION, "name": profile.name,
            "measured": dict(profile.measured),
            "engines": {k: engine(e) for k, e in profile.engines.items()}}
