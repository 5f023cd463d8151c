"""Quantized ops: integer matmul-class ops and the (de)quantizers, default and com.microsoft.

Integer arithmetic is counted as such: a quantized Conv or MatMul does the MACs of its float
parent (MACs = output elements × reduction length, as linear.py), so an int8 model's MACs equal
its fp32 parent's; FLOPs = 2·MACs plus, per element, what the quantization adds:
  dequantize (x − zero_point)·scale                          2 per element
  quantize   saturate(round(x / scale) + zero_point)         5 per element (divide, round, add,
                                                               clamp low, clamp high)
  zero-point subtraction of an integer operand              1 per operand element
  requantize an int32 accumulator to 8 bits                  5 per output element (multiply by
                                                               the combined scale, round, add the
                                                               zero point, clamp twice)
The QLinear* elementwise ops of com.microsoft are counted as dequantize → float op → quantize,
what they compute (onnxruntime may use a lookup table for 8-bit inputs).

Scales and zero points are ``meta_inputs``: quantization metadata, counted apart from the
parameters (passes/graph/params.py). MatMulNBits packs its 4-bit weights two per byte into a uint8
(N, blocks, blob) initializer: ``packed_inputs`` gives the logical N·K elements.
"""
from __future__ import annotations

from ..costs import shape_fns as sf
from ..costs.linear import conv, matmul
from ..costs.registry import WINDOW_ATTRS, OpView, rule

MS = "com.microsoft::"
DEQUANT, QUANT, REQUANT = 2, 5, 5


@rule("QuantizeLinear", MS + "QuantizeLinear", meta_inputs=(1, 2), saves="nothing",
      rf="pointwise", shapes=lambda v: [(v.dtype(2) or "uint8", v.shape(0))])
def quantize(op: OpView) -> tuple[int, int]:
    return 0, QUANT * op.in_numel(0)


@rule("DequantizeLinear", MS + "DequantizeLinear", meta_inputs=(1, 2), saves="nothing",
      rf="pointwise", shapes=lambda v: [(v.dtype(1), v.shape(0))])
def dequantize(op: OpView) -> tuple[int, int]:
    return 0, DEQUANT * op.in_numel(0)


@rule("DynamicQuantizeLinear", meta_outputs=(1, 2), saves="nothing", rf="pointwise")
def dynamic_quantize(op: OpView) -> tuple[int, int]:
    # min and max over x (2 per element), then quantize (5); the scale and zero point are a
    # handful of scalar operations.
    return 0, (2 + QUANT) * op.in_numel(0)


def _zero_points(op: OpView, pairs: tuple[tuple[int, int], ...]) -> int:
    """(operand, its zero point) pairs: one subtraction per operand element where given."""
    return sum(op.in_numel(x) for x, zp in pairs if op.has_input(zp))


@rule("ConvInteger", meta_inputs=(2, 3), saves="operands", rf="conv", attr_names=WINDOW_ATTRS)
def conv_integer(op: OpView) -> tuple[int, int]:
    # (x, w, x_zero_point, w_zero_point) -> int32: the float Conv's MACs, zero points subtracted
    macs, _ = conv(op)
    return macs, 2 * macs + _zero_points(op, ((0, 2), (1, 3)))


@rule("MatMulInteger", meta_inputs=(2, 3), saves="operands")
def matmul_integer(op: OpView) -> tuple[int, int]:
    # (A, B, a_zero_point, b_zero_point) -> int32
    macs, _ = matmul(op)
    return macs, 2 * macs + _zero_points(op, ((0, 2), (1, 3)))


class _Shifted(OpView):
    """An OpView whose inputs are renumbered (QLinearConv's x and w are inputs 0 and 3)."""
    __slots__ = ("_map",)

    def __init__(self, op: OpView, mapping: dict[int, int]):
        super().__init__(op.node, op.graph, op._rule)
        self._map = mapping

    def in_spec(self, i: int):
        return super().in_spec(self._map.get(i, 99))


@rule("QLinearConv", meta_inputs=(1, 2, 4, 5, 6, 7), saves="operands", rf="conv",
      attr_names=WINDOW_ATTRS)
def qlinear_conv(op: OpView) -> tuple[int, int]:
    # (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B int32): the float Conv's MACs;
    # x − x_zp per input element, w − w_zp per weight, bias add and requantize per output.
    macs, _ = conv(_Shifted(op, {0: 0, 1: 3}))
    out = op.out_numel()
    bias = out if op.has_input(8) else 0
    return macs, 2 * macs + op.in_numel(0) + op.in_numel(3) + bias + REQUANT * out


@rule("QLinearMatMul", meta_inputs=(1, 2, 4, 5, 6, 7), saves="operands")
def qlinear_matmul(op: OpView) -> tuple[int, int]:
    # (a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
    macs, _ = matmul(_Shifted(op, {0: 0, 1: 3}))
    return macs, 2 * macs + op.in_numel(0) + op.in_numel(3) + REQUANT * op.out_numel()


def _qgemm_shape(v):
    a, b = v.shape(0), v.shape(3)
    if a is None or b is None:
        return [None]
    m = a[1] if sf.attr_int(v, "transA") else a[0]
    n = b[0] if sf.attr_int(v, "transB") else b[1]
    return [(v.dtype(8) if v.has_input(8) else "float32", (m, n))]


@rule(MS + "QGemm", meta_inputs=(1, 2, 4, 5, 7, 8), saves="operands", shapes=_qgemm_shape)
def qgemm(op: OpView) -> tuple[int, int]:
    # (A, a_scale, a_zp, B, b_scale, b_zp, C int32, y_scale, y_zp): Y (M, N), K = numel(A)/M;
    # zero points subtracted, C added, then requantized (y_scale given) or scaled to float (1).
    m, n = op.out_shape()
    k = op.in_numel(0) // m if m else 0
    macs = m * n * k
    out = m * n
    tail = REQUANT * out if op.has_input(7) else out
    bias = out if op.has_input(6) else 0
    return macs, 2 * macs + op.in_numel(0) + op.in_numel(3) + bias + tail


@rule(MS + "QLinearAdd", MS + "QLinearMul", meta_inputs=(1, 2, 4, 5, 6, 7), saves="inputs",
      rf="pointwise", shapes=lambda v: [(v.dtype(0), sf.broadcast(v.shape(0), v.shape(3)))])
def qlinear_binary(op: OpView) -> tuple[int, int]:
    # (A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp): dequantize both operands, one add
    # or multiply and a quantize per output element.
    out = op.out_numel()
    return 0, DEQUANT * (op.in_numel(0) + op.in_numel(3)) + (1 + QUANT) * out


def _qlinear_unary(k: int):
    def fn(op: OpView) -> tuple[int, int]:
        # (X, X_scale, X_zp, Y_scale, Y_zp): dequantize, the float op (k), quantize
        return 0, (DEQUANT + k + QUANT) * op.in_numel(0)
    return fn


_UNARY = dict(meta_inputs=(1, 2, 3, 4), saves="inputs", same_shape=True, shapes=sf.like(0))
rule(MS + "QLinearSigmoid", rf="pointwise", **_UNARY)(_qlinear_unary(3))    # sigmoid 3
rule(MS + "QLinearLeakyRelu", rf="pointwise", **_UNARY)(_qlinear_unary(2))  # compare + mul
rule(MS + "QLinearSoftmax", rf="softmax", **_UNARY)(_qlinear_unary(5))      # softmax 5


def _qgap_shape(v):
    x = v.shape(0)
    if x is None:
        return [None]
    if sf.attr_int(v, "channels_last"):
        return [(v.dtype(0), (x[0],) + (1,) * (len(x) - 2) + (x[-1],))]
    return [(v.dtype(0), tuple(x[:2]) + (1,) * (len(x) - 2))]


@rule(MS + "QLinearGlobalAveragePool", meta_inputs=(1, 2, 3, 4), saves="nothing",
      shapes=_qgap_shape)
def qlinear_global_avg_pool(op: OpView) -> tuple[int, int]:
    # one add per input element, then per output: dequantize (2), divide (1), quantize (5)
    return 0, op.in_numel(0) + (DEQUANT + 1 + QUANT) * op.out_numel()


# QLinearConcat(Y_scale, Y_zp, X1, X1_scale, X1_zp, X2, …): settings at 0, 1, then every
# third position from 3 on.
_QCONCAT_META = (0, 1) + tuple(p for k in range(256) for p in (3 * k + 3, 3 * k + 4))


def _qconcat_shape(v):
    shapes = [v.shape(i) for i in range(2, v.n_inputs, 3)]
    if not shapes or any(s is None for s in shapes):
        return [None]
    axis = sf.attr_int(v, "axis") % len(shapes[0])
    dims = [s[axis] for s in shapes]
    total = sum(dims) if all(isinstance(d, int) for d in dims) else None
    return [(v.dtype(2), tuple(shapes[0][:axis]) + (total,) + tuple(shapes[0][axis + 1:]))]


@rule(MS + "QLinearConcat", meta_inputs=_QCONCAT_META, saves="nothing", rf="concat",
      shapes=_qconcat_shape)
def qlinear_concat(op: OpView) -> tuple[int, int]:
    # each input element requantized to the output's scale: dequantize + quantize
    return 0, (DEQUANT + QUANT) * op.out_numel()


def _nbits_packed(spec, attrs) -> tuple[int, str]:
    bits = int(attrs.get("bits", 4))
    return int(attrs["N"]) * int(attrs["K"]), f"uint{bits}"


def _nbits_shape(v):
    a = v.shape(0)
    return [(v.dtype(0), None if a is None else tuple(a[:-1]) + (sf.attr_int(v, "N"),))]


@rule(MS + "MatMulNBits", meta_inputs=(2, 3, 4), packed_inputs={1: _nbits_packed},
      saves="operands", shapes=_nbits_shape)
def matmul_nbits(op: OpView) -> tuple[int, int]:
    # (A (…, K), B packed (N, K/block, block·bits/8), scales, zero_points, g_idx, bias):
    # Y = A·dequantize(B)ᵀ: MACs = rows(A)·N·K; each of the N·K weights dequantized (2);
    # a bias add per output.
    k, n = int(op.attr("K")), int(op.attr("N"))
    rows = op.in_numel(0) // k if k else 0
    macs = rows * n * k
    bias = op.out_numel() if op.has_input(5) else 0
    return macs, 2 * macs + DEQUANT * n * k + bias


@rule(MS + "MatMulIntegerToFloat", meta_inputs=(2, 3, 4, 5), saves="operands",
      shapes=lambda v: [(v.dtype(2), sf.matmul(v.shape(0), v.shape(1)))])
def matmul_integer_to_float(op: OpView) -> tuple[int, int]:
    # (A, B, a_scale, b_scale, a_zp, b_zp, bias): integer MACs, zero points subtracted, the
    # int32 result scaled to float (1 per output), a bias add.
    macs, _ = matmul(op)
    out = op.out_numel()
    bias = out if op.has_input(6) else 0
    return macs, 2 * macs + _zero_points(op, ((0, 4), (1, 5))) + out + bias


@rule(MS + "DynamicQuantizeMatMul", meta_inputs=(2, 3), saves="operands",
      shapes=lambda v: [(v.dtype(0), sf.matmul(v.shape(0), v.shape(1)))])
def dynamic_quantize_matmul(op: OpView) -> tuple[int, int]:
    # (A float, B int8, b_scale, b_zp, bias): A quantized on the fly (min/max 2 + quantize 5
    # per element), integer MACs, the result scaled to float (1 per output), a bias add.
    macs, _ = matmul(op)
    out = op.out_numel()
    bias = out if op.has_input(4) else 0
    return macs, 2 * macs + (2 + QUANT) * op.in_numel(0) + out + bias


def _per_byte(spec, attrs) -> int:
    """Logical values per stored element: 2 for 4-bit values packed in uint8."""
    bits = int(attrs.get("bits", 4))
    return 8 // bits if spec.dtype in ("uint8", "int8") and bits < 8 else 1


def _gbq_packed(spec, attrs) -> tuple[int, str]:
    k = _per_byte(spec, attrs)
    return spec.numel * k, spec.dtype if k == 1 else f"uint{int(attrs.get('bits', 4))}"


def _gbq_shape(v):
    data, idx = v.shape(0), v.shape(1)
    if data is None or idx is None:
        return [None]
    axis = sf.attr_int(v, "gather_axis") % len(data)
    last = data[-1]
    bits = sf.attr_int(v, "bits", 4)
    if v.dtype(0) in ("uint8", "int8") and bits < 8 and isinstance(last, int):
        last = last * (8 // bits)
    full = tuple(data[:-1]) + (last,)
    return [(v.dtype(2), full[:axis] + tuple(idx) + full[axis + 1:])]


@rule(MS + "GatherBlockQuantized", meta_inputs=(2, 3), index_inputs=(1,), reads="outputs",
      packed_inputs={0: _gbq_packed}, saves=(1,), shapes=_gbq_shape)
def gather_block_quantized(op: OpView) -> tuple[int, int]:
    # (data, indices, scales, zero_points): the gathered rows dequantized, 2 per output element.
    # Bytes read are counted as a selection's (the output's size plus the indices).
    return 0, DEQUANT * op.out_numel()
