"""The microbenchmarks ``graphcost calibrate`` runs (calibrate.py for eager PyTorch,
calibrate_ort.py for ONNX Runtime): the sizes measured, and how a call is timed — the fastest
of several batches of calls, with operands cycled past the caches."""
from __future__ import annotations

import itertools
import time
from typing import Callable, Sequence

from ...passes.device.profile import Curve

GEMM_SIZES = (16, 32, 64, 128, 256, 512, 1024)
# (batch, channels in, channels out, height = width, kernel): CNN-like convolutions
CONV_SHAPES = ((1, 3, 16, 64, 3), (1, 16, 32, 32, 3), (1, 64, 64, 56, 3), (4, 64, 64, 56, 3),
               (4, 128, 128, 28, 3), (2, 256, 256, 14, 3), (4, 64, 256, 56, 1))
# (batch, channels, height = width): depthwise 3×3 convolutions (a group per channel)
GROUPED_SHAPES = ((1, 16, 28), (1, 32, 112), (4, 144, 56), (8, 192, 56), (8, 960, 7))
# (batch, channels, height = width): 3×3 max pooling, stride 2 (ResNet's stem)
POOL_SHAPES = ((1, 16, 28), (1, 64, 112), (4, 64, 112), (8, 128, 56))
# (batch·heads, sequence, head dim)
ATTENTION_SHAPES = ((4, 64, 32), (8, 128, 64), (16, 256, 64), (16, 512, 64))
MEMORY_ELEMENTS = tuple(2 ** k for k in range(10, 25, 2))   # 4 KiB … 64 MiB of fp32
# (batch, channels, height = width): a training step's batch norm, forward and backward
NORM_SHAPES = ((1, 16, 28), (1, 32, 112), (4, 96, 56), (8, 192, 28), (8, 960, 7))
# dropout's elements (its draws take ~7 ns each on one core: 4 Mi elements, 30 ms a call)
RANDOM_ELEMENTS = tuple(2 ** k for k in range(10, 23, 4))   # 4 KiB … 16 MiB of fp32


def fastest(fn: Callable[[], object], budget: float = 0.05) -> float:
    """Seconds per call of ``fn``: the fastest of five batches, each batch's calls lasting at
    least ``budget`` seconds together (so a timer's resolution does not show)."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - start >= budget or calls >= 1 << 20:
            break
        calls *= 2
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def rates(points: Sequence[tuple[float, float]], launch: float) -> Curve:
    """(size, seconds per call) -> a rate curve, the launch cost taken off each call (the
    estimate adds it back once per node), at most 95% of it: a call timed no slower than a
    launch (a moment the launch was measured slow) keeps a finite rate."""
    best: dict[float, float] = {}
    for size, t in points:
        best[size] = max(best.get(size, 0.0), size / max(t - launch, 0.05 * t, 1e-12))
    return Curve(tuple(sorted(best.items())))


COLD_BYTES = 64 << 20   # operands cycled through per microbenchmark: beyond the caches


def cold(make: Callable[[], tuple], run: Callable[..., object], *,
         timer: Callable[[Callable[[], object]], float] | None = None,
         cold_bytes: int = COLD_BYTES) -> float:
    """Seconds per ``run(*operands)`` with operands that are not in the caches, as a model's
    layers meet theirs (each reads what the one before wrote, and weights read once per
    call): enough sets of ``make()``'s operands cycled through to pass ``cold_bytes`` (a hot
    loop over one set runs large convolutions twice as fast as they run in a model), timed
    by ``timer`` (a GPU's: calibrate_cuda.py; else ``fastest``, looked up when called)."""
    first = make()
    size = sum(t.numel() * t.element_size() for t in first if hasattr(t, "numel"))
    sets = [first] + [make() for _ in range(min(63, cold_bytes // max(1, size)))]
    turn = itertools.cycle(sets)
    return (timer or fastest)(lambda: run(*next(turn)))
