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

The time: the same runs made 5,762 and 5,605 tokens/s per GPU, steps of 2 × 8,192 tokens in
2.843 s and 2.923 s, on H100s with 96 GB of HBM2e at 2.4 TB/s and a 500 W limit (device
``h100-96gb``). graphcost's datasheet estimate (passes/device/gpu_engine.py: its one fitted
constant, GEMM_SHARE, was set on the 8-GPU run) must hold both within ±15%, and the band it
states must cover what they miss by.
"""
from __future__ import annotations

import pytest
from graphcost.passes.device.gpu_engine import PUBLISHED_RUNS

from graphcost import analyze

GiB = 2 ** 30
PUBLISHED = {8: 82.4, 128: 67.0}   # GiB, max reserved per GPU
TOKENS_PER_S = {8: 5762, 128: 5605}   # per GPU
TOKENS = 2 * 8192                     # a rank's step


@pytest.fixture(scope="module")
def reports():
    out = {}
    for ranks in PUBLISHED:
        r = analyze("zoo:llama3_8b", batch=2, dims={"seq": 8192}, train=True,
                    optimizer="adamw", precision="bf16-master", checkpoint={"sac": True},
                    device="h100-96gb", what_if=False, parallel={"mesh": f"dp_shard={ranks}"})
        assert r.parallel is not None and r.parallel.world_size == ranks
        out[ranks] = r
    return out


@pytest.fixture(scope="module")
def reserved(reports):
    return {n: r.parallel.reserved_peak_bytes / GiB for n, r in reports.items()}


@pytest.mark.parametrize("ranks", list(PUBLISHED))
def test_torchtitan_llama31_8b_fsdp_reserved_memory(reserved, ranks):
    assert abs(reserved[ranks] / PUBLISHED[ranks] - 1) <= 0.05, reserved


def test_what_more_ranks_save_is_the_sharded_state(reserved):
    saved = reserved[8] - reserved[128]
    assert abs(saved / (PUBLISHED[8] - PUBLISHED[128]) - 1) <= 0.05, saved


@pytest.mark.parametrize("ranks", list(TOKENS_PER_S))
def test_torchtitan_llama31_8b_fsdp_step_time(reports, ranks):
    t = reports[ranks].time
    published = TOKENS / TOKENS_PER_S[ranks]
    assert t is not None and t.basis == "datasheet"
    assert abs(t.seconds / published - 1) <= 0.15, (t.seconds, published)
    assert t.band is not None and abs(t.seconds / published - 1) <= t.band
    # the throughput is the step's tokens over its time: 2 × 8,192 tokens a rank
    assert t.tokens_per_second == pytest.approx(TOKENS / t.seconds)
    # torchtitan reports 33% MFU for its eager 8B runs against the SXM's 989 TFLOP/s (its
    # FLOPs: 6 × parameters + the attention's 12·l·h·q·t a token); graphcost's within 5 points
    assert abs(t.mfu - 0.33) <= 0.05, t.mfu


def test_the_band_comes_from_these_runs(reports):
    """The estimates the band was computed from are today's (a constant changed without
    re-running them would leave the band stale)."""
    stored = {run.model.split(" FSDP ")[1].split()[0]: run for run in PUBLISHED_RUNS}
    for ranks, r in reports.items():
        run = stored[str(ranks)]
        assert run.measured_s == pytest.approx(TOKENS / TOKENS_PER_S[ranks])
        assert r.time.seconds == pytest.approx(run.estimated_s, rel=0.01)


def test_a_rank_step_is_its_kernels_and_its_exposed_collectives(reports):
    for r in reports.values():
        t = r.time
        work = max(t.arithmetic_seconds + t.memory_seconds + t.launch_seconds, t.host_seconds)
        assert t.seconds == pytest.approx(work + t.optimizer_seconds + t.recompute_seconds
                                          + t.communication_seconds)
    # over 128 ranks FSDP's traffic crosses InfiniBand (50 GB/s a GPU) instead of NVLink:
    # more of it is hidden under the compute, and more is exposed
    t8, t128 = reports[8].time, reports[128].time
    assert t128.overlapped_seconds > 5 * t8.overlapped_seconds
    assert t128.communication_seconds > t8.communication_seconds
