"""The one "fits" answer (passes/device/fits.py): what a run needs on a GPU against what the device
offers, by hand arithmetic, and the same answer in every section that asks; then graphcost
against the steps measured on a GPU (benchmarks/results/cuda_h200.json, written by
benchmarks/accuracy_cuda.py on an H200 with PyTorch 2.11: the figures CUDA reported)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from graphcost.analyzer.app.devices import get_device, parse_overhead
from graphcost.passes.device.fits import CONTEXT_BYTES, cublas_workspace_bytes, fit

from graphcost import analyze
from tests.cli_runner import run_cli

MiB = 1 << 20
MEASURED = {r["case"]: r for r in json.loads(
    (Path(__file__).resolve().parent.parent / "benchmarks/results/cuda_h200.json").read_text())
    if "case" in r}


def test_cublas_workspaces_are_pytorchs_defaults():
    # CublasHandlePool.cpp parseChosenWorkspaceSize: ":4096:8" = 4,096 KiB × 8 = 32 MiB on
    # sm90 / sm100 / sm120, else ":4096:2:16:8" = (4,096·2 + 16·8) KiB = 8,519,680 B; ROCm
    # 32 MiB, 128 MiB on gfx94x/gfx95x (MI300X)
    assert cublas_workspace_bytes(get_device("h100-sxm")) == 32 * MiB
    assert cublas_workspace_bytes(get_device("rtx5090")) == 32 * MiB
    assert cublas_workspace_bytes(get_device("a100-80gb")) == 8_519_680
    assert cublas_workspace_bytes(get_device("mi300x")) == 128 * MiB


def test_needs_adds_the_parts_and_offers_what_the_driver_gives():
    h100 = get_device("h100-sxm")
    # a training step whose allocator replay reserves 10 GiB: 10 GiB + 2 workspaces of 32 MiB
    # + the measured context 726,466,560 B = 10,737,418,240 + 67,108,864 + 726,466,560
    f = fit(h100, 9 << 30, reserved_bytes=10 << 30, threads=2)
    assert [p.bytes for p in f.parts] == [10 << 30, 64 * MiB, CONTEXT_BYTES]
    assert f.needs == 11_530_993_664
    # the H100 80GB offers cudaMemGetInfo's total, measured: 85,017,493,504 B
    assert (f.offers, f.fits, f.margin) == (85_017_493_504, True, 85_017_493_504 - f.needs)
    # room for tensors at the replay's ratio (10/9): (offers − 64 MiB − context) · 0.9
    assert f.tensor_room == int((85_017_493_504 - 67_108_864 - CONTEXT_BYTES) / (10 / 9))
    # not replayed (a serving batch): the tensors × 1.1, said to be an estimate
    e = fit(h100, 1000, threads=1)
    assert e.parts[0].bytes == 1100 and "estimate" in e.parts[0].source
    assert e.needs == 1100 + 32 * MiB + CONTEXT_BYTES
    # a device with no measured figure offers its nominal size
    assert fit(get_device("t4"), 0).offers == 16 << 30


def test_overhead_replaces_the_model_part_by_part():
    a100 = get_device("a100-80gb")
    # allocator=5% replaces the replay: 1,000 · 1.05; the context keeps the model's parts
    f = fit(a100, 1000, reserved_bytes=4096, overhead=parse_overhead("allocator=5%"))
    assert f.needs == 1050 + 8_519_680 + CONTEXT_BYTES
    # context=1GiB replaces the workspaces and the context; the replay stays
    f = fit(a100, 1000, reserved_bytes=4096, overhead=parse_overhead("context=1GiB"))
    assert f.needs == 4096 + (1 << 30)
    assert fit(a100, 1000, reserved_bytes=4096, overhead=parse_overhead("none")).needs == 1000


def test_every_section_gives_the_same_answer():
    # --serve used to print two "needs" (the serving batch's and the prefill graph's); now the
    # roofline's fit is the serving batch's, and the text has one fits line
    r = analyze("zoo:llama_tiny", serve={"prompt": 64, "generate": 16}, device="a100-80gb")
    assert r.serving.fit == r.roofline.fit
    done = run_cli("zoo:llama_tiny", "--serve", "--prompt", "64", "--generate", "16",
                   "--device", "a100-80gb", env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("needs ") == 1 and "fits        yes: needs" in done.stdout
    # a training step: its fit is on the two-step reserved replay, which holds the two cuBLAS
    # workspaces (the forward's thread and autograd's): no part beside it
    t = analyze("zoo:mlp", train=True, device="a100-80gb", what_if=False)
    assert t.roofline.fit.parts[0].bytes == t.training.reserved_peak_bytes
    assert not any(p.what.startswith("cuBLAS") for p in t.roofline.fit.parts)


def _within(predicted: int, case: str, key: str, tol: float) -> None:
    measured = MEASURED[case][key]
    assert abs(predicted / measured - 1) <= tol, (case, key, predicted, measured)


def test_gpt2_inference_on_a_gpu_as_cuda_measured_it():
    # GPT-2 124M (transformers, SDPA), batch 8 × 1,024 tokens, fp32 inference on an H200:
    # max_memory_allocated 2,205,214,720 B, max_memory_reserved 2,841,640,960 B, the process
    # 3,552,575,488 B (NVML); the efficient kernel ran
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_positions=1024, use_cache=False,
                                  attn_implementation="sdpa")
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(cfg)
    r = analyze(model, (torch.empty(8, 1024, dtype=torch.long, device="meta"),),
                device="h100-sxm")  # sm90 like the H200: the same kernels and workspaces
    case = "gpt2-124M-infer-b8-s1024"
    ws = 32 * MiB  # one cuBLAS workspace, allocated by the first matmul and kept
    assert [u.kernel for u in r.attention] == ["efficient"]
    _within(r.peak_bytes + ws, case, "allocated", 0.01)
    # the replay holds the workspace where the first matmul allocates it (no part beside it)
    assert not any(p.what.startswith("cuBLAS") for p in r.roofline.fit.parts)
    _within(r.memory.reserved_peak_bytes, case, "reserved", 0.01)
    _within(r.roofline.fit.needs, case, "process", 0.01)


def test_a_small_training_step_counts_its_two_workspaces():
    # zoo llama_tiny, AdamW, batch 8 on an H200: 89,074,688 B allocated at the second step's
    # peak, of which 2 × 32 MiB are cuBLAS workspaces (the forward's thread and autograd's);
    # the tensors alone were 76% under. The reserved replay holds both, each from its thread's
    # first matmul: 111,149,056 B, what CUDA reserved
    # (loss="sum": the recorded step backpropagated the sum of the outputs)
    r = analyze("zoo:llama_tiny", batch=8, train=True, optimizer="adamw", device="h100-sxm",
                what_if=False, loss="sum")
    case = "llama_tiny-train-b8-adamw"
    _within(r.peak_bytes + 64 * MiB, case, "allocated", 0.02)
    assert r.training.reserved_peak_bytes == MEASURED[case]["reserved"] == 111_149_056


def test_nccl_buffers_are_a_labelled_estimate_per_rank():
    from graphcost.passes.device.fits import nccl_part
    # NCCL 2.22+: 12 MiB per channel (LL 512 KiB + LL128 4.6875 MiB + Simple 4 MiB received,
    # in 2 MiB IPC allocations: 10 MiB, + 2 MiB sent); 24 channels in one node of 8 GPUs;
    # NVLink SHARP on an H100 SXM: 16 × 2 × 128 KiB × 8 steps × 8 heads = 256 MiB.
    # 8 ranks on H100 SXM: 24 × 12 + 256 = 544 MiB; on A100s (no NVLS) 288 MiB; across nodes
    # 16 ring + 16 tree channels: 32 × 12 = 384 MiB; one rank: no communicator's buffers
    h100, a100 = get_device("h100-sxm"), get_device("a100-80gb")
    part = nccl_part(h100, 8)
    assert part is not None and part.bytes == 544 * MiB and "estimate" in part.source
    assert nccl_part(a100, 8).bytes == 288 * MiB
    assert nccl_part(a100, 16).bytes == 384 * MiB
    assert nccl_part(h100, 1) is None
    # in the one fits answer of a data-parallel run, beside the rank's replayed reserved peak
    r = analyze("zoo:mlp", batch=2, train=True, optimizer="adam", device="h100-sxm",
                parallel={"strategy": "fsdp", "world_size": 8})
    parts = {p.what.split(" (")[0]: p.bytes for p in r.roofline.fit.parts}
    assert parts["NCCL buffers"] == 544 * MiB
    assert parts["reserved by PyTorch's caching allocator"] == r.parallel.reserved_peak_bytes
    assert r.roofline.fit.needs == sum(parts.values())


def test_a_rank_over_the_device_by_its_cache_alone_fits_flushing_it():
    """Where the two steps' unlimited replay reserves more than the device leaves the
    allocator but the tensors fit, PyTorch's allocator frees its cached segments and retries
    the cudaMalloc (``release_cached_blocks``; num_alloc_retries) and the step runs: the fit
    is the replay held to the device, and says so. (What graphcost gave a Qwen3-30B-A3B-shaped
    mixture at seq 4,096 on 8 H100s, FSDP 8, full AC: 93.7 GiB reserved unlimited, 71.1 GiB
    of tensors; held to the device, 77.5 GiB after one flush in two steps. Not measured.)"""
    h100 = get_device("h100-sxm")
    have = h100.usable_memory or h100.memory_bytes
    kw = dict(batch=8, train=True, optimizer="adam", device="h100-sxm", what_if=False,
              parallel={"mesh": "dp_shard=2"})
    free = analyze("zoo:llama_tiny", **kw)
    p = free.parallel
    assert p.flushing is None and free.roofline.fit.fits and not free.roofline.fit.flushes
    # what the device leaves the allocator: 2 MiB under the unlimited reserved peak (the
    # context given as the rest, so that no NCCL part is added beside it)
    capacity = p.reserved_peak_bytes - 2 * MiB
    held = analyze("zoo:llama_tiny", overhead=f"context={have - capacity}", **kw)
    _fits_held(held.roofline.fit, held.parallel.flushing, p.per_rank_peak_bytes, capacity)
    from graphcost.analyzer.render.html import html_report
    assert "fits, flushing the allocator's cache, on" in html_report(held)
    assert "(the cache held under it)" in html_report(held)
    out = run_cli("zoo:llama_tiny", "--batch", "8", "--train", "--optimizer", "adam",
                  "--device", "h100-sxm", "--parallel", "dp_shard=2", "--overhead",
                  f"context={have - capacity}")
    assert "yes, flushing the allocator's cache" in out.stdout, out.stdout
    assert "(the cache held under it)" in out.stdout and "to spare" not in out.stdout
    # 16 MiB under it the ranks' tensors and workspaces no longer fit once the cache is
    # emptied either: out of memory, judged by the unlimited replay
    short = analyze("zoo:llama_tiny", overhead=f"context={have - capacity + 16 * MiB}", **kw)
    assert short.parallel.flushing is None and not short.roofline.fit.fits


def test_a_training_step_over_the_device_by_its_cache_alone_fits_flushing_it():
    """The same on one device: ResNet-18's step at batch 32 on an H100 (graphcost's replay:
    1.17 GiB reserved over two steps, 832 MiB of tensors at its peak); with 90% of what the
    unlimited replay reserves left to the allocator, the replay held to it empties the cache
    and runs on."""
    h100 = get_device("h100-sxm")
    have = h100.usable_memory or h100.memory_bytes
    kw = dict(batch=32, train=True, optimizer="adam", device="h100-sxm", what_if=False)
    t = analyze("zoo:resnet18", **kw).training
    assert t.flushing is None
    capacity = int(0.9 * t.reserved_peak_bytes)
    r = analyze("zoo:resnet18", overhead=f"context={have - capacity}", **kw)
    _fits_held(r.roofline.fit, r.training.flushing, t.peak_bytes, capacity)


def _fits_held(f, flushing, tensors: int, capacity: int) -> None:
    """``f`` fits on the replay held to ``capacity`` (``flushing``), the rest of the device
    given as the context."""
    assert flushing is not None and flushing.retries >= 1
    # at most the capacity; at least the tensors' peak and the two matmul threads' cuBLAS
    # workspaces the replay keeps (32 MiB each on sm90)
    assert tensors + 2 * 32 * MiB <= flushing.reserved_bytes <= capacity
    assert f.fits and f.flushes == flushing.retries
    assert f.needs == flushing.reserved_bytes + (f.offers - capacity)
    assert "emptying its cache" in f.parts[0].what
