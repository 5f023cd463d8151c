"""The validation of ``graphcost calibrate``: small zoo models run for real on this machine
and estimated with the profile just measured; the runs' errors are the profile's error band.

- torch: an eager forward (under ``no_grad``) and an eager training step (forward, the loss
  graphcost traces, backward, the for-loop optimizer step; the second step, its state made);
- onnxruntime: the model exported by torch's TorchScript exporter, run in an InferenceSession
  on the CPU provider at torch's thread count.

Each time is the fastest of several runs (microbench.fastest), in each of two rounds over the
list, the faster kept. ``benchmarks/time_cpu.py`` runs
the same comparison over a wider set of models.
"""
from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Callable

from ...passes.device.profile import DeviceProfile, Run
from .microbench import fastest

# (zoo name, batch) for the forward runs, and (zoo name, batch, optimizer) for the steps
FORWARD = (("small_cnn", 8), ("resnet18", 1), ("mobilenet_v2", 1), ("gpt2", 2),
           ("llama_tiny", 2), ("mlp", 32), ("bert", 2))
STEPS = (("small_cnn", 8, "sgd"), ("gpt2", 2, "adamw"), ("mlp", 32, "adam"))
ONNX = (("small_cnn", 8), ("resnet18", 1), ("mobilenet_v2", 1), ("gpt2", 2), ("mlp", 32))


def _estimate(model, inputs, profile: DeviceProfile, **kw) -> float:
    from ..app.api import analyze

    report = analyze(model, inputs, device_profile=profile, **kw)
    assert report.time is not None
    return report.time.seconds


def forward_run(name: str, batch: int, profile: DeviceProfile) -> Run:
    import torch

    from ...models_zoo import registry as zoo

    model, inputs = zoo.build_model(name), zoo.example_inputs(name, batch)
    with torch.no_grad():
        measured = fastest(lambda: model(*inputs), budget=0.1)
    return Run(f"{name} b{batch} forward", measured, _estimate(model, inputs, profile))


def step_run(name: str, batch: int, optimizer: str, profile: DeviceProfile) -> Run:
    from ...models_zoo import registry as zoo
    from .reference import eager_training_step

    model = zoo.build_model(name, eval=False)
    inputs = zoo.example_inputs(name, batch)
    step, _ = eager_training_step(model, inputs, optimizer)
    step()   # the optimizer state
    measured = fastest(step, budget=0.1)
    estimated = _estimate(zoo.build_model(name, eval=False), inputs, profile, train=True,
                          optimizer=optimizer, what_if=False, include_inputs=False)
    return Run(f"{name} b{batch} {optimizer} step", measured, estimated)


def timed_session(model, inputs: tuple, path: Path, budget: float = 0.1) -> float:
    """``model`` exported to ``path`` by torch's TorchScript exporter and run in an ONNX
    Runtime session on the CPU provider at torch's thread count: seconds per run (fastest)."""
    import numpy as np
    import onnxruntime as ort
    import torch

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")   # the TorchScript exporter's deprecation notice
        torch.onnx.export(model, inputs, str(path), dynamo=False, opset_version=17)
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.asarray(x.numpy()) for i, x in zip(session.get_inputs(), inputs)}
    return fastest(lambda: session.run(None, feeds), budget=budget)


def onnx_run(name: str, batch: int, profile: DeviceProfile, folder: Path) -> Run:
    from ...models_zoo import registry as zoo

    path = folder / f"{name}.onnx"
    measured = timed_session(zoo.build_model(name), zoo.example_inputs(name, batch), path)
    return Run(f"{name} b{batch} onnxruntime", measured, _estimate(str(path), None, profile))


def validation_runs(profile: DeviceProfile, say: Callable[[str], None] = lambda _: None,
                    rounds: int = 2) -> dict[str, tuple[Run, ...]]:
    """The runs for each engine the profile measured, each measured in ``rounds`` rounds
    over the list and its fastest kept (a shared machine slows for minutes at a time: the
    profile's scale is fitted on these)."""
    each = [_validation_round(profile, say) for _ in range(rounds)]
    return {engine: tuple(min(same, key=lambda r: r.measured_s)
                          for same in zip(*(r[engine] for r in each)))
            for engine in each[0]}


def _validation_round(profile: DeviceProfile,
                      say: Callable[[str], None]) -> dict[str, tuple[Run, ...]]:
    runs: dict[str, tuple[Run, ...]] = {}
    if "torch" in profile.engines:
        torch_runs = []
        for name, batch in FORWARD:
            say(f"validating: {name} forward")
            torch_runs.append(forward_run(name, batch, profile))
        for name, batch, optimizer in STEPS:
            say(f"validating: {name} training step")
            torch_runs.append(step_run(name, batch, optimizer, profile))
        runs["torch"] = tuple(torch_runs)
    if "onnxruntime" in profile.engines:
        with tempfile.TemporaryDirectory() as folder:
            ort_runs = []
            for name, batch in ONNX:
                say(f"validating: {name} on onnxruntime")
                ort_runs.append(onnx_run(name, batch, profile, Path(folder)))
            runs["onnxruntime"] = tuple(ort_runs)
    return runs
