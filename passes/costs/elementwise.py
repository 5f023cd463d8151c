"""Elementwise math and activations: FLOPs per output element, no MACs.

Each function counts as one FLOP (exp, log, sqrt, tanh, erf … are one FLOP, as in most
counters); compound activations count their expansion, written next to each entry.
"""
from __future__ import annotations

from ..costs.registry import OpView, rule

# FLOPs per output element of unary ops, with the expansion counted.
UNARY_FLOPS = {
    "Relu": 1,            # max(x, 0)
    "Abs": 1, "Neg": 1, "Sign": 1, "Floor": 1, "Ceil": 1, "Round": 1,
    "Reciprocal": 1, "Sqrt": 1, "Exp": 1, "Log": 1, "Erf": 1, "Tanh": 1,
    "Sin": 1, "Cos": 1, "Tan": 1, "Asin": 1, "Acos": 1, "Atan": 1,
    "Sinh": 1, "Cosh": 1, "Asinh": 1, "Acosh": 1, "Atanh": 1,
    "Not": 1, "IsNaN": 1, "IsInf": 1, "BitwiseNot": 1,
    "LeakyRelu": 2,       # x < 0 ? alpha·x : x  → compare + multiply
    "ThresholdedRelu": 1, # compare
    "Sigmoid": 3,         # 1 / (1 + exp(-x)) → exp, add, divide (negation folded)
    "HardSigmoid": 4,     # max(0, min(1, alpha·x + beta)) → mul, add, min, max
    "HardSwish": 5,       # x · hardsigmoid(x) (torch: x · clamp(x + 3, 0, 6) / 6, also 5)
    "Softplus": 3,        # log(1 + exp(x))
    "Softsign": 3,        # x / (1 + |x|)
    "Elu": 3,             # x < 0 ? alpha·(exp(x) − 1) : x
    "Celu": 4,            # max(0,x) + min(0, alpha·(exp(x/alpha) − 1))
    "Selu": 4,            # gamma · elu
    "Mish": 5,            # x · tanh(softplus(x))
    "Shrink": 2,          # compare + add
    "Swish": 5,           # x · sigmoid(alpha·x) → multiply, sigmoid 3, multiply
}

# torch (aten) names of the same ops, registered on the same rule.
ATEN_UNARY = {
    "Relu": ("aten.relu.default",), "Abs": ("aten.abs.default",), "Neg": ("aten.neg.default",),
    "Sign": ("aten.sign.default",), "Floor": ("aten.floor.default",),
    "Ceil": ("aten.ceil.default",), "Round": ("aten.round.default",),
    "Reciprocal": ("aten.reciprocal.default",), "Sqrt": ("aten.sqrt.default",),
    "Exp": ("aten.exp.default",), "Log": ("aten.log.default",), "Erf": ("aten.erf.default",),
    "Tanh": ("aten.tanh.default",), "Sin": ("aten.sin.default",), "Cos": ("aten.cos.default",),
    "Not": ("aten.logical_not.default", "aten.bitwise_not.default"),
    "IsNaN": ("aten.isnan.default",), "IsInf": ("aten.isinf.default",),
    "LeakyRelu": ("aten.leaky_relu.default",), "Sigmoid": ("aten.sigmoid.default",),
    "Elu": ("aten.elu.default",),
}  # (hardsigmoid, hardswish, softplus, celu, selu and mish are decomposed by torch)
# aten-only unary ops.
UNARY_FLOPS.update({
    "aten.rsqrt.default": 2,      # sqrt + reciprocal
    "aten.log1p.default": 2, "aten.expm1.default": 2,
    "aten.log2.default": 2,       # ln(x) · (1 / ln 2), as the ONNX exporters write it
    "aten.exp2.default": 1,       # 2^x (torchao's float8 scales rounded to a power of 2)
})

# Binary ops by what their backward keeps: add/sub pass the gradient through (nothing), a
# product keeps each factor for the other's gradient, the rest keep both inputs; comparisons
# and logic have no gradient.
BINARY_PASS = ("Add", "Sub")
BINARY_PRODUCT = ("Mul", "Div")  # x/y: dx = g/y needs y, dy = −g·x/y² needs x (and y)
BINARY_KEEP = ("Pow", "Mod")
BINARY_NO_GRAD = ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or",
                  "Xor", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor")
BINARY_OPS = BINARY_PASS + BINARY_PRODUCT + BINARY_KEEP + BINARY_NO_GRAD


def _per_output(k: int):
    def fn(op: OpView) -> tuple[int, int]:
        return 0, k * op.out_numel()
    return fn


# What each unary op's backward keeps: the output where the derivative is a function of it
# (ReLU: y > 0; sigmoid: y(1 − y); tanh: 1 − y²; exp: y; sqrt: 1/(2y)), nothing where it is
# constant or zero (neg, floor, comparisons), else the input (GELU, erf, log, sin …).
SAVES_OUTPUT = frozenset({"Relu", "Sigmoid", "Tanh", "Exp", "Sqrt", "Reciprocal", "Elu",
                          "aten.rsqrt.default", "aten.exp2.default"})
SAVES_NOTHING = frozenset({"Neg", "Sign", "Floor", "Ceil", "Round", "Not", "IsNaN", "IsInf",
                           "BitwiseNot"})

# Unary ops may write into their dying input (the in-place what-if) and pass a receptive
# field through.
for _op, _k in UNARY_FLOPS.items():
    rule(_op, *ATEN_UNARY.get(_op, ()),
         saves="outputs" if _op in SAVES_OUTPUT else
         "nothing" if _op in SAVES_NOTHING else "inputs",
         inplace=True, same_shape=True, rf="pointwise")(_per_output(_k))


@rule("aten.silu.default", saves="inputs", inplace=True, same_shape=True, rf="pointwise")
def silu(op: OpView) -> tuple[int, int]:
    # x · sigmoid(x): sigmoid 3 + multiply 1 = 4 per element (what its decomposition counts;
    # the frontend keeps it whole, one kernel as PyTorch runs it)
    return 0, 4 * op.out_numel()


@rule("Gelu", "aten.gelu.default", saves="inputs", inplace=True, same_shape=True,
      rf="pointwise")
def gelu(op: OpView) -> tuple[int, int]:
    # exact: 0.5·x·(1 + erf(x/√2)) → divide, erf, add, multiply, multiply = 5 per element
    # (what an exporter's expansion of it, Div → Erf → Add → Mul → Mul, counts too);
    # tanh form: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) → x³ (1, a Pow), ·0.044715, +x,
    # ·√(2/π), tanh, +1, ·x, ·0.5 = 8.
    return 0, (8 if op.attr("approximate", "none") == "tanh" else 5) * op.out_numel()


ATEN_PASS = ("aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar")
ATEN_PRODUCT = ("aten.mul.Tensor", "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar")
ATEN_KEEP = (
    "aten.div.Tensor_mode", "aten.pow.Tensor_Scalar",
    "aten.pow.Tensor_Tensor", "aten.pow.Scalar", "aten.remainder.Tensor",
    "aten.remainder.Scalar", "aten.fmod.Tensor", "aten.fmod.Scalar",
    "aten.maximum.default", "aten.minimum.default", "aten.atan2.default")
ATEN_NO_GRAD = (
    "aten.eq.Tensor", "aten.eq.Scalar", "aten.ne.Tensor", "aten.ne.Scalar", "aten.lt.Tensor",
    "aten.lt.Scalar", "aten.le.Tensor", "aten.le.Scalar", "aten.gt.Tensor", "aten.gt.Scalar",
    "aten.ge.Tensor", "aten.ge.Scalar",
    "aten.logical_and.default", "aten.logical_or.default", "aten.logical_xor.default",
    "aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor",
)
ATEN_BINARY = ATEN_PASS + ATEN_PRODUCT + ATEN_KEEP + ATEN_NO_GRAD

# One FLOP per output element (broadcasting counts the broadcast result). Add passes its
# gradient to same-shaped operands unchanged (a view), Sub to its first.
_binary = _per_output(1)
rule(*BINARY_PASS[:1], *ATEN_PASS[:2], saves="nothing", grad_view="same_shape",
     rf="pointwise")(_binary)
rule(*BINARY_PASS[1:], *ATEN_PASS[2:], saves="nothing", grad_view="same_shape",
     grad_view_inputs=(0,), rf="pointwise")(_binary)
rule(*BINARY_PRODUCT, *ATEN_PRODUCT, saves="operands", rf="pointwise")(_binary)
rule(*BINARY_KEEP, *ATEN_KEEP, saves="inputs", rf="pointwise")(_binary)
rule(*BINARY_NO_GRAD, *ATEN_NO_GRAD, saves="nothing", rf="pointwise")(_binary)


@rule("Clip", "aten.clamp.default", "aten.clamp.Tensor", "aten.hardtanh.default",
      config_inputs=(1, 2), saves=(0,), inplace=True, same_shape=True, rf="pointwise")
def clip(op: OpView) -> tuple[int, int]:
    # one compare per bound given (max with the lower, min with the upper): ONNX passes them
    # as inputs 1 and 2 (attributes before opset 11, ±inf meaning none), aten.clamp as min /
    # max arguments (torch's hardswish decomposes into two one-sided clamps), hardtanh always
    # both. The bounds are settings, not weights.
    if "min_val" in op.node.attrs:  # hardtanh
        bounds = 2
    elif any(k in op.node.attrs for k in ("min", "max")):
        bounds = sum(1 for k in ("min", "max") if op.attr(k) is not None
                     and abs(float(op.attr(k))) != float("inf"))
    else:
        bounds = sum(1 for i in (1, 2) if op.has_input(i))
    return 0, bounds * op.out_numel()


@rule("PRelu", saves="inputs", same_shape=True, rf="pointwise")
def prelu(op: OpView) -> tuple[int, int]:
    return 0, 2 * op.out_numel()  # compare + multiply by the slope


@rule("Where", "aten.where.self", saves=(0,),  # the backward routes the gradient by the condition
      rf="pointwise")
def where(op: OpView) -> tuple[int, int]:
    return 0, op.out_numel()  # one select per element (counted, like Max)


@rule("Max", "Min", saves="inputs", rf="pointwise")
def variadic(op: OpView) -> tuple[int, int]:
    # n inputs → n−1 pairwise ops per output element; one input is a copy.
    return 0, max(0, len(op.present_inputs()) - 1) * op.out_numel()


rule("Sum", saves="nothing", grad_view="same_shape", rf="pointwise")(variadic)


@rule("Mean", saves="nothing", rf="pointwise")
def mean(op: OpView) -> tuple[int, int]:
    return 0, len(op.present_inputs()) * op.out_numel()  # n−1 adds + 1 divide


@rule("SwiGLU", saves="inputs", same_shape=True, rf="pointwise")
def swiglu(op: OpView) -> tuple[int, int]:
    return 0, 6 * op.out_numel()  # Swish(A) (5) · B (1)


@rule("aten.polar.default", saves="inputs", rf="pointwise")
def polar(op: OpView) -> tuple[int, int]:
    """abs · (cos θ + i sin θ), a complex element from two real ones (Llama 4's rotary
    frequencies): cos, sin and two products."""
    return 0, 4 * op.out_numel()


@rule("Bernoulli", saves="nothing", same_shape=True, kernel="random")
def bernoulli(op: OpView) -> tuple[int, int]:
    return 0, op.out_numel()  # one draw per element (aten.bernoulli counts the same)


@rule("Multinomial", saves="nothing")
def multinomial(op: OpView) -> tuple[int, int]:
    # input (B, C) unnormalized log-probabilities → (B, samples): per row exp and a running
    # sum over the classes (2·C), per sample a draw and a binary search (1 + ⌈log2 C⌉).
    b, c = op.in_shape(0)
    samples = op.out_shape(0)[1]
    search = max(1, (max(c, 2) - 1).bit_length())
    return 0, b * 2 * c + b * samples * (1 + search)
