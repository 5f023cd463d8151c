"""Devices and the roofline: datasheet figures, the per-node formula on the design notes' worked
MNIST numbers, and the CLI options (--device, --device-spec, --tf32, `graphcost devices`)."""
from __future__ import annotations

import json

import pytest
from graphcost.analyzer.app.api import analyze
from graphcost.analyzer.app.devices import (
    DEVICES,
    get_device,
    parse_device_spec,
    parse_overhead,
)
from graphcost.analyzer.cli.main import main
from graphcost.passes.errors import GraphcostError

REQUIRED = ("gtx1080ti", "v100", "t4", "a10", "l4", "a100-40gb", "a100-80gb", "h100-sxm",
            "rtx3090", "rtx4090")


def test_the_issue_devices_are_all_there_with_the_design_notes_1080ti():
    assert set(REQUIRED) <= set(DEVICES)
    d = get_device("GTX1080TI")
    # design notes §1.4: GTX 1080 Ti, 10.6 TFLOP/s fp32, 484 GB/s
    assert d.peak_flops["fp32"] == 10.6e12 and d.bandwidth == 484e9
    a100 = get_device("a100-40gb")  # NVIDIA A100 datasheet: 19.5 fp32, 156 tf32, 312 bf16
    assert (a100.peak("fp32"), a100.peak("tf32"), a100.peak("bf16")) == (19.5e12, 156e12, 312e12)
    assert a100.memory == 40 * 2**30 and a100.bandwidth == 1555e9
    assert get_device("t4").peak("bf16") == 8.1e12  # no bf16 path on Turing: the fp32 rate


def test_todays_gpus_carry_their_datasheet_figures():
    mib, tf = 1 << 20, 1e12
    # NVIDIA H100 datasheet, PCIe: BF16 1,513 TFLOPS with sparsity -> 756.5 dense; 2 TB/s
    pcie = get_device("h100-pcie")
    assert (pcie.peak("bf16"), pcie.bandwidth, pcie.memory) == (756.5 * tf, 2000e9, 80 << 30)
    # NVL: FP8 3,341 sparse -> 1,670.5 dense; 94 GB
    nvl = get_device("h100-nvl")
    assert nvl.narrow_flops["fp8"] == 1670.5 * tf and nvl.memory == 94 << 30
    # H200: the H100 SXM's rates, 141 GB at 4.8 TB/s
    h200, sxm = get_device("h200"), get_device("h100-sxm")
    assert dict(h200.peak_flops) == dict(sxm.peak_flops) and h200.bandwidth == 4800e9
    # HGX B200, eight GPUs: FP4 144 PFLOPS sparse -> 144 / 8 / 2 = 9 PFLOPS per GPU dense;
    # FP32 600 TFLOPS / 8 = 75; 64 TB/s / 8 = 8 TB/s
    b200 = get_device("b200")
    assert (b200.narrow_flops["fp4"], b200.peak("fp32"), b200.bandwidth) == \
        (9000 * tf, 75 * tf, 8000e9)
    # GB200 NVL72, 72 GPUs: FP32 5,760 TFLOPS / 72 = 80; BF16 360 PFLOPS sparse / 72 / 2 = 2.5
    gb200 = get_device("gb200")
    assert (gb200.peak("fp32"), gb200.peak("bf16")) == (80 * tf, 2500 * tf)
    # AMD MI300X data sheet: FP16 1,307.4 TFLOPS dense, 192 GB at 5.3 TB/s; MI325X 256 GB, 6 TB/s
    mi = get_device("mi300x"), get_device("mi325x")
    assert [(d.peak("fp16"), d.memory, d.bandwidth) for d in mi] == \
        [(1307.4 * tf, 192 << 30, 5300e9), (1307.4 * tf, 256 << 30, 6000e9)]
    # L40S datasheet: FP8 1,466 sparse -> 733; RTX 6000 Ada: FP8 1,457 sparse -> 728.5
    assert get_device("l40s").narrow_flops["fp8"] == 733 * tf
    assert get_device("rtx6000-ada").narrow_flops["fp8"] == 728.5 * tf
    # RTX 5090: 3,352 "AI TOPS" is FP4 with sparsity -> 1,676 dense; 32 GB at 1,792 GB/s
    r5090 = get_device("rtx5090")
    assert (r5090.narrow_flops["fp4"], r5090.memory, r5090.bandwidth) == \
        (1676 * tf, 32 << 30, 1792e9)
    # parts without fp8 have none; parts before Blackwell have no fp4
    assert "fp8" not in get_device("a100-80gb").narrow_flops
    assert "fp4" not in sxm.narrow_flops and "fp4" not in get_device("mi300x").narrow_flops
    # a card sold as 80 GB offers a process less: cudaMemGetInfo's total on an H100 80GB HBM3
    # (benchmarks/results/cuda_h100_sxm.json) is 85,017,493,504 B = 81,079.06 MiB, under
    # 80 GiB = 81,920 MiB
    assert sxm.usable_memory == 85_017_493_504 < 81_920 * mib == sxm.memory
    assert get_device("t4").usable_memory is None   # no measured figure: the nominal applies


def test_aliases_and_did_you_mean():
    assert get_device("H100") is DEVICES["h100-sxm"] and get_device(" a100 ") is \
        DEVICES["a100-80gb"]
    assert get_device("RTX-5090") is DEVICES["rtx5090"]
    with pytest.raises(GraphcostError, match=r"did you mean h100-pcie"):
        get_device("h100-pci")
    with pytest.raises(GraphcostError, match=r"did you mean mi300x"):
        get_device("mi300")
    # an alias near the name is offered as its device, once
    with pytest.raises(GraphcostError, match=r"did you mean rtx6000-ada\b") as err:
        get_device("rtx6000 ada")
    assert str(err.value).count("rtx6000-ada") == 2   # the hint and the list of known names


def test_mnist_roofline_matches_the_design_notes_bytes_on_a_1080ti():
    r = analyze("zoo:mnist_net", device="gtx1080ti")
    ro = r.roofline
    by_name = {n.name: n for n in r.nodes}
    conv1, fc1 = by_name["/conv1/Conv"], by_name["/fc1/Gemm"]
    # conv1: MemRead 4,176 B + MemWrite 23,040 B (design notes §1.2) over 484 GB/s
    #   = 27,216 / 484e9 = 56.23 ns; compute 2·144,000 (+5,760 bias) / 10.6e12 = 28.2 ns
    #   -> memory-bound at 56.23 ns
    t = ro.nodes[conv1.index]
    assert t.bound == "memory" and t.seconds == pytest.approx(27_216 / 484e9)
    assert t.intensity == pytest.approx(conv1.flops / 27_216)
    # fc1: 65,480 + 200 B -> 65,680 / 484e9 = 135.7 ns
    assert ro.nodes[fc1.index].seconds == pytest.approx(65_680 / 484e9)
    assert ro.total_seconds == pytest.approx(sum(
        max(n.flops / 10.6e12, (n.bytes_read + n.bytes_written) / 484e9) for n in r.nodes))
    assert ro.top[0] == fc1.index  # the slowest node is fc1 (its weights dominate the bytes)


def test_resnet50_on_an_a100_is_bounded_below_by_its_convolutions():
    r = analyze("zoo:resnet50", batch=16, device="a100-40gb")
    ro = r.roofline
    # every MAC is 2 FLOPs at ≤ 19.5 TFLOP/s: 2 · 65,426,948,096 / 19.5e12 = 6.71 ms at least
    assert ro.total_seconds >= 2 * 65_426_948_096 / 19.5e12
    assert ro.compute_seconds + ro.memory_seconds == pytest.approx(ro.total_seconds)
    assert len(ro.top) == 10 and all(r.nodes[i].op == "Conv" for i in ro.top)
    tf = analyze("zoo:resnet50", batch=16, device="a100-40gb", tf32=True).roofline
    assert tf.total_seconds < ro.total_seconds / 2  # TF32 is 8× the fp32 rate for the convs
    # fits: the reserved replay, which holds the cuBLAS workspace (sm80: 4,096·2 + 16·8 KiB =
    # 8,519,680 B) from the classifier's matmul on and cuDNN's convolution workspaces, + the
    # measured context (726,466,560 B) ≤ 40 GiB (no usable figure known)
    tensors = r.totals.param_bytes + r.totals.buffer_bytes + r.memory.peak_bytes
    assert ro.tensor_bytes == tensors and ro.fit.fits
    assert [p.bytes for p in ro.fit.parts] == [r.memory.reserved_peak_bytes, 726_466_560]
    assert "workspaces" in ro.fit.parts[0].what
    assert ro.fit.needs == sum(p.bytes for p in ro.fit.parts)
    assert ro.fit.offers == 40 * 2**30 and ro.fit.margin == ro.fit.offers - ro.fit.needs


def test_half_precision_training_uses_the_tensor_core_rate_and_reports_fallbacks():
    r = analyze("zoo:small_cnn", batch=2, train=True, optimizer="sgd",
                precision="bf16-master", device="t4")
    dtypes = {t.dtype for t in r.roofline.nodes}
    assert "bf16" in dtypes and r.roofline.fallbacks == ("bf16",)
    assert r.roofline.tensor_bytes == r.training.peak_bytes


def test_device_spec_and_overhead_parsing():
    d = parse_device_spec("flops=19.5T, bandwidth=1555G, memory=40GiB, fp16=312T")
    assert (d.peak("fp32"), d.peak("fp16"), d.bandwidth, d.memory) == \
        (19.5e12, 312e12, 1555e9, 40 * 2**30)
    from graphcost.passes.device.fits import fit
    t4 = get_device("t4")
    assert fit(t4, 1000, overhead=parse_overhead("context=1GiB,allocator=5%")).needs == \
        1050 + 2**30
    assert fit(t4, 1000, overhead=parse_overhead("none")).needs == 1000
    # a key left out keeps the model's figure: the replay (here none: the estimate) and the
    # workspace and context
    assert fit(t4, 1000, overhead=parse_overhead("allocator=0%")).needs == \
        1000 + 8_519_680 + 726_466_560
    for bad in ("flops=1T,bandwidth=1G", "flops=fast,bandwidth=1G,memory=1GB",
                "flops=1T,bandwidth=1G,memory=four", "flops=1T,bandwidth=1G,memory=1G,x=2"):
        with pytest.raises(GraphcostError):
            parse_device_spec(bad)
    with pytest.raises(GraphcostError, match="allocator"):
        parse_overhead("allocator=lots")


@pytest.mark.parametrize("argv, message", [
    (["--device", "a300"], "unknown device 'a300'"),
    (["--device-spec", "flops=1T,bandwidth=1G,memory=four"], "memory 'four'"),
    (["--tf32"], "--tf32 goes with --device"),
    (["--device", "t4", "--device-spec", "flops=1T,bandwidth=1G,memory=1G"], "either"),
    (["--device", "t4", "--overhead", "context=big"], "context"),
])
def test_bad_device_options_give_one_line_and_exit_2(capsys, argv, message):
    assert main(["zoo:small_cnn", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    if "unknown device" in err:
        assert all(name in err for name in REQUIRED)  # lists the known ones


def test_cli_device_outputs(capsys):
    assert main(["zoo:mnist_net", "--device", "gtx1080ti", "--details"]) == 0
    out = capsys.readouterr().out
    assert "not a benchmark" in out and "slowest nodes" in out and "fits        yes" in out
    assert main(["zoo:mnist_net", "--device", "gtx1080ti", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["roofline"]["device"] == "gtx1080ti" and "roofline" in doc["convention"]
    assert len(doc["roofline"]["nodes"]) == len(doc["nodes"])
    assert main(["zoo:mnist_net", "--device", "gtx1080ti", "--format", "csv"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith("roofline_seconds,intensity,bound")
    assert main(["devices", "--format", "json"]) == 0
    assert set(REQUIRED) <= set(json.loads(capsys.readouterr().out))


def test_installed_command_device_and_max_batch():
    """The same through the installed `graphcost` a user runs (a subprocess)."""
    import os
    import shutil
    import subprocess

    exe = shutil.which("graphcost")
    if exe is None:
        pytest.skip("graphcost is not installed: run `pip install -e .` first")

    def run(*args):
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, COLUMNS="200"))
    p = run("zoo:mnist_net", "--device", "gtx1080ti", "--format", "json")
    assert p.returncode == 0, p.stderr
    ro = json.loads(p.stdout)["roofline"]
    # fc1 is the slowest node: (65,480 + 200) B / 484 GB/s (design notes' MemRead/MemWrite)
    assert ro["nodes"][ro["top"][0]]["seconds"] == pytest.approx(65_680 / 484e9)
    p = run("zoo:small_cnn", "--max-batch", "--device", "t4", "--format", "json")
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["kind"] == "max_batch" and doc["max_batch"] > 1000
    p = run("zoo:small_cnn", "--device", "tpu9")
    assert p.returncode == 2 and "known: gtx1080ti" in p.stderr and p.stdout == ""
    p = run("devices")
    assert p.returncode == 0 and "h100-sxm" in p.stdout and "RTX 4090" in p.stdout


def test_the_devices_table_writes_numbers_one_way():
    # issue 26: "1978.9" sat beside "3,350" — rates now take thousands separators too; at 80
    # columns the labels go whole rather than cut (NVIDI…80 Ti), the names say the part
    from tests.cli_runner import run_cli
    narrow = run_cli("devices", env={"COLUMNS": "80"}).stdout
    h100 = next(line for line in narrow.splitlines() if line.startswith("h100-sxm "))
    assert "1,978.9" in h100 and "3,350" in h100 and "…" not in narrow
    wide = run_cli("devices", env={"COLUMNS": "140"}).stdout
    assert "NVIDIA H100 SXM5 80GB" in wide
