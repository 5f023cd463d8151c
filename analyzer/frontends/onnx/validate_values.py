"""Value-level rules of analyzer/frontends/onnx/validate.py: tensors, types, dims, element types.

A tensor's bytes must agree with its dims (raw_data length, value count, or the length an
external reference declares — the external file itself is never opened); dims are
non-negative and element counts fit in int64; element types are ones onnx knows.
"""
from __future__ import annotations

import math
from typing import Iterable

import onnx
from onnx import AttributeProto, TensorProto

from ....passes.errors import GraphcostError

INT64_MAX = 2 ** 63 - 1
_ELEM_TYPES = frozenset(TensorProto.DataType.values())
# Sub-byte element types are packed in raw_data: bits per element.
_PACKED_BITS = {getattr(TensorProto, n): b for n, b in (
    ("UINT4", 4), ("INT4", 4), ("FLOAT4E2M1", 4), ("UINT2", 2), ("INT2", 2),
    ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)) if hasattr(TensorProto, n)}
_ITEMSIZE = {dt: onnx.helper.tensor_dtype_to_np_dtype(dt).itemsize for dt in _ELEM_TYPES
             if dt != TensorProto.UNDEFINED}
TENSOR_ATTRS = (AttributeProto.TENSOR, AttributeProto.SPARSE_TENSOR, AttributeProto.TENSORS,
                AttributeProto.SPARSE_TENSORS)


class Bad(ValueError):
    """A broken rule; the caller adds where (messages are built only on failure)."""


def _numel(dims: Iterable[int]) -> int:
    dims = list(dims)
    if dims and min(dims) < 0:
        raise Bad(f"negative dim {min(dims)}")
    n = math.prod(dims)
    if n > INT64_MAX:
        raise Bad("its element count overflows int64")
    return n


def check_tensor(t: onnx.TensorProto) -> None:
    dt = t.data_type
    itemsize = _ITEMSIZE.get(dt)
    if itemsize is None:
        raise Bad(f"unknown element type {dt}")
    n = _numel(t.dims)
    bits = _PACKED_BITS.get(dt)
    nbytes = n * itemsize if bits is None else -(-n * bits // 8)
    if t.data_location == TensorProto.EXTERNAL:
        # the file is never opened: only what the model itself declares is checked
        keys = {e.key: e.value for e in t.external_data}
        if "location" not in keys:
            raise Bad("external data without a location")
        length = keys.get("length")
        if length is not None and dt != TensorProto.STRING and \
                (not length.isdigit() or int(length) != nbytes):
            raise Bad(f"its external data length {length} does not match its dims "
                       f"({nbytes} bytes)")
        return
    if dt == TensorProto.STRING:
        if len(t.string_data) != n:
            raise Bad(f"{len(t.string_data)} strings for {n} elements")
        return
    got = len(t.raw_data)
    if got or t.HasField("raw_data"):
        if got != nbytes:
            raise Bad(f"raw_data holds {got} bytes, its dims say {nbytes}")
        return
    got = len(getattr(t, onnx.helper.tensor_dtype_to_field(dt)))
    if dt in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        want = 2 * n
    elif bits in (2, 4):  # one byte of packed values per int32_data entry
        want = -(-n * bits // 8)
    else:
        want = n
    if got != want:
        raise Bad(f"holds {got} values, its dims say {want}")


def check_sparse(s: onnx.SparseTensorProto) -> None:
    """Dims, values and indices as tensors, then the indices against the dense shape (as
    onnxruntime's CopySparseData does: [NNZ] flat positions or [NNZ, rank] coordinates, each
    within the dims). Unsorted or repeated indices are left alone: onnxruntime runs them."""
    numel = _numel(s.dims)
    for part, t in (("values", s.values), ("indices", s.indices)):
        try:
            check_tensor(t)
        except Bad as exc:
            raise Bad(f"{part}: {exc}") from None
    values, indices = s.values, s.indices
    nnz = values.dims[0] if len(values.dims) == 1 else None
    idims = list(indices.dims)
    if nnz is None or idims[:1] != [nnz] or len(idims) > 2 or \
            (len(idims) == 2 and idims[1] != len(s.dims)):
        raise Bad(f"values of shape {list(values.dims)} and indices of shape {idims} do not "
                  f"make [NNZ] values with [NNZ] or [NNZ, {len(s.dims)}] indices")
    if indices.data_location == TensorProto.EXTERNAL or not nnz:
        return  # (never opened: an external sparse tensor is refused where it would be read)
    idx = onnx.numpy_helper.to_array(indices).astype("int64", copy=False)
    bounds = [numel] if len(idims) == 1 else list(s.dims)
    for axis, hi in enumerate(bounds):
        column = idx if len(idims) == 1 else idx[:, axis]
        if column.size and (column.min() < 0 or column.max() >= hi):
            bad = column[(column < 0) | (column >= hi)][0]
            raise Bad(f"index {int(bad)} is out of bounds [0, {hi})")


def check_type(tp: onnx.TypeProto, need_elem: bool) -> None:
    kind = tp.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tt = getattr(tp, kind)
        et = tt.elem_type
        if et not in _ELEM_TYPES or (need_elem and et == TensorProto.UNDEFINED):
            raise Bad(f"unknown element type {et}")
        if tt.HasField("shape"):
            n = 1
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    v = d.dim_value
                    if v < 0:
                        raise Bad(f"negative dim {v}")
                    n *= v
                    if n > INT64_MAX:
                        raise Bad("its element count overflows int64")
                elif type(d.dim_param) is not str:
                    raise Bad("a dim_param is not valid UTF-8")
    elif kind == "sequence_type":
        check_type(tp.sequence_type.elem_type, need_elem)
    elif kind == "optional_type":
        check_type(tp.optional_type.elem_type, need_elem)
    elif kind == "map_type":
        check_type(tp.map_type.value_type, need_elem)


def check_tensor_attr(a: onnx.AttributeProto, where: str) -> None:
    try:
        if a.type == AttributeProto.TENSOR:
            check_tensor(a.t)
        elif a.type == AttributeProto.SPARSE_TENSOR:
            check_sparse(a.sparse_tensor)
        elif a.type == AttributeProto.TENSORS:
            for t in a.tensors:
                check_tensor(t)
        else:
            for sp in a.sparse_tensors:
                check_sparse(sp)
    except Bad as exc:
        raise GraphcostError(f"invalid graph: {where}: {exc}") from None
