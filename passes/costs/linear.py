"""Matmul-class ops: the only ops that contribute MACs.

MACs = output elements × reduction length (no bias). FLOPs = 2·MACs, plus one add per output
element for a bias and one multiply per output element for a non-unit alpha/beta. So the
matmul-class FLOPs equal torch.utils.flop_counter.FlopCounterMode's count (2·MACs, bias ignored)
once the bias adds are subtracted, and MACs match torchvision's "GFLOPS" tables.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..costs.registry import WINDOW_ATTRS, OpView, rule

if TYPE_CHECKING:
    from ..device_rates import DeviceRates


def cudnn_conv_workspace(op: OpView, device: "DeviceRates") -> tuple[int, ...]:
    """cuDNN's workspace around a convolution with a kernel larger than 1×1 (groups 1): its
    input's and output's bytes — the NHWC copies its implicit-GEMM kernels work on. Read off
    PyTorch 2.11's allocator trace of ResNet-50 at batch 64 on an H200 (cuDNN 9.19, fp32 with
    TF32, heuristics, benchmarks/results/cuda_traces_h200.json.gz): 7×7 stem 244,093,712 B
    against 244,056,064; a 3×3 at 56×56 102,908,051 against 102,760,448; deeper 3×3s up to
    11 MB more. The 1×1 convolutions there took none in the first three stages (400 B) and
    in+out in the last: counted as none. An estimate: cuDNN picks the algorithm at run time.
    None on ROCm (MIOpen's are not modelled)."""
    weight = op.in_shape(1)
    if device.rocm or len(weight) < 3 or all(k == 1 for k in weight[2:]) or \
            int(op.attr("group", 1) or 1) != 1:
        return ()
    return ((op.in_spec(0).nbytes or 0) + (op.out_spec(0).nbytes or 0),)


def broadcast_operand_copies(op: OpView, device: "DeviceRates") -> tuple[int, ...]:
    """The copies a CUDA matrix product makes of broadcast operands: cuBLAS reads a matrix
    whose rows or columns are contiguous, and an operand expanded from fewer elements
    (stride 0: the gradient of a sum, one scalar spread over every logit) is first copied
    whole (``prepare_matrix_for_cublas`` in aten/src/ATen/native/cuda/Blas.cpp), after the
    product's output is allocated. Exact: a Llama's step under the sum-of-logits loss copies
    its 262,144,000 B logit gradient once for each of the head's two products (PyTorch 2.11,
    H200, benchmarks/results/cuda_traces_h200.json.gz)."""
    first = 1 if op.node.op == "aten.addmm.default" else 0
    return tuple(op.in_spec(k).nbytes or 0 for k in (first, first + 1) if op.broadcast(k))


def conv_kernel(op: OpView) -> str:
    """A grouped convolution (MobileNet's depthwise ones: a channel per group) reaches a small
    share of a dense one's FLOP rate, so it has a curve of its own."""
    groups = op.attr("group", None) or op.attr("groups", 1) or 1
    return "grouped_conv" if int(groups) > 1 else "conv"


@rule("Conv", saves="operands", rf="conv", attr_names=WINDOW_ATTRS, kernel=conv_kernel,
      workspace=cudnn_conv_workspace, workspace_in_training=False)
def conv(op: OpView) -> tuple[int, int]:
    # W is (C_out, C_in/groups, k1, k2, ...): each output element reduces over W.shape[1:].
    out = op.out_numel()
    macs = out * math.prod(op.in_shape(1)[1:])
    return macs, 2 * macs + (out if op.has_input(2) else 0)


@rule("ConvTranspose", saves="operands", rf="conv_transpose", attr_names=WINDOW_ATTRS,
      kernel=conv_kernel)
def conv_transpose(op: OpView) -> tuple[int, int]:
    # W is (C_in, C_out/groups, k...): every input element is scattered into C_out/g·prod(k)
    # outputs, one MAC each (FlopCounterMode counts the same for transposed convs).
    macs = op.in_numel(0) * math.prod(op.in_shape(1)[1:])
    return macs, 2 * macs + (op.out_numel() if op.has_input(2) else 0)


@rule("aten.convolution.default", saves="operands", rf="conv", attr_names=WINDOW_ATTRS,
      kernel=conv_kernel, workspace=cudnn_conv_workspace, workspace_in_training=False)
def aten_convolution(op: OpView) -> tuple[int, int]:
    # aten's one convolution op (input, weight, bias) with a ``transposed`` flag (the
    # receptive-field pass reads it too).
    return conv_transpose(op) if op.attr("transposed") else conv(op)


@rule("aten.addmm.default", saves="inputs", cublas=True, workspace=broadcast_operand_copies)
def addmm(op: OpView) -> tuple[int, int]:
    # (bias, mat1, mat2): reduction over mat1's last dim, one bias add per output element.
    out = op.out_numel()
    macs = out * op.in_shape(1)[-1]
    return macs, 2 * macs + out


@rule("Gemm", saves="operands", cublas=True)
def gemm(op: OpView) -> tuple[int, int]:
    # Y = alpha·op(A)·op(B) + beta·C with Y (M, N); K = numel(A) / M whatever transA says.
    m, n = op.out_shape()
    k = op.in_numel(0) // m if m else 0
    macs = m * n * k
    extra = 0
    if op.attr("alpha", 1.0) != 1.0:
        extra += m * n
    if op.has_input(2):
        extra += m * n * (2 if op.attr("beta", 1.0) != 1.0 else 1)
    return macs, 2 * macs + extra


@rule("MatMul", "aten.mm.default", "aten.bmm.default", saves="operands", cublas=True,
      workspace=broadcast_operand_copies)
def matmul(op: OpView) -> tuple[int, int]:
    # Numpy matmul semantics: every output element reduces over A's last dim.
    a = op.in_shape(0)
    macs = op.out_numel() * (a[-1] if a else 1)
    return macs, 2 * macs


@rule("aten._scaled_mm.default", saves="operands", cublas=True)
def scaled_mm(op: OpView) -> tuple[int, int]:
    # A float8 product (torchao's float8 linears: (a, b, scale_a, scale_b, ...)): an mm whose
    # scales multiply each output once in the epilogue, which FlopCounterMode does not count
    # (its _scaled_mm formula is mm's), nor does this.
    macs = op.out_numel() * op.in_shape(0)[-1]
    return macs, 2 * macs


def _einsum_labels(term: str, rank: int) -> list[str]:
    """Labels of one operand; '...' becomes positional labels counted from the right."""
    if "..." not in term:
        return list(term)
    head, tail = term.split("...")
    n_ell = rank - len(head) - len(tail)
    return list(head) + [f"…{n_ell - i}" for i in range(n_ell)] + list(tail)


@rule("Einsum", saves="inputs")
def einsum(op: OpView) -> tuple[int, int]:
    # A contraction visits every combination of distinct labels once: MACs = Π sizes of all
    # labels. With one operand (a pure reduction or transpose) there are no MACs, one add per
    # input element. Three or more operands are counted as a left-to-right chain bounded by the
    # same product (an upper bound; stated in the README).
    eq = op.attr("equation", "").replace(" ", "")
    lhs = eq.split("->")[0]
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    for i, term in enumerate(terms):
        shape = op.in_shape(i)
        for label, size in zip(_einsum_labels(term, len(shape)), shape):
            sizes[label] = max(sizes.get(label, 1), size)
    if len(terms) == 1:
        return 0, op.in_numel(0)
    macs = math.prod(sizes.values()) * (len(terms) - 1)
    return macs, 2 * macs


@rule("Det", saves="inputs")
def det(op: OpView) -> tuple[int, int]:
    # (…, n, n): an LU factorization per matrix, ⌈n³/3⌉ MACs, then the product of the n
    # diagonal entries (n).
    n = op.in_shape(0)[-1]
    mats = op.in_numel(0) // max(1, n * n)
    macs = mats * -(-n ** 3 // 3)
    return macs, 2 * macs + mats * n


@rule("aten.linalg_solve_triangular.default", saves="inputs", cublas=True)
def solve_triangular(op: OpView) -> tuple[int, int]:
    # A X = B (left) or X A = B, A (…, n, n) triangular: each of X's elements x_i is its
    # right-hand side less the i − 1 products with the elements solved before it, then one
    # division by A's diagonal (none when unitriangular). Over a row of n: n(n − 1)/2
    # multiply-adds, so MACs = numel(X)·(n − 1)/2 (an integer: numel(X) holds n), the
    # unit-diagonal count of LAPACK's xTRSM. The backward keeps A and X, X of B's size.
    n = op.in_shape(0)[-1]
    out = op.out_numel()
    macs = out * max(0, n - 1) // 2
    return macs, 2 * macs + (0 if op.attr("unitriangular", False) else out)


@rule("aten.scaled_dot_product_attention.default", saves="inputs", dispatched=True,
      kernel="attention")
@rule("Attention", "ai.onnx.preview::FlexAttention",
      "aten._scaled_dot_product_flash_attention_for_cpu.default",
      "aten._scaled_dot_product_flash_attention.default",
      "aten._scaled_dot_product_efficient_attention.default",
      "aten._scaled_dot_product_cudnn_attention.default", saves="inputs", kernel="attention",
      bodies=True)  # FlexAttention's score_mod / prob_mod (the others carry no graphs)
def attention(op: OpView) -> tuple[int, int]:
    # ONNX Attention (opset 23), FlexAttention (its score_mod / prob_mod bodies are costed as
    # nodes of their own) and torch's scaled_dot_product_attention, every kernel of it:
    # scores = Q·Kᵀ (Sq·Sk·D per head), out = softmax·V (Sq·Sk·Dv).
    # In ONNX's 3-D (B, S, H·D) and 4-D (B, H, S, D) layouts, and torch's (…, S, D) of any rank
    # (windowed attention passes (B, H, windows, N, D)), this is Sk·(numel(Q)+numel(Y)) MACs,
    # Sk being the keys' second-to-last dim in every layout. A causal mask is not discounted
    # (FlopCounterMode does not either); softmax adds 5 FLOPs and the scale 1 FLOP per score.
    k = op.in_shape(1)
    sk = k[-2]
    q_numel, y_numel = op.in_numel(0), op.out_numel(0)
    macs = sk * (q_numel + y_numel)
    q = op.in_shape(0)
    d = q[-1] if len(q) == 4 else q[-1] // max(1, int(op.attr("q_num_heads", 1) or 1))
    scores = q_numel // max(1, d) * sk
    return macs, 2 * macs + 6 * scores


@rule("aten._grouped_mm.default", "transformers.grouped_mm_fallback.default",
      saves="operands", routing="experts")
def grouped_mm(op: OpView) -> tuple[int, int]:
    # A mixture of experts' matmul: tokens sorted by expert (S, K) against every expert's
    # weights (E, K, N), ``offs`` ending each expert's group of rows. Each token row meets one
    # expert's matrix, so MACs = S·N·K whatever the routing: the active experts' work, not
    # E times it. torch's other layouts follow the same count (output elements × the
    # reduction), except 2-D × 2-D (a weight gradient, (K, S)·(S, N) → (E, K, N)), where each
    # of the S rows reaches one expert's slice of the output only.
    macs = op.out_numel() * op.in_shape(0)[-1]
    if len(op.in_shape(0)) == 2 and len(op.in_shape(1)) == 2:
        macs //= max(1, op.out_shape(0)[0])
    return macs, 2 * macs


@rule("transformers.grouped_mm_fallback_backward.default", saves="nothing")
def grouped_mm_backward(op: OpView) -> tuple[int, int]:
    # transformers' backward of its grouped matmul: (input (S, K), weights (E, K, N), offs,
    # grad (S, N)) -> grad input (S·K·N MACs) and grad weights (S·K·N: each row updates its
    # own expert's matrix). Experts no token reached get zero gradients (written, not
    # computed).
    macs = 2 * op.out_numel(0) * op.in_shape(3)[-1]
    return macs, 2 * macs
