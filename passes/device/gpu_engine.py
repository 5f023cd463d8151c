"""What eager PyTorch's kernels achieve on a GPU nobody calibrated here: the datasheet's rates
(passes/device_rates.py) times the share of them each kind of kernel is known to reach, as an
``EngineProfile`` the time estimate (time_estimate.py) prices a graph with — the same pricing a
profile ``graphcost calibrate`` measured on a machine gets, so that one code path prices both.

The shares, and where each comes from (docs/time.md has the table):

- ``GEMM_SHARE``: a large cuBLAS GEMM's share of the dense tensor-core peak. **Fitted**: the
  one constant chosen so that the estimate of torchtitan's published eager Llama 3.1 8B run
  (FSDP over 8 H100s, benchmarks/llama3_h100_202412_torchtitan.md, Table 1) matches it; every
  other published run (``PUBLISHED_RUNS``) checks it.
- ``ATTENTION_SHARE``: the fused attention kernel PyTorch dispatches, fwd and bwd together.
  FlashAttention-2 reaches 35% of an H100's peak (the FlashAttention-3 paper's abstract, Shah
  et al. 2024); FlashAttention-3 75% forward; cuDNN's fused attention, which PyTorch prefers on
  sm90, is taken between the two (its backward is slower than its forward); the memory-
  efficient kernel below FlashAttention-2. Assumed, not fitted.
- ``MEMORY_SHARE``: an elementwise kernel's share of the HBM bandwidth on a large call.
  Assumed (copy kernels reach 85–90% of HBM3's datasheet rate).
- ``KERNEL_S``: what every kernel costs on the GPU beyond its work (launch latency, the last
  wave's idle SMs): what makes small calls reach a small share. Assumed.
- ``HOST_S``: eager PyTorch's host time per op (Python, the dispatcher, the launch call). The
  GPU runs behind the host, so a step takes the longer of the two (``EngineProfile.host_s``).
  Assumed.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from ..device_rates import DeviceRates
from .profile import Curve, EngineProfile, Run

GEMM_SHARE = 0.465
ATTENTION_SHARE: Mapping[str, float] = MappingProxyType(
    {"flash": 0.35, "cudnn": 0.50, "efficient": 0.25})
MEMORY_SHARE = 0.80
KERNEL_S = 3e-6
HOST_S = 12e-6
MEMORY_SIZES = (4096.0, 1 << 30)   # bytes per call: the curve's two ends (flat between)

# Published runs the estimate is checked against (tests/test_published_time.py recomputes
# each and checks it against the published figure): the published step (seconds: tokens per
# GPU a step over the published tokens/s per GPU) and graphcost's estimate when the constants
# above were last set. Their errors give the band, never below ``MIN_BAND``: two runs of one
# model cannot bound another model's error (a floor chosen, docs/time.md).
PUBLISHED_RUNS: tuple[Run, ...] = (
    # torchtitan, Llama 3.1 8B, local batch 2 × 8,192 tokens, op SAC, bf16 + fp32 reduce,
    # AdamW, no torch.compile: 5,762 and 5,605 tokens/s per GPU (Tables 1 and 3)
    Run("torchtitan Llama 3.1 8B FSDP 8 (h100-96gb)", 16384 / 5762, 2.839),
    Run("torchtitan Llama 3.1 8B FSDP 128 (h100-96gb)", 16384 / 5605, 2.828),
)
MIN_BAND = 0.15


def datasheet_band(engine: EngineProfile) -> float:
    """The band a datasheet estimate carries: its published runs' (``EngineProfile.band``),
    at least ``MIN_BAND``."""
    return max(engine.band or 0.0, MIN_BAND)


def datasheet_engine(device: DeviceRates, attention: str | None = None) -> EngineProfile:
    """Eager PyTorch on ``device`` at the shares above; ``attention``: the fused attention
    kernel PyTorch dispatches there (passes/graph/attention_dispatch.py), None: FlashAttention-2's."""
    gemm = {dt: Curve(((1.0, GEMM_SHARE * rate),)) for dt, rate in device.peak_flops.items()
            if rate}
    share = ATTENTION_SHARE.get(attention or "flash", ATTENTION_SHARE["flash"])
    attn = {dt: Curve(((1.0, share * rate),)) for dt, rate in device.peak_flops.items() if rate}
    memory = Curve(tuple((size, MEMORY_SHARE * device.bandwidth) for size in MEMORY_SIZES))
    return EngineProfile(launch_s=KERNEL_S, view_s=0.0, arithmetic={"gemm": gemm,
                                                                   "attention": attn},
                         memory=memory, validation=PUBLISHED_RUNS, host_s=HOST_S)
