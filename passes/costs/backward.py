"""Backward (and training-only) ops of the joint forward+backward graph.

Matmul-class backward ops count MACs as FlopCounterMode counts FLOPs (= 2·MACs): a
convolution's backward computes the input gradient and the weight gradient, each as many MACs
as the forward; SDPA's backward does 5 matmul-sized products where the forward does 2.
Elementwise backward ops count FLOPs per element, written next to each.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..costs.registry import OpView, ShapeUnknown, lookup, rule, zero_cost
from .linear import conv_kernel

if TYPE_CHECKING:
    from ..device_rates import DeviceRates


@rule("aten.convolution_backward.default", kernel=conv_kernel)
def convolution_backward(op: OpView) -> tuple[int, int]:
    # (grad_output, input, weight, bias_sizes, stride, …, transposed, …, output_mask)
    grad_out, weight = op.in_numel(0), op.in_shape(2)
    if op.attr("transposed"):
        fwd = op.in_numel(1) * math.prod(weight[1:])
    else:
        fwd = grad_out * math.prod(weight[1:])
    mask = tuple(op.attr("output_mask") or (True, True, True))
    macs = fwd * (int(bool(mask[0])) + int(bool(mask[1])))
    bias = grad_out if len(mask) > 2 and mask[2] else 0  # bias grad: sum of grad_output
    return macs, 2 * macs + bias


def _expanded_kv(op: OpView) -> int:
    """Bytes of dK (or dV) made for every query head where key/value heads are fewer (0 where
    they are as many): b·h_q·Sk·d in the key's dtype, summed into the outputs afterwards."""
    q, k = op.in_shape(1), op.in_shape(2)
    if k[-3] == q[-3]:
        return 0
    itemsize = (op.in_spec(2).nbytes or 0) // max(1, math.prod(k))
    return math.prod(q[:-3]) * q[-3] * k[-2] * k[-1] * itemsize


def cudnn_attention_backward_workspace(op: OpView, device: "DeviceRates") -> tuple[int, ...]:
    """cuDNN's workspace around its attention backward, one allocation: dQ accumulated in
    fp32 and a float per query row (b·h·Sq·(d + 1)·4 B) + 256 B, and with fewer key/value
    heads than query heads dK and dV for every query head in the input's dtype. Read off PyTorch
    2.11's allocator traces on an H200 (cuDNN 9.19, bf16,
    benchmarks/results/cuda_traces_h200.json.gz): 8,519,936 B for 4 heads of 64 over 8,192
    tokens, 33,816,832 B for 16 query and 8 key/value heads of 64 over 2 × 2,048 — two
    traces, so an estimate beyond their shapes."""
    q = op.in_shape(1)
    return (math.prod(q[:-1]) * (q[-1] + 1) * 4 + 256 + 2 * _expanded_kv(op),)


def flash_attention_backward_workspace(op: OpView, device: "DeviceRates") -> tuple[int, ...]:
    """What FlashAttention-2's backward allocates besides dQ, dK, dV (PyTorch's
    flash_api.cpp ``mha_bwd``, from source, not measured): the softmax's row sums
    (b·h·Sq'·4 B) and dQ accumulated in fp32 (b·Sq'·h·d'·4 B), Sq' the query length rounded
    up to 128 and d' the head size to 32 (64 above 128); with fewer key/value heads than query
    heads, dK and dV for every query head in the input's dtype, summed into the outputs. The
    same bytes cuDNN's measured workspace holds, less its 256 (see
    ``cudnn_attention_backward_workspace``)."""
    *lead, heads, rows, d = op.in_shape(1)
    bh = math.prod(lead) * heads
    step = 32 if d <= 128 else 64
    rows_r, d_r = -(-rows // 128) * 128, -(-d // step) * step
    kv = _expanded_kv(op)
    return (bh * rows_r * 4, bh * rows_r * d_r * 4) + ((kv, kv) if kv else ())


def efficient_attention_backward_workspace(op: OpView, device: "DeviceRates"
                                           ) -> tuple[int, ...]:
    """What the memory-efficient (CUTLASS) kernel's backward allocates besides dQ, dK, dV
    (PyTorch's attention_backward.cu ``_efficient_attention_backward``, from source, not
    measured): ``delta``, a float per query row (b·h·Sq·4 B; in fp32 it is computed through
    a float product of dO and O that is freed before the workspace comes: left out), then the
    kernel's workspace, for heads of up to 64 the fp32 dQ accumulator of its 64 × 64 tiles
    (b·h·⌈Sq/64⌉·16,400 B on sm80 and later); larger heads' tiles are not modelled."""
    q = op.in_shape(1)
    *lead, heads, rows, d = q
    bh = math.prod(lead) * heads
    out = (bh * rows * 4,)
    if d <= 64 and device.capability is not None and device.capability >= (8, 0):
        out += (bh * -(-rows // 64) * 16_400,)
    return out


@rule("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
      kernel="attention")
def sdpa_backward(op: OpView) -> tuple[int, int]:
    # (grad_out, query, key, value, out, …): dQ, dK, dV, dP and the recomputed P = 5 products
    # of Sq·Sk·D per head (FlopCounterMode: 10·b·h·Sq·Sk·d FLOPs), softmax backward 3/score.
    q, k = op.in_shape(1), op.in_shape(2)
    b_h_sq = math.prod(q[:-1])
    sk, d = k[-2], q[-1]
    macs = 5 * b_h_sq * sk * d
    return macs, 2 * macs + 3 * b_h_sq * sk


rule("aten._scaled_dot_product_cudnn_attention_backward.default",
     workspace=cudnn_attention_backward_workspace, kernel="attention")(sdpa_backward)
rule("aten._scaled_dot_product_flash_attention_backward.default",
     workspace=flash_attention_backward_workspace, kernel="attention")(sdpa_backward)
rule("aten._scaled_dot_product_efficient_attention_backward.default",
     workspace=efficient_attention_backward_workspace, kernel="attention")(sdpa_backward)


@rule("aten.gelu_backward.default")
def gelu_backward(op: OpView) -> tuple[int, int]:
    # (grad_output, self, approximate): one kernel in PyTorch; per element the elementwise ops
    # of its reference decomposition (torch/_decomp): exact — x/√2, erf, +1, ·½ (the CDF),
    # x·x, ·−½, exp, ·1/√(2π) (the PDF), x·PDF, CDF + x·PDF, ·grad = 11; tanh form 18
    return 0, (18 if op.attr("approximate", "none") == "tanh" else 11) * op.out_numel(0)


@rule("aten.threshold_backward.default")
def threshold_backward(op: OpView) -> tuple[int, int]:
    # (grad_output, self, threshold): ReLU's backward, one kernel in PyTorch, which reads the
    # saved output while it writes the gradient (decomposed, a boolean mask of it was made
    # first and the output freed: the step's peak 0.75 of an activation low); per element its
    # reference decomposition's compare and select = 2
    return 0, 2 * op.out_numel(0)


@rule("aten.silu_backward.default")
def silu_backward(op: OpView) -> tuple[int, int]:
    # (grad_output, self): one kernel in PyTorch; per element its reference decomposition's
    # grad · s · (1 + x · (1 − s)) with s = sigmoid(x): sigmoid 3, 1 − s, x·, 1 +, s·, grad· = 8
    return 0, 8 * op.out_numel(0)


@rule("aten.embedding_dense_backward.default")
def embedding_backward(op: OpView) -> tuple[int, int]:
    # (grad_output, indices, num_weights, padding_idx, scale_grad_by_freq): one kernel in
    # PyTorch; its reference decomposition's count: each index compared with padding_idx,
    # each gradient element masked, then added into its row (index_put, counted as a copy)
    return 0, op.in_numel(0) + op.in_numel(1)


@rule("aten.index_select_backward.default")
def index_select_backward(op: OpView) -> tuple[int, int]:
    # (grad, self_sizes, dim, index): zeros of the input's size, then each gradient element
    # added into its row (index_add): one add per gradient element
    return 0, op.in_numel(0)


@rule("aten.native_layer_norm_backward.default")
def layer_norm_backward(op: OpView) -> tuple[int, int]:
    # (grad_out, input, mean, rstd, weight, bias; normalized_shape, output_mask): one kernel
    # in PyTorch; per element its reference decomposition's x̂ = (x − mean)·rstd (2), the
    # input gradient's g·w, its two row sums and their products, subtractions and scale (9),
    # the weight gradient's g·x̂ and sum (2), the bias gradient's sum (1); per row 1/N
    mask = tuple(op.attr("output_mask") or (True, True, True))
    per = 2 + 9 * bool(mask[0]) + 2 * bool(mask[1]) + bool(len(mask) > 2 and mask[2])
    return 0, per * op.in_numel(1) + op.in_numel(2)


@rule("aten.native_group_norm_backward.default")
def group_norm_backward(op: OpView) -> tuple[int, int]:
    # (grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask): one kernel in
    # PyTorch; per element as a LayerNorm's backward (x̂ 2, the input gradient 9, the weight
    # gradient's g·x̂ and sum 2, the bias gradient's sum 1); per group 1
    mask = tuple(op.attr("output_mask") or (True, True, True))
    per = 2 + 9 * bool(mask[0]) + 2 * bool(mask[1]) + bool(len(mask) > 2 and mask[2])
    return 0, per * op.in_numel(1) + op.in_numel(2)


# (kernel="batch_norm": a training step's batch norm, forward with its statistics and backward,
# runs far from the memory rate of its bytes on a CPU — about 3.5 times their time for
# MobileNetV2's: graphcost calibrate times the pair)
@rule("aten.native_batch_norm_backward.default", buffer_inputs=(3, 4), kernel="batch_norm")
def batch_norm_backward(op: OpView) -> tuple[int, int]:
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
    # output_mask): one kernel in PyTorch; FLOPs its reference decomposition's (torch/_decomp):
    # per element Σgrad (1) and Σgrad·(x−mean) (3); the input gradient (grad − (x−mean)·proj
    # − mean grad)·scale 5 more; per channel the weight gradient (1) and, with the input
    # gradient, its four scale factors and the mean gradient (5)
    mask = tuple(op.attr("output_mask") or (True, True, True))
    n, c = op.in_numel(1), op.in_shape(1)[1] if len(op.in_shape(1)) > 1 else 1
    return 0, n * (9 if mask[0] else 4) + c * (6 if mask[0] else 1)


@rule("aten.max_pool2d_with_indices_backward.default",
      "aten.max_pool3d_with_indices_backward.default", "aten.avg_pool2d_backward.default",
      "aten._adaptive_avg_pool2d_backward.default")
def pool_backward(op: OpView) -> tuple[int, int]:
    return 0, op.out_numel(0)  # one scatter-add (or divide) per input-gradient element


@rule("aten.grid_sampler_2d_backward.default", "aten.grid_sampler_3d_backward.default")
def grid_sampler_backward(op: OpView) -> tuple[int, int]:
    # (grad_output, input, grid, interpolation_mode, …, output_mask): per grad_output element
    # and each of the mode's n taps (bilinear 2^r, bicubic 4^r, nearest 1): the input gradient
    # multiplies and scatter-adds (2n); the grid gradient, per coordinate, weighs the tap
    # values by the gradient (2n each; nearest has none) after unnormalizing (2 per
    # coordinate and position).
    grad, grid = op.in_numel(0), op.in_shape(2)
    r = grid[-1]
    mode = int(op.attr("interpolation_mode", 0))
    taps = {0: 2 ** r, 1: 1, 2: 4 ** r}.get(mode, 2 ** r)
    mask = tuple(op.attr("output_mask") or (True, True))
    flops = grad * 2 * taps if mask[0] else 0
    if mask[-1] and mode != 1:
        flops += grad * 2 * taps * r + math.prod(grid[:-1]) * 2 * r
    return 0, flops


@rule("aten._native_batch_norm_legit_functional.default", "aten._native_batch_norm_legit.no_stats",
      buffer_inputs=(3, 4), kernel="batch_norm")
def batch_norm_train(op: OpView) -> tuple[int, int]:
    return 0, 5 * op.in_numel(0)  # statistics + normalize (design notes: ≈5 per element)


# (kernel="random": drawing the numbers is the work — PyTorch's CPU bernoulli_ draws one
# element at a time, about 20 times an elementwise copy's time per element: docs/time.md)
@rule("aten.native_dropout.default", cpu_noise=1, kernel="random")
def dropout_train(op: OpView) -> tuple[int, int]:
    return 0, 2 * op.in_numel(0)  # draw + compare for the mask, scale the kept values


@rule("aten.bernoulli.p", kernel="random")
def one_per_element(op: OpView) -> tuple[int, int]:
    return 0, op.in_numel(0)  # one draw per element


# ---------------------------------------------------------------------------------------------
# Synthetic backward ops of the ONNX training estimate (passes/training/backward_estimate.py). An ONNX
# export holds no backward; the estimate writes one node per differentiated forward node.

BACKWARD_OP = "graphcost.backward"          # computes gradients (or accumulates two)
# The estimate's loss (the sum of every floating output) is written with these standard ops.
LOSS_REDUCE_OP, LOSS_ADD_OP = "ReduceSum", "Add"
GRAD_VIEW_OP = "graphcost.backward_view"    # gradients passed through as views of input 0
GRAD_SEED_OP = "graphcost.grad_seed"        # d loss / d loss = 1, a scalar

MATMUL_BACKWARD_FACTOR = {"Attention": 2.5}  # SDPA: 5 products backward to the forward's 2
_BIASED = frozenset({"Conv", "ConvTranspose", "Gemm"})  # input 2 is a bias


@rule(BACKWARD_OP, saves="nothing")
def estimated_backward(op: OpView) -> tuple[int, int]:
    """FLOPs of a synthesized backward node, from its forward node's own rule.

    attrs: ``forward_index`` (the forward node in the same graph), ``grad_inputs`` (the forward
    input positions that receive a gradient), ``accumulate`` (this node adds two gradient
    contributions of one tensor: 1 FLOP per element).

    * matmul-class (the forward has MACs): each factor needing a gradient costs one product the
      size of the forward (dX = dY·Wᵀ and dW = Xᵀ·dY: 2× the forward MACs when both are needed,
      1× for a first layer whose input needs none — as aten.convolution_backward's output_mask),
      FLOPs = 2·MACs, + 1 per output element for a bias gradient (a sum of dY). Attention: 2.5×
      the forward's MACs (FlopCounterMode's SDPA formulas: 5 products to the forward's 2).
    * everything else: the forward's FLOPs — the derivative costs about what the function does
      (ReLU 1 vs aten's threshold_backward 1, GELU 8 vs 8, LayerNorm 7 vs 8, softmax 5 vs 3);
      data movement and views 0.
    """
    if op.attr("accumulate"):
        return 0, op.out_numel(0)
    graph = op.graph
    fwd = graph.nodes[op.attr("forward_index")]
    r = lookup(fwd.op)
    if r is None:  # the estimator names such nodes so that they show as unsupported
        raise ShapeUnknown(fwd.op)
    macs, flops = r.fn(OpView(fwd, graph))
    if not macs:
        return 0, flops
    grads = set(op.attr("grad_inputs") or ())
    if fwd.op in MATMUL_BACKWARD_FACTOR:
        bmacs = int(macs * MATMUL_BACKWARD_FACTOR[fwd.op])
    elif fwd.op == "Einsum":
        bmacs = macs * len(grads)
    else:
        bmacs = macs * len(grads & {0, 1})
    bias = OpView(fwd, graph).out_numel(0) if fwd.op in _BIASED and 2 in grads else 0
    return bmacs, 2 * bmacs + bias


zero_cost(GRAD_VIEW_OP, reason="a gradient passed through unchanged (the backward of a view, a "
          "transpose, an add or a concat): a view of the incoming gradient", alias=True,
          family="backward")
zero_cost(GRAD_SEED_OP, reason="d loss / d loss = 1: a constant scalar", reads="none",
          family="backward")
