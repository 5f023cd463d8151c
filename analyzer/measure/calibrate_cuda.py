"""``graphcost calibrate --device GPU``: what eager PyTorch's kernels achieve on this machine's
CUDA GPU, written as a device profile whose ``torch`` engine prices a step on that GPU
(``graphcost MODEL --device GPU --device-profile FILE``) instead of the datasheet's rates at
published shares (passes/device/gpu_engine.py).

What is measured, each kernel timed on the GPU's own clock (CUDA events around a CUDA graph's
replay of many calls, so that the host's launch time does not show; eager calls where a kernel
cannot be captured), operands cycled past the 50 MB L2 cache of an H100/H200:

- launch: a 1-element add's GPU time (a kernel doing no work); view: none (a view launches no
  kernel on a GPU);
- host: eager PyTorch's host time per op (its Python, dispatcher and launch call), timed on
  small models whose kernels do almost no work: the GPU waits on the host there, as it does
  on any small model (``EngineProfile.host_s``); and a training step's host time per autograd
  node beyond it (``autograd_s``: recording the node, running it from the backward's engine);
- gemm: square matmuls from 256³ to 8192³ in fp32 (no TF32, PyTorch's default), bf16 and fp16;
  conv and grouped_conv: 3×3 convolutions of CNN-like widths and depthwise ones, fp32 (cuDNN's
  TF32, PyTorch's default for convolutions) and bf16; attention: causal
  scaled_dot_product_attention in bf16 and fp16 at head dim 64 and 128 (the kernel PyTorch
  dispatches: cuDNN's or FlashAttention on sm90), priced by the FLOPs graphcost counts
  (4·b·h·s²·d for the forward, causal or not, as FlopCounterMode counts them);
- memory: an elementwise add from 64 KiB to 1 GiB per operand.

Then the validation: zoo models run for real on the GPU (eager forwards and training steps,
fp32 and bf16-mixed), estimated with the new profile on that GPU's device row. The median
ratio of measured to estimated kernel time, over the runs whose kernels outlast the host, is
the profile's scale (what the microbenchmarks miss in a model: non-square shapes, memory-bound
kernels slower than an add, the allocator), which multiplies the kernels' time and not the
host's (measured on models already); the runs' errors after it are the band.
``benchmarks/time_cuda.py`` checks the profile on models calibrate never ran.
"""
from __future__ import annotations

import datetime
import statistics
from dataclasses import replace
from typing import Callable

from ...passes.device.profile import Curve, DeviceProfile, EngineProfile, Run
from ...passes.device_rates import DeviceRates
from . import microbench as mb
from .calibrate_cuda_runs import GpuRun, wall_seconds

GEMM_SIZES = (256, 512, 1024, 2048, 4096, 8192)
# (batch, channels in, channels out, height = width, kernel): 3×3 convolutions of CNN-like
# widths whose FLOPs ascend (a curve is read by FLOPs: ResNet's stages at one batch all have
# the same, and a stem's 3 input channels would stand for all of them)
CONV_SHAPES = ((1, 64, 64, 14, 3), (1, 64, 64, 56, 3), (8, 64, 64, 56, 3),
               (32, 128, 128, 28, 3), (64, 128, 128, 56, 3), (64, 256, 256, 56, 3))
# (batch, channels, height = width): depthwise 3×3 convolutions (MobileNet's)
GROUPED_SHAPES = ((8, 32, 112), (32, 144, 56), (64, 192, 56), (128, 384, 28), (128, 960, 14))
# (batch·heads, sequence, head dim)
ATTENTION_SHAPES = ((32, 512, 64), (32, 1024, 128), (16, 2048, 128), (8, 4096, 128),
                    (4, 8192, 128))
MEMORY_ELEMENTS = tuple(2 ** k for k in range(14, 29, 2))   # 64 KiB … 1 GiB of fp32
COLD_BYTES = 512 << 20     # operands cycled through: ten times an H200's L2
CAPTURED_TIME = 0.02       # seconds of work a captured graph holds (its replay is timed)


def _events(fn: Callable[[], object], calls: int = 1) -> float:
    """GPU seconds of ``calls`` calls of ``fn`` between two CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def gpu_seconds(fn: Callable[[], object]) -> float:
    """GPU seconds per call of ``fn``: as many calls as fill ``CAPTURED_TIME`` (at most 256)
    captured in one CUDA graph, its replay timed (the fastest of three); a call that cannot
    be captured is timed eagerly (its launches then show where they outlast the kernel)."""
    import torch

    for _ in range(3):   # cuBLAS's and cuDNN's plans, the allocator's blocks: made uncaptured
        fn()
    one = min(_events(fn) for _ in range(3))
    calls = max(1, min(256, int(CAPTURED_TIME / max(one, 1e-7))))
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except RuntimeError:   # (not capturable: a host synchronization, a CPU tensor)
        torch.cuda.synchronize()
        return min(_events(fn, calls) for _ in range(3)) / calls
    graph.replay()
    seconds = min(_events(graph.replay) for _ in range(3)) / calls
    del graph
    return seconds


def timer_for(device) -> Callable[[Callable[[], object]], float]:
    """Seconds per call on ``device``: the GPU's clock, or (a CPU: the tests' dry run of this
    module) microbench.fastest."""
    return gpu_seconds if device.type == "cuda" else mb.fastest


def cuda_engine(device, rates: DeviceRates) -> EngineProfile:
    """Eager PyTorch on ``device`` (a CUDA device; a CPU runs the same code as a check), the
    host's figures read against graphcost's analyses on ``rates``."""
    import torch

    timer = timer_for(device)
    one = torch.ones(1, device=device)
    launch = timer(lambda: torch.add(one, one))
    with torch.no_grad():
        arithmetic = {"gemm": _gemm(device, timer, launch), "conv": _conv(device, timer, launch),
                      "grouped_conv": _grouped(device, timer, launch),
                      "attention": _attention(device, timer, launch)}
        memory = [(12 * n, _cold(lambda n=n: (_rand(device, n), _rand(device, n)), torch.add,
                                 timer)) for n in MEMORY_ELEMENTS]
    host = host_per_op(device, rates)
    return EngineProfile(launch, 0.0, arithmetic, mb.rates(memory, launch), host_s=host,
                         autograd_s=autograd_per_node(device, rates, host))


def _rand(device, *shape, dtype=None):
    import torch

    return torch.randn(*shape, device=device, dtype=dtype)


def _cold(make, run, timer) -> float:
    return mb.cold(make, run, timer=timer, cold_bytes=COLD_BYTES)


def _dtypes(names: tuple[str, ...]):
    import torch

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    return [(name, table[name]) for name in names]


def _gemm(device, timer, launch) -> dict[str, Curve]:
    import torch

    return {name: mb.rates([(2 * n ** 3, _cold(
        lambda n=n, d=dtype: (_rand(device, n, n, dtype=d), _rand(device, n, n, dtype=d)),
        torch.mm, timer)) for n in GEMM_SIZES], launch)
        for name, dtype in _dtypes(("fp32", "bf16", "fp16"))}


def _conv(device, timer, launch) -> dict[str, Curve]:
    import torch.nn.functional as F

    return {name: mb.rates([(2 * b * co * hw * hw * ci * k * k, _cold(
        lambda b=b, ci=ci, co=co, hw=hw, k=k, d=dtype: (_rand(device, b, ci, hw, hw, dtype=d),
                                                        _rand(device, co, ci, k, k, dtype=d)),
        lambda x, w: F.conv2d(x, w, padding=w.shape[-1] // 2), timer))
        for b, ci, co, hw, k in CONV_SHAPES], launch)
        for name, dtype in _dtypes(("fp32", "bf16"))}


def _grouped(device, timer, launch) -> dict[str, Curve]:
    import torch.nn.functional as F

    return {name: mb.rates([(2 * b * c * hw * hw * 9, _cold(
        lambda b=b, c=c, hw=hw, d=dtype: (_rand(device, b, c, hw, hw, dtype=d),
                                          _rand(device, c, 1, 3, 3, dtype=d)),
        lambda x, w: F.conv2d(x, w, padding=1, groups=w.shape[0]), timer))
        for b, c, hw in GROUPED_SHAPES], launch)
        for name, dtype in _dtypes(("fp32", "bf16"))}


def _attention(device, timer, launch) -> dict[str, Curve]:
    import torch.nn.functional as F

    return {name: mb.rates([(4 * bh * s * s * d, _cold(
        lambda bh=bh, s=s, d=d, dt=dtype: (_rand(device, 1, bh, s, d, dtype=dt),) * 3,
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), timer))
        for bh, s, d in ATTENTION_SHAPES], launch)
        for name, dtype in _dtypes(("bf16", "fp16"))}


def _small_models(train: bool = False) -> list[tuple]:
    """Small models of three kinds (modules around every op: the tiny MLP blocks; the zoo's
    Llama and GPT-2, whose forwards call functions between their modules), at sizes whose
    kernels do almost no work, so that the GPU waits on the host: (model, args) on the CPU."""
    from ...models_zoo import registry as zoo
    from .calibrate import tiny_blocks

    model, x = tiny_blocks()
    return [(model.train(train), (x,)),
            *((zoo.build_model(name, eval=not train), zoo.example_inputs(name, 1, seq=8))
              for name in ("llama_tiny", "gpt2"))]


def host_per_op(device, rates: DeviceRates) -> float:
    """Eager PyTorch's host seconds per traced node of a forward: the median over the small
    models of a forward's wall time (rounds of 50 calls) over its nodes."""
    import torch

    from ..app.api import analyze

    per_node = []
    for model, args in _small_models():
        nodes = len(analyze(model, args, device=rates).nodes)
        model, args = model.to(device), tuple(a.to(device) for a in args)
        with torch.no_grad():
            per_node.append(wall_seconds(lambda: model(*args), device, calls=50) / nodes)
    return statistics.median(per_node)


def autograd_per_node(device, rates: DeviceRates, host: float) -> float:
    """A training step's host seconds per autograd node beyond ``host`` per traced node
    (recording the node in the forward, running it from the backward's engine): the median
    over the small models of (a step's wall time − host × its traced nodes) over its autograd
    nodes, as time_estimate.py counts them (read off the estimate's host time, which is
    linear in them). The step: zero_grad, the forward, graphcost's loss, the backward."""
    from .reference import eager_training_step

    per_node = []
    for model, args in _small_models(train=True):
        plain, probe = (_host_estimate(model, args, rates, host, a) for a in (0.0, 1e-6))
        nodes = (probe - plain) / 1e-6
        step, _ = eager_training_step(model.to(device), tuple(a.to(device) for a in args),
                                      "none", device_type=device.type)
        per_node.append(max(0.0, (wall_seconds(step, device, calls=50) - plain) / max(nodes, 1.0)))
    return statistics.median(per_node)


def _host_estimate(model, args, rates: DeviceRates, host: float, autograd: float) -> float:
    """The host time a training step's estimate holds at these two host figures."""
    from ..app.api import analyze

    flat = Curve(((1.0, 1e30),))
    probe = EngineProfile(0.0, 0.0, {"gemm": {"fp32": flat}}, flat, host_s=host,
                          autograd_s=autograd)
    t = analyze(model, args, device=rates, train=True, optimizer="none", what_if=False,
                device_profile=DeviceProfile("host probe", {}, {"torch": probe})).time
    assert t is not None
    return t.host_seconds


def describe_gpu(device) -> dict[str, str]:
    import torch

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "(a CPU: dry run)"
    return {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "gpu": gpu[:200], "cuda": str(torch.version.cuda)}


def calibrate_gpu(rates: DeviceRates, device,
                  validate: Callable[[DeviceProfile], tuple[GpuRun, ...]] | None = None
                  ) -> DeviceProfile:
    """``rates``' GPU (the device row the validation's analyses run on) measured on
    ``device``, in two rounds (the better figure kept), then validated (``validate``:
    calibrate_cuda_runs.py's runs, which need the profile to estimate with)."""
    from .calibrate import steadier

    measured = describe_gpu(device)
    engine = steadier(cuda_engine(device, rates), cuda_engine(device, rates))
    profile = DeviceProfile(f"{rates.name} (calibrated: {measured['gpu']})", measured,
                            {"torch": engine})
    if validate is None:
        return profile
    return DeviceProfile(profile.name, measured,
                         {"torch": fitted_gpu(engine, validate(profile))})


def fitted_gpu(engine: EngineProfile, runs: tuple[GpuRun, ...]) -> EngineProfile:
    """The engine with its validation runs and the scale of its kernels: the median of
    measured over estimated kernel time (with the optimizer's) on the runs whose kernels
    outlast the host (a host-bound run's time is the host's, measured apart, and says nothing
    of the kernels); the runs' estimates are then the longer of the scaled kernels and the
    host, plus the scaled optimizer, as time_estimate.py prices every later step."""
    bound = [r for r in runs if r.kernels_s >= r.host_s and r.kernels_s + r.optimizer_s > 0]
    k = statistics.median(r.run.measured_s / (r.kernels_s + r.optimizer_s) for r in bound) \
        if bound else 1.0
    return replace(engine, scale=k, validation=tuple(
        Run(r.run.model, r.run.measured_s, max(k * r.kernels_s, r.host_s) + k * r.optimizer_s)
        for r in runs))
