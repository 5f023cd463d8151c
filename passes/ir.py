"""The one intermediate representation every frontend lowers into and every pass reads.

Everything here is immutable (frozen dataclasses, tuples, read-only mappings) so a pass can
never change what another pass sees. This module imports nothing from ``passes`` or from any
frontend: it is the contract between them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Mapping

# Bits per element for the dtypes ONNX and torch name. Sub-byte types round up per tensor.
DTYPE_BITS: Mapping[str, int] = MappingProxyType({
    "float64": 64, "float32": 32, "float16": 16, "bfloat16": 16,
    "float8e4m3fn": 8, "float8e4m3fnuz": 8, "float8e5m2": 8, "float8e5m2fnuz": 8,
    "float8e8m0": 8, "float4e2m1": 4,
    "int64": 64, "int32": 32, "int16": 16, "int8": 8, "int4": 4, "int2": 2,
    "uint64": 64, "uint32": 32, "uint16": 16, "uint8": 8, "uint4": 4, "uint2": 2,
    "bool": 8, "complex64": 64, "complex128": 128, "string": 0, "undefined": 0,
})
FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "float8e4m3fn",
                          "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float8e8m0",
                          "float4e2m1"})
# Values that are not tensors: an ONNX sequence (or map) is a handle of unknown length, held in
# the IR as a 0-byte scalar of this dtype; the tensors it holds are counted where they are
# written (an optional value is its element's spec: a tensor, or a sequence handle).
HANDLE_DTYPES = frozenset({"sequence", "map"})
# Integer types narrow enough to be quantized weights rather than indices or shapes.
QUANT_DTYPES = frozenset({"int8", "uint8", "int4", "uint4", "int2", "uint2"})

Dim = int | str  # a concrete size, or a symbol that no binding resolved

# Field metadata of a pass result: the pass's working state, not part of the report (the
# report's serializer, analyzer/app/report.py, leaves such fields out).
INTERNAL: Mapping[str, bool] = MappingProxyType({"internal": True})


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Shape and dtype of a tensor; ``shape`` is None when even the rank is unknown.

    ``numel`` and ``nbytes`` are computed once at construction (None while any dim is
    symbolic): every pass reads them, often more than once per tensor.
    """
    shape: tuple[Dim, ...] | None
    dtype: str
    numel: int | None = field(init=False, compare=False, repr=False)
    nbytes: int | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        n: int | None = None
        if self.shape is not None and all(type(d) is int for d in self.shape):
            n = math.prod(self.shape)  # type: ignore[arg-type]
        object.__setattr__(self, "numel", n)
        object.__setattr__(self, "nbytes", None if n is None else
                           (n * DTYPE_BITS.get(self.dtype, 0) + 7) // 8)

    @property
    def known(self) -> bool:
        return self.numel is not None

    def shape_str(self) -> str:
        if self.dtype in HANDLE_DTYPES:
            return self.dtype
        if self.shape is None:
            return "?"
        return "×".join(str(d) for d in self.shape) if self.shape else "scalar"


class ValueKind(str, Enum):
    INPUT = "input"            # a graph input the caller feeds
    PARAM = "param"            # a trainable weight (initializer / nn.Parameter)
    BUFFER = "buffer"          # non-trainable state (BatchNorm running stats, registered buffers)
    CONST = "const"            # an index/shape constant (integer initializer)
    ACTIVATION = "activation"  # produced by a node


@dataclass(frozen=True, slots=True)
class Value:
    name: str
    spec: TensorSpec
    kind: ValueKind
    producer: int | None = None  # index of the producing node, None for inputs/params/consts


@dataclass(frozen=True, slots=True)
class Node:
    """One operation in execution order.

    ``op`` is the registry key the cost rules are looked up by: the ONNX op type for the
    default domain (``Conv``), ``domain::Type`` for other domains, ``aten.<name>`` for torch.
    ``repeat`` multiplies the node's cost: nodes of a Loop/Scan body run once per iteration.
    ``bound`` is set when the node's output sizes depend on the data and the frontend took the
    largest the inputs allow (the sentence says what was assumed): its costs are upper bounds.
    ``autograd`` (a joint graph's backward node): the autograd node whose backward formula it
    is part of (its sequence number; consecutive nodes with one number are one eager call).
    """
    index: int
    name: str
    op: str
    inputs: tuple[str, ...]      # value names; "" marks an omitted optional input
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    scope: str = ""
    repeat: int = 1
    bound: str = ""
    autograd: int | None = None


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """The kernel an attention call was traced as (passes/graph/attention_dispatch.py): ``kernel``
    an Attention word; ``reason`` why the kernels PyTorch tries first were passed over ("" when
    the first one runs); ``target`` the machine and dtype the choice was made for."""
    scope: str
    kernel: str
    reason: str
    target: str


@dataclass(frozen=True, slots=True)
class SizeBound:
    """A size the data decides (torch.export's unbacked symbol: u0, u1…), the range it may
    take and where its maximum comes from. The graph's shapes stand at ``upper``; a value
    whose size needs a symbol with no ``upper`` keeps it symbolic (its nodes are not costed)."""
    symbol: str
    lower: int
    upper: int | None
    source: str      # what declares the maximum ("--dim u3=300", the op's rule, torch's range)
    origin: str      # the node that made it, "name (op) in scope"
    capped: tuple[str, ...] = ()  # sizes from it the model caps lower: "Min(100, u7) ≤ 100"


@dataclass(frozen=True)
class Graph:
    name: str
    source: str                           # "onnx" or "fx"
    nodes: tuple[Node, ...]
    values: Mapping[str, Value]
    inputs: tuple[str, ...]               # graph inputs the caller feeds, in order
    outputs: tuple[str, ...]
    dims: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    batch: int = 1                        # the batch size the inputs were bound with
    module_types: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    warnings: tuple[str, ...] = ()
    # A joint forward+backward graph: each trainable parameter -> its gradient (a graph
    # output). A PARAM value with no entry is frozen (requires_grad=False): no gradient, no
    # optimizer state. Empty for an inference graph.
    grads: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Parameter value -> its name in the model (``named_parameters()``: "h.0.attn.c_attn.weight")
    # where the frontend knows it; an ONNX initializer's own name is usually that already.
    param_paths: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # value -> index of the last node during which the model's own Python code still held it
    # (a local variable, a list, a returned tuple of a frame not yet returned), as observed
    # while the forward was traced; eager lifetimes keep the tensor at least that long
    eager_refs: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    # value -> the value whose storage it was written into: the model ran the op in place
    # (ReLU(inplace=True), ``+=``), which the traced graph writes as a new tensor
    eager_inplace: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # sizes the data decides, and every value whose shape uses one at the lower ends of the
    # ranges (the graph's own values stand at the upper ends): see SizeBound
    size_bounds: tuple[SizeBound, ...] = ()
    lower_values: Mapping[str, Value] = field(default_factory=lambda: MappingProxyType({}))
    # how a stack of identical blocks was traced when only three of them were (the rest
    # repeated in the IR: analyzer/frontends/torch/repeat_layers.py); empty when all were
    traced_layers: str = ""
    # each attention call of the trace, in order, with the kernel it was traced as (a joint
    # graph; an inference graph keeps attention whole and its rule costs it)
    attention: tuple[AttentionKernel, ...] = ()
    # a joint graph: the loss its step backpropagates, in words (the report's training.loss;
    # analyzer/frontends/torch/lm_loss.py), "" for an inference graph
    loss: str = ""
    # facts derived from this graph alone (``derived``), computed once: a plan's layouts ask
    # them of one graph many times. Not a field ``replace`` copies: a changed graph starts empty
    _derived: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def derived(self, key: tuple, make):
        """``make()``, a function of this graph alone, computed on the first call with ``key``;
        what it returns must not be changed by the caller."""
        if key not in self._derived:
            self._derived[key] = make()
        return self._derived[key]

    def spec(self, name: str) -> TensorSpec | None:
        v = self.values.get(name)
        return v.spec if v is not None else None

