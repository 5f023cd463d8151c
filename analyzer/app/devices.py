"""Accelerators for the roofline estimate: dense peak FLOP/s per dtype, memory bandwidth, size.

Figures are the vendors' datasheet peaks for dense math (no 2:4 sparsity), boost clocks; fp16 and
bf16 are tensor-core rates with fp32 accumulation where the datasheet gives both. ``None`` means
the device has no fast path for that dtype (the roofline then uses the fp32 rate and says so).
Memory sizes are the nominal sizes in GiB (a "40GB" A100 has 40 GiB). The GTX 1080 Ti uses
the design documents' 10.6 TFLOP/s. fp8 and fp4 rates (``DeviceRates.narrow_flops``, fp8 with
fp32 accumulation like fp16) are kept apart from the rates the roofline prices; a card's
``usable_memory`` is what a process is offered, below the nominal size, where it was measured.
A part sold in several forms is one row each, per GPU (B200 and GB200 from their 8- and
72-GPU systems' datasheets).
"""
from __future__ import annotations

import difflib
from types import MappingProxyType
from typing import Mapping

from ...passes.choices import OptimizerImpl
from ...passes.device.fits import Overhead  # noqa: F401  (the values)
from ...passes.device.profile import DeviceProfile
from ...passes.device.roofline import DTYPES  # noqa: F401
from ...passes.device_rates import DeviceRates
from ...passes.errors import GraphcostError, opt
from ...passes.parallel.comm import InterconnectRates
from ...passes.parallel.step_time import Links
from .units import parse_rate, parse_size

T, GB, GiB, MiB = 1e12, 1e9, 1 << 30, 1 << 20


def _dev(name, label, fp32, tf32, fp16, bf16, int8, bandwidth_gbs, memory_gib, *,
         fp8=None, fp4=None, usable_mib=None, sm=None, sms=None) -> DeviceRates:
    rates = {"fp32": fp32, "tf32": tf32, "fp16": fp16, "bf16": bf16, "int8": int8}
    narrow = {k: v * T for k, v in (("fp8", fp8), ("fp4", fp4)) if v}
    return DeviceRates(name, label, MappingProxyType({k: v * T if v else None
                                                      for k, v in rates.items()}),
                       bandwidth_gbs * GB, int(memory_gib * GiB), MappingProxyType(narrow),
                       usable_mib and int(usable_mib * MiB), sm, sm is None, sms)


# Datasheets give tensor-core rates "with sparsity" (2:4) first: the rows take the dense half.
# usable_mib: the memory a process is offered before its CUDA context, as PyTorch prints it
# (torch.cuda.get_device_properties(0).total_memory, "MB" = MiB; public run logs; a driver
# moves it by a few MiB); left out where no such print was found (then ``memory`` applies).
# The H100 SXM's and the H200's are measured: cudaMemGetInfo's total, 85,017,493,504 B on an
# H100 80GB HBM3 with driver 580.159.04 and CUDA 13.0 (benchmarks/results/cuda_h100_sxm.json),
# 150,109,880,320 B on an H200 (benchmarks/results/cuda_h200.json).
# sm: the CUDA compute capability (NVIDIA's table; which attention kernels PyTorch runs on it);
# the AMD parts have none. sms: its streaming multiprocessors (the architecture whitepapers'
# and datasheets' SM counts; the GB200's GPUs are B200s), which size the global buffers of
# PyTorch's CUDA reductions (passes/costs/cuda_reduce.py).
# name, label, TFLOP/s fp32, tf32, fp16, bf16, TOP/s int8, GB/s, GiB (+ fp8, fp4 TFLOP/s)
DEVICES: Mapping[str, DeviceRates] = MappingProxyType({d.name: d for d in (
    _dev("gtx1080ti", "NVIDIA GeForce GTX 1080 Ti", 10.6, None, None, None, 42.4, 484, 11,
         sm=(6, 1), sms=28),
    _dev("v100", "NVIDIA V100 SXM2 32GB", 15.7, None, 125, None, 62.8, 900, 32, sm=(7, 0), sms=80),
    _dev("t4", "NVIDIA T4", 8.1, None, 65, None, 130, 320, 16, sm=(7, 5), sms=40),
    _dev("a10", "NVIDIA A10", 31.2, 62.5, 125, 125, 250, 600, 24, sm=(8, 6), sms=72),
    # NVIDIA L4 datasheet: FP8 485 TFLOPS with sparsity
    _dev("l4", "NVIDIA L4", 30.3, 60, 121, 121, 242.5, 300, 24, fp8=242.5, sm=(8, 9), sms=58),
    _dev("a100-40gb", "NVIDIA A100 SXM4 40GB", 19.5, 156, 312, 312, 624, 1555, 40,
         sm=(8, 0), sms=108),
    _dev("a100-80gb", "NVIDIA A100 SXM4 80GB", 19.5, 156, 312, 312, 624, 2039, 80,
         sm=(8, 0), sms=108),
    # NVIDIA H100 Tensor Core GPU datasheet, SXM: FP8 3,958 TFLOPS with sparsity
    _dev("h100-sxm", "NVIDIA H100 SXM5 80GB", 67, 494.7, 989.4, 989.4, 1978.9, 3350, 80,
         fp8=1978.9, usable_mib=85_017_493_504 / MiB, sm=(9, 0), sms=132),  # measured, see above
    # same datasheet, PCIe: TF32 756, BF16/FP16 1,513, FP8/INT8 3,026 (sparse); 2 TB/s
    _dev("h100-pcie", "NVIDIA H100 PCIe 80GB", 51, 378, 756.5, 756.5, 1513, 2000, 80,
         fp8=1513, usable_mib=81008, sm=(9, 0), sms=114),
    # same datasheet, NVL (per GPU): TF32 835, BF16/FP16 1,671, FP8/INT8 3,341 (sparse); 94 GB
    # HBM3 at 3.9 TB/s
    _dev("h100-nvl", "NVIDIA H100 NVL 94GB", 60, 417.5, 835.5, 835.5, 1670.5, 3900, 94,
         fp8=1670.5, sm=(9, 0), sms=132),
    # torchtitan's benchmark machines (Meta's Grand Teton, benchmarks/llama3_h100_202412_
    # torchtitan.md): H100 SXM5 with 96 GB HBM2e at 2.4 TB/s, at a 500 W power limit. Its
    # rates here are the SXM5's datasheet ones, as torchtitan computes its MFU (the real clocks
    # at 500 W are lower and not published: "between SXM and NVL")
    _dev("h100-96gb", "NVIDIA H100 SXM5 96GB HBM2e (500 W)", 67, 494.7, 989.4, 989.4, 1978.9,
         2400, 96, fp8=1978.9, sm=(9, 0), sms=132),
    # NVIDIA H200 datasheet, SXM: the H100 SXM's GH100 at its clocks (TF32 989, BF16 1,979,
    # FP8/INT8 3,958 sparse), 141 GB HBM3e at 4.8 TB/s
    _dev("h200", "NVIDIA H200 SXM 141GB", 67, 494.7, 989.4, 989.4, 1978.9, 4800, 141,
         fp8=1978.9, usable_mib=150_109_880_320 / MiB, sm=(9, 0), sms=132),  # measured
    # NVIDIA HGX B200 datasheet, 8 GPUs: FP32 600 TFLOPS, TF32 18, FP16/BF16 36, FP8 and INT8
    # 72, FP4 144 PFLOPS (sparse); 1.44 TB HBM3e at 64 TB/s: per GPU, an eighth
    _dev("b200", "NVIDIA B200 (HGX, per GPU)", 75, 1125, 2250, 2250, 4500, 8000, 180,
         fp8=4500, fp4=9000, sm=(10, 0), sms=148),
    # NVIDIA GB200 NVL72 datasheet, 72 GPUs: FP32 5,760 TFLOPS, TF32 180, FP16/BF16 360, FP8
    # and INT8 720, FP4 1,440 PFLOPS (sparse); 13.4 TB HBM3e at 576 TB/s: per GPU, a 72nd
    _dev("gb200", "NVIDIA GB200 (NVL72, per GPU)", 80, 1250, 2500, 2500, 5000, 8000, 186,
         fp8=5000, fp4=10000, sm=(10, 0), sms=148),
    # AMD Instinct MI300X data sheet: FP32 163.4, TF32 653.7, FP16/BF16 1,307.4, FP8 and INT8
    # 2,614.9 (dense; sparse doubles them); 192 GB HBM3 at 5.3 TB/s
    _dev("mi300x", "AMD Instinct MI300X", 163.4, 653.7, 1307.4, 1307.4, 2614.9, 5300, 192,
         fp8=2614.9),
    # AMD Instinct MI325X data sheet: the MI300X's compute; 256 GB HBM3e at 6 TB/s
    _dev("mi325x", "AMD Instinct MI325X", 163.4, 653.7, 1307.4, 1307.4, 2614.9, 6000, 256,
         fp8=2614.9),
    # NVIDIA L40S datasheet: TF32 366, BF16/FP16 733, FP8/INT8 1,466 (sparse); 48 GB GDDR6,
    # 864 GB/s
    _dev("l40s", "NVIDIA L40S", 91.6, 183, 362.05, 362.05, 733, 864, 48, fp8=733,
         sm=(8, 9), sms=142),
    # NVIDIA RTX 6000 Ada datasheet (FP32 91.1, FP8 1,457 sparse; 48 GB, 960 GB/s) and the Ada
    # Lovelace architecture whitepaper's table (TF32 182.1, FP16/BF16 364.2 with FP32
    # accumulate, INT8 728.5 dense)
    _dev("rtx6000-ada", "NVIDIA RTX 6000 Ada", 91.1, 182.1, 364.2, 364.2, 728.5, 960, 48,
         fp8=728.5, sm=(8, 9), sms=142),
    _dev("rtx3090", "NVIDIA GeForce RTX 3090", 35.6, 35.6, 71, 71, 284, 936, 24, sm=(8, 6), sms=82),
    # Ada whitepaper: FP8 with FP32 accumulate 330.3 dense
    _dev("rtx4090", "NVIDIA GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2, 660.6, 1008, 24,
         fp8=330.3, usable_mib=24563, sm=(8, 9), sms=128),
    # NVIDIA RTX Blackwell GPU architecture whitepaper, RTX 5090 (dense, FP32 accumulate where
    # it differs, as for the 4090): FP32 104.8, TF32 104.8, FP16/BF16 209.5, FP8 419, INT8
    # 838, FP4 1,676 (3,352 "AI TOPS" sparse); 32 GB GDDR7 at 1,792 GB/s
    _dev("rtx5090", "NVIDIA GeForce RTX 5090", 104.8, 104.8, 209.5, 209.5, 838, 1792, 32,
         fp8=419, fp4=1676, sm=(12, 0), sms=170),
)})


# other names the devices go by (a bare "h100" is the SXM part, "a100" the 80 GB one)
ALIASES: Mapping[str, str] = MappingProxyType({
    "h100": "h100-sxm", "h100-80gb": "h100-sxm", "h100-sxm5": "h100-sxm", "a100": "a100-80gb",
    "h200-sxm": "h200", "rtx-6000-ada": "rtx6000-ada", "rtx6000ada": "rtx6000-ada",
    "rtx-5090": "rtx5090", "rtx-4090": "rtx4090", "rtx-3090": "rtx3090"})


def _link(name: str, label: str, gbs: float) -> InterconnectRates:
    return InterconnectRates(name, label, gbs * GB)


# The links between data-parallel ranks: bandwidth per GPU in each direction (a ring
# collective sends and receives at once, so one direction bounds it; NVLink's "900 GB/s" is
# both directions added). Datasheet peaks; NCCL's measured bus bandwidth stays below them.
INTERCONNECTS: Mapping[str, InterconnectRates] = MappingProxyType({i.name: i for i in (
    _link("nvlink4", "NVLink 4 (H100 SXM): 900 GB/s both ways, 450 GB/s each way", 450),
    _link("nvlink3", "NVLink 3 (A100 SXM): 600 GB/s both ways, 300 GB/s each way", 300),
    _link("nvlink5", "NVLink 5 (B200, GB200): 1.8 TB/s both ways, 900 GB/s each way", 900),
    _link("pcie5", "PCIe 5.0 x16: 64 GB/s each way", 64),
    _link("pcie4", "PCIe 4.0 x16: 32 GB/s each way", 32),
    _link("ib-ndr", "InfiniBand NDR, one 400 Gb/s NIC per GPU: 50 GB/s each way", 50),
    _link("ib-hdr", "InfiniBand HDR, one 200 Gb/s NIC per GPU: 25 GB/s each way", 25),
    _link("eth-100g", "100 Gb/s Ethernet per GPU: 12.5 GB/s each way", 12.5),
)})


# The link between the GPUs of one node, by device (the others' PCIe 5.0 or 4.0 by generation);
# between nodes one 400 Gb/s NIC per GPU unless --interconnect names another
NODE_LINKS: Mapping[str, str] = MappingProxyType({
    "a100-40gb": "nvlink3", "a100-80gb": "nvlink3", "h100-sxm": "nvlink4", "h100-96gb": "nvlink4",
    "h200": "nvlink4", "b200": "nvlink5", "gb200": "nvlink5"})
GPUS_PER_NODE = 8


def node_links(device: DeviceRates, interconnect: InterconnectRates | None,
               gpus_per_node: int = GPUS_PER_NODE) -> Links:
    """The links a rank's collectives cross on ``device``: its node's (NVLink where it has
    it) and the network's (``interconnect``, else InfiniBand NDR), ``gpus_per_node`` GPUs a
    node."""
    cc = device.capability
    intra = NODE_LINKS.get(device.name, "pcie5" if cc is None or cc >= (9, 0) else "pcie4")
    return Links(INTERCONNECTS[intra], interconnect or INTERCONNECTS["ib-ndr"], gpus_per_node)


def get_interconnect(name: str) -> InterconnectRates:
    key = name.strip().lower()
    if key in INTERCONNECTS:
        return INTERCONNECTS[key]
    close = difflib.get_close_matches(key, INTERCONNECTS, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise GraphcostError(f"{opt('parallel.interconnect', value=name)}: unknown{hint}; known: "
                         + ", ".join(INTERCONNECTS))


def default_optimizer_impl(device: DeviceRates | None) -> str:
    """The Adam implementation PyTorch picks on the target: ``foreach`` on a GPU, the
    for-loop on a CPU (no device named: graphcost verify's CPU)."""
    gpu = device is not None and device.name != "this-cpu"
    return OptimizerImpl.FOREACH if gpu else OptimizerImpl.FORLOOP


def get_device(name: str) -> DeviceRates:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in DEVICES:
        return DEVICES[key]
    # an alias close to the name is offered as the device it stands for
    close = difflib.get_close_matches(key, [*DEVICES, *ALIASES], n=6, cutoff=0.5)
    close = list(dict.fromkeys(ALIASES.get(c, c) for c in close))[:3]
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise GraphcostError(f"unknown device {name!r}{hint}; known: {', '.join(DEVICES)}; or "
                         f"describe one with {opt('device_spec')} flops=…,bandwidth=…,memory=…")


def parse_device_spec(text: str) -> DeviceRates:
    """``flops=19.5T,bandwidth=1555G,memory=40GiB`` (flops in FLOP/s and bandwidth in bytes/s
    take SI suffixes K/M/G/T/P; memory is a size like 40GiB, 4GB, 4e9). Optional per-dtype
    rates: ``fp16=312T`` etc.; ``flops`` is the fp32 rate."""
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not value.strip():
            raise GraphcostError(f"{opt('device_spec')}: expected KEY=VALUE, got {part!r}")
        fields[key.strip().lower()] = value.strip()
    allowed = {"flops", "bandwidth", "memory", "name", *DTYPES}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise GraphcostError(f"{opt('device_spec')}: unknown key(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(allowed))}")
    missing = [k for k in ("flops", "bandwidth", "memory") if k not in fields]
    if missing:
        raise GraphcostError(f"{opt('device_spec')} needs {', '.join(missing)} "
                             "(e.g. flops=19.5T,bandwidth=1555G,memory=40GiB)")
    rates = {d: parse_rate(fields[d], f"{opt('device_spec')} {d}") if d in fields else None
             for d in DTYPES}
    rates["fp32"] = parse_rate(fields["flops"], f"{opt('device_spec')} flops")
    return DeviceRates(fields.get("name", "custom"), f"custom ({text})", MappingProxyType(rates),
                  parse_rate(fields["bandwidth"], f"{opt('device_spec')} bandwidth"),
                  parse_size(fields["memory"], f"{opt('device_spec')} memory"))


def parse_overhead(text: str) -> Overhead:
    """``context=512MiB,allocator=10%`` (a key left out keeps the model's figure: the
    measured context and workspaces, the replayed allocator; ``none`` = no overhead)."""
    if text.strip().lower() == "none":
        return Overhead(0, 0.0)
    context, fraction = Overhead.context_bytes, Overhead.allocator_fraction
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (x.strip() for x in part.partition("="))
        key = key.lower()
        if not sep or key not in ("context", "allocator"):
            raise GraphcostError(f"{opt('overhead')}: expected context=SIZE or allocator=PERCENT, "
                                 f"got {part!r}")
        if key == "context":
            context = 0 if value in ("0", "0B") else parse_size(value, f"{opt('overhead')} context")
        else:
            try:
                fraction = float(value[:-1]) / 100 if value.endswith("%") else float(value)
            except ValueError:
                raise GraphcostError(f"{opt('overhead')} allocator={value}: expected a percentage "
                                     "such as 10%") from None
            if not 0 <= fraction < 10:
                raise GraphcostError(f"{opt('overhead')} allocator={value}: out of range")
    return Overhead(context, fraction)


PROFILE_MAX_BYTES = 1 << 20   # a profile is a few KiB: a larger file is not one


def read_profile(path: str) -> DeviceProfile:
    """The device profile in the JSON file ``path`` (``graphcost calibrate`` writes one),
    checked field by field; a GraphcostError naming the file otherwise."""
    import json
    import os

    from ...passes.device.profile import profile_from_json

    try:
        size = os.stat(path).st_size
        if size > PROFILE_MAX_BYTES:
            raise GraphcostError(f"{path}: {size:,} bytes is not a device profile (at most "
                                 f"{PROFILE_MAX_BYTES:,}; graphcost calibrate writes a few KiB)")
        with open(path, "rb") as f:
            data = json.loads(f.read(PROFILE_MAX_BYTES + 1))
    except OSError as exc:
        raise GraphcostError(f"{path}: cannot read the device profile ({exc.strerror})") from None
    except (ValueError, RecursionError):
        raise GraphcostError(f"{path}: not JSON (a device profile is the JSON file graphcost "
                             "calibrate writes)") from None
    try:
        return profile_from_json(data)
    except GraphcostError as exc:
        raise GraphcostError(f"{path}: {exc}") from None
