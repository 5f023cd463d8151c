"""graphcost against the memory and the time torchtitan publishes for its own runs (docs/performance.md
of pytorch/torchtitan, "Table 1" and "Table 3": Llama 3.1 8B, FSDP2 over 8 and over 128 H100s,
local batch 2, sequence 8,192, selective (op) activation checkpointing, bf16 parameters with
fp32 gradient reduction, AdamW, no torch.compile): the peak memory torchtitan logs is the CUDA
caching allocator's max reserved, 82.4 GiB and 67.0 GiB.

graphcost's reserved peak for those settings (zoo:llama3_8b, the 8B shape in the
torchtitan-style decoder; docs/large-models.md), when this landed: 81.69 GiB (−0.9%) and
66.92 GiB (−0.1%). Their difference, what sharding over 128 ranks instead of 8 saves (fp32
parameters, gradients and AdamW state: 16 B a parameter × (1/8 − 1/128)), is 14.8 GiB against
15.4 published.

The time: the same runs made 5,762 and 5,605 tokens/s per GPU eager, 6,667 and 6,514 under
torch.compile: steps of 2 × 8,192 tokens in 2.843 s, 2.923 s, 2.457 s and 2.515 s, on H100s with
96 GB of HBM2e at 2.4 TB/s and a 500 W limit (device ``h100-96gb``). graphcost's datasheet
estimate (passes/device/gpu_engine.py: its two fitted constants were set on the two 8-GPU
runs) must hold them within ±15%, and the band it states must cover what they miss by.
benchmarks/time_published.py adds the compiled 128-GPU run, the float8, context-parallel and
tensor-parallel runs torchtitan publishes and Megatron-LM's model table.
"""
from __future__ import annotations

import pytest
from graphcost.passes.device.gpu_engine import PUBLISHED_RUNS

from graphcost import analyze

GiB = 2 ** 30
PUBLISHED = {8: 82.4, 128: 67.0}   # GiB, max reserved per GPU
# (ranks, torch.compile) -> tokens/s per GPU (the compiled run over 128 GPUs, 6,514, is in
# benchmarks/time_published.py: one analysis fewer here)
TOKENS_PER_S = {(8, False): 5762, (128, False): 5605, (8, True): 6667}
TOKENS = 2 * 8192                     # a rank's step


def _analyze(ranks: int, compile: bool):  # noqa: A002
    r = analyze("zoo:llama3_8b", batch=2, dims={"seq": 8192}, train=True,
                optimizer="adamw", precision="bf16-master", checkpoint={"sac": True},
                device="h100-96gb", what_if=False, parallel={"mesh": f"dp_shard={ranks}"},
                compile=compile)
    assert r.parallel is not None and r.parallel.world_size == ranks
    return r


@pytest.fixture(scope="module")
def reports():
    return {key: _analyze(*key) for key in TOKENS_PER_S}


@pytest.fixture(scope="module")
def reserved(reports):
    return {n: reports[n, False].parallel.reserved_peak_bytes / GiB for n in PUBLISHED}


@pytest.mark.parametrize("ranks", list(PUBLISHED))
def test_torchtitan_llama31_8b_fsdp_reserved_memory(reserved, ranks):
    assert abs(reserved[ranks] / PUBLISHED[ranks] - 1) <= 0.05, reserved


def test_what_more_ranks_save_is_the_sharded_state(reserved):
    saved = reserved[8] - reserved[128]
    assert abs(saved / (PUBLISHED[8] - PUBLISHED[128]) - 1) <= 0.05, saved


@pytest.mark.parametrize("key", list(TOKENS_PER_S))
def test_torchtitan_llama31_8b_fsdp_step_time(reports, key):
    t = reports[key].time
    published = TOKENS / TOKENS_PER_S[key]
    assert t is not None and t.basis == "datasheet"
    assert abs(t.seconds / published - 1) <= 0.15, (t.seconds, published)
    assert t.band is not None and abs(t.seconds / published - 1) <= t.band
    # the throughput is the step's tokens over its time: 2 × 8,192 tokens a rank
    assert t.tokens_per_second == pytest.approx(TOKENS / t.seconds)
    # torchtitan reports 33% to 39% MFU for these runs (eager, compiled) against the SXM's
    # 989 TFLOP/s (its FLOPs: 6 × parameters + the attention's 12·l·h·q·t a token)
    assert 0.33 - 0.03 <= t.mfu <= 0.39 + 0.03, t.mfu


def test_the_band_comes_from_these_runs(reports):
    """The estimates the band was computed from are today's (a constant changed without
    re-running them would leave the band stale)."""
    stored = {run.model: run for run in PUBLISHED_RUNS}
    for (ranks, compiled), r in reports.items():
        run = next(v for k, v in stored.items() if k.startswith(
            f"torchtitan 8B FSDP {ranks} {'compile' if compiled else 'eager'}"))
        assert run.measured_s == pytest.approx(TOKENS / TOKENS_PER_S[ranks, compiled])
        assert r.time.seconds == pytest.approx(run.estimated_s, rel=0.01)


def test_a_rank_step_is_its_kernels_and_its_exposed_collectives(reports):
    for r in (reports[8, False], reports[128, False]):
        t = r.time
        work = max(t.arithmetic_seconds + t.memory_seconds + t.launch_seconds, t.host_seconds)
        assert t.seconds == pytest.approx(work + t.optimizer_seconds + t.recompute_seconds
                                          + t.communication_seconds)
    # over 128 ranks FSDP's traffic crosses InfiniBand (50 GB/s a GPU) instead of NVLink:
    # more of it is hidden under the compute, and more is exposed
    t8, t128 = reports[8, False].time, reports[128, False].time
    assert t128.overlapped_seconds > 5 * t8.overlapped_seconds
    assert t128.communication_seconds > t8.communication_seconds


def test_compile_fuses_the_memory_bound_kernels_and_leaves_the_matmuls(reports):
    eager, compiled = reports[8, False].time, reports[8, True].time
    assert compiled.engine == "torch.compile" and eager.engine == "torch"
    assert compiled.arithmetic_seconds == pytest.approx(eager.arithmetic_seconds)
    assert compiled.memory_seconds < 0.5 * eager.memory_seconds
    assert compiled.kernels < 0.3 * eager.kernels
