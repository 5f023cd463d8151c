"""What PyTorch's kernels achieve on a GPU nobody calibrated here: the datasheet's rates
(passes/device_rates.py) times the share of them each kind of kernel is known to reach, as an
``EngineProfile`` the time estimate (time_estimate.py) prices a graph with — the same pricing a
profile ``graphcost calibrate`` measured on a machine gets, so that one code path prices both.

The shares, and where each comes from (docs/time.md has the table):

- ``GEMM_SHARE`` and ``MEMORY_SHARE``: a large cuBLAS GEMM's share of the dense tensor-core
  peak, an elementwise kernel's of the HBM bandwidth. **Fitted**, together: the two constants
  that make the estimates of torchtitan's published Llama 3.1 8B run (FSDP over 8 H100s,
  benchmarks/llama3_h100_202412_torchtitan.md, Table 1) eager and under torch.compile match
  both (the two runs differ in their memory-bound kernels alone, which separates the two);
  every other published run (``PUBLISHED_RUNS``) checks them. They absorb what the model
  leaves out (the allocator, synchronisations, the 500 W limit of those H100s).
- ``ATTENTION_SHARE``: a fused attention kernel (FlashAttention, cuDNN's, the memory-efficient
  one: whichever PyTorch dispatches), forward and backward together. FlashAttention-2 reaches
  35% of an H100's peak (the FlashAttention-3 paper's abstract, Shah et al. 2024),
  FlashAttention-3 75% forward; one share between the two for every fused kernel: which one
  PyTorch picks changes with its release (cuDNN's first on sm90 from torch 2.9), and no
  published run separates them. Assumed, not fitted.
- ``KERNEL_S``: what every kernel costs on the GPU beyond its work (launch latency, the last
  wave's idle SMs): what makes small calls reach a small share. Assumed.
- ``HOST_S``: eager PyTorch's host time per op (Python, the dispatcher, the launch call). The
  GPU runs behind the host, so a step takes the longer of the two (``EngineProfile.host_s``).
  Assumed; ``COMPILED_HOST_S`` the same under torch.compile (its wrapper launches each
  generated or library kernel without per-op Python), assumed.
"""
from __future__ import annotations

from dataclasses import replace

from ..device_rates import DeviceRates
from .profile import Curve, EngineProfile, Run

GEMM_SHARE = 0.514
ATTENTION_SHARE = 0.50
MEMORY_SHARE = 0.607
KERNEL_S = 3e-6
HOST_S = 12e-6
COMPILED_HOST_S = 4e-6   # torch.compile's wrapper: a launch per kernel, no per-op Python

# Published runs the estimate is checked against (benchmarks/time_published.py runs each;
# tests/test_published_runs.py recomputes the 8B ones): the published step (seconds: tokens per
# GPU a step over the published tokens/s per GPU) and graphcost's estimate when the constants
# above were last set. Their errors give the band, never below ``MIN_BAND`` (a floor chosen:
# runs of two model families cannot bound every model's error; docs/time.md).
PUBLISHED_RUNS: tuple[Run, ...] = (
    # torchtitan, Llama 3.1 8B, local batch 2 × 8,192 tokens, op SAC, bf16 + fp32 reduce,
    # AdamW: 5,762 and 5,605 tokens/s per GPU eager, 6,667 and 6,514 with torch.compile
    # (benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3)
    Run("torchtitan 8B FSDP 8 eager (fitted)", 16384 / 5762, 2.8435),
    Run("torchtitan 8B FSDP 8 compile (fitted)", 16384 / 6667, 2.4571),
    Run("torchtitan 8B FSDP 128 eager", 16384 / 5605, 2.8200),
    Run("torchtitan 8B FSDP 128 compile", 16384 / 6514, 2.4341),
    # vanilla TP in bfloat16, torch.compile (asyncTP_llama3_h100_2025-06_torchtitan.md): 8B
    # FSDP 8 × TP 8, op SAC, local batch 12 (12 × 8,192 / 8 tokens a GPU): 4,378 tokens/s;
    # 70B FSDP 32 × TP 8, full AC, local batch 16: 597.3
    Run("torchtitan 8B FSDP 8 x TP 8 compile", 12288 / 4378, 2.9927),
    Run("torchtitan 70B FSDP 32 x TP 8 compile", 16384 / 597.3, 31.089),
    # the same two with async TP: 4,809.4 and 652.4 tokens/s
    Run("torchtitan 8B FSDP 8 x TP 8 compile async TP", 12288 / 4809.4, 2.2253),
    Run("torchtitan 70B FSDP 32 x TP 8 compile async TP", 16384 / 652.4, 26.05),
    # with float8 linears (--float8 tensorwise), torch.compile, op SAC: 8,532 and 8,380
    # tokens/s (Tables 1 and 3); full AC, local batch 1 of 32,768 tokens: 3,890 (Table 2)
    Run("torchtitan 8B FSDP 8 compile float8", 16384 / 8532, 16384 / 7631),
    Run("torchtitan 8B FSDP 128 compile float8", 16384 / 8380, 16384 / 7714),
    Run("torchtitan 8B FSDP 8 seq 32k compile float8 full AC", 32768 / 3890, 32768 / 3949),
    # float8 tensorwise beside tensor parallelism (torchao's float8 styles), torch.compile:
    # 70B FSDP 32 × TP 8, full AC, local batch 16: 829 and 876 tokens/s with async TP (Table
    # 4), 809.8 and 942.4 (the async-TP document); 8B FSDP 8 × TP 8, op SAC, local batch 12:
    # 5,078.1 and 5,570.1 (the async-TP document)
    Run("torchtitan 70B FSDP 32 x TP 8 compile float8", 16384 / 829, 23.472),
    Run("torchtitan 70B FSDP 32 x TP 8 compile float8 async TP", 16384 / 876, 19.251),
    Run("torchtitan 70B FSDP 32 x TP 8 compile float8 (async-TP doc)", 16384 / 809.8, 23.472),
    Run("torchtitan 70B FSDP 32 x TP 8 compile float8 async TP (async-TP doc)", 16384 / 942.4,
        19.251),
    Run("torchtitan 8B FSDP 8 x TP 8 compile float8", 12288 / 5078.1, 2.8343),
    Run("torchtitan 8B FSDP 8 x TP 8 compile float8 async TP", 12288 / 5570.1, 2.1897),
    # Megatron-LM's README model table (H100 SXM, DP 48, 4 sequences of 4,096 a data-
    # parallel rank): the step its per-GPU TFLOP/s give by its own FLOPs formula, against
    # the zoo decoder of that shape (benchmarks/time_published.py, MEGATRON)
    Run("Megatron-LM 1.7B TP 1", 0.452, 0.459),
    Run("Megatron-LM 7.1B TP 2", 0.800, 0.894),
    Run("Megatron-LM 16B TP 4", 0.850, 0.980),
    Run("Megatron-LM 32B TP 8", 0.892, 1.012),
)
MIN_BAND = 0.15
# Context parallelism's published runs (Table 2: FSDP × CP over 8 GPUs, float8, full AC, local
# batch 1, 32,768 tokens a GPU a step): a layout of its own band, since its ring attention at
# 131k and 262k tokens runs twice as long as estimated, the furthest any layout misses by
CONTEXT_PARALLEL_RUNS: tuple[Run, ...] = (
    Run("torchtitan 8B FSDP 4 x CP 2 seq 65k compile float8 full AC", 32768 / 2540,
        32768 / 2801),
    Run("torchtitan 8B FSDP 2 x CP 4 seq 131k compile float8 full AC", 32768 / 1071,
        32768 / 1814),
    Run("torchtitan 8B CP 8 seq 262k compile float8 full AC", 32768 / 548, 32768 / 1051),
)


# Pipelines' published runs (torchtitan's Table 5: Llama 3.1 405B, FSDP 8 × TP 8 × PP 8 over
# 512 H100s, float8 tensorwise, async TP, torch.compile, full AC, local batch 32 as 32
# micro-batches: 4,096 tokens a GPU a step): 100 tokens/s per GPU under 1F1B and 128 under
# interleaved 1F1B, which the estimate puts 32% and 20% faster — a layout of its own band
PIPELINE_RUNS: tuple[Run, ...] = (
    Run("torchtitan 405B FSDP 8 x TP 8 x PP 8 1F1B compile float8 async TP", 4096 / 100,
        27.997),
    Run("torchtitan 405B FSDP 8 x TP 8 x PP 8 interleaved 1F1B compile float8 async TP",
        4096 / 128, 25.602),
)


def datasheet_band(engine: EngineProfile) -> float:
    """The band a datasheet estimate carries: its published runs' (``EngineProfile.band``),
    at least ``MIN_BAND``."""
    return max(engine.band or 0.0, MIN_BAND)


def context_parallel_band(engine: EngineProfile) -> tuple[float, int]:
    """(the band a context-parallel step's datasheet estimate carries, the runs it comes
    from): its own published runs', at least the datasheet band."""
    return _own_band(engine, CONTEXT_PARALLEL_RUNS)


def pipeline_band(engine: EngineProfile) -> tuple[float, int]:
    """(the band a pipeline's step estimate carries, the runs it comes from): the published
    pipelines', at least ``engine``'s band (a GPU profile's or the datasheet's)."""
    return _own_band(engine, PIPELINE_RUNS)


def _own_band(engine: EngineProfile, runs: tuple[Run, ...]) -> tuple[float, int]:
    own = replace(engine, validation=runs)
    return max(own.band or 0.0, datasheet_band(engine)), len(runs)


def datasheet_engine(device: DeviceRates, *, compiled: bool = False) -> EngineProfile:
    """PyTorch on ``device`` at the shares above, eager or (``compiled``) torch.compile's
    kernels."""
    gemm = {dt: Curve(((1.0, GEMM_SHARE * rate),))
            for dt, rate in (*device.peak_flops.items(), *device.narrow_flops.items()) if rate}
    attn = {dt: Curve(((1.0, ATTENTION_SHARE * rate),))
            for dt, rate in device.peak_flops.items() if rate}
    memory = Curve(((1.0, MEMORY_SHARE * device.bandwidth),))   # (one rate at every size)
    return EngineProfile(launch_s=KERNEL_S, view_s=0.0, arithmetic={"gemm": gemm,
                                                                   "attention": attn},
                         memory=memory, validation=PUBLISHED_RUNS,
                         host_s=COMPILED_HOST_S if compiled else HOST_S)
