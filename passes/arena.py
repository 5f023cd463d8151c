"""Offset planning: the arena a static allocator needs for the activations.

Greedy by size (Pisarchyk & Lee, "Efficient Memory Management for Deep Neural Net Inference",
2020; TFLite's GreedyBySize planner): take tensors largest first and put each at the lowest
offset of the smallest gap that fits among already-placed tensors whose lifetimes overlap it.
The arena is never smaller than the peak of live bytes; fragmentation = arena / peak − 1.

Placed tensors are indexed by time buckets, so a tensor is compared only with tensors that
share a bucket with it instead of with all of them (near-linear on real graphs, where lifetimes
are short; long-lived tensors cost one entry per bucket they span).
"""
from __future__ import annotations

from dataclasses import dataclass

from graphcost.passes.liveness import Storage

BUCKET = 32  # nodes per time bucket


@dataclass(frozen=True)
class ArenaPlan:
    arena_bytes: int
    offsets: tuple[int, ...]   # aligned with the storages given


def plan_arena(storages: tuple[Storage, ...], alignment: int = 64) -> ArenaPlan:
    order = sorted((i for i, s in enumerate(storages) if s.nbytes > 0),
                   key=lambda i: (-storages[i].nbytes, storages[i].birth, i))
    offsets = [0] * len(storages)
    buckets: dict[int, list[int]] = {}
    arena = 0
    for i in order:
        s = storages[i]
        size = -(-s.nbytes // alignment) * alignment
        b0, b1 = s.birth // BUCKET, s.death // BUCKET
        seen: set[int] = set()
        busy: list[tuple[int, int]] = []
        for b in range(b0, b1 + 1):
            for j in buckets.get(b, ()):
                if j in seen:
                    continue
                seen.add(j)
                t = storages[j]
                if t.birth <= s.death and s.birth <= t.death:
                    off = offsets[j]
                    busy.append((off, off + -(-t.nbytes // alignment) * alignment))
        busy.sort()
        best, best_gap, prev_end = -1, 0, 0
        for off, end in busy:
            gap = off - prev_end
            if gap >= size and (best < 0 or gap < best_gap):
                best, best_gap = prev_end, gap
            if end > prev_end:
                prev_end = end
        if best < 0:
            best = prev_end
        offsets[i] = best
        if best + size > arena:
            arena = best + size
        for b in range(b0, b1 + 1):
            buckets.setdefault(b, []).append(i)
    return ArenaPlan(arena, tuple(offsets))
