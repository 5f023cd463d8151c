"""A device as every pass reads it: its peak rates, bandwidth, memory and what it can run.

The device table and its parsing live in analyzer/app/devices.py; the roofline
(passes/device/roofline.py) prices nodes with these rates, and the op catalogue (costs/) asks
a device which kernels and workspaces it runs. It sits at the root of passes/ because both
read it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class DeviceRates:
    name: str
    label: str
    peak_flops: Mapping[str, float | None]   # FLOP/s (int8: OP/s) for each of DTYPES
    bandwidth: float                          # bytes/s
    memory: int                               # bytes
    # fp8 and fp4 dense FLOP/s where the part has them: beside peak_flops, which the roofline
    # prices and the report copies, so that neither changes
    narrow_flops: Mapping[str, float] = field(default_factory=dict)
    usable_memory: int | None = None   # bytes the driver offers a process (None: not known)
    # an NVIDIA part's CUDA compute capability (which attention kernels it runs); None: not
    # known (a --device-spec) or not NVIDIA (``rocm``)
    capability: tuple[int, int] | None = None
    rocm: bool = False                        # an AMD part (PyTorch's ROCm build)
    sms: int | None = None                    # streaming multiprocessors (None: not known)

    @property
    def is_gpu(self) -> bool:
        """An NVIDIA or AMD GPU of the table (a --device-spec is not known to be one)."""
        return self.capability is not None or self.rocm

    def own_rate(self, dtype: str) -> float | None:
        """The device's rate for ``dtype`` itself (fp8 and fp4: ``narrow_flops``'); None where
        it has no fast path for it."""
        return self.peak_flops.get(dtype) or self.narrow_flops.get(dtype)

    def peak(self, dtype: str) -> float:
        """The rate for ``dtype`` (``own_rate``), falling back to fp32 where the device has no
        fast path."""
        rate = self.own_rate(dtype) or self.peak_flops["fp32"]
        assert rate is not None  # every device has an fp32 rate (a --device spec must give one)
        return rate
