"""ONNX frontend: ModelProto -> passes.ir.Graph, without reading weight bytes.

* External data files are never opened (``load_external_data=False``): an initializer's shape
  comes from its ``dims``, so a model shipped with or without its weight files analyzes the same.
* Shapes come from ONNX's own shape inference (with data propagation, so Shape→Gather→Reshape
  chains resolve) run on a *skeleton*: the nodes, the bound inputs and only the small integer
  initializers that shape computations read; every other initializer becomes a typed graph
  input. Weights never pass through inference, which keeps it ~5× faster on real models.
* Model-local functions are inlined first (onnx.inliner), within a node budget counted before
  expanding (analyzer/frontends/onnx/inline.py). If/Loop/Scan bodies are lowered as
  nodes of their own, placed before the control-flow node: a Loop body repeats ``M`` times when
  its trip count is a constant, else once with a warning; a Scan body repeats once per scanned
  slice; both If branches are counted (an upper bound, with a warning).
* This module does not import torch.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import onnx
from onnx import TensorProto, helper

from ....passes.errors import GraphcostError, first_line, opt
from ....passes.ir import Graph, TensorSpec
from ..binding import RawDim, bind_inputs
from . import shapes as onnx_shapes
from .infer import check_declared_types, infer
from .inline import inline_functions
from .lowering import Lowering
from .types import (
    DTYPE,  # noqa: F401 (app/resolve.py and measure/verify_onnx.py read it here)
    SpecReader,
    is_handle,
    raw_dims,
    tensor_type,
    type_spec,
)
from .validate import validate_model

# Initializers up to this many elements stay in the skeleton so shape inference can read their
# values (Reshape targets, Slice bounds, Expand shapes, Resize scales); larger ones are weights.
SMALL_CONST_ELEMS = 1024


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Reads the graph only: external weight files are not opened, nothing is written."""
    p = Path(path)
    if not p.is_file():
        raise GraphcostError(f"{p}: no such file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends: not ONNX, or truncated
        raise GraphcostError(f"{p}: not a readable ONNX model ({type(exc).__name__}: "
                             f"{first_line(exc) or 'parse failed'})") from None
    if not model.HasField("graph") or (model.ir_version == 0 and not model.opset_import):
        raise GraphcostError(f"{p}: not an ONNX model (no graph / IR version in the file)")
    return model


def lower_onnx(model: onnx.ModelProto, *, name: str = "model", batch: int | None = None,
               dims: Mapping[str, int] | None = None,
               input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Lower ``model`` (never modified) into the IR with every graph input bound."""
    dims = dict(dims or {})
    input_shapes = dict(input_shapes or {})
    model = inline_functions(model, name)  # a new proto (the caller's stays), within budget
    model = validate_model(model, name)  # refuses invalid graphs; sorts unsorted ones
    g = model.graph
    if len(g.node) == 0:
        raise GraphcostError(f"{name}: the graph has no nodes")
    feeds, raw = _feeds(g)
    # --dim NAME=MAX also bounds a Loop whose trip count is data: NAME is its trip-count value
    # (or, for a loop run by its condition alone, the Loop node's name)
    loops = _dynamic_loops(g)
    trips = {k: dims.pop(k) for k in list(dims) if k in loops}
    bound, symbols, used_batch = bind_inputs(raw, batch=batch, dims=dims,
                                             input_shapes=input_shapes)
    sk, weights = _skeleton(model, feeds, bound)
    inferred, sk, reader, specs = _shapes(sk, g, name)
    bounds = onnx_shapes.bound_data_dependent(sk, specs, reader,
                                              lambda m: infer(m, name, True))
    return Lowering(inferred, name, weights, bound, symbols, used_batch, reader,
                     specs, bounds, trips).graph()


def _feeds(g: onnx.GraphProto) -> tuple[list[onnx.ValueInfoProto],
                                        list[tuple[str, list[RawDim]]]]:
    """The graph inputs that are no initializer, and the raw dims of the tensors among them
    (what bind_inputs binds)."""
    init_names = {t.name for t in g.initializer}
    feeds = [vi for vi in g.input if vi.name not in init_names]
    raw = []
    for vi in feeds:
        tensor = tensor_type(vi.type)
        if tensor is None:
            if is_handle(vi.type):  # a sequence or map: nothing to bind (HANDLE_DTYPES)
                continue
            raise GraphcostError(f"input {vi.name!r} is neither a tensor, a sequence, a map nor "
                                 "an optional of one: not supported")
        rd = raw_dims(tensor)
        if rd is None:
            raise GraphcostError(f"input {vi.name!r} has no shape in the graph: pass "
                                 f"{opt('input_shapes', vi.name, '...')}")
        raw.append((vi.name, rd))
    return feeds, raw


def _skeleton(model: onnx.ModelProto, feeds: list[onnx.ValueInfoProto],
              bound: Mapping[str, tuple[int, ...]],
              ) -> tuple[onnx.ModelProto, list[tuple[str, str, tuple[int, ...]]]]:
    """The skeleton shape inference runs on (nodes + bound inputs + small integer constants;
    weights become inputs), and every weight's (name, dtype, shape)."""
    g = model.graph
    sk = onnx.ModelProto()
    # IR < 4 required every initializer to be a graph input, and ONNX's inference reads the
    # values of only those that are (the skeleton lists small constants as initializers alone):
    # at IR 4 it reads them all, so an IR 3 file gets the shapes its own inference gives.
    sk.ir_version = max(model.ir_version, 4)
    sk.opset_import.extend(model.opset_import)
    sg = sk.graph
    sg.name = g.name
    sg.node.extend(g.node)
    for vi in g.output:  # declared symbolic output shapes would mask the bound ones
        out = sg.output.add()
        out.CopyFrom(vi)
        if vi.type.HasField("tensor_type") and not type_spec(vi.type).known:
            out.type.tensor_type.ClearField("shape")
    for vi in feeds:
        if vi.name not in bound:  # a sequence or map handle: as declared
            sg.input.append(vi)
            continue
        tt = tensor_type(vi.type)
        assert tt is not None  # what is bound is a tensor (or an optional one)
        tp = helper.make_tensor_type_proto(tt.tensor_type.elem_type, bound[vi.name])
        if vi.type.HasField("optional_type"):
            tp = helper.make_optional_type_proto(tp)
        sg.input.append(helper.make_value_info(vi.name, tp))
    return sk, _skeleton_weights(g, sg)


def _skeleton_weights(g: onnx.GraphProto, sg: onnx.GraphProto,
                      ) -> list[tuple[str, str, tuple[int, ...]]]:
    """``g``'s initializers into the skeleton ``sg``: small ones as they are, the rest as
    typed inputs; returns every weight's (name, dtype, shape)."""
    weights: list[tuple[str, str, tuple[int, ...]]] = []
    for t in g.initializer:
        dtype = DTYPE.get(t.data_type, "undefined")
        shape = tuple(t.dims)
        weights.append((t.name, dtype, shape))
        n = 1
        for d in shape:
            n *= d
        if n <= SMALL_CONST_ELEMS and t.data_location != TensorProto.EXTERNAL:
            sg.initializer.append(t)
        else:
            sg.input.append(helper.make_tensor_value_info(t.name, t.data_type, shape))
    for t in g.sparse_initializer:
        dtype = DTYPE.get(t.values.data_type, "undefined")
        weights.append((t.values.name, dtype, tuple(t.dims)))
        sg.input.append(helper.make_tensor_value_info(t.values.name, t.values.data_type, t.dims))
    return weights


def _shapes(sk: onnx.ModelProto, g: onnx.GraphProto, name: str,
            ) -> tuple[onnx.ModelProto, onnx.ModelProto, SpecReader, dict[str, TensorSpec]]:
    """ONNX's inference on the skeleton, once more on a folded one where shapes stay unknown:
    (the first inferred model, the skeleton last inferred, its reader, the specs)."""
    # Ops of other domains (com.microsoft) get their shapes from their rules, inside ONNX's
    # inference (onnx_shapes.py).
    onnx_shapes.move_to_shapes(sk.graph.node, sk)
    # Data propagation only matters where shapes are computed from Shape/Size values.
    data_prop = any(n.op_type in ("Shape", "Size") for n in g.node)
    inferred = infer(sk, name, data_prop)
    check_declared_types(g.value_info, inferred.graph, name)
    reader = SpecReader()
    specs: dict[str, TensorSpec] = {}
    reader.collect(inferred.graph, specs)
    if any(not spec.known for spec in specs.values()):
        # e.g. Range fed by Shape arithmetic: fold those integers and infer once more; the
        # IR keeps the original nodes and takes the second pass's shapes.
        from .fold import fold_shape_values, with_folded_constants
        sk = with_folded_constants(sk, fold_shape_values(inferred))
        second = infer(sk, name, True)
        specs = {}
        reader.collect(second.graph, specs)
    return inferred, sk, reader, specs


def _dynamic_loops(g: onnx.GraphProto) -> set[str]:
    """The names a Loop's trip count may be bounded by: its trip-count value, else (a loop
    that only its condition stops) the node's name; constants included (harmless)."""
    names = set()
    for node in g.node:
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx"):
            names.add(node.input[0] if node.input and node.input[0] else node.name)
    return names
