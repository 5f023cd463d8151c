"""Table tests for the rule families of issue #9 (quantized, contrib, recurrent, signal,
detection, ml, sequence, losses and the remaining default-domain ops).

Same conventions as tests/test_cost_rules.py: one-node models, expected (MACs, FLOPs, bytes
read, bytes written) worked out by hand in the comment above each row. float32 = 4 B,
uint8/int8 = 1 B, int32 = 4 B, int64 = 8 B, bool = 1 B. Inputs given as ndarrays are
initializers (read like any input); X(...) are graph inputs.
"""
from __future__ import annotations

import numpy as np
import pytest
from graphcost.analyzer.app.api import analyze
from onnx import TensorProto

from tests.test_cost_rules import build, x

F32, I64, U8, I32, BOOL = (TensorProto.FLOAT, TensorProto.INT64, TensorProto.UINT8,
                           TensorProto.INT32, TensorProto.BOOL)


def f(*shape) -> np.ndarray:
    return np.ones(shape, np.float32)


def u8(*shape) -> np.ndarray:
    return np.ones(shape, np.uint8)


def s(v: float) -> np.ndarray:
    return np.array(v, np.float32)       # a float32 scalar: 4 B


ZP = np.array(0, np.uint8)               # a uint8 zero point: 1 B


def i64(*v) -> np.ndarray:
    return np.array(v, np.int64)


def row(op, inputs, attrs=None, *, domain="", opset=22, n_out=1, ml_opset=None):
    model = build(op, inputs, attrs, opset=opset, n_out=n_out, domain=domain)
    if ml_opset:
        for o in model.opset_import:
            if o.domain == domain:
                o.version = ml_opset
    report = analyze(model)
    return report, report.nodes[-1]


def case(id, op, inputs, expect, attrs=None, **kw):
    return pytest.param(op, inputs, attrs, kw, expect, id=id)


MS = dict(domain="com.microsoft")
ML = dict(domain="ai.onnx.ml")
QUANT = [
    # QuantizeLinear (2,3,4): 24·5 = 120; read 96 + 4 + 1 = 101; written 24 uint8
    case("quantize", "QuantizeLinear", [x(2, 3, 4), s(0.1), ZP], (0, 120, 101, 24)),
    # DequantizeLinear uint8 (2,3,4): 24·2 = 48; read 24 + 4 + 1 = 29; written 96
    case("dequantize", "DequantizeLinear", [x(2, 3, 4, dtype=U8), s(0.1), ZP], (0, 48, 29, 96)),
    # DynamicQuantizeLinear (2,3,4): min/max 2 + quantize 5 = 7·24 = 168; read 96;
    #   written y 24 + scale 4 + zero point 1 = 29
    case("dynamic_quantize", "DynamicQuantizeLinear", [x(2, 3, 4)], (0, 168, 96, 29),
         n_out=3),
    # MatMulInteger uint8 (3,4)·(4,5): MACs 3·5·4 = 60; FLOPs 120 + zero points 12 + 20 = 152;
    #   read 12 + 20 + 1 + 1 = 34; written int32 15·4 = 60
    case("matmul_integer", "MatMulInteger", [x(3, 4, dtype=U8), u8(4, 5), ZP, ZP],
         (60, 152, 34, 60)),
    # ConvInteger x (1,1,5,5), w (2,1,3,3), x_zp only: out 2·3·3 = 18; MACs 18·9 = 162;
    #   FLOPs 324 + 25 = 349; read 25 + 18 + 1 = 44; written int32 72
    case("conv_integer", "ConvInteger", [x(1, 1, 5, 5, dtype=U8), u8(2, 1, 3, 3), ZP],
         (162, 349, 44, 72)),
    # QLinearMatMul (2,4)·(4,3): MACs 24; FLOPs 48 + 8 + 12 + requantize 5·6 = 98;
    #   read a 8 + 4 + 1, b 12 + 4 + 1, y 4 + 1 = 35; written 6
    case("qlinear_matmul", "QLinearMatMul",
         [x(2, 4, dtype=U8), s(0.1), ZP, u8(4, 3), s(0.1), ZP, s(0.1), ZP], (24, 98, 35, 6)),
    # QLinearConv x (1,1,4,4), w (2,1,3,3), bias int32 (2,): out 2·2·2 = 8; MACs 8·9 = 72;
    #   FLOPs 144 + x 16 + w 18 + bias 8 + requantize 40 = 226;
    #   read 16 + 5 + 18 + 5 + 5 + 8 = 57; written 8
    case("qlinear_conv", "QLinearConv",
         [x(1, 1, 4, 4, dtype=U8), s(0.1), ZP, u8(2, 1, 3, 3), s(0.1), ZP, s(0.1), ZP,
          np.zeros(2, np.int32)], (72, 226, 57, 8)),
    # com.microsoft QLinearAdd (2,3)+(3,): dequantize 2·(6 + 3) = 18, add + quantize 6·6 = 36
    #   → 54; read 6 + 5 + 3 + 5 + 5 = 24; written 6
    case("qlinear_add", "QLinearAdd",
         [x(2, 3, dtype=U8), s(0.1), ZP, x(3, dtype=U8), s(0.1), ZP, s(0.1), ZP],
         (0, 54, 24, 6), **MS),
    # QLinearSigmoid (2,3): (2 + 3 + 5)·6 = 60; read 6 + 10 = 16; written 6
    case("qlinear_sigmoid", "QLinearSigmoid", [x(2, 3, dtype=U8), s(0.1), ZP, s(0.1), ZP],
         (0, 60, 16, 6), **MS),
    # QLinearSoftmax (2,3): (2 + 5 + 5)·6 = 72
    case("qlinear_softmax", "QLinearSoftmax", [x(2, 3, dtype=U8), s(0.1), ZP, s(0.1), ZP],
         (0, 72, 16, 6), {"opset": 13}, **MS),
    # QLinearGlobalAveragePool (1,2,3,3) → (1,2,1,1): 18 adds + (2 + 1 + 5)·2 = 34;
    #   read 18 + 10 = 28; written 2
    case("qlinear_gap", "QLinearGlobalAveragePool",
         [x(1, 2, 3, 3, dtype=U8), s(0.1), ZP, s(0.1), ZP], (0, 34, 28, 2), **MS),
    # QLinearConcat (2,3) ++ (2,1) on axis 1 → (2,4): 7·8 = 56; read 5 + 6 + 5 + 2 + 5 = 23
    case("qlinear_concat", "QLinearConcat",
         [s(0.1), ZP, x(2, 3, dtype=U8), s(0.1), ZP, x(2, 1, dtype=U8), s(0.1), ZP],
         (0, 56, 23, 8), {"axis": 1}, **MS),
    # QGemm (2,4)·(4,3) + C int32 (3,): MACs 24; FLOPs 48 + 8 + 12 + 6 + requantize 30 = 104;
    #   read 8 + 5 + 12 + 5 + 12 + 5 = 47; written 6
    case("qgemm", "QGemm",
         [x(2, 4, dtype=U8), s(0.1), ZP, u8(4, 3), s(0.1), ZP, np.zeros(3, np.int32), s(0.1),
          ZP], (24, 104, 47, 6), **MS),
    # MatMulNBits A (2,64), B packed (N=3, 2 blocks, 16 B), scales (6,): MACs 2·3·64 = 384;
    #   FLOPs 768 + dequantize 2·3·64 = 384 → 1,152; read 512 + 96 + 24 = 632; written 24
    case("matmul_nbits", "MatMulNBits", [x(2, 64), u8(3, 2, 16), f(6)], (384, 1152, 632, 24),
         {"K": 64, "N": 3, "bits": 4, "block_size": 32}, **MS),
    # MatMulIntegerToFloat (2,4)·(4,3), a_zp: MACs 24; FLOPs 48 + 8 + scale 6 = 62;
    #   read 8 + 12 + 4 + 4 + 1 = 29; written 24
    case("matmul_integer_to_float", "MatMulIntegerToFloat",
         [x(2, 4, dtype=U8), u8(4, 3), s(0.1), s(0.1), ZP], (24, 62, 29, 24), **MS),
    # DynamicQuantizeMatMul (2,4)·int8 (4,3): MACs 24; FLOPs 48 + 7·8 + 6 = 110;
    #   read 32 + 12 + 4 = 48; written 24
    case("dynamic_quantize_matmul", "DynamicQuantizeMatMul",
         [x(2, 4), np.ones((4, 3), np.int8), s(0.1)], (24, 110, 48, 24), **MS),
    # GatherBlockQuantized uint8 (10,8) holding 4-bit (10,16), 3 indices → (3,16) = 48:
    #   FLOPs 96; written 192; read = 192 + indices 24 = 216
    case("gather_block_quantized", "GatherBlockQuantized",
         [u8(10, 8), x(3, dtype=I64), f(10, 1)], (0, 96, 216, 192),
         {"bits": 4, "block_size": 16, "gather_axis": 0, "quantize_axis": 1}, **MS),
]

CONTRIB = [
    # SkipLayerNormalization (2,3,8) with gamma, beta, bias: (1 + 5 + 1 + 2)·48 = 432;
    #   read 192 + 192 + 32·3 = 480; written 192
    case("skip_layer_norm", "SkipLayerNormalization", [x(2, 3, 8), x(2, 3, 8), f(8), f(8), f(8)],
         (0, 432, 480, 192), **MS),
    # SkipSimplifiedLayerNormalization: (1 + 4)·48 = 240; read 192·2 + 32 = 416
    case("skip_simplified", "SkipSimplifiedLayerNormalization", [x(2, 3, 8), x(2, 3, 8), f(8)],
         (0, 240, 416, 192), **MS),
    # SimplifiedLayerNormalization (onnxruntime's, ONNX domain): 4·48 = 192; read 224
    case("simplified_layer_norm", "SimplifiedLayerNormalization", [x(2, 3, 8), f(8)],
         (0, 192, 224, 192)),
    # FastGelu + bias: (8 + 1)·48 = 432; BiasGelu (5 + 1)·48 = 288; Gelu 5·48 = 240;
    # BiasAdd x + bias + skip: 2·48 = 96, read 192 + 32 + 192 = 416
    case("fast_gelu", "FastGelu", [x(2, 3, 8), f(8)], (0, 432, 224, 192), **MS),
    case("bias_gelu", "BiasGelu", [x(2, 3, 8), f(8)], (0, 288, 224, 192), **MS),
    case("gelu", "Gelu", [x(2, 3, 8)], (0, 240, 192, 192), **MS),
    case("quick_gelu", "QuickGelu", [x(2, 3, 8)], (0, 240, 192, 192), **MS),
    case("bias_add", "BiasAdd", [x(2, 3, 8), f(8), x(2, 3, 8)], (0, 96, 416, 192), **MS),
    # Attention input (1,4,8), W (8,24), bias (24,), 2 heads: projection 32·24 = 768 MACs,
    #   attention Sk 4·(4·8 + 4·8) = 256 → 1,024; FLOPs 2,048 + bias 4·24 = 96 + 6·(2·4·4 = 32)
    #   = 2,336; read 128 + 768 + 96 = 992; written 128
    case("attention", "Attention", [x(1, 4, 8), f(8, 24), f(24)], (1024, 2336, 992, 128),
         {"num_heads": 2}, **MS),
    # MultiHeadAttention Q (1,4,8), K/V (1,6,8), 2 heads: 6·(32 + 32) = 384 MACs;
    #   scores 2·4·6 = 48; FLOPs 768 + 288 = 1,056; read 128 + 192 + 192 = 512; written 128
    case("multi_head_attention", "MultiHeadAttention", [x(1, 4, 8), x(1, 6, 8), x(1, 6, 8)],
         (384, 1056, 512, 128), {"num_heads": 2}, **MS),
    # GroupQueryAttention Q (1,4,16), K/V (1,4,8), 4 heads on 2 KV heads, total length 4:
    #   MACs 4·2·4·16 = 512; scores 4·4·4 = 64; FLOPs 1,024 + 384 = 1,408;
    #   read 256 + 128 + 128 + seqlens 4 + total 4 = 520;
    #   written out 256 + present K/V (1,2,4,4) 64·4·2 = 512
    case("group_query_attention", "GroupQueryAttention",
         [x(1, 4, 16), x(1, 4, 8), x(1, 4, 8), None, None, np.array([3], np.int32),
          np.array(4, np.int32)], (512, 1408, 520, 512),
         {"num_heads": 4, "kv_num_heads": 2}, n_out=3, **MS),
    # RotaryEmbedding (ONNX 23) X (1,2,4,8), cos/sin (4,4) → rot 8 of head 8: 3·64 = 192;
    #   read 256 + 64 + 64 + position ids 32 = 416; written 256
    case("rotary_onnx", "RotaryEmbedding", [x(1, 2, 4, 8), f(4, 4), f(4, 4), x(1, 4, dtype=I64)],
         (0, 192, 416, 256), opset=23),
    # com.microsoft RotaryEmbedding (input, position_ids, cos, sin), 3-D (1,4,16), 2 heads of 8
    case("rotary_ms", "RotaryEmbedding", [x(1, 4, 16), x(1, 4, dtype=I64), f(4, 4), f(4, 4)],
         (0, 192, 416, 256), {"num_heads": 2}, **MS),
    # EmbedLayerNormalization ids (1,4) int32 ×2, word (10,8), pos (6,8), segment (2,8):
    #   (3 − 1 + 7)·32 = 288; written out 128 + mask index 4 = 132; read 132 + ids 16 + 16 = 164
    case("embed_layer_norm", "EmbedLayerNormalization",
         [x(1, 4, dtype=I32), x(1, 4, dtype=I32), f(10, 8), f(6, 8), f(2, 8), f(8), f(8)],
         (0, 288, 164, 132), n_out=2, **MS),
]

RECURRENT = [
    # RNN S=3, B=2, I=4, H=5: MACs 3·2·5·(4 + 5) = 270; per unit 1 + tanh 1 = 2 →
    #   FLOPs 540 + 30·2 = 600; read 96 + 80 + 100 = 276; written Y 120 + Y_h 40 = 160
    case("rnn", "RNN", [x(3, 2, 4), f(1, 5, 4), f(1, 5, 5)], (270, 600, 276, 160),
         {"hidden_size": 5}, n_out=2),
    # GRU with bias: MACs 3·2·3·5·9 = 810; per unit 3·(1 + 2) + 12 = 21 →
    #   FLOPs 1,620 + 30·21 = 2,250; read 96 + 240 + 300 + 120 = 756; written 160
    case("gru", "GRU", [x(3, 2, 4), f(1, 15, 4), f(1, 15, 5), f(1, 30)], (810, 2250, 756, 160),
         {"hidden_size": 5}, n_out=2),
    # LSTM: MACs 3·2·4·5·9 = 1,080; per unit 4 + 15 = 19 → FLOPs 2,160 + 570 = 2,730;
    #   read 96 + 320 + 400 = 816; written Y 120 + Y_h 40 + Y_c 40 = 200
    case("lstm", "LSTM", [x(3, 2, 4), f(1, 20, 4), f(1, 20, 5)], (1080, 2730, 816, 200),
         {"hidden_size": 5}, n_out=3),
    # LinearAttention B=1, T=2, 2 heads of dk = dv = 4: MACs 2·(2·16 + 2·16) = 128;
    #   scale 2·2·4 = 16 → FLOPs 272; read 64·3 = 192; written 64 + state (1,2,4,4) 128 = 192
    case("linear_attention", "LinearAttention", [x(1, 2, 8), x(1, 2, 8), x(1, 2, 8)],
         (128, 272, 192, 192), {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "linear"},
         opset=27, n_out=2),
    # CausalConvWithState (1,2,5), k=3: MACs 30, FLOPs 60; read 40 + 24 = 64;
    #   written 40 + state (1,2,2) 16 = 56
    case("causal_conv", "CausalConvWithState", [x(1, 2, 5), f(2, 1, 3)], (30, 60, 64, 56),
         opset=27, n_out=2),
]

SIGNAL = [
    # DFT (opset 17) real (1,8,1), axis 1: one length-8 transform, 5·8·3/2 = 60;
    #   read 32; written (1,8,2) 64
    case("dft_real", "DFT", [x(1, 8, 1)], (0, 60, 32, 64), opset=17),
    # DFT (opset 20) complex (2,8,2), axis input 1: 2 transforms · 5·8·3 = 240;
    #   read 128 + 8 = 136; written 128
    case("dft_complex_axis_input", "DFT", [x(2, 8, 2), None, np.array(1, np.int64)],
         (0, 240, 136, 128),
         opset=20),
    # STFT (1,16,1), step 4, window 8: 3 frames · (window 8 + 60) = 204;
    #   read 64 + 8 + 32 = 104; written: ONNX's inference gives (1,3,8,2) (all 8 bins) = 192
    case("stft", "STFT", [x(1, 16, 1), np.array(4, np.int64), f(8)], (0, 204, 104, 192),
         opset=17),
    # HannWindow 10: 5·10 = 50; reads nothing; written 40. Blackman 9·10 = 90
    case("hann", "HannWindow", [np.array(10, np.int64)], (0, 50, 0, 40), opset=17),
    case("blackman", "BlackmanWindow", [np.array(10, np.int64)], (0, 90, 0, 40), opset=17),
]

DETECTION = [
    # RoiAlign X (1,2,8,8), 3 RoIs, 2×2 bins, sampling_ratio 2: 24 outputs · 4 samples · 8
    #   + 24 divides = 792; read 512 + 48 + 24 = 584; written 96
    case("roi_align", "RoiAlign", [x(1, 2, 8, 8), x(3, 4), x(3, dtype=I64)],
         (0, 792, 584, 96), {"output_height": 2, "output_width": 2, "sampling_ratio": 2}),
    # GridSample X (1,2,4,4), grid (1,3,3,2), bilinear: 18·7 = 126 + 9 positions·2·2 = 36
    #   → 162; read 128 + 72 = 200; written 72
    case("grid_sample", "GridSample", [x(1, 2, 4, 4), x(1, 3, 3, 2)], (0, 162, 200, 72)),
    # AffineGrid θ (2,2,3), size [2,1,3,4] → (2,3,4,2) = 48 · 3 = 144 MACs; FLOPs 288;
    #   read 48 + 32 = 80; written 192
    case("affine_grid", "AffineGrid", [x(2, 2, 3), i64(2, 1, 3, 4)], (144, 288, 80, 192)),
    # DeformConv X (1,1,4,4), W (2,1,3,3), offset (1,18,2,2): out 8; MACs 72; samples
    #   1·1·4·9 = 36 · (2 + 7) = 324 → FLOPs 144 + 324 = 468; read 64 + 72 + 288 = 424;
    #   written 32
    case("deform_conv", "DeformConv", [x(1, 1, 4, 4), f(2, 1, 3, 3), x(1, 18, 2, 2)],
         (72, 468, 424, 32)),
    # MaxUnpool (1,1,2,2) by 2×2 → (1,1,4,4): read 16 + 32 = 48; written 64
    case("max_unpool", "MaxUnpool", [x(1, 1, 2, 2), x(1, 1, 2, 2, dtype=I64)], (0, 0, 48, 64),
         {"kernel_shape": [2, 2], "strides": [2, 2]}),
]

MISC = [
    # Det (2,3,3): ⌈27/3⌉ = 9 MACs per matrix → 18; FLOPs 36 + 2·3 = 42; read 72; written 8
    case("det", "Det", [x(2, 3, 3)], (18, 42, 72, 8)),
    # Swish 5·24 = 120; SwiGLU (Swish 5 + 1)·8 = 48, read 64, written 32
    case("swish", "Swish", [x(2, 3, 4)], (0, 120, 96, 96), opset=24),
    case("swiglu", "SwiGLU", [x(2, 4), x(2, 4)], (0, 48, 64, 32), opset=28),
    # Hardmax 6 compares; CumProd 6 multiplies, read 24 + axis 8 = 32; Bernoulli 6 draws
    case("hardmax", "Hardmax", [x(2, 3)], (0, 6, 24, 24)),
    case("cumprod", "CumProd", [x(2, 3), np.array(1, np.int64)], (0, 6, 32, 24), opset=26),
    case("bernoulli", "Bernoulli", [x(2, 3)], (0, 6, 24, 24)),
    # NegativeLogLikelihoodLoss input (2,3), target (2,), mean: 2·(1 + 1) = 4; read 24 + 16;
    #   written a scalar 4. SoftmaxCrossEntropyLoss adds log-softmax 5·6 = 30 → 34
    case("nll_loss", "NegativeLogLikelihoodLoss", [x(2, 3), x(2, dtype=I64)], (0, 4, 40, 4)),
    case("softmax_cross_entropy", "SoftmaxCrossEntropyLoss", [x(2, 3), x(2, dtype=I64)],
         (0, 34, 40, 4)),
    # BitCast is a view: nothing moves
    case("bitcast", "BitCast", [x(2, 3)], (0, 0, 0, 0), {"to": TensorProto.INT32}, opset=26),
]

_TREE = dict(  # one tree: 0 → (1, 2 leaf); 1 → (3 leaf, 4 leaf): longest path 2 compares
    nodes_treeids=[0] * 5, nodes_nodeids=[0, 1, 2, 3, 4], nodes_featureids=[0, 1, 0, 0, 0],
    nodes_modes=["BRANCH_LEQ", "BRANCH_LEQ", "LEAF", "LEAF", "LEAF"],
    nodes_values=[0.5, 0.5, 0, 0, 0], nodes_truenodeids=[1, 3, 0, 0, 0],
    nodes_falsenodeids=[2, 4, 0, 0, 0], target_treeids=[0, 0, 0], target_nodeids=[2, 3, 4],
    target_ids=[0, 0, 0], target_weights=[1.0, 2.0, 3.0], n_targets=1)
ML_ROWS = [
    # LinearClassifier X (2,3), 2 classes: MACs 2·2·3 = 12; FLOPs 24 + 2·2·(intercept 1 +
    #   arg-max 1) = 32; read 24; written labels 16 + scores 16 = 32
    case("linear_classifier", "LinearClassifier", [x(2, 3)], (12, 32, 24, 32),
         {"coefficients": [1.0] * 6, "intercepts": [0.0, 0.0], "classlabels_ints": [0, 1]},
         n_out=2, **ML),
    # Normalizer L2 (2,3): 3·6 + 2 square roots = 20
    case("normalizer", "Normalizer", [x(2, 3)], (0, 20, 24, 24), {"norm": "L2"}, **ML),
    # Scaler 2·6 = 12; Binarizer 6
    case("scaler", "Scaler", [x(2, 3)], (0, 12, 24, 24), {"scale": [2.0], "offset": [1.0]},
         **ML),
    case("binarizer", "Binarizer", [x(2, 3)], (0, 6, 24, 24), **ML),
    # TreeEnsembleRegressor, 2 samples: (2 compares + 1 leaf add)·2 + 2·1 (aggregate) = 8;
    #   read 24; written (2,1) 8
    case("tree_regressor", "TreeEnsembleRegressor", [x(2, 3)], (0, 8, 24, 8), _TREE, **ML),
    # SVMRegressor, linear without support vectors, 3 coefficients: MACs 2·3 = 6;
    #   FLOPs 12 + 2 (rho) = 14; read 24; written (2,1) 8
    case("svm_regressor_linear", "SVMRegressor", [x(2, 3)], (6, 14, 24, 8),
         {"coefficients": [1.0, 1.0, 1.0], "kernel_type": "LINEAR", "n_supports": 0}, **ML),
]


def _check(op, inputs, attrs, kw, expect):
    report, r = row(op, inputs, attrs, **kw)
    assert r.status == "ok", (r, report.coverage)
    got = (r.macs, r.flops, r.bytes_read, r.bytes_written)
    assert got == expect, f"(macs, flops, read, written): got {got}, expected {expect}"
    return report, r


@pytest.mark.parametrize("op, inputs, attrs, kw, expect",
                         QUANT + CONTRIB + RECURRENT + SIGNAL + DETECTION + MISC + ML_ROWS)
def test_breadth_rules(op, inputs, attrs, kw, expect):
    _check(op, inputs, attrs, kw, expect)


def test_matmul_nbits_params_are_logical_elements_bytes_as_stored():
    # B (3, 2, 16) uint8 holds N·K = 3·64 = 192 4-bit weights in 96 bytes; scales (6,) are
    # metadata (24 B)
    report, _ = row("MatMulNBits", [x(2, 64), u8(3, 2, 16), f(6)],
                    {"K": 64, "N": 3, "bits": 4, "block_size": 32}, **MS)
    t = report.totals
    assert (t.params, t.param_bytes) == (192, 96)
    assert t.param_bytes_by_dtype == {"uint4": 96}
    assert (t.quant_meta, t.quant_meta_bytes) == (6, 24)


def test_quantized_conv_weights_and_int32_bias_are_params():
    # QLinearConv: w (2,1,3,3) uint8 18 B + bias int32 (2,) 8 B are params (20 elements,
    # 26 B); six scales/zero points: 3 float32 (12 B) + 3 uint8 (3 B) = 6 elements, 15 B
    report, _ = row("QLinearConv", [x(1, 1, 4, 4, dtype=U8), s(0.1), ZP, u8(2, 1, 3, 3), s(0.1),
                                    ZP, s(0.1), ZP, np.zeros(2, np.int32)])
    t = report.totals
    assert (t.params, t.param_bytes) == (20, 26)
    assert t.param_bytes_by_dtype == {"int32": 8, "uint8": 18}
    assert (t.quant_meta, t.quant_meta_bytes) == (6, 15)
    assert t.flops_by_dtype == {"int8": 226}  # uint8 inputs: priced at the int8 rate


def test_every_onnx_schema_has_a_rule():
    # every op of the default domain, ai.onnx.ml, ai.onnx.preview(.training), at every opset
    # the installed onnx knows
    from graphcost.analyzer.frontends.onnx.shapes import op_key
    from graphcost.passes.costs import lookup
    from onnx import defs
    names = {op_key(s.domain, s.name) for s in defs.get_all_schemas_with_history()
             if not s.domain.startswith("graphcost.")}  # the frontend's private shape schemas
    assert not sorted(n for n in names if lookup(n) is None)


ISSUE_CONTRIB = """Attention MultiHeadAttention GroupQueryAttention RotaryEmbedding
SkipLayerNormalization SkipSimplifiedLayerNormalization SimplifiedLayerNormalization
EmbedLayerNormalization FastGelu BiasGelu Gelu QuickGelu BiasAdd MatMulNBits MatMulIntegerToFloat
DynamicQuantizeMatMul GatherBlockQuantized QLinearAdd QLinearMul QLinearSigmoid QLinearConcat
QLinearGlobalAveragePool QLinearSoftmax""".split()


@pytest.mark.parametrize("op", ISSUE_CONTRIB)
def test_contrib_op_has_a_rule_with_shapes(op):
    from graphcost.passes.costs import lookup
    r = lookup(f"com.microsoft::{op}")
    assert r is not None and (r.shapes is not None or r.same_shape)
