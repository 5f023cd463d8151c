"""Table tests for the per-op cost rules (passes/costs/*.py), one table per rule family.

Every case is a tiny ONNX model (float32 unless said otherwise, concrete shapes, weights as
initializers) analyzed with ``analyze``. The expected MACs, FLOPs, bytes read and bytes written
are worked out by hand in the comment above each case; nothing here calls graphcost code to
compute an expectation.

Conventions (design-notes.md §1.5, passes/costs/registry.py):
  MACs  = output elements × reduction length for Conv/ConvTranspose/Gemm/MatMul/Einsum/Attention,
          bias excluded; 0 for every other op.
  FLOPs = 2·MACs + bias adds (+ alpha/beta multiplies) + per-op arithmetic documented in the rules.
  bytes_read    = bytes of every distinct input (weights and integer constants included);
                  views 0; Slice/Split read what they output; Gather that plus its indices;
                  Shape/Constant/ConstantOfShape read 0.
  bytes_written = bytes of every output (0 for views).
float32 = 4 B, float16 = 2 B, int64 = 8 B, bool = 1 B per element.
"""
from __future__ import annotations

from dataclasses import dataclass

import graphcost.passes.costs  # noqa: F401  (registers every rule family)
import numpy as np
import pytest
from graphcost.analyzer.app.api import analyze
from graphcost.passes.costs import registry
from onnx import TensorProto, helper, numpy_helper

F32, F16, I64, BOOL = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.BOOL


# --------------------------------------------------------------------------------------------
# Model builder
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class X:
    """A graph input with a concrete shape (float32 unless ``dtype`` says otherwise)."""
    shape: tuple[int, ...]
    dtype: int = F32


def x(*shape: int, dtype: int = F32) -> X:
    return X(tuple(shape), dtype)


def w(*shape: int) -> np.ndarray:
    """A float32 weight initializer of ``shape`` (values do not matter to the cost rules)."""
    return np.zeros(shape, np.float32)


def i64(*values: int) -> np.ndarray:
    """An int64 initializer (axes, pads, sizes, shapes …)."""
    return np.array(values, np.int64)


def const(name: str, value) -> object:
    """A Constant node producing ``name`` (float32 array or scalar)."""
    arr = np.asarray(value, np.float32)
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr))


def build(op: str, inputs, attrs=None, *, opset: int = 17, n_out: int = 1, domain: str = "",
          before=(), out_shape: tuple[int, ...] | None = None):
    """One-node ONNX model. ``inputs`` entries: X → graph input, ndarray → initializer,
    str → an existing value (a name made by ``before`` nodes or an earlier input ``in<i>``),
    None → omitted optional input. The node under test is the graph's last node.
    ``out_shape`` declares output 0 as float32 of that shape (for ops ONNX cannot infer)."""
    names, graph_inputs, inits = [], [], []
    for i, spec in enumerate(inputs):
        name = f"in{i}"
        if spec is None:
            names.append("")
            continue
        if isinstance(spec, str):
            names.append(spec)
            continue
        if isinstance(spec, np.ndarray):
            inits.append(numpy_helper.from_array(spec, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, spec.dtype, spec.shape))
        names.append(name)
    outs = [f"out{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, domain=domain, **(attrs or {}))
    out_infos = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs]
    if out_shape is not None:
        out_infos[0] = helper.make_tensor_value_info(outs[0], F32, out_shape)
    graph = helper.make_graph([*before, node], "t", graph_inputs, out_infos, initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets)


def run(op: str, inputs, attrs=None, **kw):
    """Analyze the one-node model; returns (report, row of the node under test)."""
    report = analyze(build(op, inputs, attrs, **kw))
    return report, report.nodes[-1]


def case(id: str, op: str, inputs, expect: tuple[int, int, int, int], attrs=None, *,
         marks=(), **kw):
    """A table row: expect = (MACs, FLOPs, bytes_read, bytes_written)."""
    return pytest.param(op, inputs, attrs, kw, expect, id=id, marks=marks)


def check(op, inputs, attrs, kw, expect):
    _, row = run(op, inputs, attrs, **kw)
    assert row.op == op
    assert row.status == "ok", row
    got = (row.macs, row.flops, row.bytes_read, row.bytes_written)
    assert got == expect, f"(macs, flops, read, written): got {got}, expected {expect}"


# --------------------------------------------------------------------------------------------
# linear.py: the matmul class
# --------------------------------------------------------------------------------------------

LINEAR = [
    # Conv 1→32, 3×3, same pad, 28×28 (design notes §1.1 conv1):
    #   out 32·28·28 = 25,088 elems; MACs = 25,088·(1·3·3) = 225,792;
    #   FLOPs = 2·225,792 + 25,088 (bias) = 476,672
    #   read = x 784·4 = 3,136 + W 32·9·4 = 1,152 + b 32·4 = 128 → 4,416; written 25,088·4 = 100,352
    case("conv_bias_same_pad", "Conv", [x(1, 1, 28, 28), w(32, 1, 3, 3), w(32)],
         (225_792, 476_672, 4_416, 100_352), {"pads": [1, 1, 1, 1]}),
    # Conv 3→8, 3×3, no pad, no bias, 10×10: out 8·8·8 = 512; MACs = 512·(3·3·3) = 13,824;
    #   FLOPs = 2·13,824 = 27,648; read = 300·4 = 1,200 + W 216·4 = 864 → 2,064; written 2,048
    case("conv_no_bias", "Conv", [x(1, 3, 10, 10), w(8, 3, 3, 3)],
         (13_824, 27_648, 2_064, 2_048)),
    # Conv 4→6, groups 2 (W 6×2×3×3), same pad, 6×6, no bias: out 6·6·6 = 216;
    #   MACs = 216·(2·3·3) = 3,888; FLOPs 7,776; read = 144·4 = 576 + W 108·4 = 432 → 1,008;
    #   written 216·4 = 864
    case("conv_groups2", "Conv", [x(1, 4, 6, 6), w(6, 2, 3, 3)],
         (3_888, 7_776, 1_008, 864), {"group": 2, "pads": [1, 1, 1, 1]}),
    # Depthwise Conv 8 ch, 3×3, stride 2, pad 1, batch 2, bias: H_out = ⌊(16+2−3)/2⌋+1 = 8;
    #   out 2·8·8·8 = 1,024; MACs = 1,024·(1·3·3) = 9,216; FLOPs = 18,432 + 1,024 = 19,456;
    #   read = x 2·8·16·16·4 = 16,384 + W 72·4 = 288 + b 8·4 = 32 → 16,704; written 4,096
    case("conv_depthwise_stride2", "Conv", [x(2, 8, 16, 16), w(8, 1, 3, 3), w(8)],
         (9_216, 19_456, 16_704, 4_096),
         {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    # Conv 1-D 2→4, k3, stride 2, no pad, bias, length 9: L_out = ⌊(9−3)/2⌋+1 = 4; out 16;
    #   MACs = 16·(2·3) = 96; FLOPs = 192 + 16 = 208;
    #   read = 18·4 = 72 + W 24·4 = 96 + b 16 → 184; written 64
    case("conv1d_stride2", "Conv", [x(1, 2, 9), w(4, 2, 3), w(4)],
         (96, 208, 184, 64), {"strides": [2]}),
    # ConvTranspose 4→2, 3×3, stride 2, bias, 5×5 in: H_out = (5−1)·2 + 3 = 11; out 2·11·11 = 242;
    #   MACs = in 4·5·5 = 100 elems × (C_out/g·3·3 = 18) = 1,800; FLOPs = 3,600 + 242 = 3,842;
    #   read = 100·4 = 400 + W 72·4 = 288 + b 2·4 = 8 → 696; written 242·4 = 968
    case("convtranspose_stride2_bias", "ConvTranspose", [x(1, 4, 5, 5), w(4, 2, 3, 3), w(2)],
         (1_800, 3_842, 696, 968), {"strides": [2, 2]}),
    # ConvTranspose 4→2, groups 2 (W 4×1×2×2), 2×2 kernel, 3×3 in, no bias:
    #   out (3−1)+2 = 4 → 2·4·4 = 32 elems; MACs = 36 in elems × (1·2·2) = 144; FLOPs 288;
    #   read = 36·4 = 144 + W 16·4 = 64 → 208; written 128
    case("convtranspose_groups2", "ConvTranspose", [x(1, 4, 3, 3), w(4, 1, 2, 2)],
         (144, 288, 208, 128), {"group": 2}),
    # Gemm (4,6)·(6,5): MACs = 4·5·6 = 120; FLOPs 240; read 96 + 120 = 216; written 20·4 = 80
    case("gemm_plain", "Gemm", [x(4, 6), w(6, 5)], (120, 240, 216, 80)),
    # Gemm as Linear(320→50) (design notes §1.2 fc1): A (1,320), B (50,320) transB, C (50,):
    #   MACs = 1·50·320 = 16,000; FLOPs = 32,000 + 50 (bias) = 32,050;
    #   read = 320·4 = 1,280 + 16,000·4 = 64,000 + 50·4 = 200 → 65,480 (the table's MemRead);
    #   written 50·4 = 200
    case("gemm_transB_bias_fc1", "Gemm", [x(1, 320), w(50, 320), w(50)],
         (16_000, 32_050, 65_480, 200), {"transB": 1}),
    # Gemm transA, alpha 0.5: A (6,4)ᵀ·B (6,5) → Y (4,5); MACs = 4·5·6 = 120;
    #   FLOPs = 240 + 20 (alpha multiply per output) = 260; read 96 + 120 = 216; written 80
    case("gemm_transA_alpha", "Gemm", [x(6, 4), w(6, 5)], (120, 260, 216, 80),
         {"transA": 1, "alpha": 0.5}),
    # Gemm alpha 2, beta 0.5, C (3,2): Y (3,2); MACs = 3·2·4 = 24;
    #   FLOPs = 48 + 6 (alpha) + 6 (C add) + 6 (beta multiply) = 66;
    #   read = 12·4 = 48 + 8·4 = 32 + 6·4 = 24 → 104; written 24
    case("gemm_alpha_beta_C", "Gemm", [x(3, 4), w(4, 2), w(3, 2)], (24, 66, 104, 24),
         {"alpha": 2.0, "beta": 0.5}),
    # MatMul (3,4)@(4,5): out 15 · K 4 = 60 MACs; FLOPs 120; read 48 + 80 = 128; written 60
    case("matmul_2d", "MatMul", [x(3, 4), x(4, 5)], (60, 120, 128, 60)),
    # MatMul (2,3,4)@(2,4,5): out 2·3·5 = 30 · 4 = 120; FLOPs 240; read 96 + 160 = 256; written 120
    case("matmul_batched_3d", "MatMul", [x(2, 3, 4), x(2, 4, 5)], (120, 240, 256, 120)),
    # MatMul (2,3,4,8)@(2,3,8,5): out 2·3·4·5 = 120 · 8 = 960; FLOPs 1,920;
    #   read = 192·4 = 768 + 240·4 = 960 → 1,728; written 480
    case("matmul_batched_4d", "MatMul", [x(2, 3, 4, 8), x(2, 3, 8, 5)],
         (960, 1_920, 1_728, 480)),
    # MatMul broadcast (2,1,3,4)@(5,4,6) → (2,5,3,6) = 180 elems · 4 = 720; FLOPs 1,440;
    #   read = 24·4 = 96 + 120·4 = 480 → 576; written 720
    case("matmul_broadcast", "MatMul", [x(2, 1, 3, 4), x(5, 4, 6)], (720, 1_440, 576, 720)),
    # MatMul with a weight (8,16)@W(16,4): out 32 · 16 = 512; FLOPs 1,024;
    #   read = 128·4 = 512 + 64·4 = 256 → 768; written 128
    case("matmul_weight", "MatMul", [x(8, 16), w(16, 4)], (512, 1_024, 768, 128)),
    # Einsum bij,bjk->bik (2,3,4),(2,4,5): MACs = b·i·j·k = 2·3·4·5 = 120; FLOPs 240;
    #   read 96 + 160 = 256; written 2·3·5·4 = 120
    case("einsum_bmm", "Einsum", [x(2, 3, 4), x(2, 4, 5)], (120, 240, 256, 120),
         {"equation": "bij,bjk->bik"}, opset=12),
    # Einsum with ellipsis ...ij,jk->...ik (2,3,4),(4,5): same 2·3·4·5 = 120 MACs; FLOPs 240;
    #   read 96 + 80 = 176; written 120
    case("einsum_ellipsis", "Einsum", [x(2, 3, 4), x(4, 5)], (120, 240, 176, 120),
         {"equation": "...ij,jk->...ik"}, opset=12),
    # Attention (opset 23), 4-D: Q (1,2,4,8), K/V (1,2,6,8): QKᵀ 1·2·4·6·8 = 384 + AV 384 → 768;
    #   scores 1·2·4·6 = 48; FLOPs = 1,536 + 6·48 (softmax 5 + scale 1) = 1,824;
    #   read = 64·4 + 96·4 + 96·4 = 1,024; written 256
    case("attention_4d", "Attention", [x(1, 2, 4, 8), x(1, 2, 6, 8), x(1, 2, 6, 8)],
         (768, 1_824, 1_024, 256), opset=23),
    # Attention 3-D: Q (1,4,16), K/V (1,6,16), 2 heads of D = 8: QKᵀ 2·4·6·8 = 384 + AV 384
    #   → 768 MACs; scores 2·4·6 = 48; FLOPs 1,536 + 288 = 1,824; read 256 + 384 + 384 = 1,024;
    #   written 256
    case("attention_3d", "Attention", [x(1, 4, 16), x(1, 6, 16), x(1, 6, 16)],
         (768, 1_824, 1_024, 256), {"q_num_heads": 2, "kv_num_heads": 2}, opset=23),
    # Einsum with one operand bij->bj (2,3,4): no MACs, one add per input element = 24 FLOPs;
    #   read 96; written 2·4·4 = 32
    case("einsum_single_operand", "Einsum", [x(2, 3, 4)], (0, 24, 96, 32),
         {"equation": "bij->bj"}, opset=12),
    # Einsum ij,jk,kl->il (2,3),(3,4),(4,5): the rule's documented upper bound is
    #   (3 − 1)·(i·j·k·l = 2·3·4·5 = 120) = 240 MACs (a left-to-right chain really does
    #   2·3·4 + 2·4·5 = 64); FLOPs 480; read 24 + 48 + 80 = 152; written 2·5·4 = 40
    case("einsum_three_operands_upper_bound", "Einsum", [x(2, 3), x(3, 4), x(4, 5)],
         (240, 480, 152, 40), {"equation": "ij,jk,kl->il"}, opset=12),
]


@pytest.mark.parametrize("op, inputs, attrs, kw, expect", LINEAR)
def test_linear_rules(op, inputs, attrs, kw, expect):
    check(op, inputs, attrs, kw, expect)


def test_mnist_conv1_matches_design_notes_table():
    # design notes §1.2: conv1 Conv2d(1,10,k=5), input 1×1×28×28 → 10×24×24.
    #   MACs = 5,760 outputs · 25 = 144,000; params 10·(25 + 1) = 260;
    #   MemRead 784·4 + 260·4 = 3,136 + 1,040 = 4,176; MemWrite 5,760·4 = 23,040;
    #   FLOPs (graphcost convention) = 2·144,000 + 5,760 = 293,760
    report, row = run("Conv", [x(1, 1, 28, 28), w(10, 1, 5, 5), w(10)])
    assert row.output_shapes == ("1×10×24×24",)
    assert row.macs == 144_000
    assert row.bytes_read == 4_176
    assert row.bytes_written == 23_040
    assert row.flops == 293_760
    assert row.params == 260
    assert report.totals.params == 260


# --------------------------------------------------------------------------------------------
# elementwise.py
# --------------------------------------------------------------------------------------------

ELEMENTWISE = [
    # Relu (2,3,4): 24 elems · 1 = 24 FLOPs; read 96; written 96
    case("relu", "Relu", [x(2, 3, 4)], (0, 24, 96, 96)),
    # Sigmoid: 24 · 3 (exp, add, divide) = 72
    case("sigmoid", "Sigmoid", [x(2, 3, 4)], (0, 72, 96, 96)),
    # Tanh: 24 · 1 = 24
    case("tanh", "Tanh", [x(2, 3, 4)], (0, 24, 96, 96)),
    # LeakyRelu: 24 · 2 (compare + multiply) = 48
    case("leaky_relu", "LeakyRelu", [x(2, 3, 4)], (0, 48, 96, 96), {"alpha": 0.1}),
    # Gelu (opset 20), exact: 0.5·x·(1 + erf(x/√2)) = 5 per element → 24 · 5 = 120;
    # tanh form: 8 per element → 24 · 8 = 192
    case("gelu_opset20", "Gelu", [x(2, 3, 4)], (0, 120, 96, 96), opset=20),
    case("gelu_tanh", "Gelu", [x(2, 3, 4)], (0, 192, 96, 96), {"approximate": "tanh"},
         opset=20),
    # HardSigmoid: alpha·x + beta, min, max = 4 per element → 24 · 4 = 96;
    # HardSwish: x · hardsigmoid(x) = 5 → 24 · 5 = 120
    case("hardsigmoid", "HardSigmoid", [x(2, 3, 4)], (0, 96, 96, 96)),
    case("hardswish", "HardSwish", [x(2, 3, 4)], (0, 120, 96, 96), opset=14),
    # Clip with min/max scalar initializers: 24 · 2 = 48; read 96 + 4 + 4 = 104; written 96
    case("clip", "Clip", [x(2, 3, 4), np.array(0.0, np.float32), np.array(6.0, np.float32)],
         (0, 48, 104, 96)),
    # Add (2,3,4)+(4,) broadcast: out 24 elems → 24 FLOPs; read 96 + 16 = 112; written 96
    case("add_broadcast", "Add", [x(2, 3, 4), x(4)], (0, 24, 112, 96)),
    # Add (2,3,4)+bias initializer (4,): same numbers, the initializer is read too
    case("add_bias_initializer", "Add", [x(2, 3, 4), w(4)], (0, 24, 112, 96)),
    # Add (3,1)+(1,4) two-sided broadcast → (3,4) = 12 FLOPs; read 12 + 16 = 28; written 48
    case("add_two_sided_broadcast", "Add", [x(3, 1), x(1, 4)], (0, 12, 28, 48)),
    # Mul(x, x): one distinct input, read once: 24 FLOPs; read 96; written 96
    case("mul_same_input_read_once", "Mul", [x(2, 3, 4), "in0"], (0, 24, 96, 96)),
    # Div (2,3)/(2,3): 6 FLOPs; read 24 + 24 = 48; written 24
    case("div", "Div", [x(2, 3), x(2, 3)], (0, 6, 48, 24)),
    # Pow (2,3)^scalar: 6 FLOPs; read 24 + 4 = 28; written 24
    case("pow_scalar", "Pow", [x(2, 3), np.array(2.0, np.float32)], (0, 6, 28, 24)),
    # Max of 3 inputs (2,3),(2,3),(3,): out 6 · (3−1) = 12 FLOPs; read 24 + 24 + 12 = 60; written 24
    case("max_3_inputs", "Max", [x(2, 3), x(2, 3), x(3)], (0, 12, 60, 24)),
    # Where(cond bool (2,3), X (2,3), Y (1,)): out 6 · 1 select = 6 FLOPs;
    #   read 6·1 + 6·4 + 1·4 = 34; written 24
    case("where", "Where", [x(2, 3, dtype=BOOL), x(2, 3), x(1)], (0, 6, 34, 24)),
]


@pytest.mark.parametrize("op, inputs, attrs, kw, expect", ELEMENTWISE)
def test_elementwise_rules(op, inputs, attrs, kw, expect):
    check(op, inputs, attrs, kw, expect)


# --------------------------------------------------------------------------------------------
# normalization.py
# --------------------------------------------------------------------------------------------

BN_INPUTS = [x(1, 3, 4, 4), w(3), w(3), w(3), w(3)]  # X, scale, B, running mean, running var

NORMALIZATION = [
    # BatchNormalization (inference) (1,3,4,4): 48 elems · 2 = 96 FLOPs;
    #   read = 48·4 = 192 + 4 vectors · 3·4 = 48 → 240; written 192
    case("batchnorm_inference", "BatchNormalization", BN_INPUTS, (0, 96, 240, 192)),
    # BatchNormalization training_mode=1 (opset 15), 3 outputs: 48 · 5 = 240 FLOPs; read 240;
    #   written Y 192 + running_mean 12 + running_var 12 = 216
    case("batchnorm_training", "BatchNormalization", BN_INPUTS, (0, 240, 240, 216),
         {"training_mode": 1}, opset=15, n_out=3),
    # LayerNormalization (opset 17) (2,3,8), scale (8,), bias (8,): 48 · (5 + 2) = 336;
    #   read = 192 + 32 + 32 = 256; written 192
    case("layernorm_scale_bias", "LayerNormalization", [x(2, 3, 8), w(8), w(8)],
         (0, 336, 256, 192), opset=17),
    # LayerNormalization without bias: 48 · (5 + 1) = 288; read 192 + 32 = 224; written 192
    case("layernorm_scale_only", "LayerNormalization", [x(2, 3, 8), w(8)],
         (0, 288, 224, 192), opset=17),
    # GroupNormalization (opset 21) (1,4,2,2), 2 groups, scale/bias (4,): 16 · 7 = 112;
    #   read = 64 + 16 + 16 = 96; written 64. ONNX's shape inference has no rule for this
    #   function op (output stays untyped), so the output shape is declared in the model.
    case("groupnorm", "GroupNormalization", [x(1, 4, 2, 2), w(4), w(4)], (0, 112, 96, 64),
         {"num_groups": 2}, opset=21, out_shape=(1, 4, 2, 2)),
    # InstanceNormalization (1,2,3,3), scale/B (2,): 18 · 7 = 126; read 72 + 8 + 8 = 88; written 72
    case("instancenorm", "InstanceNormalization", [x(1, 2, 3, 3), w(2), w(2)],
         (0, 126, 88, 72)),
    # Softmax (2,5): 10 · 5 = 50; read 40; written 40
    case("softmax", "Softmax", [x(2, 5)], (0, 50, 40, 40), {"axis": -1}),
    # LogSoftmax (2,5): 10 · 5 = 50
    case("logsoftmax", "LogSoftmax", [x(2, 5)], (0, 50, 40, 40), {"axis": -1}),
]


@pytest.mark.parametrize("op, inputs, attrs, kw, expect", NORMALIZATION)
def test_normalization_rules(op, inputs, attrs, kw, expect):
    check(op, inputs, attrs, kw, expect)


def test_batchnorm_running_stats_are_buffers_not_params():
    # BN over 3 channels: scale + B = 2·3 = 6 trainable params (24 B);
    # running mean + var = 2·3 = 6 buffer elements (24 B) — design notes §1.4.
    report, row = run("BatchNormalization", BN_INPUTS)
    assert report.totals.params == 6
    assert report.totals.param_bytes == 24
    assert report.totals.buffers == 6
    assert report.totals.buffer_bytes == 24
    assert row.params == 6


# --------------------------------------------------------------------------------------------
# pooling.py
# --------------------------------------------------------------------------------------------

POOLING = [
    # MaxPool k2 s2 (1,3,4,4) → (1,3,2,2) = 12 outputs · 2·2 = 48 FLOPs; read 192; written 48
    case("maxpool_k2s2", "MaxPool", [x(1, 3, 4, 4)], (0, 48, 192, 48),
         {"kernel_shape": [2, 2], "strides": [2, 2]}),
    # MaxPool k2 s2 with the Indices output: same 48 FLOPs, read 192;
    #   written Y 12·4 = 48 + int64 indices 12·8 = 96 → 144
    case("maxpool_with_indices", "MaxPool", [x(1, 3, 4, 4)], (0, 48, 192, 144),
         {"kernel_shape": [2, 2], "strides": [2, 2]}, n_out=2),
    # MaxPool k3 s1 pad 1 (1,2,5,5) → (1,2,5,5) = 50 · 9 = 450; read 200; written 200
    case("maxpool_k3_same", "MaxPool", [x(1, 2, 5, 5)], (0, 450, 200, 200),
         {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    # AveragePool k2 s2 (1,2,6,6) → (1,2,3,3) = 18 · 4 = 72; read 288; written 72
    case("avgpool_k2s2", "AveragePool", [x(1, 2, 6, 6)], (0, 72, 288, 72),
         {"kernel_shape": [2, 2], "strides": [2, 2]}),
    # GlobalAveragePool (2,3,4,4): every input added once → 96 FLOPs; read 384;
    #   written (2,3,1,1) = 6·4 = 24
    case("global_avgpool", "GlobalAveragePool", [x(2, 3, 4, 4)], (0, 96, 384, 24)),
    # ReduceMean (opset 13, axes attr [2,3], keepdims) (2,3,4,4): 96 FLOPs; read 384; written 24
    case("reducemean_attr_axes", "ReduceMean", [x(2, 3, 4, 4)], (0, 96, 384, 24),
         {"axes": [2, 3]}, opset=13),
    # ReduceMean (opset 18, axes input int64 [2,3]): 96 FLOPs; read 384 + 2·8 = 400; written 24
    case("reducemean_input_axes", "ReduceMean", [x(2, 3, 4, 4), i64(2, 3)], (0, 96, 400, 24),
         opset=18),
    # ReduceSum (opset 13) (2,3,4), axes input int64 [1], keepdims 0: 24 FLOPs;
    #   read = 96 + axes 8 = 104; written (2,4) = 8·4 = 32
    case("reducesum", "ReduceSum", [x(2, 3, 4), i64(1)], (0, 24, 104, 32), {"keepdims": 0},
         opset=13),
    # ReduceMax (opset 18) (2,3,4), no axes → all, keepdims → (1,1,1): 24 FLOPs; read 96; written 4
    case("reducemax_all", "ReduceMax", [x(2, 3, 4)], (0, 24, 96, 4), opset=18),
]


@pytest.mark.parametrize("op, inputs, attrs, kw, expect", POOLING)
def test_pooling_rules(op, inputs, attrs, kw, expect):
    check(op, inputs, attrs, kw, expect)


# --------------------------------------------------------------------------------------------
# movement.py: copies, selections, views, constants, Resize, Range
# --------------------------------------------------------------------------------------------

RANGE_CONSTS = (const("start", 0.0), const("limit", 10.0), const("delta", 2.0))

MOVEMENT = [
    # Resize nearest (opset 13) (1,3,4,4) → sizes [1,3,8,8]: a copy, 0 FLOPs;
    #   read = 48·4 = 192 + sizes 4·8 = 32 → 224; written 1·3·8·8·4 = 768
    case("resize_nearest_sizes", "Resize", [x(1, 3, 4, 4), None, None, i64(1, 3, 8, 8)],
         (0, 0, 224, 768), {"mode": "nearest"}, opset=13),
    # Resize linear (opset 13) same sizes: 2 resized axes → 2²−1 = 3 lerps · 3 FLOPs = 9 per
    #   output; 192 outputs · 9 = 1,728; read 224; written 768
    case("resize_linear_sizes", "Resize", [x(1, 3, 4, 4), None, None, i64(1, 3, 8, 8)],
         (0, 1_728, 224, 768), {"mode": "linear"}, opset=13),
    # Resize linear, scales [1,1,2,2] from a Constant node, (1,2,3,3) → (1,2,6,6) = 72 outputs:
    #   72 · 9 = 648 FLOPs; read = 18·4 = 72 + scales 4·4 = 16 → 88; written 72·4 = 288
    case("resize_linear_const_scales", "Resize", [x(1, 2, 3, 3), None, "scales"],
         (0, 648, 88, 288), {"mode": "linear"}, opset=13,
         before=(const("scales", [1.0, 1.0, 2.0, 2.0]),)),
    # Pad (opset 13) (1,2,3,3) pads [0,0,1,1,0,0,1,1] → (1,2,5,5) = 50 elems; 0 FLOPs;
    #   read = 18·4 = 72 + pads 8·8 = 64 → 136; written 200
    case("pad", "Pad", [x(1, 2, 3, 3), i64(0, 0, 1, 1, 0, 0, 1, 1)], (0, 0, 136, 200),
         opset=13),
    # Transpose (2,3,4) perm [2,0,1]: copy; read 96; written 96
    case("transpose", "Transpose", [x(2, 3, 4)], (0, 0, 96, 96), {"perm": [2, 0, 1]}),
    # Concat axis 1 (2,3),(2,5) → (2,8): read 24 + 40 = 64; written 64
    case("concat", "Concat", [x(2, 3), x(2, 5)], (0, 0, 64, 64), {"axis": 1}),
    # Slice (opset 13) (4,6) rows 1:3 → (2,6) = 12 elems: read = written = 48
    #   (starts/ends/axes are not counted: Slice reads only what it outputs)
    case("slice_rows", "Slice", [x(4, 6), i64(1), i64(3), i64(0)], (0, 0, 48, 48), opset=13),
    # Slice (10,) 0:10:2 → 5 elems: read = written = 20
    case("slice_step", "Slice", [x(10), i64(0), i64(10), i64(0), i64(2)], (0, 0, 20, 20),
         opset=13),
    # Split (opset 13) (6,4) axis 0 split [2,4] → (2,4) + (4,4): written 32 + 64 = 96; read 96
    case("split", "Split", [x(6, 4), i64(2, 4)], (0, 0, 96, 96), {"axis": 0}, opset=13,
         n_out=2),
    # Gather as embedding: table W (100,16), indices int64 (2,5) → (2,5,16) = 160 elems:
    #   written 640; read = gathered rows 640 + indices 10·8 = 80 → 720 (not the 6,400 B table)
    case("gather_embedding", "Gather", [w(100, 16), x(2, 5, dtype=I64)], (0, 0, 720, 640),
         {"axis": 0}),
    # Views: 0 FLOPs, 0 bytes either way.
    case("reshape", "Reshape", [x(2, 3, 4), i64(6, 4)], (0, 0, 0, 0)),
    case("flatten", "Flatten", [x(2, 3, 4)], (0, 0, 0, 0), {"axis": 1}),
    case("squeeze", "Squeeze", [x(1, 3, 1, 4), i64(0, 2)], (0, 0, 0, 0), opset=13),
    case("unsqueeze", "Unsqueeze", [x(3, 4), i64(0)], (0, 0, 0, 0), opset=13),
    case("identity", "Identity", [x(3, 4)], (0, 0, 0, 0)),
    case("dropout", "Dropout", [x(3, 4)], (0, 0, 0, 0), opset=13),
    # Shape of (2,3,4): reads metadata only (0); writes int64 (3,) = 24
    case("shape", "Shape", [x(2, 3, 4)], (0, 0, 0, 24)),
    # Cast float32 → float16 (2,3,4): read 24·4 = 96; written 24·2 = 48
    case("cast_f32_to_f16", "Cast", [x(2, 3, 4)], (0, 0, 96, 48), {"to": F16}),
    # Expand (3,1) to [2,3,4]: read 3·4 = 12 + shape 3·8 = 24 → 36; written 24·4 = 96
    case("expand", "Expand", [x(3, 1), i64(2, 3, 4)], (0, 0, 36, 96)),
    # Tile (2,3) repeats [2,2] → (4,6): read 24 + 16 = 40; written 96
    case("tile", "Tile", [x(2, 3), i64(2, 2)], (0, 0, 40, 96)),
    # ConstantOfShape [2,3] (default float32 zeros): reads nothing; writes 6·4 = 24
    case("constant_of_shape", "ConstantOfShape", [i64(2, 3)], (0, 0, 0, 24)),
    # Range(0, 10, 2) with float32 Constant inputs → 5 elems: 1 FLOP each = 5;
    #   read 3 scalars · 4 = 12; written 5·4 = 20
    case("range_constants", "Range", ["start", "limit", "delta"], (0, 5, 12, 20),
         before=RANGE_CONSTS),
]


@pytest.mark.parametrize("op, inputs, attrs, kw, expect", MOVEMENT)
def test_movement_rules(op, inputs, attrs, kw, expect):
    check(op, inputs, attrs, kw, expect)


def test_constant_reads_nothing():
    # Constant (2,3) float32 feeding Relu: Constant reads 0, writes 6·4 = 24, 0 FLOPs.
    report = analyze(build("Relu", ["c"], before=(const("c", np.zeros((2, 3))),)))
    row = report.nodes[0]
    assert (row.op, row.status) == ("Constant", "ok")
    assert (row.macs, row.flops, row.bytes_read, row.bytes_written) == (0, 0, 0, 24)


def test_gather_embedding_table_is_a_param():
    # the (100,16) embedding table is 1,600 trainable elements, though Gather reads only 640 B.
    report, row = run("Gather", [w(100, 16), x(2, 5, dtype=I64)], {"axis": 0})
    assert report.totals.params == 1_600
    assert row.params == 1_600


def test_resize_with_scales_initializer():
    # Same numbers as resize_linear_const_scales: (1,2,3,3) ×[1,1,2,2] → (1,2,6,6) = 72 outputs;
    #   FLOPs 72·9 = 648; read 72 + 16 = 88; written 288; params 0 (scales are not weights).
    report, row = run("Resize", [x(1, 2, 3, 3), None, np.array([1, 1, 2, 2], np.float32)],
                      {"mode": "linear"}, opset=13)
    assert row.status == "ok"
    assert (row.macs, row.flops, row.bytes_read, row.bytes_written) == (0, 648, 88, 288)
    assert report.totals.params == 0


# --------------------------------------------------------------------------------------------
# Coverage: an op without a rule is reported, never silently zero
# --------------------------------------------------------------------------------------------

def test_unsupported_ops_are_reported_not_folded():
    # x (4,4) → Relu (16 FLOPs) → com.example::Foo twice: an op of a custom domain has no rule
    # (every op of onnx's own domains has one since issue #9, and an op onnx does not define in
    # its own domains is an invalid graph, refused before any pass)
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Foo", ["r"], ["f1"], domain="com.example"),
        helper.make_node("Foo", ["r"], ["f2"], domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "t", [vi("x", F32, (4, 4))],
                              [vi(o, TensorProto.UNDEFINED, None) for o in ("f1", "f2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    assert registry.lookup("com.example::Foo") is None
    report = analyze(model)
    assert report.coverage.unsupported == {"com.example::Foo": 2}
    assert [n.status for n in report.nodes] == ["ok", "unsupported", "unsupported"]
    assert report.coverage.nodes == 3
    assert report.coverage.covered == 1 < report.coverage.nodes
    assert round(report.coverage.percent, 2) == 33.33
    # totals are the covered Relu alone: 16 FLOPs, 64 B read, 64 B written
    t = report.totals
    assert (t.macs, t.flops, t.bytes_read, t.bytes_written) == (0, 16, 64, 64)


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------

def test_registering_an_existing_op_raises_and_leaves_registry_intact():
    before = registry.registered()
    conv_rule = registry.lookup("Conv")
    with pytest.raises(ValueError, match="Conv"):
        @registry.rule("Conv")
        def _dup(op):  # pragma: no cover - never registered
            return 0, 0
    with pytest.raises(ValueError, match="Reshape"):
        registry.zero_cost("Reshape", reason="duplicate")
    # _add checks a single name before inserting it, so nothing changed.
    assert registry.lookup("Conv") is conv_rule
    assert registry.registered() == before


def test_failed_multi_name_registration_is_atomic(monkeypatch):
    # On a copy of the registry, so a half-registration cannot leak into other tests.
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(ValueError):
        @registry.rule("GraphcostTestNewOp", "Conv")
        def _dup(op):  # pragma: no cover
            return 0, 0
    assert registry.lookup("GraphcostTestNewOp") is None


REQUIRED_OPS = """Relu Sigmoid Tanh LeakyRelu Clip Erf Exp Log Sqrt Pow Add Sub Mul Div Conv
ConvTranspose Gemm MatMul Einsum BatchNormalization LayerNormalization GroupNormalization
InstanceNormalization Softmax LogSoftmax MaxPool AveragePool GlobalAveragePool ReduceMean ReduceSum
ReduceMax Resize Pad Dropout Reshape Transpose Concat Slice Gather Split Squeeze Unsqueeze Flatten
Expand Where Cast Shape Constant ConstantOfShape Identity Range Tile""".split()


@pytest.mark.parametrize("op", REQUIRED_OPS)
def test_required_op_has_a_rule(op):
    assert registry.lookup(op) is not None
