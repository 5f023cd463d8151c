"""Small helpers to build ONNX graphs by hand in tests."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def model(nodes, inputs, outputs, inits=(), opset=17, functions=()):
    """inputs/outputs: [(name, shape)] float32 (shape entries may be strings)."""
    g = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                          functions=list(functions))
    m.ir_version = 8
    return m


def weight(name, *shape):
    return name, np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def shape_const(name, values):
    return name, np.asarray(values, dtype=np.int64)


def node(op, ins, outs, name=None, **attrs):
    return helper.make_node(op, ins, outs, name=name or outs[0], **attrs)
