"""A checked .pt2 program rebuilt in time linear in its nodes, by torch's own deserializer.

torch's deserializer took 330 s of CPU and 3.7 GB for 100,000 relu nodes (1.2 MB on disk), and
run_decompositions then re-traced them all (~2 ms a node); graphcost now takes ~21 s and 1.2 GB,
about twice the same graph's as ONNX. What cost more per node than anything the program
computes, and what replaces it:

* ``_dict_to_dataclass`` asks ``typing.get_type_hints`` again for every object of the JSON:
  here each schema type gets its converter once (``to_dataclass``, the same dataclasses);
* a tensor's fake value was ``empty_strided`` dispatched through the FakeTensorMode (130 µs):
  a tensor of static sizes gets it from a meta tensor directly (``fake_of``, 13 µs, the same
  FakeTensor of the same mode), its metadata never made a dataclass, and a graph with no
  symbol skips the search for unbacked symbols (``_plain_graph``, torch's deserialize_graph
  for such a graph; each node still by torch's own code, a call of one tensor by ``_call``,
  which leaves out the tests of the node's kind on every read);
* both graph modules it makes generate their Python code at once (4 s each): they are
  torch's _LazyGraphModule, which does it when first run (graphcost never runs them);
* the retrace: a core ATen program of static sizes (``ep.run_decompositions()`` before
  saving) is lowered as it is once every value has been found to be what its operator makes
  (``unchecked``, each distinct call run once on fake tensors): the retrace would give back
  the same calls and values.

Anything else (a symbolic size, a subgraph, a node of several outputs) goes torch's way.
``tests/test_hostile_pt2.py`` checks the rebuild node for node against torch's own.
"""
from __future__ import annotations

import dataclasses
import operator
import threading
import types
import typing
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Annotated, Any, Callable, cast

import torch
from torch._export.serde import schema
from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE, deserialize_device
from torch._export.serde.union import _Union, _UnionTag
from torch._subclasses.fake_tensor import FakeTensor

from ....passes.errors import first_line
from .compat import TORCH_VERSION

# The fast paths below reach into torch's deserializer, as torch 2.13 and 2.14 write it (checked
# node for node against torch's own: tests/test_hostile_pt2.py); older releases read the
# program with torch's own converter and deserializer (linear too, several times slower)
FAST = TORCH_VERSION >= (2, 13)

# ATen operators torch's deserializer treats apart from the rest
_APART = frozenset({torch.ops.aten.item.default, torch.ops.aten._assert_scalar.default,
                    torch.ops.aten.sym_constrain_range_for_size.default})
# one converter per schema type, made on first use (a recursive type, Graph inside Argument
# inside Graph, reads itself through the placeholder its cell stands for meanwhile)
_CONVERTERS: dict[Any, Callable[[Any], Any]] = {}
_PATCH = threading.Lock()  # torch's deserializer is one at a time anyway (_CURRENT_DESERIALIZER)


def to_dataclass(tp, data):
    """``data`` (the program's JSON) as the schema dataclass ``tp``: what torch's
    ``_dict_to_dataclass`` makes (keys the schema does not have are ignored, as there), with
    the type hints looked up once per type instead of once per object. A value of the wrong
    kind (a list where the schema has a dataclass) raises ValueError."""
    return _converter(tp)(data)


def _converter(tp) -> Callable[[Any], Any]:
    conv = _CONVERTERS.get(tp)
    if conv is None:
        cell: list[Callable[[Any], Any]] = []
        _CONVERTERS[tp] = lambda data: cell[0](data)
        cell.append(_make(_resolve(tp)))
        conv = _CONVERTERS[tp] = cell[0]
    return conv


def _resolve(tp):
    """A schema type named by a string or a forward reference, as the class itself."""
    if isinstance(tp, typing.ForwardRef):
        tp = tp.__forward_arg__
    if isinstance(tp, str):
        found = getattr(schema, tp, None)
        if found is None:
            raise ValueError(f"the schema has no type {tp!r}")
        return found
    return tp


def _make(tp) -> Callable[[Any], Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return _converter(args[0])
    if origin in (typing.Union, types.UnionType):
        return _optional(tp, args)
    if isinstance(tp, type) and issubclass(tp, _Union):
        return _union(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass(tp)
    if origin is list:
        item = _converter(args[0])
        return lambda data: [item(d) for d in _of(list, data)]
    if origin is dict:
        value = _converter(args[1])
        return lambda data: {k: value(v) for k, v in _of(dict, data).items()}
    return _float if tp is float else _scalar


def _of(kind: type, data):
    if type(data) is not kind:
        raise ValueError(f"a {type(data).__name__} where the schema has a {kind.__name__}")
    return data


def _scalar(data):
    if isinstance(data, (list, dict)):
        raise ValueError("a list or mapping where the schema has a single value")
    return data


def _float(data):
    return float(_scalar(data))


def _optional(tp, args) -> Callable[[Any], Any]:
    other = [a for a in args if a is not type(None)]
    if len(args) != 2 or len(other) != 1:
        raise ValueError(f"the schema type {tp} is not an optional")
    inner = _converter(other[0])
    return lambda data: None if data is None else inner(data)


def _dataclass(cls) -> Callable[[Any], Any]:
    hints = typing.get_type_hints(cls, globalns=schema.__dict__)
    fields = tuple((f.name, _converter(hints[f.name])) for f in dataclasses.fields(cls))

    def conv(data):
        _of(dict, data)
        return cls(**{name: c(data[name]) for name, c in fields if name in data})
    return conv


def _union(cls) -> Callable[[Any], Any]:
    """What ``cls.create(kind=value)`` makes — every other field None, the tag naming the
    kind — without its per-object checks of the class's field names (made once, here)."""
    hints = typing.get_type_hints(cls, globalns=schema.__dict__)
    names = [f.name for f in dataclasses.fields(cls)]
    kinds = {n: (_converter(hints[n]), _UnionTag.create(n, cls)) for n in names}
    cls.create(**{names[0]: None})  # the class's own check, once
    nones = dict.fromkeys(names)

    def conv(data):
        if type(data) is not dict or len(data) != 1:
            raise ValueError(f"a {cls.__name__} that is not one {{kind: value}}")
        ((key, value),) = data.items()
        if key not in kinds:
            raise ValueError(f"a {cls.__name__} of the unknown kind {str(key)[:40]!r}")
        c, tag = kinds[key]
        obj = object.__new__(cls)
        obj.__dict__.update(nones)
        obj.__dict__[key] = c(value)
        obj.__dict__["_type"] = tag
        return obj
    return conv


def plain(graph: dict) -> bool:
    """A graph (its checked JSON) of static sizes only: every tensor's sizes and strides
    integers, no symbolic value, no custom object, tensors in and out. torch's deserializer
    makes nothing symbolic of it, so its tensors can be made straight from the JSON."""
    return isinstance(graph, dict) and all(not graph.get(k) for k in (
        "sym_int_values", "sym_bool_values", "sym_float_values", "custom_obj_values")) \
        and all(_one_tensor(a) for k in ("inputs", "outputs") for a in _list(graph.get(k))) \
        and isinstance(graph.get("tensor_values"), dict) \
        and all(_static(m) for m in graph["tensor_values"].values())


def _list(value) -> list:
    return value if isinstance(value, list) else [None]


def _one_tensor(arg) -> bool:
    return isinstance(arg, dict) and list(arg) == ["as_tensor"] and \
        isinstance(arg["as_tensor"], dict) and isinstance(arg["as_tensor"].get("name"), str)


def _static(meta) -> bool:
    return isinstance(meta, dict) and meta.get("dtype") in _SERIALIZE_TO_TORCH_DTYPE and all(
        isinstance(meta.get(k), list) and all(
            isinstance(d, dict) and list(d) == ["as_int"] and type(d["as_int"]) is int
            for d in meta[k]) for k in ("sizes", "strides")) and \
        type(meta.get("requires_grad", False)) is bool and isinstance(meta.get("device"), dict)


def fake_of(mode, meta: dict) -> torch.Tensor:
    """The fake value of a static tensor (its checked JSON), as torch's deserializer makes it
    (``empty_strided`` under the FakeTensorMode, which runs the meta kernel and wraps its
    result) but without the dispatch: 13 µs instead of 130."""
    sizes = [d["as_int"] for d in meta["sizes"]]
    strides = [d["as_int"] for d in meta["strides"]]
    elem = torch.empty_strided(sizes, strides, dtype=_SERIALIZE_TO_TORCH_DTYPE[meta["dtype"]],
                               device="meta")
    device = deserialize_device(schema.Device(**meta["device"]))
    fake = FakeTensor(mode, elem, device)
    return fake.requires_grad_() if meta.get("requires_grad") else fake


def _plain_graph(self, graph: dict) -> "torch.fx.Graph":
    """What torch's ``GraphModuleDeserializer.deserialize_graph`` makes of a plain graph, its
    tensors read from the JSON (no dataclass for them, no symbol to look for after), each
    node by torch's own ``deserialize_node``."""
    from torch._export.serde.serialize import SerializeError

    for name, meta in graph["tensor_values"].items():
        self.serialized_name_to_meta[name] = partial(fake_of, self.fake_tensor_mode, meta)
    for arg in graph["inputs"]:
        name = arg["as_tensor"]["name"]
        node = self.graph.placeholder(name)
        node.name = name  # (as torch does: FX may find the name illegal, "input")
        self.sync_fx_node(name, node)
    for raw in graph.get("nodes", []):
        try:
            node, target = to_dataclass(schema.Node, raw), self.deserialize_operator(raw["target"])
            if _one_tensor_call(raw, target):
                _call(self, node, target, raw["outputs"][0]["as_tensor"]["name"])
            else:
                self.deserialize_node(node, target)
        except Exception as exc:
            raise SerializeError(f"Failed deserializing node {str(raw.get('name'))[:80]!r}: "
                                 f"{type(exc).__name__}: {exc}") from None
    outputs = [self.serialized_name_to_node[a["as_tensor"]["name"]] for a in graph["outputs"]]
    if graph.get("is_single_tensor_return"):
        if len(outputs) != 1:
            raise SerializeError(f"a single tensor return of {len(outputs)} outputs")
        self.graph.output(outputs[0]).meta["val"] = outputs[0].meta["val"]
    else:
        self.graph.output(tuple(outputs)).meta["val"] = tuple(o.meta["val"] for o in outputs)
    return self.graph


def _one_tensor_call(raw: dict, target) -> bool:
    """A named call of an ATen operator returning one tensor, none torch's deserializer
    treats apart (``item`` may return a symbol; two others constrain the ShapeEnv)."""
    return isinstance(target, torch._ops.OpOverload) and target not in _APART and \
        isinstance(raw.get("name"), str) and bool(raw["name"]) and \
        isinstance(raw.get("outputs"), list) and len(raw["outputs"]) == 1 and \
        _one_tensor(raw["outputs"][0])


def _call(self, node, target, output: str) -> None:
    """What torch's ``deserialize_node`` does with a ``_one_tensor_call`` (named after its
    output, its value that tensor's), without its tests of the node's kind on every read."""
    args, kwargs = self.deserialize_inputs(target, node)
    fx_node = self.graph.create_node("call_function", target, args, kwargs, node.name)
    self.sync_fx_node(output, fx_node)
    fx_node.meta.update(self.deserialize_metadata(node.metadata))
    fx_node.meta.setdefault("nn_module_stack", {})  # (torch writes none where it is empty)


@dataclass
class Serialized:
    """A checked program as torch's schema dataclasses; a plain top graph (``plain``) is
    left as JSON but for its signature, inputs and outputs: its nodes and tensors are read by
    ``_plain_graph``."""
    program: Any
    graph: dict
    plain: bool


def serialized(doc: dict) -> Serialized:
    graph = doc["graph_module"]["graph"]
    if not FAST:
        from torch._export.serde.serialize import _dict_to_dataclass
        return Serialized(cast(schema.ExportedProgram,
                               _dict_to_dataclass(schema.ExportedProgram, doc)), graph,
                          plain(graph))  # (fast_rebuild reads no graph itself before 2.13)
    if not plain(graph):
        return Serialized(to_dataclass(schema.ExportedProgram, doc), graph, False)
    skeleton = {**doc, "graph_module": {**doc["graph_module"], "graph": {
        **graph, "nodes": [], "tensor_values": {}}}}
    return Serialized(to_dataclass(schema.ExportedProgram, skeleton), graph, True)


@contextmanager
def fast_rebuild(program: Serialized):
    """Meanwhile torch's deserializer reads ``program``'s plain top graph with
    ``_plain_graph`` (any other graph, a subgraph, a symbolic one, as it would), and the
    graph modules it makes generate their Python code when first run instead of at once
    (torch's _LazyGraphModule: graphcost never runs them; 4 s for 100,000 nodes)."""
    if not FAST:
        yield
        return
    from torch._export.serde.serialize import GraphModuleDeserializer as Deserializer
    from torch.export import exported_program as ep
    from torch.fx._lazy_graph_module import _LazyGraphModule

    slow_graph, slow_module = Deserializer.deserialize_graph, ep._create_graph_module_for_export
    top = program.program.graph_module.graph

    def deserialize_graph(self, serialized_graph):
        return _plain_graph(self, program.graph) if program.plain and serialized_graph is top \
            else slow_graph(self, serialized_graph)

    with _PATCH:
        # (torch's Final metaclass forbids a subclass of the deserializer)
        Deserializer.deserialize_graph = deserialize_graph
        ep._create_graph_module_for_export = _LazyGraphModule
        try:
            yield
        finally:
            Deserializer.deserialize_graph = slow_graph
            ep._create_graph_module_for_export = slow_module


@lru_cache(maxsize=None)
def _core(target) -> bool:
    """A call the retrace would keep as it is: a core ATen operator with no decomposition in
    graphcost's table (no in-place or out= variant is core), or getitem."""
    if target is operator.getitem:
        return True
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.core in target.tags \
        and target not in _decomposed()


@lru_cache(maxsize=1)
def _decomposed() -> frozenset:
    from .frontend import training_decompositions

    return frozenset(training_decompositions())


def unchecked(program: "torch.export.ExportedProgram") -> str | None:
    """Why ``program`` cannot be lowered as it is, without torch's retrace (None when it can):
    a call outside core ATen (the retrace decomposes it), a symbolic size, or a call whose
    recorded value is not what its operator makes of its inputs' (the retrace recomputes
    every value; here each distinct call — operator, its inputs' shapes, strides and dtypes,
    its other arguments — runs once on fake tensors, as the retrace would run it)."""
    for n in program.graph.nodes:
        if n.op == "call_function" and not _core(n.target):
            return f"{n.target} is outside core ATen"
    return _recomputed(program.graph)


def _recomputed(graph: "torch.fx.Graph") -> str | None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    made: dict = {}  # (operator, what its arguments are) -> what it makes
    sig: dict = {}   # node -> what its value is
    try:
        for n in graph.nodes:
            if n.op == "placeholder":
                sig[n] = _what(n.meta.get("val"))
            elif n.op == "call_function":
                if n.target is operator.getitem:
                    computed = sig[n.args[0]][n.args[1]]
                else:
                    key = (n.target, _key(n.args, sig), _key(n.kwargs, sig))
                    computed = made.get(key)
                    if computed is None:
                        computed = made[key] = _run(mode, n, sig)
                recorded = _what(n.meta.get("val"))
                if computed != recorded:
                    return f"node {n.name!r} records {recorded}, {n.target} makes {computed}"
                sig[n] = computed
    except Exception as exc:  # a symbolic size, an operator that fails on its arguments
        return f"{type(exc).__name__}: {first_line(exc, 200)}"
    return None


def _what(value):
    """What a value is as far as graphcost reads it: a tensor's shape, strides, dtype and
    device (an int where torch has a symbol raises; not its storage offset, which torch's
    deserializer does not restore), anything else itself."""
    if isinstance(value, torch.Tensor):
        if not all(type(d) is int for d in (*value.shape, *value.stride())):
            raise ValueError("a symbolic size")
        return tuple(value.shape), value.stride(), value.dtype, value.device
    if isinstance(value, (list, tuple)):
        return tuple(_what(v) for v in value)
    return value


def _key(value, sig: dict):
    if isinstance(value, torch.fx.Node):
        return ("node", sig[value])
    if isinstance(value, (list, tuple)):
        return tuple(_key(v, sig) for v in value)
    if isinstance(value, dict):
        return tuple((k, _key(v, sig)) for k, v in value.items())
    return value


def _run(mode, node: "torch.fx.Node", sig: dict):
    """What ``node``'s operator makes of fake tensors that are its inputs' values."""
    def fake(arg: "torch.fx.Node"):
        shape, stride, dtype, device = sig[arg]
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)
    call = cast(Callable, node.target)  # (a core ATen operator: unchecked looked)
    with mode:
        args = torch.fx.map_arg(node.args, fake)
        kwargs = torch.fx.map_arg(node.kwargs, fake)
        return _what(call(*args, **kwargs))


def operator_of(target: str):
    """The operator a checked call target names (``torch.ops.aten.relu.default``), or None
    where torch has none of that name."""
    found: Any = torch
    for part in target.split(".")[1:]:
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


def outside_core(targets) -> list[str]:
    """Those of ``targets`` (a program's checked call target names; torch writes no getitem,
    a node lists its outputs) that torch would re-trace to reach core ATen."""
    return sorted(t for t in set(targets)
                  if not t.startswith("torch.ops.aten.") or not _core(operator_of(t)))
