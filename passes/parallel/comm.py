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

from dataclasses import dataclass, field, replace
from typing import Mapping


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
    # wire bytes by mesh dimension (passes/parallel/mesh.py): which group's link carries them
    by_dim: Mapping[str, int] = field(default_factory=dict)
    calls_by_dim: Mapping[str, int] = field(default_factory=dict)   # collective calls, the same
    all_to_all_bytes: int = 0     # tokens exchanged (expert parallelism: what a rank sends)


def comm_volume(world: int, all_gather: int, reduce_scatter: int, all_reduce: int,
                collectives: int, link: InterconnectRates | None,
                dim: str = "dp_shard") -> CommVolume:
    """The collectives of one group of ``world`` ranks, the mesh dimension ``dim``."""
    frac = (world - 1) / world if world > 1 else 0.0
    wire = round(frac * (all_gather + reduce_scatter + 2 * all_reduce))
    return CommVolume(all_gather, reduce_scatter, all_reduce, wire,
                      collectives if world > 1 else 0, link.name if link else None,
                      link.bandwidth if link else None,
                      wire / link.bandwidth if link else None, {dim: wire} if wire else {},
                      {dim: collectives} if wire else {})


def with_dimension(comm: CommVolume, dim: str, wire: int, calls: int, *, all_gather: int = 0,
                   reduce_scatter: int = 0, all_reduce: int = 0,
                   all_to_all: int = 0) -> CommVolume:
    """``comm`` with another mesh dimension's collectives: their volumes, ``wire`` bytes
    over the rank's link (the bound on the same link) and ``calls``."""
    total = comm.wire_bytes + wire
    return replace(comm, all_gather_bytes=comm.all_gather_bytes + all_gather,
                   reduce_scatter_bytes=comm.reduce_scatter_bytes + reduce_scatter,
                   all_reduce_bytes=comm.all_reduce_bytes + all_reduce,
                   all_to_all_bytes=comm.all_to_all_bytes + all_to_all, wire_bytes=total, collectives=comm.collectives + calls,
                   seconds=total / comm.bandwidth if comm.bandwidth else None,
                   by_dim={**comm.by_dim, dim: wire},
                   calls_by_dim={**comm.calls_by_dim, dim: calls})


def across_replicas(comm: CommVolume, replicas: int, shard_grad_bytes: int,
                    calls: int) -> CommVolume:
    """HSDP: after each reduce-scatter in its shard group a rank all-reduces the gradient
    shard that came out (in place, FSDP2's ``foreach_reduce``) with the same shard of the
    other ``replicas`` − 1 groups, over dp_replicate. The bound puts it on the same link (the
    groups usually span nodes, where the link is slower: give that link's interconnect)."""
    if replicas <= 1:
        return comm
    wire = round(2 * (replicas - 1) / replicas * shard_grad_bytes)
    return with_dimension(comm, "dp_replicate", wire, calls, all_reduce=shard_grad_bytes)


def summed(comms: list[CommVolume]) -> CommVolume:
    """One rank's collectives of several programs (an interleaved pipeline's stages), a step:
    their volumes, wire bytes and calls added, by mesh dimension too."""
    def total(name: str) -> int:
        return sum(getattr(c, name) for c in comms)
    by_dim: dict[str, int] = {}
    calls: dict[str, int] = {}
    for c in comms:
        for d, w in c.by_dim.items():
            by_dim[d] = by_dim.get(d, 0) + w
        for d, n in c.calls_by_dim.items():
            calls[d] = calls.get(d, 0) + n
    wire, first = total("wire_bytes"), comms[0]
    return replace(first, all_gather_bytes=total("all_gather_bytes"),
                   reduce_scatter_bytes=total("reduce_scatter_bytes"),
                   all_reduce_bytes=total("all_reduce_bytes"),
                   all_to_all_bytes=total("all_to_all_bytes"), wire_bytes=wire,
                   collectives=total("collectives"),
                   seconds=wire / first.bandwidth if first.bandwidth else None,
                   by_dim=by_dim, calls_by_dim=calls)
