"""Signal processing: DFT, STFT, window functions, mel filter banks, image decoding.

A transform of length N is counted as an FFT: 5·N·⌈log2 N⌉ real FLOPs per complex transform
(the radix-2 Cooley–Tukey count FFTW reports its speed in), half of it for a real input
(onesided or not, a real signal's transform is computed as half a complex one). No MACs: the
MACs column is the matmul class (linear.py), and an FFT is not a matrix product.
"""
from __future__ import annotations

import math

from ..costs.registry import OpView, rule, zero_cost


def _fft(n: int, real: bool) -> int:
    flops = 5 * n * max(1, math.ceil(math.log2(max(n, 2))))
    return flops // 2 if real else flops


@rule("DFT", config_inputs=(1, 2), input_attrs={1: "dft_length", 2: "axis"}, saves="nothing")
def dft(op: OpView) -> tuple[int, int]:
    # input (…, N, 1 | 2), real or complex: one transform per position of every other axis,
    # of length N = dft_length (else the input's length). The axis is an attribute (default 1)
    # until opset 17, an input (default −2) from opset 20.
    x = op.in_shape(0)
    rank = len(x)
    axis = op.attr("axis", -2)  # (opset 17's schema default 1 is in the attributes)
    axis = int(axis) + rank if int(axis) < 0 else int(axis)
    n = int(op.attr("dft_length") or x[axis])
    transforms = op.in_numel(0) // max(1, x[axis] * x[-1])
    return 0, transforms * _fft(n, x[-1] == 1)


@rule("STFT", config_inputs=(1, 3), input_attrs={3: "frame_length"}, saves="nothing")
def stft(op: OpView) -> tuple[int, int]:
    # signal (B, L, 1 | 2) → (B, frames, bins, 2): per frame a window multiply (N) and a
    # length-N transform, N = the window's length (else frame_length).
    b, frames, _, _ = op.out_shape(0)
    if op.has_input(2):
        n = op.in_shape(2)[0]
    elif op.attr("frame_length") is not None:
        n = int(op.attr("frame_length"))
    else:  # from the output's bins: N, or N/2 + 1 one-sided (exact for an even N)
        bins = op.out_shape(0)[2]
        n = 2 * (bins - 1) if op.attr("onesided", 1) else bins
    real = op.in_shape(0)[-1] == 1
    window = n if op.has_input(2) else 0
    return 0, b * frames * (window + _fft(n, real))


def _per_output(k: int):
    def fn(op: OpView) -> tuple[int, int]:
        return 0, k * op.out_numel(0)
    return fn


# Windows of N points: the angle 2πn/N (multiply, divide), each cosine term (cos, scale) and
# the sums: Hann 0.5 − 0.5·cos (5), Hamming α − β·cos (5), Blackman 0.42 − 0.5·cos(θ) +
# 0.08·cos(2θ) (angle 2, two terms of cos + scale 4, 2θ 1, two adds 2 → 9).
rule("HannWindow", "HammingWindow", config_inputs=(0,), reads="none", saves="nothing")(
    _per_output(5))
rule("BlackmanWindow", config_inputs=(0,), reads="none", saves="nothing")(_per_output(9))
# Mel filter bank (bins, mel bins): a triangular weight per entry — two compares, a
# subtraction and a divide (4).
rule("MelWeightMatrix", config_inputs=(0, 1, 2, 3, 4), reads="none", saves="nothing")(
    _per_output(4))

zero_cost("ImageDecoder", reason="decodes compressed bytes (entropy decoding, not arithmetic "
          "graphcost counts); the image's size depends on the data and has no bound from the "
          "input", family="signal")
