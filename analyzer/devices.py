"""Accelerators for the roofline estimate: dense peak FLOP/s per dtype, memory bandwidth, size.

Figures are the vendors' datasheet peaks for dense math (no 2:4 sparsity), boost clocks; fp16 and
bf16 are tensor-core rates with fp32 accumulation where the datasheet gives both. ``None`` means
the device has no fast path for that dtype (the roofline then uses the fp32 rate and says so).
Memory sizes are the nominal sizes in GiB (a "40GB" A100 has 40 GiB). The GTX 1080 Ti uses
the design documents' 10.6 TFLOP/s.
"""
from __future__ import annotations

import difflib
from types import MappingProxyType
from typing import Mapping

from graphcost.analyzer.errors import GraphcostError
from graphcost.analyzer.units import parse_rate, parse_size
from graphcost.passes.comm import InterconnectRates
from graphcost.passes.roofline import DTYPES, DeviceRates, Overhead  # noqa: F401  (the values)

T, GB, GiB = 1e12, 1e9, 1 << 30


def _dev(name, label, fp32, tf32, fp16, bf16, int8, bandwidth_gbs, memory_gib) -> DeviceRates:
    rates = {"fp32": fp32, "tf32": tf32, "fp16": fp16, "bf16": bf16, "int8": int8}
    return DeviceRates(name, label, MappingProxyType({k: v * T if v else None
                                                 for k, v in rates.items()}),
                  bandwidth_gbs * GB, int(memory_gib * GiB))


# name, label, TFLOP/s fp32, tf32, fp16, bf16, TOP/s int8, GB/s, GiB
DEVICES: Mapping[str, DeviceRates] = MappingProxyType({d.name: d for d in (
    _dev("gtx1080ti", "NVIDIA GeForce GTX 1080 Ti", 10.6, None, None, None, 42.4, 484, 11),
    _dev("v100", "NVIDIA V100 SXM2 32GB", 15.7, None, 125, None, 62.8, 900, 32),
    _dev("t4", "NVIDIA T4", 8.1, None, 65, None, 130, 320, 16),
    _dev("a10", "NVIDIA A10", 31.2, 62.5, 125, 125, 250, 600, 24),
    _dev("l4", "NVIDIA L4", 30.3, 60, 121, 121, 242.5, 300, 24),
    _dev("a100-40gb", "NVIDIA A100 SXM4 40GB", 19.5, 156, 312, 312, 624, 1555, 40),
    _dev("a100-80gb", "NVIDIA A100 SXM4 80GB", 19.5, 156, 312, 312, 624, 2039, 80),
    _dev("h100-sxm", "NVIDIA H100 SXM5 80GB", 67, 494.7, 989.4, 989.4, 1978.9, 3350, 80),
    _dev("rtx3090", "NVIDIA GeForce RTX 3090", 35.6, 35.6, 71, 71, 284, 936, 24),
    _dev("rtx4090", "NVIDIA GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2, 660.6, 1008, 24),
)})


# other names the devices go by
ALIASES: Mapping[str, str] = MappingProxyType({"h100-80gb": "h100-sxm"})


def _link(name: str, label: str, gbs: float) -> InterconnectRates:
    return InterconnectRates(name, label, gbs * GB)


# The links between data-parallel ranks: bandwidth per GPU in each direction (a ring
# collective sends and receives at once, so one direction bounds it; NVLink's "900 GB/s" is
# both directions added). Datasheet peaks; NCCL's measured bus bandwidth stays below them.
INTERCONNECTS: Mapping[str, InterconnectRates] = MappingProxyType({i.name: i for i in (
    _link("nvlink4", "NVLink 4 (H100 SXM): 900 GB/s both ways, 450 GB/s each way", 450),
    _link("nvlink3", "NVLink 3 (A100 SXM): 600 GB/s both ways, 300 GB/s each way", 300),
    _link("pcie5", "PCIe 5.0 x16: 64 GB/s each way", 64),
    _link("pcie4", "PCIe 4.0 x16: 32 GB/s each way", 32),
    _link("ib-ndr", "InfiniBand NDR, one 400 Gb/s NIC per GPU: 50 GB/s each way", 50),
    _link("ib-hdr", "InfiniBand HDR, one 200 Gb/s NIC per GPU: 25 GB/s each way", 25),
    _link("eth-100g", "100 Gb/s Ethernet per GPU: 12.5 GB/s each way", 12.5),
)})


def get_interconnect(name: str) -> InterconnectRates:
    key = name.strip().lower()
    if key in INTERCONNECTS:
        return INTERCONNECTS[key]
    close = difflib.get_close_matches(key, INTERCONNECTS, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise GraphcostError(f"--interconnect {name}: unknown{hint}; known: "
                         + ", ".join(INTERCONNECTS))


def default_optimizer_impl(device: DeviceRates | None) -> str:
    """The Adam implementation PyTorch picks on the target: ``foreach`` on a GPU, the
    for-loop on a CPU (no device named: graphcost verify's CPU)."""
    return "foreach" if device is not None and device.name != "this-cpu" else "forloop"


def get_device(name: str) -> DeviceRates:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in DEVICES:
        return DEVICES[key]
    close = difflib.get_close_matches(key, DEVICES, n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise GraphcostError(f"unknown device {name!r}{hint}; known: {', '.join(DEVICES)}; or "
                         "describe one with --device-spec flops=…,bandwidth=…,memory=…")


def parse_device_spec(text: str) -> DeviceRates:
    """``flops=19.5T,bandwidth=1555G,memory=40GiB`` (flops in FLOP/s and bandwidth in bytes/s
    take SI suffixes K/M/G/T/P; memory is a size like 40GiB, 4GB, 4e9). Optional per-dtype
    rates: ``fp16=312T`` etc.; ``flops`` is the fp32 rate."""
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not value.strip():
            raise GraphcostError(f"--device-spec: expected KEY=VALUE, got {part!r}")
        fields[key.strip().lower()] = value.strip()
    allowed = {"flops", "bandwidth", "memory", "name", *DTYPES}
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise GraphcostError(f"--device-spec: unknown key(s) {', '.join(unknown)}; "
                             f"known: {', '.join(sorted(allowed))}")
    missing = [k for k in ("flops", "bandwidth", "memory") if k not in fields]
    if missing:
        raise GraphcostError(f"--device-spec needs {', '.join(missing)} "
                             "(e.g. flops=19.5T,bandwidth=1555G,memory=40GiB)")
    rates = {d: parse_rate(fields[d], f"--device-spec {d}") if d in fields else None
             for d in DTYPES}
    rates["fp32"] = parse_rate(fields["flops"], "--device-spec flops")
    return DeviceRates(fields.get("name", "custom"), f"custom ({text})", MappingProxyType(rates),
                  parse_rate(fields["bandwidth"], "--device-spec bandwidth"),
                  parse_size(fields["memory"], "--device-spec memory"))


def parse_overhead(text: str) -> Overhead:
    """``context=512MiB,allocator=10%`` (either key may be left out; ``none`` = no overhead)."""
    if text.strip().lower() == "none":
        return Overhead(0, 0.0)
    context, fraction = Overhead.context_bytes, Overhead.allocator_fraction
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (x.strip() for x in part.partition("="))
        key = key.lower()
        if not sep or key not in ("context", "allocator"):
            raise GraphcostError(f"--overhead: expected context=SIZE or allocator=PERCENT, "
                                 f"got {part!r}")
        if key == "context":
            context = 0 if value in ("0", "0B") else parse_size(value, "--overhead context")
        else:
            try:
                fraction = float(value[:-1]) / 100 if value.endswith("%") else float(value)
            except ValueError:
                raise GraphcostError(f"--overhead allocator={value}: expected a percentage "
                                     "such as 10%") from None
            if not 0 <= fraction < 10:
                raise GraphcostError(f"--overhead allocator={value}: out of range")
    return Overhead(context, fraction)
