"""Roofline time per node on a device, and whether the run fits its memory: a lower bound,
not a benchmark.

time(node) = max(FLOPs / peak FLOP/s of the node's dtype, (bytes read + bytes written) / memory
bandwidth) — Williams, Waterman & Patterson, "Roofline" (CACM 2009). It assumes every kernel
reaches the datasheet peak, every byte the cost pass counts crosses DRAM once (no cache reuse
across nodes, no fusion), and no launch overhead: real runs are slower.

The dtype of a node is that of its first typed input: half types use the device's fp16/bf16
(tensor-core) rate, 8-bit integer inputs its int8 rate, float8 inputs its fp8 rate (where the
part has one: ``DeviceRates.narrow_flops``), everything else fp32 — or tf32 for
multiply-accumulate ops when ``tf32`` is set (PyTorch's ``allow_tf32``). A dtype the device has
no fast path for falls back to its fp32 rate.

The device is a ``DeviceRates`` value (the device table and its parsing live in
analyzer/app/devices.py); whether the run fits it is passes/device/fits.py's answer, which the
roofline section carries (``fit``).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Mapping

from ..device_rates import DeviceRates
from ..ir import INTERNAL, QUANT_DTYPES, Graph
from .fits import Fit

_HALF = {"float16": "fp16", "bfloat16": "bf16"}
DTYPES = ("fp32", "tf32", "fp16", "bf16", "int8")


@dataclass(frozen=True, slots=True)
class NodeTime:
    index: int
    seconds: float
    intensity: float | None  # FLOPs per byte moved (None: FLOPs but nothing moved)
    bound: str               # "compute" | "memory" | "" (neither FLOPs nor bytes)
    dtype: str               # the rate used: fp32 | tf32 | fp16 | bf16 | int8 | fp8


@dataclass(frozen=True)
class Roofline:
    """The report's ``roofline`` section."""
    device: str
    label: str
    peak_flops: Mapping[str, float | None]
    bandwidth: float
    memory_bytes: int
    tf32: bool
    total_seconds: float
    compute_seconds: float        # the part of the total spent in compute-bound nodes
    memory_seconds: float         # ... and in memory-bound ones
    top: tuple[int, ...]          # the ten slowest nodes (indices), slowest first
    tensor_bytes: int             # the report's peak: everything live on the device
    fit: Fit                      # what the run needs there against what the device offers
    fallbacks: tuple[str, ...]    # dtypes that used the fp32 rate for lack of a fast path
    nodes: tuple[NodeTime, ...]
    device_rates: DeviceRates = field(metadata=INTERNAL)


def node_dtype(graph: Graph, node, macs: int, tf32: bool) -> str:
    for name in node.inputs:
        v = graph.values.get(name) if name else None
        if v is None or v.spec.dtype == "undefined":
            continue
        dt = v.spec.dtype
        if dt in _HALF:
            return _HALF[dt]
        if dt in QUANT_DTYPES:
            return "int8"
        if dt.startswith("float8"):  # (torchao's float8 linears' _scaled_mm)
            return "fp8"
        break
    return "tf32" if tf32 and macs else "fp32"


def _seconds(count: int, rate: float) -> float:
    """count / rate, at most the largest float: a count past 2^1024 (nested loops of 2^63
    trips, labelled by passes/magnitude.py) has no float of its own."""
    try:
        return count / rate
    except OverflowError:
        return sys.float_info.max


def roofline(graph: Graph, node_costs, device: DeviceRates, *, tensor_bytes: int,
             fit: Fit, tf32: bool = False) -> Roofline:
    """``node_costs``: the cost pass's per-node costs, aligned with ``graph.nodes``;
    ``tensor_bytes``: what the run holds at its peak (the report's peak)."""
    bw = device.bandwidth
    out = []
    compute = memory = 0.0
    fallbacks = set()
    for node, nc in zip(graph.nodes, node_costs):
        c = nc.cost
        dtype = node_dtype(graph, node, c.macs, tf32)
        if device.own_rate(dtype) is None:
            fallbacks.add(dtype)
        t_flops = _seconds(c.flops, device.peak(dtype))
        moved = c.bytes_read + c.bytes_written
        t_bytes = _seconds(moved, bw)
        seconds = max(t_flops, t_bytes)
        if seconds == 0.0:
            bound = ""
        elif t_flops >= t_bytes:
            bound = "compute"
            compute = min(compute + seconds, sys.float_info.max)
        else:
            bound = "memory"
            memory = min(memory + seconds, sys.float_info.max)
        intensity = _seconds(c.flops, moved) if moved else None if c.flops else 0.0
        out.append(NodeTime(node.index, seconds, intensity, bound, dtype))
    top = tuple(t.index for t in sorted(out, key=lambda t: (-t.seconds, t.index))[:10]
                if t.seconds > 0)
    return Roofline(device.name, device.label, dict(device.peak_flops), device.bandwidth,
                    device.memory, tf32, min(compute + memory, sys.float_info.max), compute,
                    memory, top, tensor_bytes, fit, tuple(sorted(fallbacks)), tuple(out),
                    device)


def flops_by_dtype(graph: Graph, node_costs) -> dict[str, int]:
    """FLOPs per arithmetic rate (fp32 | fp16 | bf16 | int8), as ``roofline`` prices them
    (tf32 off): an int8 model's integer ops land under int8."""
    out: dict[str, int] = {}
    for node, nc in zip(graph.nodes, node_costs):
        if nc.cost.flops:
            dt = node_dtype(graph, node, nc.cost.macs, False)
            out[dt] = out.get(dt, 0) + nc.cost.flops
    return out
