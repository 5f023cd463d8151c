"""Second chance for shapes ONNX inference leaves symbolic: fold the integer shape arithmetic.

Once every graph input is bound, the small integer tensors that exporters compute from
``Shape`` (sequence lengths feeding ``Range``, targets of ``Reshape`` and ``Expand``) are
constants. ONNX's data propagation resolves many of them but not all (``Range`` takes no
propagated values), so an exported transformer's position ids stay ``unk__0``. Here those
values are evaluated with onnx's own reference implementation, node by node, and the nodes
that produce them are replaced by ``Constant`` nodes in a copy of the skeleton, which is
inferred once more. Only runs when the first inference left unknown dims.

Hostile input costs nothing here: a node is evaluated only when ONNX inference (with its known
inputs as constants) says its output has at most MAX_ELEMS elements — before anything is
allocated — and never when it reads external data (a Constant whose tensor lives in another
file would be opened relative to the current directory).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MAX_ELEMS = 64  # shape arithmetic is tiny; larger integer tensors are data, not shapes
INT_TYPES = {TensorProto.INT64, TensorProto.INT32}


def _spec_shape(vi: onnx.ValueInfoProto):
    dims = vi.type.tensor_type.shape.dim
    if not vi.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
        return None
    return [d.dim_value for d in dims]


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=object)) if shape else 1


def _reads_external(node: onnx.NodeProto) -> bool:
    """A tensor attribute whose bytes live in another file (or a sparse one, which may):
    evaluating it would open that file, relative to the current directory."""
    for a in node.attribute:
        if a.type in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS):
            return True
        if a.type == onnx.AttributeProto.TENSOR and a.t.data_location == TensorProto.EXTERNAL:
            return True
        if a.type == onnx.AttributeProto.TENSORS and any(
                t.data_location == TensorProto.EXTERNAL for t in a.tensors):
            return True
    return False


def _output_numel(node: onnx.NodeProto, known: dict[str, np.ndarray], ins: list[str],
                  opset) -> int | None:
    """Elements the node would produce, from ONNX inference with its known inputs as
    constants (ConstantOfShape([n, n]) says n², before anything is allocated); None when the
    sizes depend on the data (NonZero) or inference cannot tell."""
    outs = [o for o in node.output if o]
    g = helper.make_graph([node], "size", [],
                          [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                           for o in outs],
                          [numpy_helper.from_array(known[i], i) for i in dict.fromkeys(ins)])
    try:
        inferred = onnx.shape_inference.infer_shapes(
            helper.make_model(g, opset_imports=opset), data_prop=True)
    except Exception:
        return None
    total = 0
    for vi in inferred.graph.output:
        shape = _spec_shape(vi)
        if shape is None:
            return None
        total += _numel(shape)
    return total


def fold_shape_values(inferred: onnx.ModelProto) -> dict[str, np.ndarray]:
    """name -> value of every small integer tensor computable from shapes and constants.
    Nothing is evaluated whose output would exceed MAX_ELEMS (checked before evaluating) or
    that reads external data."""
    from onnx.reference import ReferenceEvaluator

    g = inferred.graph
    shapes = {vi.name: _spec_shape(vi) for vi in [*g.input, *g.value_info, *g.output]}
    known: dict[str, np.ndarray] = {}
    for t in g.initializer:
        if t.data_type in INT_TYPES and t.data_location != TensorProto.EXTERNAL:
            known[t.name] = numpy_helper.to_array(t)
    opset = [o for o in inferred.opset_import]
    for node in g.node:
        if node.domain not in ("", "ai.onnx") or not node.output:
            continue
        if node.op_type in ("Shape", "Size"):
            shp = shapes.get(node.input[0]) if node.input else None
            if shp is None:
                continue
            if node.op_type == "Size":
                known[node.output[0]] = np.array(_numel(shp), dtype=np.int64)
                continue
            attrs = {a.name: a.i for a in node.attribute}
            known[node.output[0]] = np.array(shp[attrs.get("start", 0):attrs.get("end")]
                                             if "end" in attrs else shp[attrs.get("start", 0):],
                                             dtype=np.int64)
            continue
        ins = [i for i in node.input if i]
        if node.op_type != "Constant" and (not ins or any(i not in known for i in ins)):
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute) or _reads_external(node):
            continue
        sizes = [shapes.get(o) for o in node.output if o]
        numel = sum(_numel(s) for s in sizes) if all(s is not None for s in sizes) else \
            _output_numel(node, known, ins, opset)
        if numel is None or numel > MAX_ELEMS:
            continue
        try:
            sess = ReferenceEvaluator(
                helper.make_model(helper.make_graph(
                    [node], "fold",
                    [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(known[i].dtype),
                                                   known[i].shape) for i in dict.fromkeys(ins)],
                    [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                     for o in node.output if o]), opset_imports=opset))
            outs = sess.run(None, {i: known[i] for i in dict.fromkeys(ins)})
        except Exception:
            continue
        for name, val in zip([o for o in node.output if o], outs):
            val = np.asarray(val)
            # floats too: a cast sequence length feeding a float Range (rotary tables)
            if val.dtype.kind in "iubf" and val.size <= MAX_ELEMS:
                known[name] = val
    return known


def with_folded_constants(skeleton: onnx.ModelProto, known: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``skeleton`` in which producers of folded values are Constant nodes."""
    out = onnx.ModelProto()
    out.CopyFrom(skeleton)
    nodes = []
    for node in out.graph.node:
        outs = [o for o in node.output if o]
        if node.op_type not in ("Constant",) and outs and all(o in known for o in outs) \
                and len(outs) == 1:
            nodes.append(helper.make_node("Constant", [], outs, name=node.name,
                                          value=numpy_helper.from_array(known[outs[0]], outs[0])))
        else:
            nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out
