"""The synthetic ViT-like ONNX graphs bench_scale.py times (and bench_hostile.py's
--validation can read): deterministic for a seed, looking like real exports — a conv stem
with a residual Conv/BatchNormalization/Relu block, a stride-4 patch Conv, Reshape and
Transpose, repeated pre-LN transformer blocks of 33 nodes (LayerNormalization, MatMul+Add on
float32 initializer weights, Reshape/Transpose heads, Softmax, erf-GELU as torch exports it,
residual Adds), a depthwise conv-mixer every 8 blocks and a Gather+Gemm head. Apart from
the timing because generating a model is not what is measured.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 64
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
MLP = 2 * HIDDEN
SEQ = 64            # 8x8 patches of a 32x32 image
IMG = 32
CLASSES = 10
OPSET = 17          # LayerNormalization; GELU decomposed with Erf, as torch exports it
BATCH = 16          # the binding used for the analysis
SEED = 0
GEN_VERSION = 1     # bump when the generator changes (invalidates cached files)


# --------------------------------------------------------------------------------------------
# Graph generation
# --------------------------------------------------------------------------------------------

class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.shared: dict[tuple, str] = {}

    def weight(self, name: str, shape: tuple[int, ...], scale: float = 0.02) -> str:
        arr = (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def ones(self, name: str, shape: tuple[int, ...]) -> str:
        self.inits.append(numpy_helper.from_array(np.ones(shape, np.float32), name))
        return name

    def zeros(self, name: str, shape: tuple[int, ...]) -> str:
        self.inits.append(numpy_helper.from_array(np.zeros(shape, np.float32), name))
        return name

    def const(self, values, dtype) -> str:
        """A shared (deduplicated) small constant initializer, as exporters fold them."""
        key = (tuple(np.asarray(values).reshape(-1).tolist()), np.asarray(values).shape,
               np.dtype(dtype).str)
        name = self.shared.get(key)
        if name is None:
            name = f"onnx::Constant_{len(self.shared)}"
            self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
            self.shared[key] = name
        return name

    def op(self, op_type: str, inputs: list[str], name: str, n_out: int = 1, **attrs) -> str:
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0]

    # -- building blocks (node counts in comments) --

    def linear(self, x: str, p: str, fan_in: int, fan_out: int) -> str:       # 2 nodes
        w = self.weight(f"{p}.weight", (fan_in, fan_out))
        b = self.zeros(f"{p}.bias", (fan_out,))
        y = self.op("MatMul", [x, w], f"{p}/MatMul")
        return self.op("Add", [y, b], f"{p}/Add")

    def layer_norm(self, x: str, p: str) -> str:                                # 1 node
        return self.op("LayerNormalization",
                       [x, self.ones(f"{p}.weight", (HIDDEN,)), self.zeros(f"{p}.bias", (HIDDEN,))],
                       f"{p}/LayerNormalization", axis=-1, epsilon=1e-5)

    def conv_bn_relu(self, x: str, p: str, cin: int, cout: int, k: int, relu=True,
                     **attrs) -> str:                                           # 2-3 nodes
        w = self.weight(f"{p}.conv.weight", (cout, cin, k, k), 0.1)
        y = self.op("Conv", [x, w], f"{p}/conv/Conv", kernel_shape=[k, k], **attrs)
        y = self.op("BatchNormalization",
                    [y, self.ones(f"{p}.bn.weight", (cout,)), self.zeros(f"{p}.bn.bias", (cout,)),
                     self.zeros(f"{p}.bn.running_mean", (cout,)),
                     self.ones(f"{p}.bn.running_var", (cout,))],
                    f"{p}/bn/BatchNormalization", epsilon=1e-5)
        return self.op("Relu", [y], f"{p}/relu/Relu") if relu else y

    def stem(self, x: str) -> str:                                              # 15 nodes
        h = self.conv_bn_relu(x, "/stem.0", 3, 16, 3, pads=[1, 1, 1, 1])
        r = self.conv_bn_relu(h, "/stem.1.a", 16, 16, 3, pads=[1, 1, 1, 1])
        r = self.conv_bn_relu(r, "/stem.1.b", 16, 16, 3, relu=False, pads=[1, 1, 1, 1])
        h = self.op("Add", [r, h], "/stem.1/Add")
        h = self.op("Relu", [h], "/stem.1/Relu")
        # Patch embedding: Conv stride 4 -> (B, 64, 8, 8) -> (B, 64, 64) -> (B, SEQ, HIDDEN).
        w = self.weight("/patch.weight", (HIDDEN, 16, 4, 4), 0.1)
        b = self.zeros("/patch.bias", (HIDDEN,))
        h = self.op("Conv", [h, w, b], "/patch/Conv", kernel_shape=[4, 4], strides=[4, 4])
        h = self.op("Reshape", [h, self.const([0, HIDDEN, -1], np.int64)], "/patch/Reshape")
        h = self.op("Transpose", [h], "/patch/Transpose", perm=[0, 2, 1])
        pos = self.weight("/pos_embed", (1, SEQ, HIDDEN))
        return self.op("Add", [h, pos], "/pos/Add")

    def transformer_block(self, x: str, i: int) -> str:                         # 33 nodes
        p = f"/blocks.{i}"
        h = self.layer_norm(x, f"{p}/ln_1")
        heads = self.const([0, -1, HEADS, HEAD_DIM], np.int64)
        q = self.linear(h, f"{p}/attn/q", HIDDEN, HIDDEN)
        k = self.linear(h, f"{p}/attn/k", HIDDEN, HIDDEN)
        v = self.linear(h, f"{p}/attn/v", HIDDEN, HIDDEN)
        q = self.op("Reshape", [q, heads], f"{p}/attn/Reshape")
        k = self.op("Reshape", [k, heads], f"{p}/attn/Reshape_1")
        v = self.op("Reshape", [v, heads], f"{p}/attn/Reshape_2")
        q = self.op("Transpose", [q], f"{p}/attn/Transpose", perm=[0, 2, 1, 3])
        k = self.op("Transpose", [k], f"{p}/attn/Transpose_1", perm=[0, 2, 3, 1])
        v = self.op("Transpose", [v], f"{p}/attn/Transpose_2", perm=[0, 2, 1, 3])
        s = self.op("MatMul", [q, k], f"{p}/attn/MatMul")
        s = self.op("Mul", [s, self.const(1.0 / math.sqrt(HEAD_DIM), np.float32)],
                    f"{p}/attn/Mul")
        a = self.op("Softmax", [s], f"{p}/attn/Softmax", axis=-1)
        o = self.op("MatMul", [a, v], f"{p}/attn/MatMul_1")
        o = self.op("Transpose", [o], f"{p}/attn/Transpose_3", perm=[0, 2, 1, 3])
        o = self.op("Reshape", [o, self.const([0, -1, HIDDEN], np.int64)], f"{p}/attn/Reshape_3")
        o = self.linear(o, f"{p}/attn/proj", HIDDEN, HIDDEN)
        x = self.op("Add", [x, o], f"{p}/Add")
        h = self.layer_norm(x, f"{p}/ln_2")
        h = self.linear(h, f"{p}/mlp/fc1", HIDDEN, MLP)
        # GELU(x) = x * 0.5 * (1 + erf(x / sqrt(2))), the torch.onnx decomposition.
        g = self.op("Div", [h, self.const(math.sqrt(2.0), np.float32)], f"{p}/mlp/act/Div")
        g = self.op("Erf", [g], f"{p}/mlp/act/Erf")
        g = self.op("Add", [g, self.const(1.0, np.float32)], f"{p}/mlp/act/Add")
        g = self.op("Mul", [h, g], f"{p}/mlp/act/Mul")
        g = self.op("Mul", [g, self.const(0.5, np.float32)], f"{p}/mlp/act/Mul_1")
        h = self.linear(g, f"{p}/mlp/fc2", MLP, HIDDEN)
        return self.op("Add", [x, h], f"{p}/Add_1")

    def conv_mixer(self, x: str, i: int) -> str:                                # 7 nodes
        p = f"/mixer.{i}"
        side = int(math.isqrt(SEQ))
        h = self.op("Transpose", [x], f"{p}/Transpose", perm=[0, 2, 1])
        h = self.op("Reshape", [h, self.const([0, HIDDEN, side, side], np.int64)], f"{p}/Reshape")
        w = self.weight(f"{p}.dw.weight", (HIDDEN, 1, 3, 3), 0.1)
        b = self.zeros(f"{p}.dw.bias", (HIDDEN,))
        h = self.op("Conv", [h, w, b], f"{p}/dw/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                    group=HIDDEN)
        h = self.op("Relu", [h], f"{p}/Relu")
        h = self.op("Reshape", [h, self.const([0, HIDDEN, -1], np.int64)], f"{p}/Reshape_1")
        h = self.op("Transpose", [h], f"{p}/Transpose_1", perm=[0, 2, 1])
        return self.op("Add", [x, h], f"{p}/Add")

    def head(self, x: str) -> str:                                              # 3 nodes
        h = self.layer_norm(x, "/ln_f")
        h = self.op("Gather", [h, self.const(0, np.int64)], "/head/Gather", axis=1)
        w = self.weight("/head.weight", (CLASSES, HIDDEN))
        b = self.zeros("/head.bias", (CLASSES,))
        return self.op("Gemm", [h, w, b], "/head/Gemm", transB=1)


def build_model(target_nodes: int, seed: int = SEED) -> onnx.ModelProto:
    b = _Builder(seed)
    x = b.stem("input")
    i = 0
    head_nodes = 3
    while True:
        mixer = (i % 8 == 7)
        need = 33 + (7 if mixer else 0)
        if len(b.nodes) + need + head_nodes > target_nodes and i > 0:
            break
        x = b.transformer_block(x, i)
        if mixer:
            x = b.conv_mixer(x, i // 8)
        i += 1
    b.head(x)
    graph = helper.make_graph(
        b.nodes, f"synthetic_vit_{target_nodes}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, IMG, IMG])],
        [helper.make_tensor_value_info(b.nodes[-1].output[0], TensorProto.FLOAT,
                                       ["batch", CLASSES])],
        initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="graphcost-bench")
    return model


def ensure_model(directory: Path, target_nodes: int) -> Path:
    path = directory / f"synthetic_{target_nodes}_v{GEN_VERSION}_s{SEED}.onnx"
    if path.is_file():
        return path
    t0 = time.perf_counter()
    model = build_model(target_nodes)
    if target_nodes <= 20_000:
        onnx.checker.check_model(model, full_check=True)
    tmp = path.with_suffix(".tmp")
    onnx.save(model, str(tmp))  # no external data: one self-contained file
    os.replace(tmp, path)
    print(f"  generated {path.name}: {len(model.graph.node)} nodes, "
          f"{path.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s", flush=True)
    return path
