"""One-node ONNX models for ``graphcost calibrate``'s ONNX Runtime microbenchmarks
(analyzer/measure/calibrate_ort.py), built with onnx's helper: the op vocabulary lives with the
ONNX frontend, not in the measurement."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17


def _model(nodes, inputs: dict[str, np.ndarray], output: str,
           initializers: dict[str, np.ndarray] | None = None) -> bytes:
    graph = helper.make_graph(
        nodes, "probe",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape))
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(a, n) for n, a in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]) \
        .SerializeToString()


def add_chain(length: int) -> bytes:
    """x + x, then + x again ``length - 1`` times: input x (1,), output y."""
    nodes = [helper.make_node("Add", ["x", "x"], ["t1"])]
    nodes += [helper.make_node("Add", [f"t{i}", "x"], [f"t{i + 1}"]) for i in range(1, length)]
    nodes.append(helper.make_node("Identity", [f"t{length}"], ["y"]))
    return _model(nodes, {"x": np.ones(1, np.float32)}, "y")


def matmul(a: np.ndarray) -> bytes:
    """y = a · a: input a."""
    return _model([helper.make_node("MatMul", ["a", "a"], ["y"])], {"a": a}, "y")


def conv(x: np.ndarray, w: np.ndarray, groups: int = 1) -> bytes:
    """y = conv(x, w), 'same' padding for an odd kernel: input x, w an initializer."""
    pad = w.shape[-1] // 2
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[pad] * 4, group=groups)
    return _model([node], {"x": x}, "y", {"w": w})


def add(a: np.ndarray, b: np.ndarray) -> bytes:
    """y = a + b: inputs a and b."""
    return _model([helper.make_node("Add", ["a", "b"], ["y"])], {"a": a, "b": b}, "y")


def flatten(a: np.ndarray) -> bytes:
    """y = flatten(a), a reshape that moves nothing: input a."""
    return _model([helper.make_node("Flatten", ["a"], ["y"])], {"a": a}, "y")


def identity(a: np.ndarray) -> bytes:
    """y = a: a run with nothing in it."""
    return _model([helper.make_node("Identity", ["a"], ["y"])], {"a": a}, "y")


def max_pool(x: np.ndarray) -> bytes:
    """y = 3×3 max pooling of x, stride 2, padding 1 (ResNet's stem): input x."""
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                            pads=[1, 1, 1, 1])
    return _model([node], {"x": x}, "y")
