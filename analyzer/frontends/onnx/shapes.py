"""The registry's shape functions run inside ONNX's own shape inference.

ONNX's inference knows only the schemas onnx ships. For ops of other domains (com.microsoft's
Attention, SkipLayerNormalization, MatMulNBits …) a rule's ``shapes`` gives the output types,
and for ops whose output size depends on the data (NonZero, NonMaxSuppression …) a rule's
``bound_shapes`` gives the largest sizes the inputs allow. Either is registered with onnx as the
inference function of a schema in a private domain (``graphcost.shape`` / ``graphcost.bound``,
the op named ``<domain>.<type>``), and the nodes of the frontend's skeleton copy are moved into that
domain: one C++ inference pass then resolves the op and everything downstream of it, with ONNX's
data propagation intact. onnx's registry is process-wide, so only private domains are
registered (a user's own onnx.checker never sees them), each op once.

Why not onnxruntime's SymbolicShapeInference: it is a Python walk over every node (sympy
arithmetic), an order of magnitude slower on a fused GPT-2 than this (README, issue #9 note), and
it would make onnxruntime a dependency of analysis.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Iterable

import onnx
from onnx import AttributeProto, TensorProto, defs, helper, numpy_helper

from ....passes.costs import lookup
from ....passes.ir import TensorSpec
from .types import DTYPE, SKIP, attr_value

# Private domains; a private op is named "<its domain>.<its type>": onnx.reference requires op
# names to be unique across domains, so a second "Attention" schema would break its import.
SHAPE_DOMAIN = "graphcost.shape"
BOUND_DOMAIN = "graphcost.bound"

_registered: set[tuple[str, str]] = set()
_UNKNOWN = TensorSpec(None, "undefined")
_ELEM = {v: k for k, v in TensorProto.DataType.items()}


def op_key(domain: str, op_type: str) -> str:
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


def original(domain: str, op_type: str) -> tuple[str, str]:
    """The node's own (domain, op type), for a node this module moved into a private domain."""
    if domain in (SHAPE_DOMAIN, BOUND_DOMAIN):
        d, t = op_type.rsplit(".", 1)
        return ("" if d == "ai.onnx" else d), t
    return domain, op_type


def _dtype_name(elem: int) -> str | None:
    return DTYPE.get(elem)


def _elem_type(name: str | None) -> int:
    if name is None:
        return TensorProto.UNDEFINED
    for num, n in DTYPE.items():
        if n == name:
            return num
    return TensorProto.UNDEFINED


class _CtxView:
    """registry.ShapeView over onnx's InferenceContext."""

    def __init__(self, ctx: Any):
        self._ctx = ctx
        self.n_inputs = ctx.get_num_inputs()

    def has_input(self, i: int) -> bool:
        return i < self.n_inputs and self._ctx.has_input(i)

    def _type(self, i: int):
        if not self.has_input(i):
            return None
        t = self._ctx.get_input_type(i)
        return t if t is not None and t.HasField("tensor_type") else None

    def dtype(self, i: int) -> str | None:
        t = self._type(i)
        return _dtype_name(t.tensor_type.elem_type) if t is not None else None

    def shape(self, i: int):
        t = self._type(i)
        if t is None or not t.tensor_type.HasField("shape"):
            return None
        return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in t.tensor_type.shape.dim)

    def attr(self, name: str, default: Any = None) -> Any:
        a = self._ctx.get_attribute(name)
        if a is None or a.type == AttributeProto.UNDEFINED:
            return default
        v = attr_value(a)
        return default if v is SKIP else v

    def const(self, i: int) -> Any:
        if not self.has_input(i):
            return None
        data = self._ctx.get_input_data(i)
        return numpy_helper.to_array(data) if data is not None else None


def _shape_fn(r, bound: bool):
    if r is None:
        return None
    if bound:
        return r.bound_shapes
    if r.shapes is None and r.same_shape:  # output 0 has input 0's shape and dtype
        return lambda v: [(v.dtype(0), v.shape(0))]
    return r.shapes


def _inference(key: str, bound: bool):
    def infer(ctx: Any) -> None:
        fn = _shape_fn(lookup(key), bound)
        if fn is None:
            return
        view = _CtxView(ctx)
        try:
            outs = fn(view)
        except Exception:  # noqa: BLE001 - a shape it cannot tell stays unknown, as in ONNX
            return
        first = view.dtype(0)
        for k, out in enumerate(outs):
            if out is None or k >= ctx.get_num_outputs() or not ctx.has_output(k):
                continue
            dtype, shape = out
            tp = helper.make_tensor_type_proto(_elem_type(dtype or first),
                                               None if shape is None else list(shape))
            ctx.set_output_type(k, tp)
    return infer


def _register(domain: str, op_type: str, bound: bool) -> tuple[str, str]:
    private = BOUND_DOMAIN if bound else SHAPE_DOMAIN
    name = f"{domain or 'ai.onnx'}.{op_type}"
    if (private, name) not in _registered:
        param = defs.OpSchema.FormalParameter
        variadic = defs.OpSchema.FormalParameterOption.Variadic
        schema = defs.OpSchema(
            name, private, 1,
            inputs=[param("inputs", "T", param_option=variadic, is_homogeneous=False,
                          min_arity=0)],
            outputs=[param("outputs", "T", param_option=variadic, is_homogeneous=False,
                           min_arity=0)],
            type_constraints=[("T", [], "any type")])
        schema.set_type_and_shape_inference_function(
            _inference(op_key(domain, op_type), bound))
        defs.register_schema(schema)
        _registered.add((private, name))
    return private, name


def needs_shapes(node: onnx.NodeProto) -> bool:
    """A node whose rule gives its output types where onnx has no schema (another domain's op,
    or one onnxruntime registers in the ONNX domain) or an ai.onnx.ml schema without inference."""
    r = lookup(op_key(node.domain, node.op_type))
    if _shape_fn(r, bound=False) is None:
        return False
    assert r is not None  # (a shape function is a rule's)
    # onnx's ai.onnx.ml schemas infer nothing for several ops: their rules' shapes replace them
    return (node.domain == "ai.onnx.ml" and r.shapes is not None) or \
        not _has_schema(node.op_type, node.domain)


@lru_cache(maxsize=None)
def _has_schema(op_type: str, domain: str) -> bool:
    try:
        defs.get_schema(op_type, "" if domain == "ai.onnx" else domain)
    except defs.SchemaError:
        return False
    return True


def move_to_shapes(nodes: Iterable[onnx.NodeProto], model: onnx.ModelProto) -> bool:
    """Move every node that ``needs_shapes`` (in the skeleton ``model``, in place) into its
    private domain. Returns whether any was moved."""
    moved = False
    for node in nodes:
        if needs_shapes(node):
            node.domain, node.op_type = _register(node.domain, node.op_type, bound=False)
            _import(model, node.domain)
            moved = True
        for a in node.attribute:  # control-flow bodies
            if a.type == AttributeProto.GRAPH:
                moved |= move_to_shapes(a.g.node, model)
    return moved


def move_to_bound(node: onnx.NodeProto, model: onnx.ModelProto) -> None:
    node.domain, node.op_type = _register(node.domain, node.op_type, bound=True)
    _import(model, node.domain)


def _import(model: onnx.ModelProto, domain: str) -> None:
    if not any(o.domain == domain for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(domain, 1))


def bound_data_dependent(sk: onnx.ModelProto, specs: dict[str, TensorSpec], reader: Any,
                         infer: Callable[[onnx.ModelProto], onnx.ModelProto]) -> dict[str, str]:
    """Outputs whose size depends on the data (NonZero, NonMaxSuppression, TopK with a tensor
    k …) and that inference left symbolic take the largest size the inputs allow (the rule's
    ``bound_shapes``), and inference runs once more so that everything downstream follows.
    ``specs`` is updated in place. Returns output name -> why it is an upper bound: the rule's
    sentence for the op itself, "downstream of …" for outputs that became known through it."""
    moved = []
    for node in sk.graph.node:
        r = lookup(op_key(node.domain, node.op_type))
        if r is None or r.bound_shapes is None:
            continue
        if any(out and not (specs.get(out) or _UNKNOWN).known for out in node.output):
            moved.append((node, r.bound))
    if not moved:
        return {}
    bounded = onnx.ModelProto()
    bounded.CopyFrom(sk)
    first = {}
    for node, _ in moved:
        first[node.output[0]] = node
    for node in bounded.graph.node:
        if node.output and node.output[0] in first:
            move_to_bound(node, bounded)
    again: dict[str, TensorSpec] = {}
    reader.collect(infer(bounded).graph, again)
    why: dict[str, str] = {}
    for node, sentence in moved:
        for out in node.output:
            if out:
                why[out] = f"upper bound: {sentence}"
    origin = moved[0][0].name or moved[0][0].op_type
    for out, spec in again.items():
        if spec.known and not (specs.get(out) or _UNKNOWN).known and out not in why:
            why[out] = f"upper bound: size follows from the bound at {origin!r}"
    specs.update({k: v for k, v in again.items() if v.known or k not in specs})
    return why


def scores_body(node: onnx.NodeProto, body: onnx.GraphProto, values, opsets) -> onnx.GraphProto:
    """A FlexAttention modifier with its input bound to the scores (B, Hq, Sq, Sk) and
    inferred on its own (ONNX's inference leaves the body's values unknown)."""
    q, k = (values.get(node.input[i]) for i in (0, 1))
    if q is None or k is None or not (q.spec.known and k.spec.known) or not body.input:
        return body
    scores = (*q.spec.shape[:3], k.spec.shape[2])
    g = onnx.GraphProto()
    g.CopyFrom(body)
    t = g.input[0].type.tensor_type
    t.ClearField("shape")
    for d in scores:
        t.shape.dim.add().dim_value = d
    for out in g.output:
        out.type.tensor_type.ClearField("shape")
    m = helper.make_model(g, opset_imports=opsets)
    try:
        return onnx.shape_inference.infer_shapes(m, strict_mode=False).graph
    except Exception:  # noqa: BLE001 - the body's values stay unknown, as before
        return body
