"""An ATen-level FX graph -> passes.ir.Graph, node by node (frontend.py captures and
decomposes the program and says which placeholders are parameters).

* Shapes and dtypes come from each node's ``meta["val"]``; non-tensor arguments become attrs
  named by the op's schema (never read by position), tensor arguments become inputs in schema
  order (a ``Tensor[]`` argument contributes each of its tensors), so the ONNX rules whose
  operands line up (Conv: input, weight, bias …) serve the aten op unchanged.
* Tuple outputs get one value per element (``name.i``) and ``getitem`` nodes resolve to them.
* Scope = the innermost ``nn_module_stack`` entry (``layer1.0.conv1``): the module hierarchy.
"""
from __future__ import annotations

import operator
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Collection, Mapping

import torch

from ....passes.ir import Graph, Node, TensorSpec, Value, ValueKind
from .dtype_names import dtype_name
from .size_bounds import SizeBinder

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _dtype(dt: torch.dtype) -> str:
    return dtype_name(dt)


def _spec(val: Any, cache: dict, sizes: SizeBinder | None = None, value: str = "",
          node: str = "") -> TensorSpec:
    if sizes is not None and any(isinstance(d, torch.SymInt) for d in val.shape):
        return sizes.spec(val, value, node)  # data-dependent sizes at their upper bounds
    shape = tuple(int(d) if not isinstance(d, torch.SymInt) else str(d) for d in val.shape)
    key = (shape, val.dtype)
    spec = cache.get(key)
    if spec is None:
        spec = cache[key] = TensorSpec(shape, _dtype(val.dtype))
    return spec


def _attr(value: Any) -> Any:
    """A non-tensor argument as a plain, immutable value."""
    if isinstance(value, (list, tuple)):
        return tuple(_attr(v) for v in value)
    if isinstance(value, torch.SymInt):
        return str(value)
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    return value


# long: one pass over the FX nodes with the alias and size tables each node updates
def lower_fx_graph(graph: "torch.fx.Graph", kind_of: Mapping[str, ValueKind],
                   alias: dict[str, str], keep_outputs: Collection[str] | None, *, name: str,
                   batch: int, dims: Mapping[str, int] | None = None,
                   module_types: Mapping[str, str] | None = None,
                   scopes: Mapping[str, str] | None = None,
                   grads: Mapping[str, str] | None = None,
                   param_paths: Mapping[str, str] | None = None,
                   held: Mapping[str, str] | None = None,
                   written: Mapping[str, str] | None = None,
                   maxima: Mapping[str, int] | None = None,
                   capped: Mapping[str, str] | None = None) -> Graph:
    """Lower an ATen-level FX graph whose placeholders ``kind_of`` classifies. ``alias`` maps
    placeholders that stand for another (tied weights); ``keep_outputs`` (None: all) names the
    graph outputs that are the model's — a list: in its order (an exported program's user
    outputs, where an output that is also an input's in-place update comes first in the
    graph's own order); ``grads`` (a joint graph) maps parameter placeholders
    to the output node holding their gradient; ``held`` maps a node to the node up to which the
    model's Python code held its tensor (the graph's ``eager_refs``), ``written`` a node to
    the node whose tensor the model wrote it into in place (``eager_inplace``). Sizes the data
    decides are bound to their upper bounds (size_bounds.SizeBinder, with ``maxima``)."""
    cache: dict = {}
    sizes = SizeBinder.of(graph, maxima, capped)
    values: dict[str, Value] = {}
    nodes: list[Node] = []
    inputs: list[str] = []
    alias = dict(alias)  # + getitem node name -> the tuple element value it picks
    outputs: list[str] = []
    position: dict[str, int] = {}  # fx node -> the IR node that ran last when it did
    for fx in graph.nodes:
        position[fx.name] = len(nodes) - 1 if fx.op != "call_function" or \
            fx.target is operator.getitem else len(nodes)
        if fx.op == "placeholder":
            val = fx.meta.get("val")
            if fx.name in alias:
                continue
            if not isinstance(val, torch.Tensor):
                continue  # a symbolic int or other non-tensor input
            kind = kind_of.get(fx.name, ValueKind.INPUT)
            values[fx.name] = Value(fx.name, _spec(val, cache, sizes, fx.name,
                                                   f"{fx.name} (input)"), kind)
            if kind == ValueKind.INPUT:
                inputs.append(fx.name)
        elif fx.op == "get_attr":   # a constant the trace made (an index from known values)
            val = _attribute_value(graph, fx)
            if isinstance(val, torch.Tensor):
                values[fx.name] = Value(fx.name, _spec(val, cache, sizes, fx.name,
                                                       f"{fx.name} (constant)"), ValueKind.CONST)
        elif fx.op == "call_function":
            if fx.target is operator.getitem:
                src, idx = fx.args
                alias[fx.name] = f"{alias.get(src.name, src.name)}.{idx}"
                continue
            if _size_arithmetic(fx):
                continue
            nodes.append(_lower_call(fx, len(nodes), values, alias, cache, scopes, sizes))
        elif fx.op == "output":
            for arg in torch.fx.map_arg(fx.args[0], lambda n: n) if fx.args else ():
                if isinstance(arg, torch.fx.Node) and (keep_outputs is None
                                                       or arg.name in keep_outputs):
                    out = alias.get(arg.name, arg.name)
                    if out in values and out not in outputs:
                        outputs.append(out)
    if isinstance(keep_outputs, list):
        order = {alias.get(n, n): i for i, n in reversed(list(enumerate(keep_outputs)))}
        outputs.sort(key=lambda o: order.get(o, len(order)))
    eager_refs = {}
    for fx_name, point in (held or {}).items():
        value = alias.get(fx_name, fx_name)
        v = values.get(value)
        if v is not None and v.kind == ValueKind.ACTIVATION and position.get(point, -1) >= 0:
            eager_refs[value] = position[point]
    eager_inplace = {}
    for fx_name, target in (written or {}).items():
        out, into = alias.get(fx_name, fx_name), alias.get(target, target)
        if out in values and into in values:
            eager_inplace[out] = into
    grad_values = {p: alias.get(g, g) for p, g in (grads or {}).items()}
    bounds, warnings, lower = (), (), {}
    if sizes is not None:
        bounds, warnings = sizes.bounds()
        lower = {n: Value(n, spec, values[n].kind, values[n].producer)
                 for n, spec in sizes.lower.items() if n in values}
    return Graph(name=name, source="fx", nodes=_placed(nodes), values=MappingProxyType(values),
                 inputs=tuple(inputs), outputs=tuple(outputs),
                 dims=MappingProxyType(dict(dims or {})), batch=batch,
                 module_types=MappingProxyType(dict(module_types or {})),
                 grads=MappingProxyType({p: g for p, g in grad_values.items()
                                         if g in outputs and p in values}),
                 param_paths=MappingProxyType(dict(param_paths or {})),
                 warnings=warnings, eager_refs=MappingProxyType(eager_refs),
                 eager_inplace=MappingProxyType(eager_inplace), size_bounds=bounds,
                 lower_values=MappingProxyType(lower))


# the module path PyTorch 2.8's decompositions give the checks they add
# (aten._assert_tensor_metadata before a dtype cast): no module at all
NO_MODULE = "_empty_nn_module_stack_from_metadata_hook"


def _placed(nodes: list[Node]) -> tuple[Node, ...]:
    """The nodes, each check with no module placed in the module of the op it guards (the
    next node's): otherwise it would stand as a module of its own in the module tree and cut
    a block's nodes into two runs (a stack of blocks could not be repeated). On 2.8 a check
    with no outputs may also come with no module stack at all between two nodes that have
    one (on a sliding-window cache's token counter, inside the attention), or, between two
    nodes of one module, the module of the layer before (the check of the rotary table
    each of DeepSeek-V2's layers reads carries the path of the layer before it)."""
    out, after = list(nodes), ""
    for i in range(len(out) - 1, -1, -1):
        if out[i].scope == NO_MODULE or (out[i].scope == "" and after and i > 0 and
                                         out[i - 1].scope and not any(out[i].outputs)):
            out[i] = replace(out[i], scope=after)
        else:
            after = out[i].scope
    for i in range(1, len(out) - 1):
        if not any(out[i].outputs) and out[i - 1].scope == out[i + 1].scope != out[i].scope:
            out[i] = replace(out[i], scope=out[i + 1].scope)
    return tuple(out)


def _size_arithmetic(fx) -> bool:
    """Size queries and arithmetic on sizes (``sym_size``, ``u0 >= 0``): no tensor op."""
    if isinstance(fx.meta.get("val"), (torch.Tensor, list, tuple)):
        return False
    return not isinstance(fx.target, torch._ops.OpOverload) or \
        str(fx.target) in ("aten.sym_size.int", "aten.sym_stride.int",
                           "aten.sym_storage_offset.default")


# long: one FX call node lowered: its ops, views, in-place writes and sizes
def _lower_call(fx, index: int, values: dict, alias: dict, cache: dict,
                scopes: Mapping[str, str] | None = None,
                sizes: SizeBinder | None = None) -> Node:
    target = fx.target
    op = str(target)  # "aten.addmm.default"
    torch_fn = fx.meta.get("torch_fn") or ("", "")
    if op == "aten.clone.default" and "dropout" in str(torch_fn[1]):
        # Export writes inference dropout as a clone; eager returns the input itself (≈ 10%
        # of a transformer's activation memory), so it is lowered as the view it is.
        op = "aten.dropout.default"
    schema = getattr(target, "_schema", None)
    tensor_inputs: list[str] = []
    attrs: dict[str, Any] = {}

    def add_tensor(arg) -> None:
        if arg is None:
            tensor_inputs.append("")
        else:
            tensor_inputs.append(alias.get(arg.name, arg.name))

    if schema is not None:
        bound = list(zip(schema.arguments, fx.args)) + [
            (a, fx.kwargs[a.name]) for a in schema.arguments if a.name in fx.kwargs]
        for arg_schema, value in bound:
            if isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"),
                                                               torch.Tensor):
                add_tensor(value)
            elif isinstance(value, (list, tuple)) and value and \
                    all(isinstance(v, torch.fx.Node) or v is None for v in value) and \
                    any(isinstance(v, torch.fx.Node) and
                        isinstance(v.meta.get("val"), torch.Tensor) for v in value):
                for v in value:
                    add_tensor(v)
            elif value is None and "Tensor" in str(arg_schema.type):
                add_tensor(None)  # an omitted optional tensor keeps its position
            else:
                attrs[arg_schema.name] = _attr(value)
    else:
        for value in fx.args:
            if isinstance(value, torch.fx.Node):
                add_tensor(value)
    while tensor_inputs and tensor_inputs[-1] == "":
        tensor_inputs.pop()

    val = fx.meta.get("val")
    out_names: list[str] = []
    stack = fx.meta.get("nn_module_stack") or {}
    scope = next(reversed(stack.values()))[0] if stack else ""
    if scopes is not None:
        scope = scopes.get(fx.name, scope)
    where = f"{fx.name} ({op})" + (f" in {scope}" if scope else "")
    if isinstance(val, torch.Tensor):
        out_names.append(fx.name)
        values[fx.name] = Value(fx.name, _spec(val, cache, sizes, fx.name, where),
                                ValueKind.ACTIVATION, index)
    elif isinstance(val, (list, tuple)):
        for i, v in enumerate(val):
            if isinstance(v, torch.Tensor):
                name = f"{fx.name}.{i}"
                values[name] = Value(name, _spec(v, cache, sizes, name, where),
                                     ValueKind.ACTIVATION, index)
                out_names.append(name)
            else:
                out_names.append("")
    bound = sizes.sentence((*tensor_inputs, *out_names)) if sizes is not None else ""
    return Node(index, fx.name, op, tuple(tensor_inputs), tuple(out_names),
                MappingProxyType(attrs) if attrs else _EMPTY, scope, 1, bound,
                fx.meta.get("autograd_node"))


def module_types(graph: "torch.fx.Graph") -> dict[str, str]:
    """Module path -> class name, from the nodes' nn_module_stack."""
    out: dict[str, str] = {}
    for fx in graph.nodes:
        for path, cls in (fx.meta.get("nn_module_stack") or {}).values():
            if path == NO_MODULE:
                continue
            out.setdefault(path, cls.rsplit(".", 1)[-1] if isinstance(cls, str)
                           else getattr(cls, "__name__", str(cls)))
    return out


def _attribute_value(graph: torch.fx.Graph, fx: torch.fx.Node):
    """The tensor a ``get_attr`` node reads: its traced value, else its module's attribute."""
    val = fx.meta.get("val")
    if val is None and graph.owning_module is not None:
        from .lifted_constants import attribute
        val = attribute(graph.owning_module, str(fx.target))
    return val
