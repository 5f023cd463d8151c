"""The validation of ``graphcost calibrate --device GPU``: zoo models run for real on the GPU
(eager forwards and training steps, fp32 and bf16) and estimated with the profile just
measured, on the GPU's device row; their errors are the profile's band (calibrate_cuda.
fitted_gpu).

Each measured time is the wall clock of whole steps (the host's launches included, as a
training loop sees them), the GPU synchronized after each, the fastest of several rounds.
Sizes are chosen to span both regimes a GPU step meets: kernels waiting on the host (the
zoo's small transformers) and the host waiting on the kernels (ResNet-50, VGG-16).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ...passes.device.profile import DeviceProfile, Run
from ...passes.device_rates import DeviceRates

# (zoo name, batch, dims, dtype) forwards; (zoo name, batch, dims, optimizer, precision) steps;
# "decoder": the zoo's Llama code at a width whose matmuls keep a GPU busy (``_build``)
FORWARD = (("resnet50", 64, {}, "fp32"), ("resnet50", 64, {}, "bf16"),
           ("vgg16", 32, {}, "bf16"), ("mobilenet_v2", 64, {}, "fp32"),
           ("gpt2", 8, {}, "fp32"), ("llama_tiny", 16, {"seq": 256}, "bf16"),
           ("decoder", 4, {"seq": 2048}, "bf16"), ("decoder", 8, {"seq": 1024}, "fp32"))
STEPS = (("resnet50", 32, {}, "momentum", "fp32"), ("resnet50", 32, {}, "adamw", "bf16-mixed"),
         ("vgg16", 16, {}, "sgd", "bf16-mixed"), ("gpt2", 16, {}, "adamw", "fp32"),
         ("llama_tiny", 16, {"seq": 256}, "adamw", "bf16-mixed"),
         ("decoder", 2, {"seq": 2048}, "adamw", "bf16-mixed"),
         ("decoder", 1, {"seq": 2048}, "adamw", "fp32"),
         ("decoder", 4, {"seq": 1024}, "sgd", "bf16-mixed"))


def _build(name: str, batch: int, dims: dict, train: bool = False):
    """(the model, its example inputs) on the CPU, seeded."""
    import torch

    from ...models_zoo import registry as zoo
    from ...models_zoo.llama import Llama, LlamaConfig

    if name != "decoder":
        return zoo.build_model(name, eval=not train), zoo.example_inputs(name, batch, **dims)
    torch.manual_seed(0)
    mid = LlamaConfig(vocab_size=32000, d_model=1024, n_layer=4, n_head=16, n_kv_head=8,
                      ffn=2816)
    ids = torch.randint(0, mid.vocab_size, (batch, dims["seq"]),
                        generator=torch.Generator().manual_seed(0))
    return Llama(mid).train(train), (ids,)


def wall_seconds(step: Callable[[], object], device, rounds: int = 5, calls: int = 3) -> float:
    """Seconds per ``step`` on the wall clock, the device synchronized at the end of each
    round of ``calls``: the fastest round's."""
    import torch

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step()
    step()
    sync()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        sync()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


@dataclass(frozen=True)
class GpuRun:
    """A validation run with its estimate's parts (the profile's scale 1): the kernels' time
    (arithmetic, memory, launches), the host's and the optimizer's, which calibrate's fit
    (calibrate_cuda.fitted_gpu) scales apart."""
    run: Run
    kernels_s: float
    host_s: float
    optimizer_s: float


def _estimate(model, inputs, profile: DeviceProfile, rates: DeviceRates,
              **kw) -> tuple[float, float, float, float]:
    """(seconds, kernels, host, optimizer) of the step's estimate with ``profile``."""
    from ..app.api import analyze

    t = analyze(model, inputs, device=rates, device_profile=profile, **kw).time
    assert t is not None
    return (t.seconds, t.arithmetic_seconds + t.memory_seconds + t.launch_seconds,
            t.host_seconds, t.optimizer_seconds)


def forward_run(case: tuple, profile: DeviceProfile, rates: DeviceRates, device) -> GpuRun:
    import torch

    name, batch, dims, dtype = case
    model, inputs = _build(name, batch, dims)
    estimated = _estimate(model, inputs, profile, rates, dtype=None if dtype == "fp32" else dtype)
    model = model.to(device)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    real = tuple(x.to(device, torch.bfloat16) if dtype == "bf16" and x.is_floating_point()
                 else x.to(device) for x in inputs)
    with torch.no_grad():
        measured = wall_seconds(lambda: model(*real), device)
    return GpuRun(Run(f"{name} b{batch} forward {dtype}", measured, estimated[0]),
                  *estimated[1:])


def step_run(case: tuple, profile: DeviceProfile, rates: DeviceRates, device) -> GpuRun:
    import torch

    from .reference import eager_training_step

    name, batch, dims, optimizer, precision = case
    model, inputs = _build(name, batch, dims, train=True)
    estimated = _estimate(model, inputs, profile, rates, train=True, optimizer=optimizer,
                          precision=precision, what_if=False, include_inputs=False)
    model = model.to(device)
    autocast = torch.bfloat16 if precision == "bf16-mixed" else None
    step, _ = eager_training_step(model, tuple(x.to(device) for x in inputs), optimizer,
                                  autocast=autocast, device_type=device.type)
    measured = wall_seconds(step, device)
    return GpuRun(Run(f"{name} b{batch} {optimizer} step {precision}", measured, estimated[0]),
                  *estimated[1:])


def gpu_validation_runs(profile: DeviceProfile, rates: DeviceRates, device,
                        say: Callable[[str], None] = lambda _: None,
                        forward: tuple = FORWARD, steps: tuple = STEPS) -> tuple[GpuRun, ...]:
    """Each case measured on ``device`` and estimated on ``rates`` with ``profile``."""
    runs = []
    for case in forward:
        say(f"validating: {case[0]} forward")
        runs.append(forward_run(case, profile, rates, device))
    for case in steps:
        say(f"validating: {case[0]} training step")
        runs.append(step_run(case, profile, rates, device))
    return tuple(runs)
