"""ONNX type helpers shared by the ONNX frontend's modules: element-type names, attribute
values (defaults from the operator schema, as onnx/reference takes them), TypeProto → TensorSpec.
"""
from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType
from typing import Any, Mapping

import onnx
from onnx import AttributeProto, TensorProto

from ....passes.errors import GraphcostError
from ....passes.ir import TensorSpec

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _dtype_names() -> dict[int, str]:
    names = {}
    for key, num in TensorProto.DataType.items():
        names[num] = {"FLOAT": "float32", "DOUBLE": "float64"}.get(key, key.lower())
    return names


DTYPE = _dtype_names()


@lru_cache(maxsize=None)
def attr_defaults(op_type: str, domain: str, opset: int) -> Mapping[str, Any]:
    """Attribute defaults from the operator schema, not hand-typed per op (as onnx/reference)."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:
        return _EMPTY
    out = {}
    for name, a in schema.attributes.items():
        if a.default_value.type != AttributeProto.UNDEFINED:
            v = attr_value(a.default_value)
            if v is not SKIP:
                out[name] = v
    return MappingProxyType(out)


SKIP = object()


def attr_value(a: AttributeProto) -> Any:
    t = a.type
    if t == AttributeProto.INT:
        return a.i
    if t == AttributeProto.FLOAT:
        return a.f
    if t == AttributeProto.STRING:
        return a.s.decode("utf-8", "replace")
    if t == AttributeProto.INTS:
        return tuple(a.ints)
    if t == AttributeProto.FLOATS:
        return tuple(a.floats)
    if t == AttributeProto.STRINGS:
        return tuple(s.decode("utf-8", "replace") for s in a.strings)
    return SKIP  # tensors and graphs stay out of the IR: specs carry what costs need


# Past 2^64 a count is labelled absurd (passes/magnitude.py: a Tile to 2^81 elements is
# reported, with a warning); past 2^128 elements it is refused: far from any device, and far
# enough below 2^1024 that every figure derived from it (bytes, sums, fits) stays a float.
MAX_ELEMENTS_LOG2 = 128
MAX_ELEMENTS = 2 ** MAX_ELEMENTS_LOG2


class SpecReader:
    """TypeProto -> TensorSpec, one shared TensorSpec per distinct type (graphs repeat a few
    shapes thousands of times, so reading each type's dims in Python once saves most of it)."""

    def __init__(self) -> None:
        self._cache: dict[bytes, TensorSpec] = {}
        self._bad: dict[int, str] = {}  # ids of specs no cost may come from -> why

    def __call__(self, tp: onnx.TypeProto) -> TensorSpec:
        key = tp.SerializeToString()
        spec = self._cache.get(key)
        if spec is None:
            spec = self._cache[key] = type_spec(tp)
            if spec.shape and any(isinstance(d, int) and d < 0 for d in spec.shape):
                self._bad[id(spec)] = "invalid graph: {where}: its output {name!r} has a " \
                                      "negative dim after shape inference ({shape})"
            elif spec.numel is not None and spec.numel > MAX_ELEMENTS:
                self._bad[id(spec)] = (
                    "refused: {where}: its output {name!r} would hold 2^"
                    f"{spec.numel.bit_length() - 1} elements or more ({{shape}}), past the "
                    f"2^{MAX_ELEMENTS_LOG2} graphcost counts")
        return spec

    def collect(self, g: onnx.GraphProto, into: dict[str, TensorSpec]) -> None:
        """Inferred specs of ``g``'s values. A negative dim there (a Resize with a NaN scale,
        a Slice gone wrong) is an invalid graph, never a negative cost; so is a tensor past
        MAX_ELEMENTS (a Tile to 2^6000 elements)."""
        bad = self._bad
        for coll in (g.value_info, g.output):
            for vi in coll:
                spec = into[vi.name] = self(vi.type)
                if id(spec) in bad:
                    node = next((n for n in g.node if vi.name in n.output), None)
                    where = "the graph" if node is None else \
                        f"node {node.name!r} ({node.op_type})" if node.name else \
                        f"a {node.op_type} node"
                    shape = spec.shape_str()
                    shape = shape if len(shape) <= 100 else shape[:100] + "…"
                    raise GraphcostError(bad[id(spec)].format(where=where, name=vi.name,
                                                              shape=shape))


def tensor_type(tp: onnx.TypeProto) -> onnx.TypeProto | None:
    """The tensor type of a tensor or of an optional tensor, else None."""
    if tp.HasField("tensor_type"):
        return tp
    if tp.HasField("optional_type") and tp.optional_type.elem_type.HasField("tensor_type"):
        return tp.optional_type.elem_type
    return None


def is_handle(tp: onnx.TypeProto) -> bool:
    """A sequence or map (or an optional one): held in the IR as a 0-byte handle."""
    if tp.HasField("optional_type"):
        tp = tp.optional_type.elem_type
    return tp.HasField("sequence_type") or tp.HasField("map_type")


def type_spec(tp: onnx.TypeProto) -> TensorSpec:
    tensor = tensor_type(tp)
    if tensor is None:
        if is_handle(tp):
            inner = tp.optional_type.elem_type if tp.HasField("optional_type") else tp
            return TensorSpec((), "sequence" if inner.HasField("sequence_type") else "map")
        return TensorSpec(None, "undefined")
    tt = tensor.tensor_type
    dtype = DTYPE.get(tt.elem_type, "undefined")
    if not tt.HasField("shape"):
        return TensorSpec(None, dtype)
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        else:
            dims.append(d.dim_param or "?")
    return TensorSpec(tuple(dims), dtype)


def raw_dims(tp: onnx.TypeProto) -> list[int | str | None] | None:
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tt.shape.dim]
