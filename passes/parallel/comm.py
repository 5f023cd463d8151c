"""Communication of one data-parallel training step, per rank, and a lower bound on its time.

Volumes are the collectives' buffer sizes per step (what NCCL's tests call the algorithm
bytes): an all-gather's output, a reduce-scatter's input, an all-reduce's buffer. With the ring
algorithms each rank sends (and receives) (N−1)/N of an all-gather's or reduce-scatter's
buffer and 2·(N−1)/N of an all-reduce's — the "wire" bytes. On a link of B bytes/s each way no
schedule moves them faster than wire / B: the lower bound, as the roofline is for compute (no
latency, no contention, every byte at the link's peak).

The interconnect is an ``InterconnectRates`` value (the table lives in analyzer/app/devices.py).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InterconnectRates:
    name: str
    label: str
    bandwidth: float          # bytes/s per rank, each direction


@dataclass(frozen=True)
class CommVolume:
    """The report's ``parallel.comm``: bytes per step and per rank."""
    all_gather_bytes: int         # parameters gathered (FSDP/ZeRO-2/3), ZeRO-1's broadcasts
    reduce_scatter_bytes: int     # gradients reduce-scattered (ZeRO-2/3, FSDP)
    all_reduce_bytes: int         # gradients all-reduced (DDP, ZeRO-1)
    wire_bytes: int               # what crosses this rank's link each way (ring algorithms)
    collectives: int              # collective calls per step
    interconnect: str | None
    bandwidth: float | None       # bytes/s each way
    seconds: float | None         # wire_bytes / bandwidth: a lower bound


def comm_volume(world: int, all_gather: int, reduce_scatter: int, all_reduce: int,
                collectives: int, link: InterconnectRates | None) -> CommVolume:
    frac = (world - 1) / world if world > 1 else 0.0
    wire = round(frac * (all_gather + reduce_scatter + 2 * all_reduce))
    return CommVolume(all_gather, reduce_scatter, all_reduce, wire,
                      collectives if world > 1 else 0, link.name if link else None,
                      link.bandwidth if link else None,
                      wire / link.bandwidth if link else None)
