"""ONNX frontend: ModelProto -> analyzer.ir.Graph, without reading weight bytes.

* External data files are never opened (``load_external_data=False``): an initializer's shape
  comes from its ``dims``, so a model shipped with or without its weight files analyzes the same.
* Shapes come from ONNX's own shape inference (with data propagation, so Shape→Gather→Reshape
  chains resolve) run on a *skeleton*: the nodes, the bound inputs and only the small integer
  initializers that shape computations read; every other initializer becomes a typed graph
  input. Weights never pass through inference, which keeps it ~5× faster on real models.
* Model-local functions are inlined first (onnx.inliner). If/Loop/Scan bodies are lowered as
  nodes of their own, placed before the control-flow node: a Loop body repeats ``M`` times when
  its trip count is a constant, else once with a warning; a Scan body repeats once per scanned
  slice; both If branches are counted (an upper bound, with a warning).
* This module does not import torch.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import onnx
import onnx.inliner
from onnx import AttributeProto, TensorProto, helper

from graphcost.analyzer.binding import bind_inputs
from graphcost.analyzer.frontends import onnx_shapes
from graphcost.analyzer.frontends.onnx_infer import infer
from graphcost.analyzer.frontends.onnx_types import (DTYPE, SpecReader, _attr_defaults,  # noqa: F401
                                                     _attr_value, _raw_dims, _SKIP, _type_spec)
from graphcost.analyzer.errors import GraphcostError
from graphcost.analyzer.ir import (FLOAT_DTYPES, QUANT_DTYPES, Graph, Node, TensorSpec, Value, ValueKind)
from graphcost.analyzer.frontends.onnx_validate import validate_model
from graphcost.passes.costs import lookup

# Initializers up to this many elements stay in the skeleton so shape inference can read their
# values (Reshape targets, Slice bounds, Expand shapes, Resize scales); larger ones are weights.
SMALL_CONST_ELEMS = 1024

_EMPTY: Mapping[str, Any] = MappingProxyType({})
# Ops whose graph attributes are bodies that run: lowered as nodes of their own, before the op
# (FlexAttention's score_mod / prob_mod run once, on the whole score tensor).
_BODIES = frozenset({"If", "Loop", "Scan", "SequenceMap", "ai.onnx.preview::FlexAttention"})

def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Reads the graph only: external weight files are not opened, nothing is written."""
    p = Path(path)
    if not p.is_file():
        raise GraphcostError(f"{p}: no such file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends: not ONNX, or truncated
        raise GraphcostError(f"{p}: not a readable ONNX model ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else 'parse failed'})") from None
    if not model.HasField("graph") or (model.ir_version == 0 and not model.opset_import):
        raise GraphcostError(f"{p}: not an ONNX model (no graph / IR version in the file)")
    return model


def lower_onnx(model: onnx.ModelProto, *, name: str = "model", batch: int | None = None,
               dims: Mapping[str, int] | None = None,
               input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Lower ``model`` (never modified) into the IR with every graph input bound."""
    dims = dict(dims or {})
    input_shapes = dict(input_shapes or {})
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)  # a new proto; the caller's stays
        except Exception as exc:
            raise GraphcostError(f"cannot inline the model's local functions: {exc}") from None
    model = validate_model(model, name)  # refuses invalid graphs; sorts unsorted ones
    g = model.graph
    if len(g.node) == 0:
        raise GraphcostError(f"{name}: the graph has no nodes")

    init_names = {t.name for t in g.initializer}
    feeds = [vi for vi in g.input if vi.name not in init_names]
    raw = []
    for vi in feeds:
        tensor = onnx_shapes.tensor_type(vi.type)
        if tensor is None:
            if onnx_shapes.is_handle(vi.type):  # a sequence or map: nothing to bind (HANDLE_DTYPES)
                continue
            raise GraphcostError(f"input {vi.name!r} is neither a tensor, a sequence, a map nor "
                                 "an optional of one: not supported")
        rd = _raw_dims(tensor)
        if rd is None:
            raise GraphcostError(f"input {vi.name!r} has no shape in the graph: pass "
                                 f"--input-shape {vi.name}=...")
        raw.append((vi.name, rd))
    # --dim NAME=MAX also bounds a Loop whose trip count is data: NAME is its trip-count value
    # (or, for a loop run by its condition alone, the Loop node's name)
    loops = _dynamic_loops(g)
    trips = {k: dims.pop(k) for k in list(dims) if k in loops}
    bound, symbols, used_batch = bind_inputs(raw, batch=batch, dims=dims,
                                             input_shapes=input_shapes)

    # The skeleton: nodes + bound inputs + small integer constants; weights become inputs.
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
        if vi.type.HasField("tensor_type") and not _type_spec(vi.type).known:
            out.type.tensor_type.ClearField("shape")
    for vi in feeds:
        if vi.name not in bound:  # a sequence or map handle: as declared
            sg.input.append(vi)
            continue
        tp = helper.make_tensor_type_proto(onnx_shapes.tensor_type(vi.type).tensor_type.elem_type,
                                          bound[vi.name])
        if vi.type.HasField("optional_type"):
            tp = helper.make_optional_type_proto(tp)
        sg.input.append(helper.make_value_info(vi.name, tp))
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

    # Ops of other domains (com.microsoft) get their shapes from their rules, inside ONNX's
    # inference (onnx_shapes.py).
    onnx_shapes.move_to_shapes(sg.node, sk)
    # Data propagation only matters where shapes are computed from Shape/Size values.
    data_prop = any(n.op_type in ("Shape", "Size") for n in g.node)
    inferred = infer(sk, name, data_prop)
    reader = SpecReader()
    specs: dict[str, TensorSpec] = {}
    reader.collect(inferred.graph, specs)
    if any(not spec.known for spec in specs.values()):
        # e.g. Range fed by Shape arithmetic: fold those integers and infer once more; the
        # IR keeps the original nodes and takes the second pass's shapes.
        from graphcost.analyzer.frontends.onnx_fold import fold_shape_values, with_folded_constants
        sk = with_folded_constants(sk, fold_shape_values(inferred))
        second = infer(sk, name, True)
        specs = {}
        reader.collect(second.graph, specs)
    bounds = onnx_shapes.bound_data_dependent(sk, specs, reader,
                                              lambda m: infer(m, name, True))
    return _Lowering(inferred, name, weights, bound, symbols, used_batch, reader,
                     specs, bounds, trips).graph()


def _dynamic_loops(g: onnx.GraphProto) -> set[str]:
    """The names a Loop's trip count may be bounded by: its trip-count value, else (a loop
    that only its condition stops) the node's name; constants included (harmless)."""
    names = set()
    for node in g.node:
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx"):
            names.add(node.input[0] if node.input and node.input[0] else node.name)
    return names


def _same_shape(op: str) -> bool:
    r = lookup(op)
    return r is not None and r.same_shape


def module_path(node_name: str) -> str:
    """The torch module path in an exporter's node name.

    Exporters write one name component per module, the module's attribute name, except that
    a container's child is written with its parent's name in front: '/layer1/layer1.0/conv1/
    Conv' is layer1 → its child 0 → conv1 = 'layer1.0.conv1', and '/layer1/layer1.0/downsample/
    downsample.0/Conv' is 'layer1.0.downsample.0'. Names without '/' carry none.
    """
    if not node_name.startswith("/"):
        return ""
    path: list[str] = []
    previous = ""
    for part in node_name.strip("/").split("/")[:-1]:
        if previous and part.startswith(previous + "."):
            path.append(part[len(previous) + 1:])  # the child, named with its parent's name
        else:
            path.append(part)
        previous = part
    return ".".join(path)


class _Lowering:
    def __init__(self, model: onnx.ModelProto, name: str, weights, bound, symbols, batch,
                 reader: SpecReader, specs: dict[str, TensorSpec],
                 bounds: Mapping[str, str] = _EMPTY, trips: Mapping[str, int] = _EMPTY):
        self.model = model
        self.name = name
        self.opsets = {o.domain or "": o.version for o in model.opset_import}
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.warnings: list[str] = []
        self.used_names: set[str] = set()
        self.weights = weights
        self.bound = bound
        self.symbols = symbols
        self.batch = batch
        self.reader = reader
        self.specs = specs
        self.bounds = bounds
        self.trips = trips          # Loop trip-count name -> the user's upper bound (--dim)
        self._consts: dict[str, onnx.TensorProto] | None = None
        self._trip_consts: dict[int, tuple] = {}  # graph id -> (graph, {name: constant})

    def graph(self) -> Graph:
        g = self.model.graph
        for name, dtype, shape in self.weights:
            kind = ValueKind.PARAM if (dtype in FLOAT_DTYPES or dtype in QUANT_DTYPES) \
                else ValueKind.CONST
            self.values[name] = Value(name, TensorSpec(shape, dtype), kind)
        inputs = []
        for vi in g.input:
            if vi.name in self.bound or (vi.name not in self.values and onnx_shapes.is_handle(vi.type)):
                inputs.append(vi.name)
                self.values[vi.name] = Value(vi.name, self.reader(vi.type), ValueKind.INPUT)
        self._lower_graph(g, scope="", repeat=1)
        return Graph(name=self.name, source="onnx", nodes=tuple(self.nodes),
                     values=MappingProxyType(self.values), inputs=tuple(inputs),
                     outputs=tuple(o.name for o in g.output),
                     dims=MappingProxyType(dict(self.symbols)), batch=self.batch,
                     warnings=tuple(self.warnings))

    def _unique(self, base: str) -> str:
        """``base`` made unique by a ``#k`` suffix (ONNX node names may repeat or be empty)."""
        name, k = base, 1
        while name in self.used_names:
            k += 1
            name = f"{base}#{k}"
        self.used_names.add(name)
        return name

    def _const_value(self, name: str) -> Any:
        """A small constant's value (an initializer or a top-level Constant): an int, a float
        or a tuple of them; None when ``name`` is not one."""
        if self._consts is None:
            self._consts = {t.name: t for t in self.model.graph.initializer}
            for node in self.model.graph.node:
                if node.op_type == "Constant" and node.output:
                    for a in node.attribute:
                        if a.name == "value":
                            self._consts[node.output[0]] = a.t
        t = self._consts.get(name) if name else None
        if t is None:
            return None
        arr = onnx.numpy_helper.to_array(t)
        return arr.item() if arr.size == 1 else tuple(arr.reshape(-1).tolist())

    def _const_int(self, name: str, g: onnx.GraphProto, where: str) -> int | None:
        """The value of a constant trip count (an initializer or a Constant node of ``g``),
        None when it is not a constant. The constants are indexed once per graph (a lookup
        per Loop would be quadratic); external data is never read."""
        entry = self._trip_consts.get(id(g))
        if entry is not None:
            table = entry[1]
        else:
            table = {}
            self._trip_consts[id(g)] = (g, table)  # holding g keeps its id from being reused
            for t in self.model.graph.initializer:
                table[t.name] = t
            for node in g.node:
                if node.op_type == "Constant" and node.output:
                    for a in node.attribute:
                        if a.name == "value" and a.type == AttributeProto.TENSOR:
                            table[node.output[0]] = a.t
                        elif a.name == "value_int":
                            table[node.output[0]] = a.i
        value = table.get(name)
        if value is None or isinstance(value, int):
            return value
        if value.data_location == TensorProto.EXTERNAL:
            return None
        arr = onnx.numpy_helper.to_array(value)
        if arr.size != 1 or arr.dtype.kind not in "iu":
            raise GraphcostError(f"{self.name}: invalid graph: {where}: its trip count {name!r} "
                                 f"must be one integer, not a {arr.dtype} tensor of shape "
                                 f"{tuple(arr.shape)}")
        return int(arr.reshape(-1)[0])

    def _lower_graph(self, g: onnx.GraphProto, scope: str, repeat: int,
                     outer_module: str = "", bound: str = "") -> None:
        """``scope`` prefixes node names inside control-flow bodies; a node's module path comes
        from its name as torch exporters write it, else from the enclosing control node."""
        opsets = self.opsets
        specs = self.specs
        values = self.values
        nodes = self.nodes
        used = self.used_names
        attr_maps: dict[tuple, Mapping[str, Any]] = {}  # identical attribute sets share a map
        undefined = TensorSpec(None, "undefined")
        activation = ValueKind.ACTIVATION
        for node in g.node:
            domain, op_type = onnx_shapes.original(node.domain, node.op_type)
            if domain == "ai.onnx":
                domain = ""
            op = op_type if domain == "" else f"{domain}::{op_type}"
            base = node.name or f"{op_type}_{len(nodes)}"
            name = f"{scope}{base}" if scope else base
            if name in used:
                name = self._unique(name)
            else:
                used.add(name)
            if op in _BODIES:
                self._lower_control_flow(node, g, name, repeat,
                                         module_path(base) or outer_module, bound)
            defaults = _attr_defaults(op_type, domain, opsets.get(domain, 1))
            attributes = node.attribute
            if attributes:
                attrs = dict(defaults)
                for a in attributes:
                    v = _attr_value(a)
                    if v is not _SKIP:
                        attrs[a.name] = v
                key = (op, *sorted(attrs.items()))
                try:
                    attrs_map = attr_maps.get(key)
                    if attrs_map is None:
                        attrs_map = attr_maps[key] = MappingProxyType(attrs)
                except TypeError:  # an unhashable value: no sharing
                    attrs_map = MappingProxyType(attrs)
            else:
                attrs_map = defaults
            r = lookup(op)
            if r is not None and r.input_attrs:  # constant inputs the rule reads as attributes
                extra = {k: v for pos, k in r.input_attrs.items() if pos < len(node.input)
                         for v in (self._const_value(node.input[pos]),) if v is not None}
                if extra:
                    attrs_map = MappingProxyType({**attrs_map, **extra})
            index = len(nodes)
            inputs = tuple(node.input)
            outputs = tuple(node.output)
            for k, out in enumerate(outputs):
                if out:
                    spec = specs.get(out)
                    if (spec is None or spec.numel is None) and k == 0 and inputs and \
                            inputs[0] in values and _same_shape(op):
                        # ONNX inference has no rule for this op at the model's opset
                        # (GroupNormalization in onnx 1.2x, for one): its rule says output 0
                        # has input 0's shape and dtype
                        spec = values[inputs[0]].spec
                    values[out] = Value(out, spec or undefined, activation, index)
            module = module_path(base) or outer_module
            why = next((self.bounds[o] for o in outputs if o in self.bounds), "") \
                if self.bounds else ""
            why = why or bound  # a body's nodes: bounded by their control-flow node
            nodes.append(Node(index, name, op, inputs, outputs, attrs_map, module, repeat, why))

    def _lower_control_flow(self, node: onnx.NodeProto, g: onnx.GraphProto, name: str,
                            repeat: int, module: str, bound: str = "") -> None:
        """Lower the bodies of a control-flow node. A body whose run count depends on the data
        is costed at the upper bound the user gives (a Loop's trip count: ``--dim M=MAX``) or
        takes both branches (If); its nodes are labelled bounds."""
        bodies = {a.name: a.g for a in node.attribute if a.type == AttributeProto.GRAPH}
        times = 1
        where = f"node {node.name!r} ({node.op_type})"
        if node.op_type == "Loop":
            m = self._const_int(node.input[0], g, where) if node.input and node.input[0] \
                else None
            key = node.input[0] if node.input and node.input[0] else node.name
            if m is not None:
                times = max(0, m)
            elif key in self.trips:
                times = self.trips[key]
                bound = bound or (f"upper bound: Loop {name!r} runs at most {times} times "
                                  f"(--dim {key}={times})")
            else:
                self.warnings.append(f"Loop {name!r}: its trip count {key!r} depends on the "
                                     f"data; its body is costed once — pass --dim {key}=MAX to "
                                     "cost it at its upper bound")
        elif node.op_type == "Scan":
            # counts were checked by onnx_validate; the axis needs the inferred rank
            n_scan = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 1)
            axes = next((list(a.ints) for a in node.attribute if a.name == "scan_input_axes"),
                        None) or [0]
            first = node.input[len(node.input) - n_scan]
            spec = self.specs.get(first) or (self.values[first].spec if first in self.values
                                             else None)
            if spec is not None and spec.shape is not None:
                rank = len(spec.shape)
                if not -rank <= axes[0] < rank:
                    raise GraphcostError(f"{self.name}: invalid graph: {where}: "
                                         f"scan_input_axes[0]={axes[0]} is out of range for "
                                         f"its scan input {first!r} of rank {rank}")
            size = spec.shape[axes[0]] if spec is not None and spec.known else None
            if isinstance(size, int):
                times = size
            else:
                self.warnings.append(f"Scan {name!r}: scan length unknown; body costed once")
        elif node.op_type == "If":
            self.warnings.append(f"If {name!r}: both branches are costed (an upper bound)")
            bound = bound or f"upper bound: both branches of If {name!r} are costed"
        elif node.op_type == "SequenceMap":
            self.warnings.append(f"SequenceMap {name!r}: the sequence's length is unknown; its "
                                 "body is costed once")
        if node.op_type == "FlexAttention":
            bodies = {k: onnx_shapes.scores_body(node, b, self.values, self.model.opset_import)
                      for k, b in bodies.items()}
        for key, body in bodies.items():
            self.reader.collect(body, self.specs)
            for vi in body.input:
                self.values[vi.name] = Value(vi.name, self.reader(vi.type), ValueKind.ACTIVATION)
            for t in body.initializer:
                self.values[t.name] = Value(t.name, TensorSpec(tuple(t.dims),
                                                               DTYPE.get(t.data_type, "undefined")),
                                            ValueKind.PARAM if DTYPE.get(t.data_type) in
                                            FLOAT_DTYPES else ValueKind.CONST)
            self._lower_graph(body, scope=f"{name}/{key}/", repeat=repeat * times,
                              outer_module=module, bound=bound)
