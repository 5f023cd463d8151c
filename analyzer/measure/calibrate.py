"""``graphcost calibrate``: measure what kernels achieve on this machine and write a device
profile (passes/device/profile.py) that ``--device-profile FILE`` prices nodes with.

For each engine (eager PyTorch on this CPU; ONNX Runtime's CPU provider), short
microbenchmarks, each the fastest of several runs (a busy machine's slow moments left out,
as cpu_probe.py does):

- launch: an add of two 1-element tensors (a call that does no work); view: a reshape;
- gemm: square fp32 (and bf16, eager) matmuls from 16³ to 1024³; conv: 3×3 and 1×1
  convolutions of CNN-like sizes; attention: scaled_dot_product_attention (eager);
- memory: an elementwise add from 4 KiB to 64 MiB per operand.

Then the validation: a few small models from the zoo, run for real (eager forward, an eager
training step, an ONNX Runtime session) and estimated with the new profile; their errors are
the band every estimate from this profile carries. The whole takes about a minute.
"""
from __future__ import annotations

import datetime
import itertools
import platform
import time
from typing import Callable

from ...passes.device.profile import Curve, DeviceProfile, EngineProfile, Run

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


def _rates(points: list[tuple[float, float]], launch: float) -> Curve:
    """(size, seconds per call) -> a rate curve, the launch cost taken off each call (the
    estimate adds it back once per node). A call no slower than a launch is left out."""
    best: dict[float, float] = {}
    for size, t in points:
        if t > 1.05 * launch:
            best[size] = max(best.get(size, 0.0), size / (t - launch))
    return Curve(tuple(sorted(best.items())))


COLD_BYTES = 64 << 20   # operands cycled through per microbenchmark: beyond the caches


def cold(make: Callable[[], tuple], run: Callable[..., object]) -> float:
    """Seconds per ``run(*operands)`` with operands that are not in the caches, as a model's
    layers meet theirs (each reads what the one before wrote, and weights read once per
    call): enough sets of ``make()``'s operands cycled through to pass ``COLD_BYTES`` (a hot
    loop over one set runs large convolutions twice as fast as they run in a model)."""
    first = make()
    size = sum(t.numel() * t.element_size() for t in first if hasattr(t, "numel"))
    sets = [first] + [make() for _ in range(min(63, COLD_BYTES // max(1, size)))]
    turn = itertools.cycle(sets)
    return fastest(lambda: run(*next(turn)))


def torch_engine() -> EngineProfile:
    """Eager PyTorch on this CPU at torch's current thread count."""
    import torch
    import torch.nn.functional as F

    one = torch.ones(1)
    launch = fastest(lambda: torch.add(one, one))
    grid = torch.ones(4, 4)
    view = fastest(lambda: grid.view(16))
    rand = torch.randn
    with torch.no_grad():
        gemm = {}
        for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            gemm[name] = _rates([(2 * n ** 3, cold(lambda n=n, d=dtype: (rand(n, n, dtype=d),
                                                                        rand(n, n, dtype=d)),
                                                   torch.mm)) for n in GEMM_SIZES], launch)
        conv = [(2 * b * co * hw * hw * ci * k * k,
                 cold(lambda b=b, ci=ci, co=co, hw=hw, k=k: (rand(b, ci, hw, hw),
                                                             rand(co, ci, k, k)),
                      lambda x, w: F.conv2d(x, w, padding=w.shape[-1] // 2)))
                for b, ci, co, hw, k in CONV_SHAPES]
        grouped = [(2 * b * c * hw * hw * 9,
                    cold(lambda b=b, c=c, hw=hw: (rand(b, c, hw, hw), rand(c, 1, 3, 3)),
                         lambda x, w: F.conv2d(x, w, padding=1, groups=w.shape[0])))
                   for b, c, hw in GROUPED_SHAPES]
        # a window's 9 compares per output, as passes/costs/pooling.py counts them
        pool = [(9 * b * c * (hw // 2) ** 2,
                 cold(lambda b=b, c=c, hw=hw: (rand(b, c, hw, hw),),
                      lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)))
                for b, c, hw in POOL_SHAPES]
        attention = [(4 * bh * s * s * d,
                      cold(lambda bh=bh, s=s, d=d: (rand(1, bh, s, d),) * 3,
                           F.scaled_dot_product_attention))
                     for bh, s, d in ATTENTION_SHAPES]
        memory = [(12 * n, cold(lambda n=n: (rand(n), rand(n)), torch.add))
                  for n in MEMORY_ELEMENTS]
    arithmetic = {"gemm": gemm, "conv": {"fp32": _rates(conv, launch)},
                  "grouped_conv": {"fp32": _rates(grouped, launch)},
                  "attention": {"fp32": _rates(attention, launch)},
                  "pool": {"fp32": _rates(pool, launch)}}
    return EngineProfile(launch, view, arithmetic, _rates(memory, launch),
                         python_s=eager_python(launch, view))


def eager_python(launch: float, view: float) -> float:
    """What eager PyTorch's forward adds per traced node beyond the dispatch: a stack of
    eight pre-norm MLP blocks at width 8 on 2 tokens (kernels that do almost no work) timed,
    less a launch per node (a view's for a node that moves nothing), over its nodes."""
    import torch
    from torch import nn

    from ..app.api import analyze

    class Block(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.norm, self.up, self.act = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU()
            self.down = nn.Linear(2 * d, d)

        def forward(self, x):
            return x + self.down(self.act(self.up(self.norm(x))))

    model = nn.Sequential(*(Block() for _ in range(8))).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        seconds = fastest(lambda: model(x))
    nodes = analyze(model, (x,)).nodes
    views = sum(1 for n in nodes if n.flops == 0 and n.bytes_total == 0)
    dispatch = (len(nodes) - views) * launch + views * view
    return max(0.0, (seconds - dispatch) / max(1, len(nodes)))


def describe_machine(threads: int) -> dict[str, str]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "threads": str(threads), "cpu": cpu[:200]}


def calibrate(validate: Callable[[DeviceProfile], dict[str, tuple[Run, ...]]] | None = None,
              engines: tuple[str, ...] = ("torch", "onnxruntime")) -> DeviceProfile:
    """This machine's profile: each engine measured, then validated (``validate``: the runs
    of analyzer/measure/calibrate_runs.py, which need the profile to estimate with)."""
    import torch

    from .calibrate_ort import onnxruntime_engine

    threads = torch.get_num_threads()
    measured = {"torch": torch_engine, "onnxruntime": onnxruntime_engine}
    profile = DeviceProfile(f"this CPU ({threads} threads)", describe_machine(threads),
                            {name: measured[name]() for name in engines})
    if validate is None:
        return profile
    runs = validate(profile)
    return DeviceProfile(profile.name, profile.measured,
                         {name: EngineProfile(e.launch_s, e.view_s, e.arithmetic, e.memory,
                                              runs.get(name, ()))
                          for name, e in profile.engines.items()})
