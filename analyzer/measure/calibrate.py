"""``graphcost calibrate``: measure what kernels achieve on this machine and write a device
profile (passes/device/profile.py) that ``--device-profile FILE`` prices nodes with.

For each engine (eager PyTorch on this CPU; ONNX Runtime's CPU provider), short
microbenchmarks, each the fastest of several runs, in two rounds whose better figure is kept
(a busy machine's slow moments left out, as cpu_probe.py does):

- launch: an add of two 1-element tensors (a call that does no work); view: a reshape;
- gemm: square fp32 (and bf16, eager) matmuls from 16³ to 1024³; conv: 3×3 and 1×1
  convolutions of CNN-like sizes; attention: scaled_dot_product_attention (eager);
- memory: an elementwise add from 4 KiB to 64 MiB per operand; random: dropout's draws
  (native_dropout, as a training step runs it) from 4 KiB to 16 MiB; batch_norm: a training
  step's batch norm, forward and backward, over CNN-like activations;
- eager only: the forward's Python per op, autograd's cost per node of a training step, and
  each for-loop optimizer's Python per parameter tensor.

Then the validation: a few small models from the zoo, run for real (eager forward, an eager
training step, an ONNX Runtime session) and estimated with the new profile; their errors are
the band every estimate from this profile carries. The whole takes about two minutes.
"""
from __future__ import annotations

import datetime
import platform
import statistics
from dataclasses import replace
from typing import Callable

from ...passes.device.profile import Curve, DeviceProfile, EngineProfile, Run
from . import microbench as mb


def torch_engine() -> EngineProfile:
    """Eager PyTorch on this CPU at torch's current thread count."""
    import torch
    import torch.nn.functional as F

    one = torch.ones(1)
    launch = mb.fastest(lambda: torch.add(one, one))
    grid = torch.ones(4, 4)
    view = mb.fastest(lambda: grid.view(16))
    rand = torch.randn
    with torch.no_grad():
        gemm = {}
        for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            gemm[name] = mb.rates([(2 * n ** 3, mb.cold(lambda n=n, d=dtype: (rand(n, n, dtype=d),
                                                                        rand(n, n, dtype=d)),
                                                   torch.mm)) for n in mb.GEMM_SIZES], launch)
        conv = [(2 * b * co * hw * hw * ci * k * k,
                 mb.cold(lambda b=b, ci=ci, co=co, hw=hw, k=k: (rand(b, ci, hw, hw),
                                                             rand(co, ci, k, k)),
                      lambda x, w: F.conv2d(x, w, padding=w.shape[-1] // 2)))
                for b, ci, co, hw, k in mb.CONV_SHAPES]
        grouped = [(2 * b * c * hw * hw * 9,
                    mb.cold(lambda b=b, c=c, hw=hw: (rand(b, c, hw, hw), rand(c, 1, 3, 3)),
                         lambda x, w: F.conv2d(x, w, padding=1, groups=w.shape[0])))
                   for b, c, hw in mb.GROUPED_SHAPES]
        # a window's 9 compares per output, as passes/costs/pooling.py counts them
        pool = [(9 * b * c * (hw // 2) ** 2,
                 mb.cold(lambda b=b, c=c, hw=hw: (rand(b, c, hw, hw),),
                      lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True)))
                for b, c, hw in mb.POOL_SHAPES]
        attention = [(4 * bh * s * s * d,
                      mb.cold(lambda bh=bh, s=s, d=d: (rand(1, bh, s, d),) * 3,
                           F.scaled_dot_product_attention))
                     for bh, s, d in mb.ATTENTION_SHAPES]
        memory = [(12 * n, mb.cold(lambda n=n: (rand(n), rand(n)), torch.add))
                  for n in mb.MEMORY_ELEMENTS]
        # a training step's dropout: a draw and a scale per element, as
        # passes/costs/backward.py counts them
        random = [(2 * n, mb.cold(lambda n=n: (rand(n),),
                                  lambda x: torch.native_dropout(x, 0.1, True)))
                  for n in mb.RANDOM_ELEMENTS]
        norm = [(14 * b * c * hw * hw + 6 * c,
                 mb.cold(lambda b=b, c=c, hw=hw: (rand(b, c, hw, hw), rand(b, c, hw, hw)),
                         _batch_norm_step))
                for b, c, hw in mb.NORM_SHAPES]
    arithmetic = {"gemm": gemm, "conv": {"fp32": mb.rates(conv, launch)},
                  "grouped_conv": {"fp32": mb.rates(grouped, launch)},
                  "attention": {"fp32": mb.rates(attention, launch)},
                  "pool": {"fp32": mb.rates(pool, launch)},
                  "random": {"fp32": mb.rates(random, launch)},
                  "batch_norm": {"fp32": mb.rates(norm, launch)}}
    return EngineProfile(launch, view, arithmetic, mb.rates(memory, launch),
                         python_s=eager_python(launch, view),
                         autograd_s=eager_autograd(launch, view),
                         optimizer_s=optimizer_python(launch))


def _batch_norm_step(x, grad):
    """A training step's batch norm: the forward with its batch statistics, then the
    backward of input, weight and bias — 5 and 9 FLOPs an element and 6 a channel, as
    passes/costs/backward.py counts them."""
    import torch

    c = x.shape[1]
    weight, bias, mean, var = torch.ones(c), torch.zeros(c), torch.zeros(c), torch.ones(c)
    _, saved_mean, saved_invstd = torch.native_batch_norm(x, weight, bias, mean, var, True,
                                                          0.1, 1e-5)
    return torch.ops.aten.native_batch_norm_backward(grad, x, weight, mean, var, saved_mean,
                                                     saved_invstd, True, 1e-5,
                                                     [True, True, True])


def tiny_blocks():
    """(a stack of eight pre-norm MLP blocks at width 8, its input of 2 tokens): kernels that
    do almost no work, so that timing it times what runs around them."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.norm, self.up, self.act = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU()
            self.down = nn.Linear(2 * d, d)

        def forward(self, x):
            return x + self.down(self.act(self.up(self.norm(x))))

    return nn.Sequential(*(Block() for _ in range(8))).eval(), torch.randn(2, 8)


def eager_python(launch: float, view: float) -> float:
    """What eager PyTorch's forward adds per traced node beyond the dispatch: the tiny
    blocks timed, less a launch per node (a view's for a node that moves nothing), over its
    nodes."""
    import torch

    from ..app.api import analyze

    model, x = tiny_blocks()
    with torch.no_grad():
        seconds = mb.fastest(lambda: model(x))
    nodes = analyze(model, (x,)).nodes
    views = sum(1 for n in nodes if n.flops == 0 and n.bytes_total == 0)
    dispatch = (len(nodes) - views) * launch + views * view
    return max(0.0, (seconds - dispatch) / max(1, len(nodes)))


def eager_autograd(launch: float, view: float, length: int = 32) -> float:
    """What eager autograd adds per node of a training step beyond its kernels' dispatch: a
    chain of ``length`` multiplies of a 4-element tensor by a number, forward and backward,
    timed, less the same forward under no_grad and the backward's kernels as the estimate
    prices them (the loss's gradient of ones and each multiply's gradient a launch, the
    sum's an expand: a view), over the chain's autograd nodes (the multiplies, the sum and
    the AccumulateGrad that hands the gradient over: ``.grad`` is None before each step, as
    ``zero_grad`` leaves it)."""
    import torch

    x = torch.ones(4, requires_grad=True)

    def chain():
        y = x
        for _ in range(length):
            y = y * 1.0001
        return y.sum()

    with torch.no_grad():
        forward = mb.fastest(chain)

    def step():
        x.grad = None
        chain().backward()

    both = mb.fastest(step)
    backward_kernels = (length + 1) * launch + view
    return max(0.0, (both - forward - backward_kernels) / (length + 2))


def optimizer_python(launch: float, tensors: int = 64) -> dict[str, float]:
    """What PyTorch's for-loop optimizer step adds per parameter tensor beyond its kernels,
    for each optimizer the estimate prices: a step over ``tensors`` tensors of 4 elements
    (their state made by a first step) timed, less the launches the estimate counts
    (passes/device/time_estimate.py ``OPTIMIZER_KERNELS``), over the tensors."""
    import torch

    from ...passes.device.time_estimate import OPTIMIZER_KERNELS

    made = {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=False),
            "momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=False),
            "adam": lambda ps: torch.optim.Adam(ps, foreach=False),
            "adamw": lambda ps: torch.optim.AdamW(ps, foreach=False)}
    out = {}
    for name, make in made.items():
        params = [torch.nn.Parameter(torch.ones(4)) for _ in range(tensors)]
        for p in params:
            p.grad = torch.ones(4)
        optimizer = make(params)
        optimizer.step()
        per_tensor = mb.fastest(optimizer.step) / tensors
        out[name] = max(0.0, per_tensor - OPTIMIZER_KERNELS[name][0] * launch)
    return out


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
    name = f"this CPU ({threads} thread{'s' if threads != 1 else ''})"
    profile = DeviceProfile(name, describe_machine(threads),
                            {name: steadier(measured[name](), measured[name]())
                             for name in engines})
    if validate is None:
        return profile
    runs = validate(profile)
    return DeviceProfile(profile.name, profile.measured,
                         {name: fitted(e, runs.get(name, ())) for name, e in profile.engines.items()})


def steadier(a: EngineProfile, b: EngineProfile) -> EngineProfile:
    """Two rounds of an engine's microbenchmarks, each figure the better round's (the
    shorter time, the higher rate): a shared machine slows for seconds at a time, longer
    than the fastest-of-five of one measurement spans (launch_s measured 1.25 and 2.03 µs
    in two calibrations on this machine ten minutes apart)."""
    def curve(x: Curve, y: Curve) -> Curve:
        rates = dict(x.points)
        for size, rate in y.points:
            rates[size] = max(rate, rates.get(size, 0.0))
        return Curve(tuple(sorted(rates.items())))

    return replace(
        a, launch_s=min(a.launch_s, b.launch_s), view_s=min(a.view_s, b.view_s),
        python_s=min(a.python_s, b.python_s), autograd_s=min(a.autograd_s, b.autograd_s),
        optimizer_s={k: min(v, b.optimizer_s.get(k, v)) for k, v in a.optimizer_s.items()},
        memory=curve(a.memory, b.memory),
        arithmetic={kind: {dt: curve(c, b.arithmetic.get(kind, {}).get(dt, c))
                           for dt, c in by.items()} for kind, by in a.arithmetic.items()})


def fitted(engine: EngineProfile, runs: tuple[Run, ...]) -> EngineProfile:
    """The engine with its validation runs and the scale they give: the median of measured
    over estimated, by which the runs' estimates (and every later one) are multiplied."""
    if not runs:
        return engine
    scale = statistics.median(r.measured_s / r.estimated_s for r in runs)
    return replace(engine, scale=scale, validation=tuple(
        Run(r.model, r.measured_s, r.estimated_s * scale) for r in runs))
