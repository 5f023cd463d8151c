"""The result of an analysis: the passes' own results, assembled, and their JSON form.

A Report holds each pass's result object as it is (``memory`` is passes.memory.liveness.Liveness,
``training`` passes.training.memory.TrainingMemory, ``roofline`` passes.device.roofline.Roofline,
``coverage`` and ``by_op_type`` the cost pass's, ``modules`` passes.graph.modules.ModuleCost …);
only ``totals`` (the cost and parameter passes summed up) and ``nodes`` (one row per node,
joining every pass) are made here. One generic serializer turns the whole into JSON (the
stable contract in README.md): dataclass fields in declaration order, minus fields marked
INTERNAL, plus the properties a class lists in ``JSON_PROPERTIES``. ``to_json`` is
deterministic: identical input gives identical bytes (no timestamps, no absolute paths).
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Mapping

from ...passes.costs import Coverage, OpTotals
from ...passes.device.roofline import Roofline
from ...passes.device.time_estimate import TimeEstimate
from ...passes.graph.attention_dispatch import AttentionUse
from ...passes.graph.modules import ModuleCost
from ...passes.graph.moe import MoE
from ...passes.graph.receptive_field import NodeField
from ...passes.ir import INTERNAL
from ...passes.memory.bounds import Bounds
from ...passes.memory.liveness import Liveness
from ...passes.memory.peak import Peak
from ...passes.parallel.pipeline import PipelineMemory
from ...passes.parallel.step import ParallelMemory
from ...passes.serving.analysis import Serving
from ...passes.training.memory import TrainingMemory

SCHEMA_VERSION = 20  # 2: "attention"; 3: what_if "bf16_master" (was "bf16_mixed");
# 4: roofline.fit and serving.fit (was required_bytes, fits, context_bytes,
# allocator_fraction); 5: "allocator"; 6: parallel.reserved_peak_bytes and
# serving.reserved_peak_bytes (the caching allocator replayed per rank and per serving batch);
# 7: memory, training and serving .reserved_by_phase (what the replay reserved by each phase);
# 8: one peak shape: `peak` in memory/training/parallel/serving and at the top; training.loss
# (the loss the step backpropagated); parallel.mesh (the layout as a device mesh);
# 9: time (the estimate a device profile gives, with its error band); 10: parallel.comm.by_dim
# (wire bytes by mesh dimension: HSDP's all-reduce over dp_replicate); 11: pipeline (every
# pipeline stage's rank under its schedule); 12: time on a GPU without a profile (its
# datasheet at published kernel shares: time.basis), a parallel rank's time (time.
# communication_seconds, overlapped_seconds, tokens_per_second, mfu, hfu), time.host_seconds,
# parallel.comm.calls_by_dim; 13: serving.collectives (a tensor-parallel replica's) and
# serving.time's engine and communication seconds; 14: pipeline.mesh and pipeline.comm (a
# pipeline beside fully_shard and tensor parallelism: the layout, its collectives by dimension);
# 15: pipeline.stages_per_rank and per_stage[].chunks (the interleaved schedule's ranks);
# 16: parallel.units[].ep and parallel.comm.all_to_all_bytes (expert parallelism); 17:
# serving.time.profile (a calibrated GPU profile priced the eager steps); 18:
# parallel.units[].gathered_bytes (what a unit's all-gather moves: float8 weights one byte);
# 19: training.reserved_peak_bytes null (reserved_by_phase empty) beside a parallel layout or
# a pipeline, whose ranks are replayed instead (parallel.reserved_peak_bytes, pipeline's);
# 20: training.flushing, parallel.flushing and roofline.fit.flushes (a step or a rank held to
# the device by flushing the allocator's cache)

CONVENTION: Mapping[str, str] = MappingProxyType({
    "macs": "multiply-accumulates of Conv, ConvTranspose, Gemm, MatMul, Einsum and attention: "
            "output elements x reduction length, bias excluded",
    "flops": "2 x MACs + every other arithmetic operation, counted per op as documented in "
             "README (bias adds, elementwise, normalization, softmax, pooling, reductions); "
             "data movement (views, copies, gathers) is 0",
    "bytes_read": "bytes of every distinct input tensor a node reads (weights included); views "
                  "read nothing; slices and gathers read only what they select",
    "bytes_written": "bytes of a node's outputs (0 for views)",
    "params": "trainable weights, each counted once however many nodes read it; BatchNorm "
              "running statistics are buffers; quantized weights count their logical "
              "elements, param_bytes their storage, scales and zero points are quant_meta",
    "bound": "a node whose output size depends on the data (NonZero, NonMaxSuppression, "
             "TopK with a tensor k …) or whose count is a worst case is costed at an upper "
             "bound; the node's bound says what it assumes. Sizes the data decides (torch's "
             "u0, u1…) stand at the upper ends of their ranges; bounds lists them and the "
             "totals and activation peak at the lower ends",
    "roofline": "lower-bound time per node on a device: max(FLOPs / peak FLOP/s of the "
                "node's dtype, (bytes_read + bytes_written) / bandwidth); not a benchmark",
    "fit": "roofline.fit: whether the run fits the device: needs = the reserved peak (the "
           "allocator replayed; an estimate, tensors x 1.1, where not replayed: a checkpoint "
           "plan) + the cuBLAS workspaces the replay does not hold (an inference replay holds "
           "its own) + NCCL's buffers (data-parallel ranks) + the CUDA context, each a part "
           "with its source, against offers (what the driver gives a process, where "
           "measured); margin = offers - needs",
    "receptive_field": "conv/pool chains: input pixels one output element sees (rf), input "
                       "pixels between adjacent outputs (jump), centre of output 0's field in "
                       "input coordinates, pixel i spanning [i, i+1) (start)",
    "memory": "activation storage at inference: each tensor lives from its producer to its last "
              "consumer (dataflow), or, for eager PyTorch, at least until the module call it "
              "was passed into returns (eager; the graph inputs to the end, as the caller "
              "holds them); views alias their input; graph inputs count unless "
              "include_inputs is false",
    "reserved_peak_bytes": "memory.reserved_peak_bytes (inference, two batches) and "
                           "training.reserved_peak_bytes (two steps, optimizer state created "
                           "in the first); with a GPU device each matmul thread's cuBLAS "
                           "workspace from its first matmul on and the kernels' temporaries "
                           "(reductions' staging buffers, broadcast matmul operands' copies, "
                           "the attention backward's temporaries and, at inference, cuDNN's "
                           "convolution workspaces): the bytes PyTorch's CUDA caching allocator would "
                           "reserve at default settings (512 B rounding, 2 MiB and 20 MiB "
                           "segments, best-fit splitting; parameters and buffers allocated "
                           "first), as a GPU runs out of them; the fit's first part",
    "peak_bytes": "everything the run holds on the device at its peak: parameters + buffers + "
                  "the activation peak at inference; a training step's peak (parameters, "
                  "buffers, gradients, optimizer state, activations incl. the input batch "
                  "unless include_inputs is false, temporaries); with a data-parallel "
                  "strategy (parallel), the worst rank's peak on its device",
    "peak": "the peak the fit judges, in one shape (memory, training, parallel and serving "
            "each have theirs): allocated_bytes (the tensors live at it), reserved_bytes (the "
            "caching allocator's replayed peak; null where not replayed: a checkpoint plan), "
            "phase, node, by_category, threads (one cuBLAS workspace each) and world_size; the "
            "serving batch's when reviewed for serving, one rank's with parallel, the "
            "checkpointed step's under a checkpoint plan",
    "parallel": "one rank's training step under a data-parallel strategy: its micro-batch is "
                "the report's batch (global batch = batch x world_size); parameters, "
                "gradients and optimizer state as the strategy shards them (dim 0 padded to a "
                "multiple of world_size), activations, communication buffers (DDP buckets, "
                "FSDP's gathered units, all-gather and reduce-scatter buffers), temporaries; "
                "offloaded bytes are host_bytes; comm bytes per step per rank with a ring "
                "algorithm's lower-bound time on the interconnect",
    "pipeline": "every pipeline stage's rank: its blocks, its peak under the schedule (its "
                "parameters, gradients and optimizer state, each in-flight micro-batch's saved "
                "tensors and received input, the last stage's kept outputs); the report's "
                "batch is one micro-batch and its other sections the whole model at it",
})


@dataclass(frozen=True)
class Totals:
    """The cost pass's totals beside the parameter pass's counts."""
    params: int
    param_bytes: int
    buffers: int
    buffer_bytes: int
    macs: int
    flops: int
    bytes_read: int
    bytes_written: int
    quant_meta: int = 0                  # quantization scales / zero points (elements)
    quant_meta_bytes: int = 0
    param_bytes_by_dtype: Mapping[str, int] = field(default_factory=dict)  # as stored
    flops_by_dtype: Mapping[str, int] = field(default_factory=dict)  # by the roofline's rate


@dataclass(frozen=True)
class NodeRow:
    """One node as every pass sees it (the per-node table)."""
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
    bound: str | None = None        # the cost is an upper bound: what it assumes

    @property
    def bytes_total(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass(frozen=True)
class Report:
    model: str
    source: str
    batch: int
    dims: Mapping[str, int]
    totals: Totals
    by_op_type: Mapping[str, OpTotals]
    coverage: Coverage
    memory: Liveness
    warnings: tuple[str, ...] = ()
    traced_layers: str = ""                    # a stack traced as three blocks (Graph's)
    # the kernels a training step's attention calls were traced as (passes/graph/attention_dispatch.py)
    attention: tuple[AttentionUse, ...] = ()
    # the caching allocator's settings the reserved figures were replayed with, as
    # PYTORCH_CUDA_ALLOC_CONF spells them ("": PyTorch's defaults)
    allocator: str = ""
    training: TrainingMemory | None = None
    parallel: ParallelMemory | None = None      # one rank's share of the training step
    pipeline: PipelineMemory | None = None      # every pipeline stage's rank (--parallel pp=N)
    roofline: Roofline | None = None
    time: TimeEstimate | None = None           # the estimate with a device profile (calibrate)
    moe: MoE | None = None                     # mixture-of-experts layers (passes.graph.moe)
    serving: Serving | None = None             # prefill/decode/KV cache (passes.serving.analysis)
    bounds: Bounds | None = None               # sizes the data decides (passes.memory.bounds)
    receptive_field: tuple[NodeField, ...] = ()   # empty unless the graph is a CNN
    modules: tuple[ModuleCost, ...] = ()
    nodes: tuple[NodeRow, ...] = ()
    shape_issues: tuple[str, ...] = field(default=(), metadata=INTERNAL)
    schema_version: int = field(default=SCHEMA_VERSION, metadata=INTERNAL)

    @property
    def peak_bytes(self) -> int:
        """Everything the run holds on the device at its peak (CONVENTION["peak_bytes"]): the
        one figure budgets are checked against; with a data-parallel strategy, one rank's (the
        worst rank's) peak. The device fit judges ``peak`` (the same bytes but under a
        checkpoint plan and for serving)."""
        if self.parallel is not None:
            return self.parallel.per_rank_peak_bytes
        if self.pipeline is not None:
            return self.pipeline.peak_bytes
        if self.training is not None:
            return self.training.peak_bytes
        return self.totals.param_bytes + self.totals.buffer_bytes + self.memory.peak_bytes

    @property
    def peak(self) -> Peak:
        """The peak the device fit judges (passes/memory/peak.py): the serving batch's when
        reviewed for serving, else one data-parallel rank's, else the training step's (the
        checkpointed step's under a checkpoint plan), else the inference run's. Its
        ``allocated_bytes`` is ``peak_bytes`` but for serving (``peak_bytes``: the prefill
        graph run once) and a checkpoint plan (``peak_bytes``: the plain step)."""
        for section in (self.serving, self.parallel, self.pipeline, self.training):
            if section is not None:
                return section.peak
        return self.memory.peak

    def to_dict(self) -> dict[str, Any]:
        body = jsonable(self)
        return {"schema_version": self.schema_version, "model": body.pop("model"),
                "source": body.pop("source"), "batch": body.pop("batch"),
                "dims": dict(sorted(body.pop("dims").items())), "peak_bytes": self.peak_bytes,
                "peak": jsonable(self.peak), "convention": dict(CONVENTION), **body}

    def to_json(self) -> str:
        # Compact separators keep json's C encoder (indent= falls back to pure Python).
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n"


_PLAIN = (str, int, bool, type(None))
_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _layout(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(public field names, JSON_PROPERTIES) of a dataclass, computed once per class."""
    got = _FIELDS.get(cls)
    if got is None:
        got = _FIELDS[cls] = (tuple(f.name for f in dataclasses.fields(cls)
                                    if not f.metadata.get("internal")),
                              tuple(getattr(cls, "JSON_PROPERTIES", ())))
    return got


def jsonable(obj: Any) -> Any:
    """A pass result (or any nesting of dataclasses, mappings, sequences and scalars) as plain
    JSON values: dataclass fields in order minus INTERNAL ones, plus ``JSON_PROPERTIES``;
    non-finite floats become null. The result shares nothing with ``obj``."""
    t = type(obj)
    if t in _PLAIN:
        return obj
    if t is float:
        return obj if math.isfinite(obj) else None
    if t is tuple or t is list:
        return [v if type(v) in _PLAIN else jsonable(v) for v in obj]
    if dataclasses.is_dataclass(t):
        names, props = _layout(t)
        out = {}
        for n in (*names, *props):  # (scalars inline: a report has 100k node rows)
            v = getattr(obj, n)
            out[n] = v if type(v) in _PLAIN else jsonable(v)
        return out
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Enum):
        return obj.value
    return obj
