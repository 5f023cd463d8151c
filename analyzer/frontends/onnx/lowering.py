"""The ONNX graph walked into IR nodes and values (onnx_frontend.lower_onnx's last step).

lower_onnx binds the inputs, builds the skeleton and runs ONNX's shape inference; this
module turns the inferred graph into the IR: one Node per ONNX node with its attributes
(schema defaults filled in, identical attribute sets shared), module paths read from the
exporters' node names, and the bodies of ops whose Rule has ``bodies`` (If/Loop/Scan,
SequenceMap, FlexAttention) lowered as nodes of their own before their node, repeated as
often as they run. Kept apart from the inference set-up because the two jobs share nothing
but the specs.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

import onnx
from onnx import AttributeProto, TensorProto

from ....passes.costs import lookup
from ....passes.errors import GraphcostError
from ....passes.ir import (
    FLOAT_DTYPES,
    QUANT_DTYPES,
    Graph,
    Node,
    TensorSpec,
    Value,
    ValueKind,
)
from . import shapes as onnx_shapes
from .types import DTYPE, SKIP, SpecReader, attr_defaults, attr_value, is_handle

_EMPTY: Mapping[str, Any] = MappingProxyType({})


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


class Lowering:
    """One ONNX graph (and its control-flow bodies) as IR nodes and values, from the specs
    ONNX's inference gave (onnx_frontend.lower_onnx prepares them)."""

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
        self._suffix: dict[str, int] = {}  # base name -> the last #k suffix given to it
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
            if vi.name in self.bound or (vi.name not in self.values
                                         and is_handle(vi.type)):
                inputs.append(vi.name)
                self.values[vi.name] = Value(vi.name, self.reader(vi.type), ValueKind.INPUT)
        self._lower_graph(g, scope="", repeat=1)
        return Graph(name=self.name, source="onnx", nodes=tuple(self.nodes),
                     values=MappingProxyType(self.values), inputs=tuple(inputs),
                     outputs=tuple(o.name for o in g.output),
                     dims=MappingProxyType(dict(self.symbols)), batch=self.batch,
                     warnings=tuple(self.warnings))

    def _unique(self, base: str) -> str:
        """``base`` made unique by a ``#k`` suffix (ONNX node names may repeat or be empty).
        The search for ``base`` resumes where it last stopped: 100k nodes of one name would
        otherwise try 1 + 2 + … + 100k suffixes."""
        k = self._suffix.get(base, 1)
        name = base
        while name in self.used_names:
            k += 1
            name = f"{base}#{k}"
        self._suffix[base] = k
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

    # long: one pass over an ONNX graph's nodes, recursing into control flow
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
            r = lookup(op)
            if r is not None and r.bodies:  # bodies that run: nodes of their own, before it
                self._lower_control_flow(node, g, name, repeat,
                                         module_path(base) or outer_module, bound)
            defaults = attr_defaults(op_type, domain, opsets.get(domain, 1))
            attributes = node.attribute
            if attributes:
                attrs = dict(defaults)
                for a in attributes:
                    v = attr_value(a)
                    if v is not SKIP:
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

    # long: If, Loop and Scan bodies, each with its bound, in one place
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
            size = spec.shape[axes[0]] if spec is not None and spec.shape is not None \
                and spec.known else None
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
