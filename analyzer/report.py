"""The typed result of an analysis and its JSON form (the stable contract in README.md).

Reports render results; they never compute costs. ``to_json`` is deterministic: identical input
gives identical bytes (no timestamps, no paths beyond the model name, keys in fixed order).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1

CONVENTION = {
    "macs": "multiply-accumulates of Conv, ConvTranspose, Gemm, MatMul, Einsum and attention: "
            "output elements x reduction length, bias excluded",
    "flops": "2 x MACs + every other arithmetic operation, counted per op as documented in "
             "README (bias adds, elementwise, normalization, softmax, pooling, reductions); "
             "data movement (views, copies, gathers) is 0",
    "bytes_read": "bytes of every distinct input tensor a node reads (weights included); views "
                  "read nothing; slices and gathers read only what they select",
    "bytes_written": "bytes of a node's outputs (0 for views)",
    "params": "trainable weights, each counted once however many nodes read it; BatchNorm "
              "running statistics are buffers",
    "roofline": "lower-bound time per node on a device: max(FLOPs / peak FLOP/s of the "
                "node's dtype, (bytes_read + bytes_written) / bandwidth); not a benchmark",
    "receptive_field": "conv/pool chains: input pixels one output element sees (rf), input "
                       "pixels between adjacent outputs (jump), centre of output 0's field in "
                       "input coordinates, pixel i spanning [i, i+1) (start)",
    "memory": "activation storage at inference: each tensor lives from its producer to its last "
              "consumer (dataflow), or, for eager PyTorch, at least until the module call it "
              "was passed into returns (eager); views alias their input",
}


@dataclass(frozen=True)
class Totals:
    params: int
    param_bytes: int
    buffers: int
    buffer_bytes: int
    macs: int
    flops: int
    bytes_read: int
    bytes_written: int


@dataclass(frozen=True)
class OpTypeRow:
    op: str
    count: int
    macs: int
    flops: int
    bytes_read: int
    bytes_written: int


@dataclass(frozen=True)
class Coverage:
    nodes: int
    covered: int
    unsupported: dict[str, int]      # op -> nodes with no cost rule
    unknown_shape: dict[str, int]    # op -> nodes whose shapes stayed unknown

    @property
    def percent(self) -> float:
        return 100.0 * self.covered / self.nodes if self.nodes else 100.0


@dataclass(frozen=True)
class LiveTensor:
    name: str
    bytes: int


@dataclass(frozen=True)
class Memory:
    include_inputs: bool
    lifetimes: str            # "dataflow" or "eager"
    naive_sum_bytes: int
    peak_bytes: int
    peak_node: str | None
    peak_node_index: int
    live_at_peak: tuple[LiveTensor, ...]
    arena_bytes: int | None      # None: not planned (a training step's joint graph)
    timeline: tuple[int, ...]

    @property
    def fragmentation(self) -> float:
        if self.arena_bytes is None or not self.peak_bytes:
            return 0.0
        return self.arena_bytes / self.peak_bytes - 1.0


@dataclass(frozen=True)
class NodeRow:
    index: int
    name: str
    op: str
    scope: str
    input_shapes: tuple[str, ...]   # activation inputs only (weights are in params)
    output_shapes: tuple[str, ...]
    params: int
    output_bytes: int
    macs: int
    flops: int
    bytes_read: int
    bytes_written: int
    status: str                     # ok | unsupported | unknown_shape
    repeat: int = 1

    @property
    def bytes_total(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class ModuleRow:
    path: str           # module path ("layer1.0.conv1"); "" is the whole model
    type: str           # class name where the frontend knows it (FX), else ""
    depth: int
    nodes: int
    params: int
    macs: int
    flops: int
    output_bytes: int


@dataclass(frozen=True)
class Training:
    """One steady-state training step (see passes/training.py for the model)."""
    optimizer: str
    param_bytes: int
    buffer_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    step_temp_bytes: int
    peak_bytes: int
    peak_phase: str
    peak_node: str | None
    breakdown: dict[str, int]
    timeline: tuple[int, ...]
    phases: tuple[str, ...]
    checkpoint: "Checkpoint | None" = None
    what_if: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "param_bytes": self.param_bytes,
                "buffer_bytes": self.buffer_bytes, "grad_bytes": self.grad_bytes,
                "optimizer_state_bytes": self.optimizer_state_bytes,
                "step_temp_bytes": self.step_temp_bytes, "peak_bytes": self.peak_bytes,
                "peak_phase": self.peak_phase, "peak_node": self.peak_node,
                "breakdown_at_peak": dict(self.breakdown), "timeline": list(self.timeline),
                "phases": list(self.phases),
                "checkpoint": self.checkpoint.to_dict() if self.checkpoint else None,
                "what_if": {k: dict(v) for k, v in self.what_if.items()}}


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint plan: the step's peak without and with it, and what it costs."""
    mode: str                    # names | every | sqrt | auto
    segments: tuple[str, ...]
    peak_without_bytes: int
    peak_bytes: int
    recompute_flops: int
    recompute_pct: float         # of the whole step's FLOPs
    budget_bytes: int | None
    timeline: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "segments": list(self.segments),
                "peak_without_bytes": self.peak_without_bytes, "peak_bytes": self.peak_bytes,
                "recompute_flops": self.recompute_flops,
                "recompute_pct": round(self.recompute_pct, 3), "budget_bytes": self.budget_bytes,
                "timeline": list(self.timeline)}


@dataclass(frozen=True)
class NodeTime:
    index: int
    seconds: float
    intensity: float     # FLOPs per byte moved
    bound: str           # compute | memory | "" (nothing to do)
    dtype: str           # which peak rate was used: fp32 | tf32 | fp16 | bf16 | int8


@dataclass(frozen=True)
class Roofline:
    """Lower-bound time on a device (passes/roofline.py) and whether the step fits its memory."""
    device: str
    label: str
    peak_flops: dict[str, float | None]
    bandwidth: float
    memory_bytes: int
    tf32: bool
    total_seconds: float
    compute_seconds: float
    memory_seconds: float
    nodes: tuple[NodeTime, ...]
    top: tuple[int, ...]          # the ten most expensive nodes (indices), slowest first
    tensor_bytes: int             # inference: params + buffers + activation peak; training: peak
    context_bytes: int            # framework overhead: CUDA context, workspaces
    allocator_fraction: float     # caching-allocator rounding and reserved blocks
    required_bytes: int           # tensor_bytes · (1 + allocator_fraction) + context_bytes
    fallbacks: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        return self.required_bytes <= self.memory_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "label": self.label,
                "peak_flops": dict(self.peak_flops), "bandwidth": self.bandwidth,
                "memory_bytes": self.memory_bytes, "tf32": self.tf32,
                "total_seconds": self.total_seconds, "compute_seconds": self.compute_seconds,
                "memory_seconds": self.memory_seconds, "top": list(self.top),
                "tensor_bytes": self.tensor_bytes, "context_bytes": self.context_bytes,
                "allocator_fraction": self.allocator_fraction,
                "required_bytes": self.required_bytes, "fits": self.fits,
                "fallbacks": list(self.fallbacks),
                "nodes": [{"index": n.index, "seconds": n.seconds,
                           "intensity": n.intensity if n.intensity != float("inf") else None,
                           "bound": n.bound, "dtype": n.dtype} for n in self.nodes]}


@dataclass(frozen=True)
class ReceptiveField:
    """A conv/pool chain node's field in input pixels, per spatial axis (passes/receptive_field)."""
    index: int
    rf: tuple[int, ...]
    jump: tuple[int, ...]
    start: tuple[float, ...]


@dataclass(frozen=True)
class Report:
    model: str
    source: str
    batch: int
    dims: dict[str, int]
    totals: Totals
    by_op_type: tuple[OpTypeRow, ...]
    coverage: Coverage
    memory: Memory
    nodes: tuple[NodeRow, ...]
    warnings: tuple[str, ...] = ()
    shape_issues: tuple[str, ...] = field(default=())
    modules: tuple[ModuleRow, ...] = ()
    training: Training | None = None
    roofline: Roofline | None = None
    receptive_field: tuple[ReceptiveField, ...] = ()   # empty unless the graph is a CNN
    moe: Any = None     # passes.moe.MoE (frozen, computed there) when the model has experts

    def to_dict(self) -> dict[str, Any]:
        t, c, m = self.totals, self.coverage, self.memory
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "source": self.source,
            "batch": self.batch,
            "dims": dict(sorted(self.dims.items())),
            "convention": CONVENTION,
            "totals": {"params": t.params, "param_bytes": t.param_bytes,
                       "buffers": t.buffers, "buffer_bytes": t.buffer_bytes,
                       "macs": t.macs, "flops": t.flops,
                       "bytes_read": t.bytes_read, "bytes_written": t.bytes_written},
            "by_op_type": {r.op: {"count": r.count, "macs": r.macs, "flops": r.flops,
                                  "bytes_read": r.bytes_read, "bytes_written": r.bytes_written}
                           for r in self.by_op_type},
            "coverage": {"nodes": c.nodes, "covered": c.covered,
                         "percent": round(c.percent, 2),
                         "unsupported": dict(c.unsupported),
                         "unknown_shape": dict(c.unknown_shape)},
            "memory": {"include_inputs": m.include_inputs, "lifetimes": m.lifetimes,
                       "naive_sum_bytes": m.naive_sum_bytes,
                       "peak_bytes": m.peak_bytes, "peak_node": m.peak_node,
                       "peak_node_index": m.peak_node_index,
                       "live_at_peak": [{"name": x.name, "bytes": x.bytes}
                                        for x in m.live_at_peak],
                       "arena_bytes": m.arena_bytes,
                       "fragmentation": round(m.fragmentation, 6),
                       "timeline": list(m.timeline)},
            "warnings": list(self.warnings),
            "training": self.training.to_dict() if self.training else None,
            "roofline": self.roofline.to_dict() if self.roofline else None,
            "moe": self.moe.to_dict() if self.moe else None,
            "receptive_field": [{"index": f.index, "rf": list(f.rf), "jump": list(f.jump),
                                 "start": list(f.start)} for f in self.receptive_field],
            "modules": [{"path": m.path, "type": m.type, "depth": m.depth, "nodes": m.nodes,
                         "params": m.params, "macs": m.macs, "flops": m.flops,
                         "output_bytes": m.output_bytes} for m in self.modules],
            "nodes": [{"index": n.index, "name": n.name, "op": n.op, "scope": n.scope,
                       "input_shapes": list(n.input_shapes),
                       "output_shapes": list(n.output_shapes),
                       "params": n.params, "output_bytes": n.output_bytes,
                       "macs": n.macs, "flops": n.flops, "bytes_read": n.bytes_read,
                       "bytes_written": n.bytes_written, "status": n.status,
                       "repeat": n.repeat} for n in self.nodes],
        }

    def to_json(self) -> str:
        # Compact separators keep json's C encoder (indent= falls back to pure Python).
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n"
