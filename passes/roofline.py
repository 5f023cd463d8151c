"""Roofline time per node on a device: a lower bound, not a benchmark.

time(node) = max(FLOPs / peak FLOP/s of the node's dtype, (bytes read + bytes written) / memory
bandwidth) — Williams, Waterman & Patterson, "Roofline" (CACM 2009). It assumes every kernel
reaches the datasheet peak, every byte the cost pass counts crosses DRAM once (no cache reuse
across nodes, no fusion), and no launch overhead: real runs are slower.

The dtype of a node is that of its first typed input: half types use the device's fp16/bf16
(tensor-core) rate, 8-bit integer inputs its int8 rate, everything else fp32 — or tf32 for
multiply-accumulate ops when ``tf32`` is set (PyTorch's ``allow_tf32``). A dtype the device has
no fast path for falls back to its fp32 rate.
"""
from __future__ import annotations

from dataclasses import dataclass

from graphcost.analyzer.devices import Device
from graphcost.analyzer.ir import QUANT_DTYPES, Graph

_HALF = {"float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True, slots=True)
class NodeTime:
    index: int
    seconds: float
    intensity: float     # FLOPs per byte moved (inf when nothing moves)
    bound: str           # "compute" | "memory" | "" (neither FLOPs nor bytes)
    dtype: str           # the rate used: fp32 | tf32 | fp16 | bf16 | int8


@dataclass(frozen=True)
class RooflineResult:
    nodes: tuple[NodeTime, ...]
    total_seconds: float
    compute_seconds: float    # the part of the total spent in compute-bound nodes
    memory_seconds: float     # ... and in memory-bound ones
    fallbacks: tuple[str, ...]  # dtypes that used the fp32 rate for lack of a fast path


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
        break
    return "tf32" if tf32 and macs else "fp32"


def roofline(graph: Graph, node_costs, device: Device, *, tf32: bool = False) -> RooflineResult:
    """``node_costs``: the cost pass's per-node costs, aligned with ``graph.nodes``."""
    bw = device.bandwidth
    out = []
    compute = memory = 0.0
    fallbacks = set()
    for node, nc in zip(graph.nodes, node_costs):
        c = nc.cost
        dtype = node_dtype(graph, node, c.macs, tf32)
        if device.peak_flops.get(dtype) is None:
            fallbacks.add(dtype)
        t_flops = c.flops / device.peak(dtype)
        moved = c.bytes_read + c.bytes_written
        t_bytes = moved / bw
        seconds = max(t_flops, t_bytes)
        if seconds == 0.0:
            bound = ""
        elif t_flops >= t_bytes:
            bound = "compute"
            compute += seconds
        else:
            bound = "memory"
            memory += seconds
        intensity = c.flops / moved if moved else float("inf") if c.flops else 0.0
        out.append(NodeTime(node.index, seconds, intensity, bound, dtype))
    return RooflineResult(tuple(out), compute + memory, compute, memory,
                          tuple(sorted(fallbacks)))


def flops_by_dtype(graph: Graph, node_costs) -> dict[str, int]:
    """FLOPs per arithmetic rate (fp32 | fp16 | bf16 | int8), as ``roofline`` prices them
    (tf32 off): an int8 model's integer ops land under int8."""
    out: dict[str, int] = {}
    for node, nc in zip(graph.nodes, node_costs):
        if nc.cost.flops:
            dt = node_dtype(graph, node, nc.cost.macs, False)
            out[dt] = out.get(dt, 0) + nc.cost.flops
    return out
