"""ONNX's shape inference as the ONNX frontend runs it: strict, with the few errors that are not
the file's fault handled (analyzer/frontends/onnx/frontend.py's ``lower_onnx`` calls ``infer``)."""
from __future__ import annotations

import re

import onnx

from ....passes.errors import GraphcostError, first_line


def infer(model: onnx.ModelProto, name: str, data_prop: bool) -> onnx.ModelProto:
    """Strict: a node whose types or shapes contradict its schema (Add on strings, a Scan axis
    beyond its input's rank) is an invalid graph, as for onnxruntime. Two errors are not the
    file's fault: a declared output shape that the bound sizes contradict (onnxruntime only
    warns: inference runs again, still strict, without those declarations, and the declared
    shapes are kept as they always were — unless inference found a negative dim there), and a
    node reading a constant whose bytes are external (never read here: lenient inference
    leaves what depends on it unknown, as it always did)."""
    strict, declared = True, None
    for _ in range(3):
        try:
            out = onnx.shape_inference.infer_shapes(model, check_type=strict,
                                                    strict_mode=strict, data_prop=data_prop)
            break
        except Exception as exc:
            first = first_line(exc) or type(exc).__name__
            if "existing shape differ" in first and declared is None:
                declared, model = model.graph.output, _without_output_shapes(model)
            elif strict and ("from external tensors" in first or _in_function_body(first)):
                # (an op's own function body failing strict inference is onnx's matter, not
                # the file's: onnx 1.23 fails MeanVarianceNormalization's, which onnxruntime
                # runs)
                strict = False
            else:
                raise GraphcostError(f"{name}: invalid graph: ONNX shape inference: {first}") \
                    from None
    else:
        raise GraphcostError(f"{name}: ONNX shape inference failed")
    if declared is not None:
        for vi in out.graph.output:
            if any(d.HasField("dim_value") and d.dim_value < 0
                   for d in vi.type.tensor_type.shape.dim):
                node = next((n for n in out.graph.node if vi.name in n.output), None)
                where = f"node {node.name!r} ({node.op_type})" if node is not None and \
                    node.name else "the graph"
                raise GraphcostError(f"{name}: invalid graph: {where}: its output {vi.name!r} "
                                     "has a negative dim after shape inference")
        del out.graph.output[:]
        out.graph.output.extend(declared)
    return out


def _in_function_body(message: str) -> bool:
    """Whether a strict-inference error was raised inside the function body onnx expands for
    an op of the model (the message names the op, then an op of its body)."""
    ops = re.findall(r"\(op_type:(\w+)", message)
    if len(ops) < 2:
        return False
    try:  # (onnx's stubs omit OpSchema.has_function)
        return onnx.defs.get_schema(ops[0]).has_function  # pyright: ignore[reportAttributeAccessIssue]
    except Exception:
        return False


def _without_output_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.output:
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
    return out


def check_declared_types(declared, inferred: onnx.GraphProto, name: str) -> None:
    """The file's value_info against inference: a tensor declared of another element type
    than its producer gives is an invalid graph (onnxruntime refuses it too: "Type Error").
    A declared shape that inference contradicts is left alone — onnxruntime runs those, and
    graphcost's shapes come from inference, never from value_info."""
    got = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.value_info
           if vi.type.HasField("tensor_type")}
    producer: dict[str, onnx.NodeProto] | None = None  # built on the first mismatch
    for vi in declared:
        if not vi.type.HasField("tensor_type"):
            continue
        want, have = vi.type.tensor_type.elem_type, got.get(vi.name, 0)
        if want and have and want != have:
            if producer is None:
                producer = {o: n for n in inferred.node for o in n.output}
            node = producer.get(vi.name)
            if node is None or node.domain not in ("", "ai.onnx"):
                continue  # typed by a rule of graphcost's (other domains), not by onnx
            where = f" of node {node.name!r} ({node.op_type})" if node.name else \
                f" of a {node.op_type} node"
            raise GraphcostError(
                f"{name}: invalid graph: value_info declares {vi.name!r}{where} "
                f"{onnx.TensorProto.DataType.Name(want).lower()}, inference gives "
                f"{onnx.TensorProto.DataType.Name(have).lower()}")
