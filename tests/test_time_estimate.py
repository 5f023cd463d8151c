"""The time estimate (passes/device/time_estimate.py) with a device profile
(passes/device/profile.py), ``--device-profile`` and ``graphcost calibrate``
(analyzer/measure/calibrate.py). How close the estimate comes to real runs on this CPU is
benchmarks/time_cpu.py's question (its figures: benchmarks/results/time_cpu.md); here the
arithmetic is checked by hand, the profile's file as hostile input, and calibrate's output."""
from __future__ import annotations

import json
from dataclasses import replace

import onnx
import pytest
from graphcost.passes.device.profile import (
    Curve,
    DeviceProfile,
    EngineProfile,
    Run,
    profile_from_json,
    profile_to_json,
)
from graphcost.passes.errors import GraphcostError
from onnx import TensorProto, helper

from graphcost import analyze
from tests.cli_runner import run_cli

FLAT = Curve(((1.0, 1e9), (1e15, 1e9)))   # 1 GFLOP/s (or 1 GB/s) at every size
LAUNCH, VIEW = 1e-6, 5e-7


def flat_profile(runs=()) -> DeviceProfile:
    engine = EngineProfile(LAUNCH, VIEW, {"gemm": {"fp32": FLAT}}, FLAT, tuple(runs))
    return DeviceProfile("test machine", {"date": "2026-12-02"},
                         {"onnxruntime": engine, "torch": engine})


def matmul_relu(path, extra_nodes=()):
    """x (64, 128) · W (128, 256) -> ReLU, W an initializer."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [128, 256], [0.0] * (128 * 256))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"]),
         *extra_nodes],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("custom.test", 1)])
    onnx.save(model, path)
    return str(path)


def test_each_node_is_priced_at_the_profiles_rates(tmp_path):
    t = analyze(matmul_relu(tmp_path / "m.onnx"), device_profile=flat_profile()).time
    assert t is not None and t.engine == "onnxruntime"
    # MatMul: 2·64·128·256 = 4,194,304 FLOPs at 1 GFLOP/s = 4,194.304 µs, beyond its bytes
    # (64·128·4 + 128·256·4 read + 64·256·4 written = 229,376 B: 229.4 µs) + a 1 µs launch;
    # ReLU: no multiply-accumulate, memory-bound: 65,536 B read + 65,536 written at 1 GB/s =
    # 131.072 µs + a launch
    assert t.arithmetic_seconds == pytest.approx(4194.304e-6)
    assert t.memory_seconds == pytest.approx(131.072e-6)
    assert t.launch_seconds == pytest.approx(2e-6) and t.kernels == 2
    assert t.seconds == pytest.approx((4194.304 + 131.072 + 2) * 1e-6)
    assert t.band is None and t.low_seconds is None   # the profile was never validated


def test_the_band_is_the_validations_90th_percentile(tmp_path):
    # errors +1% … +10%, -12%: the nearest rank of the 90th percentile of 11 is the 10th
    # smallest absolute error, 10%
    runs = [Run(f"m{i}", 1.0, 1 + i / 100) for i in range(1, 11)] + [Run("m11", 1.0, 0.88)]
    t = analyze(matmul_relu(tmp_path / "m.onnx"), device_profile=flat_profile(runs)).time
    assert t is not None and t.band == pytest.approx(0.10) and t.runs == 11
    assert t.low_seconds == pytest.approx(0.9 * t.seconds)
    assert t.high_seconds == pytest.approx(1.1 * t.seconds)


def test_calibration_scales_by_the_validations_median_ratio(tmp_path):
    from graphcost.analyzer.measure.calibrate import fitted

    engine = flat_profile().engines["torch"]
    # measured / estimated: 1.2, 1.25, 1.5 -> the median, 1.25, multiplies every estimate;
    # the scaled estimates 1.25, 2.5, 2.5 against 1.2, 2.5, 3.0 measured err by +4.2%, 0 and
    # -16.7%: the 90th percentile of three (nearest rank: the 3rd) is 1/6
    runs = (Run("a", 1.2, 1.0), Run("b", 2.5, 2.0), Run("c", 3.0, 2.0))
    engine = fitted(replace(engine, python_s=3e-6), runs)
    assert engine.scale == pytest.approx(1.25) and engine.python_s == 3e-6   # (kept)
    assert [r.estimated_s for r in engine.validation] == pytest.approx([1.25, 2.5, 2.5])
    assert engine.band == pytest.approx(1 / 6)
    profile = DeviceProfile("fitted", {}, {"onnxruntime": engine})
    t = analyze(matmul_relu(tmp_path / "m.onnx"), device_profile=profile).time
    assert t is not None
    # each of the two nodes pays its 1 µs launch and the profile's 3 µs of Python
    assert t.seconds == pytest.approx(1.25 * (4194.304 + 131.072 + 2 * (1 + 3)) * 1e-6)
    assert t.arithmetic_seconds + t.memory_seconds + t.launch_seconds == pytest.approx(t.seconds)


def test_a_curve_is_read_log_log_and_never_extrapolated():
    c = Curve(((1e3, 1e9), (1e6, 1e10)))
    assert c.rate(10 ** 4.5) == pytest.approx(10 ** 9.5)   # halfway in log size: in log rate
    assert c.rate(1.0) == 1e9 and c.rate(1e9) == 1e10


def test_a_node_without_a_rule_is_priced_at_a_launch_and_named(tmp_path):
    path = matmul_relu(tmp_path / "m.onnx",
                       [helper.make_node("Mystery", ["y"], ["z"], domain="custom.test")])
    t = analyze(path, device_profile=flat_profile()).time
    assert t is not None and dict(t.unpriced) == {"custom.test::Mystery": 1}
    assert t.launch_seconds == pytest.approx(3e-6) and t.kernels == 3


def test_a_training_step_adds_the_optimizer_step():
    import torch
    from graphcost.passes.device.time_estimate import OPTIMIZER_KERNELS

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    r = analyze(model, (torch.randn(32, 256),), train=True, optimizer="adam", what_if=False,
                device_profile=flat_profile())
    assert r.time is not None and r.time.engine == "torch"
    # adam's for-loop step: 8 kernels per parameter tensor moving 18 bytes per parameter byte;
    # tensors of 256·512, 512, 512·10 and 10 fp32 values: 8 launches each plus
    # 18·4·(131,072 + 512 + 5,120 + 10) B at 1 GB/s
    assert OPTIMIZER_KERNELS["adam"] == (8, 18)
    params = 256 * 512 + 512 + 512 * 10 + 10
    assert r.time.optimizer_seconds == pytest.approx(4 * 8 * LAUNCH + 18 * 4 * params / 1e9)
    # a profile that timed adam's Python (5 µs a tensor) adds it for each of the 4 tensors
    profile = flat_profile()
    engine = replace(profile.engines["torch"], optimizer_s={"adam": 5e-6, "sgd": 1e-6})
    t = analyze(model, (torch.randn(32, 256),), train=True, optimizer="adam", what_if=False,
                device_profile=replace(profile, engines={"torch": engine})).time
    assert t is not None
    assert t.optimizer_seconds - r.time.optimizer_seconds == pytest.approx(4 * 5e-6)


def test_each_autograd_node_of_an_eager_step_adds_the_profiles_autograd_cost():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    profile = flat_profile()
    engine = replace(profile.engines["torch"], autograd_s=2e-6)
    with_autograd = replace(profile, engines={"torch": engine})
    args = (model, (torch.randn(32, 256),))
    kw = dict(train=True, optimizer="adam", what_if=False)
    base = analyze(*args, device_profile=profile, **kw).time
    t = analyze(*args, device_profile=with_autograd, **kw).time
    assert base is not None and t is not None
    # eager's autograd graph of sum(Linear(ReLU(Linear(x)))): SumBackward0, AddmmBackward0 and
    # TBackward0 (the weight's transpose) per Linear, ReluBackward0 — 6 formulas — and an
    # AccumulateGrad per parameter (2 weights, 2 biases): 10 nodes at 2 µs
    assert t.launch_seconds - base.launch_seconds == pytest.approx(10 * 2e-6)
    assert t.seconds - base.seconds == pytest.approx(10 * 2e-6)
    inference = analyze(*args, device_profile=with_autograd).time
    plain = analyze(*args, device_profile=profile).time
    assert inference is not None and plain is not None
    assert inference.seconds == plain.seconds        # a forward records no autograd node


def test_dropout_is_priced_at_the_rate_its_draws_were_measured_at():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.1))
    args, kw = (model, (torch.randn(16, 64),)), dict(train=True, optimizer="sgd", what_if=False)
    base = analyze(*args, device_profile=flat_profile(), **kw).time
    profile = flat_profile()
    slow = Curve(((1.0, 1e6), (1e15, 1e6)))   # 1 MFLOP/s of draws: far below the bytes' pace
    engine = replace(profile.engines["torch"],
                     arithmetic={**profile.engines["torch"].arithmetic, "random": {"fp32": slow}})
    t = analyze(*args, device_profile=replace(profile, engines={"torch": engine}), **kw).time
    assert base is not None and t is not None
    # native_dropout of 16·64 = 1,024 elements: 2,048 FLOPs (draw and scale) at 1 MFLOP/s =
    # 2,048 µs of arithmetic, where it was memory-bound before: it reads 4,096 B and writes
    # 4,096 B of values and its noise, which a CPU run keeps in fp32 (another 4,096 B):
    # 12,288 B at 1 GB/s = 12.288 µs (the profile without ``random`` prices its 2,048 FLOPs
    # as a GEMM's, 2.048 µs, under its bytes)
    assert t.arithmetic_seconds - base.arithmetic_seconds == pytest.approx(2048e-6)
    assert base.memory_seconds - t.memory_seconds == pytest.approx(12.288e-6)


def test_a_training_batch_norm_is_priced_at_its_class_an_inference_one_at_its_bytes():
    import torch

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8))
    x = (torch.randn(2, 3, 10, 10),)
    profile = flat_profile()
    slow = Curve(((1.0, 1e6), (1e15, 1e6)))   # 1 MFLOP/s: far below the bytes' pace
    engine = replace(profile.engines["torch"], arithmetic={
        **profile.engines["torch"].arithmetic, "batch_norm": {"fp32": slow}})
    slow_norm = replace(profile, engines={"torch": engine})
    kw = dict(train=True, optimizer="sgd", what_if=False)
    base = analyze(model, x, device_profile=profile, **kw).time
    t = analyze(model, x, device_profile=slow_norm, **kw).time
    assert base is not None and t is not None
    # the batch norm's 2·8·8·8 = 1,024 elements: 5 FLOPs each forward, 9 each backward (its
    # input's gradient, the conv's output's, is asked for) and 6 a channel; at 1 MFLOP/s,
    # (5 + 9)·1,024 + 6·8 = 14,384 FLOPs take 14.384 ms, where the flat profile's GEMM rate
    # (1 GFLOP/s) left them under their bytes
    assert t.arithmetic_seconds - base.arithmetic_seconds == pytest.approx(14.384e-3)
    model.eval()
    assert analyze(model, x, device_profile=slow_norm).time == \
        analyze(model, x, device_profile=profile).time   # inference's folds to its bytes


def test_a_data_parallel_rank_gets_no_estimate_and_says_why():
    import torch

    model = torch.nn.Linear(64, 64)
    r = analyze(model, (torch.randn(8, 64),), train=True, device_profile=flat_profile(),
                parallel={"strategy": "ddp", "world_size": 2})
    assert r.time is None
    assert any("no time estimate for this parallel rank" in w for w in r.warnings)


def test_the_command_line_prints_the_estimate_and_its_band(tmp_path):
    runs = [Run(f"m{i}", 1.0, 1.05) for i in range(10)]
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(profile_to_json(flat_profile(runs))))
    out = run_cli(matmul_relu(tmp_path / "m.onnx"), "--device-profile", profile)
    assert out.returncode == 0, out.stderr
    assert "time        ≈ 4.33 ms ± 5% per forward (estimate: test machine, ONNX Runtime;" \
        in out.stdout
    assert "band from 10 validated runs)" in out.stdout


BAD = {
    "not JSON": ("{", "not JSON"),
    "another format": ({"format": "x"}, "format: expected 'graphcost-device-profile'"),
    "a negative rate": ({"engines": {"torch": {"memory": [[1, -5]]}}},
                        "engines.torch.memory[0][1]: expected a positive number"),
    "sizes out of order": ({"engines": {"torch": {"memory": [[10, 1], [5, 1]]}}},
                           "engines.torch.memory: sizes must ascend"),
    "an unknown engine": ({"engines": {"tpu": {}}}, "engines: unknown key 'tpu'"),
    "a text for a number": ({"engines": {"torch": {"launch_s": "fast"}}},
                            "engines.torch.launch_s: expected a number ≥ 0"),
    "an optimizer never timed": ({"engines": {"torch": {"optimizer_s": {"lion": 1e-6}}}},
                                 "engines.torch.optimizer_s: unknown key 'lion'"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_profile_is_one_line_and_exit_2(tmp_path, case):
    content, said = BAD[case]
    good = profile_to_json(flat_profile())
    if isinstance(content, dict):
        doc = {**good, **{k: v for k, v in content.items() if k != "engines"}}
        for name, fields in content.get("engines", {}).items():
            doc["engines"] = {name: {**good["engines"].get(name, {}), **fields}}
        content = json.dumps(doc)
    path = tmp_path / "p.json"
    path.write_text(content)
    out = run_cli(matmul_relu(tmp_path / "m.onnx"), "--device-profile", path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert said in out.stderr and str(path) in out.stderr


def test_a_profile_file_too_large_is_refused_unread(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(" " * ((1 << 20) + 1))
    with pytest.raises(GraphcostError, match="is not a device profile"):
        analyze(matmul_relu(tmp_path / "m.onnx"), device_profile=str(path))


def test_the_api_names_a_wrong_device_profile_argument(tmp_path):
    with pytest.raises(GraphcostError, match="device_profile must be the path"):
        analyze(matmul_relu(tmp_path / "m.onnx"), device_profile=42)


def test_calibrate_measures_every_curve_and_the_file_reads_back(tmp_path, monkeypatch):
    from graphcost.analyzer.measure import microbench

    # a few small sizes keep this quick; the command measures the full ranges
    small = {"GEMM_SIZES": (32, 128), "CONV_SHAPES": ((1, 8, 8, 16, 3), (1, 16, 16, 16, 3)),
             "GROUPED_SHAPES": ((1, 8, 16), (1, 16, 16)), "POOL_SHAPES": ((1, 8, 16),),
             "MEMORY_ELEMENTS": (2 ** 12, 2 ** 16), "RANDOM_ELEMENTS": (2 ** 12,),
             "NORM_SHAPES": ((1, 8, 16),),
             "COLD_BYTES": 1 << 16}
    for name, value in small.items():
        monkeypatch.setattr(microbench, name, value)
    monkeypatch.setattr(microbench, "fastest", lambda fn, budget=0.0: _timed(fn))
    monkeypatch.setattr(microbench, "ATTENTION_SHAPES", ((2, 32, 16), (2, 64, 16)))
    out = run_cli("calibrate", "--no-validation", "-o", tmp_path / "p.json")
    assert out.returncode == 0, out.stderr
    profile = profile_from_json(json.loads((tmp_path / "p.json").read_text()))
    eager, ort = profile.engines["torch"], profile.engines["onnxruntime"]
    assert set(eager.arithmetic) == {"gemm", "conv", "grouped_conv", "attention", "pool",
                                     "random", "batch_norm"}
    # dropout of 4,096 elements: a draw and a scale each, as the rule counts them
    assert eager.arithmetic["random"]["fp32"].points[0][0] == 2 * 4096
    # batch norm of 8 channels of 16×16 forward (5 an element) and backward (9 an element, 6
    # a channel): 14·2,048 + 48
    assert eager.arithmetic["batch_norm"]["fp32"].points[0][0] == 14 * 2048 + 48
    assert set(ort.arithmetic) == {"gemm", "conv", "grouped_conv", "pool"}
    assert set(eager.arithmetic["gemm"]) == {"fp32", "bf16"}
    for engine in (eager, ort):
        assert 0 <= engine.launch_s < 1e-3 and engine.validation == ()
        # each matmul's size is its FLOPs, 2·n³: 65,536 and 4,194,304 (their rates depend on
        # how busy the machine is: profile_from_json checked they are positive)
        assert [size for size, _ in engine.arithmetic["gemm"]["fp32"].points] == \
            [65536, 4194304]
        # 3×3 max pooling, stride 2, of 8 channels of 16×16: 8·8·8 outputs × 9 compares
        assert engine.arithmetic["pool"]["fp32"].points[0][0] == 9 * 8 * 8 * 8
    # eager autograd costs something per node (how much, the machine decides); ONNX Runtime
    # has none
    assert 0 < eager.autograd_s < 1e-3 and ort.autograd_s == 0
    assert set(eager.optimizer_s) == {"sgd", "momentum", "adam", "adamw"}
    assert all(0 <= s < 1e-3 for s in eager.optimizer_s.values()) and not ort.optimizer_s
    assert profile.measured["threads"].isdigit() and "not validated" in out.stdout


def _timed(fn) -> float:
    import time

    best = float("inf")
    for _ in range(20):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
