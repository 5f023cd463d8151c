"""The aten table beside the ONNX one (tests/test_cost_rules.py), and ONNX/FX parity.

Each case is a one-op torch module traced through the FX frontend (torch.export, then the core
ATen decompositions): the expected MACs and FLOPs are worked out by hand in the comment above
it (conventions in tests/test_cost_rules.py's docstring). The same module exported to ONNX
(the legacy exporter, opset 17) must give the same MACs and FLOPs: one rule per op, reached
from either vocabulary, whatever the exporter or the decompositions split the op into.
"""
from __future__ import annotations

import io

import onnx
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from graphcost import analyze


class SDPA(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


class Op(nn.Module):
    """A module around one functional op."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class Solve(nn.Module):
    """torch.linalg.solve_triangular of a lower-triangular A against B."""

    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, a, b):
        return torch.linalg.solve_triangular(a, b, upper=False, **self.kw)


class Grid(nn.Module):
    def forward(self, x, grid):
        return F.grid_sample(x, grid, mode="bilinear", align_corners=False)


def case(id, module, shapes, macs, flops):
    return pytest.param(module, shapes, macs, flops, id=id)


CASES = [
    # conv 3→8, k3 p1, bias, on 1×3×8×8: 8·8·8 = 512 outputs, each 3·3·3 = 27 MACs
    # → 13,824 MACs; FLOPs 2·13,824 + 512 bias adds = 28,160
    case("conv", nn.Conv2d(3, 8, 3, padding=1), [(1, 3, 8, 8)], 13_824, 28_160),
    # linear 16→32 on 4×16: 128 outputs × 16 = 2,048 MACs; 2·2,048 + 128 bias = 4,224
    case("linear", nn.Linear(16, 32), [(4, 16)], 2_048, 4_224),
    # layer norm over 16 with affine on 4×16: 64 elements × (5 + scale + bias) = 448
    case("layer_norm", nn.LayerNorm(16), [(4, 16)], 0, 448),
    # eval batch norm folds to x·s + t: 1·8·4·4 = 128 elements × 2 = 256
    case("batch_norm", nn.BatchNorm2d(8).eval(), [(1, 8, 4, 4)], 0, 256),
    # relu: 64 elements × 1
    case("relu", nn.ReLU(), [(1, 64)], 0, 64),
    # hardswish: x·clamp(x + 3, 0, 6)/6 → add, min, max, mul, div = 5 × 64 = 320
    case("hardswish", nn.Hardswish(), [(1, 64)], 0, 320),
    # silu: x·sigmoid(x) → sigmoid 3 + mul 1 = 4 × 64 = 256
    case("silu", nn.SiLU(), [(1, 64)], 0, 256),
    # exact gelu: 0.5·x·(1 + erf(x/√2)) → 5 × 64 = 320
    case("gelu", nn.GELU(), [(1, 64)], 0, 320),
    # softmax over 16 on 4×16: max, subtract, exp, sum, divide = 5 × 64 = 320
    case("softmax", Op(lambda x: torch.softmax(x, -1)), [(4, 16)], 0, 320),
    # max pool k2 s2 on 1×4×8×8 → 1×4×4×4 = 64 outputs × 2·2 window = 256
    case("max_pool", nn.MaxPool2d(2), [(1, 4, 8, 8)], 0, 256),
    # average pool: the same window count, 256
    case("avg_pool", nn.AvgPool2d(2), [(1, 4, 8, 8)], 0, 256),
    # global average pool: every one of the 1·4·8·8 = 256 inputs added once
    case("global_avg_pool", nn.AdaptiveAvgPool2d(1), [(1, 4, 8, 8)], 0, 256),
    # bilinear upsample 1×3×8×8 → 1×3×16×16 (aten.upsample_bilinear2d.vec; ONNX Resize
    # linear): 768 outputs × 3 lerps of 3 FLOPs (2 resized axes: 2² − 1 lerps) = 6,912
    case("upsample_bilinear", Op(lambda x: F.interpolate(x, size=(16, 16), mode="bilinear",
                                                         align_corners=False)),
         [(1, 3, 8, 8)], 0, 6_912),
    # the same with align_corners and a scale factor: 1×3×5×7 → 1×3×10×14 = 420 outputs × 9
    case("upsample_bilinear_corners", Op(lambda x: F.interpolate(
        x, scale_factor=2, mode="bilinear", align_corners=True)), [(1, 3, 5, 7)], 0, 3_780),
    # bicubic 1×3×8×8 → 1×3×16×16 (aten.upsample_bicubic2d.vec, kept whole; ONNX Resize
    # cubic): 768 outputs × 4 taps × (mul + add) × 2 resized axes = 12,288
    case("upsample_bicubic", Op(lambda x: F.interpolate(x, size=(16, 16), mode="bicubic",
                                                        align_corners=False)),
         [(1, 3, 8, 8)], 0, 12_288),
    # trilinear 1×2×4×4×4 → 1×2×8×8×8 = 1,024 outputs × 7 lerps (2³ − 1) × 3 = 21,504
    case("upsample_trilinear", Op(lambda x: F.interpolate(x, scale_factor=2,
                                                          mode="trilinear")),
         [(1, 2, 4, 4, 4)], 0, 21_504),
    # grid_sample bilinear, x 1×3×8×8, grid 1×5×6×2 → 1×3×5×6 = 90 outputs × 7 (4 taps: 4
    # multiplies + 3 adds) = 630, + 30 positions × 2 coordinates × 2 (unnormalize) = 120 → 750
    case("grid_sample", Grid(), [(1, 3, 8, 8), (1, 5, 6, 2)], 0, 750),
    # log2 of 64 elements: ln(x)·(1/ln 2) = 2 FLOPs each (the exporters' Log + Div) → 128
    case("log2", Op(torch.log2), [(64,)], 0, 128),
    # max of a 4×16 tensor (aten.max.default, ONNX ReduceMax): one compare per element = 64
    case("max_all", Op(torch.max), [(4, 16)], 0, 64),
]
# Rules the legacy ONNX exporter cannot reach (opset 17 has no 5-D GridSample): FX only.
FX_CASES = [
    # grid_sample trilinear, x 1×3×4×8×8, grid 1×2×5×6×3 → 1×3×2×5×6 = 180 outputs × 15
    # (8 taps: 8 multiplies + 7 adds) = 2,700, + 60 positions × 3 coordinates × 2 = 360
    # → 3,060
    case("grid_sample_3d", Grid(), [(1, 3, 4, 8, 8), (1, 2, 5, 6, 3)], 0, 3_060),
    # windowed attention: SDPA on rank-5 (B, heads, windows, N, d) = (1, 3, 16, 196, 32), as
    # timm's NesT calls it: QKᵀ 3·16·196·196·32 = 59,006,976 MACs + PV the same = 118,013,952;
    # FLOPs 2·MACs + 6 per score (3·16·196·196 = 1,843,968 scores) = 247,091,712
    case("sdpa_rank5", SDPA(), [(1, 3, 16, 196, 32)] * 3, 118_013_952, 247_091_712),
    # triangular solve A X = B, A 2×4×4 unit lower-triangular, B 2×4×3 (the gated delta
    # rule's call): x_i = b_i − Σ_{j<i} a_ij·x_j, 0 + 1 + 2 + 3 = 6 MACs per column, 2·3
    # columns → 36 MACs, 72 FLOPs, no divisions (unit diagonal)
    case("solve_triangular_unit", Solve(unitriangular=True), [(2, 4, 4), (2, 4, 3)], 36, 72),
    # X A = B (left=False), A 5×5 lower-triangular, B 3×5: each row of X solved from its
    # last element back, 0 + 1 + 2 + 3 + 4 = 10 MACs a row → 30 MACs; FLOPs 60 + one
    # division per element of X (15) = 75
    case("solve_triangular_right", Solve(left=False), [(5, 5), (3, 5)], 30, 75),
    # antialiased bicubic 1×2×8×8 → 1×2×4×4, each axis shrunk by 2: 4 taps stretched to 8;
    # the last axis first, 1·2·8·4 = 64 outputs × 8 taps × 2 = 1,024, then the rows,
    # 1·2·4·4 = 32 × 16 = 512 → 1,536
    case("upsample_bicubic_aa", Op(lambda x: F.interpolate(
        x, size=(4, 4), mode="bicubic", antialias=True)), [(1, 2, 8, 8)], 0, 1_536),
    # antialiased bilinear 1×1×4×4 → 1×1×8×6, enlarged (2 taps as they are): 1·1·4·6 = 24 ×
    # 2 taps × 2 = 96, then 1·1·8·6 = 48 × 4 = 192 → 288
    case("upsample_bilinear_aa", Op(lambda x: F.interpolate(
        x, size=(8, 6), mode="bilinear", antialias=True)), [(1, 1, 4, 4)], 0, 288),
    # HaloNet's windows and Gemma 4's checks, x 1×2×10 (20 elements): unfold(-1, 4, 2) a
    # view of (10 − 4)/2 + 1 = 4 windows → 1×2×4×4, summed per window: 32 adds; any over
    # dims (0, 1) of x > 0: 20 compares + 20 reads = 40; torch.all(x < 100) for
    # _assert_async: 20 compares, all() as not-any-not: 20 + 20 + 1, the assert 0 → 133
    case("unfold_any_assert", Op(lambda x: (
        torch._assert_async(torch.all(x < 100), "too big"),
        x.unfold(-1, 4, 2).sum(-1), torch.any(x > 0, dim=(0, 1)))[1:]),
        [(1, 2, 10)], 0, 133),
]
# SDPA, q k v 1×2×6×4 (B H S D): QKᵀ 2·6·6·4 = 288 MACs + PV 288 = 576 MACs; FLOPs 2·576 +
# softmax 5 and scale 1 per score (2·6·6 = 72 scores) = 1,152 + 432 = 1,584. The legacy
# exporter writes attention as MatMul → Softmax → MatMul with √scale applied to q and to kᵀ
# (48 + 48 multiplies instead of 72 on the scores) and 4 scalar ops computing √scale
# (Sqrt, Div, Sqrt, Sqrt): 1,584 − 72 + 96 + 4 = 1,612.
ATTENTION = (SDPA(), [(1, 2, 6, 4)] * 3, 576, 1_584, 1_612)


def fx_totals(module, shapes):
    args = tuple(torch.randn(s) for s in shapes)
    r = analyze(module, args)
    assert r.coverage.unsupported == {} and r.coverage.unknown_shape == {}, r.coverage
    return r.totals.macs, r.totals.flops


def onnx_totals(module, shapes):
    args = tuple(torch.randn(s) for s in shapes)
    buf = io.BytesIO()
    torch.onnx.export(module, args, buf, dynamo=False, opset_version=17)
    r = analyze(onnx.load_from_string(buf.getvalue()))
    assert r.coverage.unsupported == {} and r.coverage.unknown_shape == {}, r.coverage
    return r.totals.macs, r.totals.flops


@pytest.mark.parametrize("module, shapes, macs, flops", CASES)
def test_aten_rules_and_onnx_parity(module, shapes, macs, flops):
    module = module.eval()
    assert fx_totals(module, shapes) == (macs, flops)
    assert onnx_totals(module, shapes) == (macs, flops)


@pytest.mark.parametrize("module, shapes, macs, flops", FX_CASES)
def test_aten_rules_fx_only(module, shapes, macs, flops):
    assert fx_totals(module.eval(), shapes) == (macs, flops)


def test_attention_macs_equal_and_flops_differ_by_the_exporters_scaling():
    module, shapes, macs, fx_flops, onnx_flops = ATTENTION
    assert fx_totals(module, shapes) == (macs, fx_flops)
    assert onnx_totals(module, shapes) == (macs, onnx_flops)


def test_a_registered_name_the_decompositions_remove_is_reported_unreachable():
    # aten.mish is decomposed (x · tanh(softplus(x))) before any graph reaches the registry
    from graphcost.analyzer.frontends.torch.frontend import training_decompositions
    from graphcost.passes.costs.registry import (
        _REGISTRY,
        registered,
        unreachable,
        zero_cost,
    )
    removed = {str(op) for op in training_decompositions()}
    assert "aten.mish.default" in removed and "aten.mish.default" not in registered()
    zero_cost("aten.mish.default", reason="test")
    try:
        assert "aten.mish.default" in unreachable(removed)
    finally:
        del _REGISTRY["aten.mish.default"]


class GridOfLinear(nn.Module):
    """grid_sample whose input and grid both need a gradient (a conv and a linear before)."""

    def __init__(self):
        super().__init__()
        self.conv, self.linear = nn.Conv2d(3, 3, 1), nn.Linear(2, 2)

    def forward(self, x, grid):
        return F.grid_sample(self.conv(x), self.linear(grid), align_corners=False)


def test_grid_sampler_backward_hand_count():
    # grad_output 1×3×5×6 = 90 elements, bilinear (4 taps), 2 coordinates: the input gradient
    # 90·2·4 = 720; the grid's 90·2·4·2 = 1,440 + 30 positions × 2 coordinates × 2 = 120
    # → 2,280
    r = analyze(GridOfLinear(), (torch.randn(1, 3, 8, 8), torch.randn(1, 5, 6, 2)), train=True)
    (node,) = [n for n in r.nodes if n.op == "aten.grid_sampler_2d_backward.default"]
    assert node.flops == 2_280


class StridedScatter(nn.Module):
    """new_empty_strided (DeepSeek-V3) and as_strided_scatter (ConvNeXt's training graph)."""

    def forward(self, x):
        y = x.new_empty_strided((4, 8), (8, 1)).fill_(1.0)
        z = torch.as_strided_scatter(x, y[:2] * 2, (2, 8), (8, 1))
        return z + y


def test_strided_allocation_and_scatter_are_costed_movement():
    # x 4×8: the fill and the scatter move data only; y[:2]·2 is 2·8 = 16 multiplies and
    # z + y 4·8 = 32 adds → 48 FLOPs, no MACs, every node with a rule
    r = analyze(StridedScatter(), input_shapes={"x": (4, 8)})
    assert r.coverage.percent == 100.0 and (r.totals.macs, r.totals.flops) == (0, 48)
