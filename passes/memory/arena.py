"""Offset planning: the arena a static allocator needs for the activations.

Greedy by size (Pisarchyk & Lee, "Efficient Memory Management for Deep Neural Net Inference",
2020; TFLite's GreedyBySize planner): take tensors largest first and put each at the lowest
offset of the smallest gap that fits among already-placed tensors whose lifetimes overlap it.
The arena is never smaller than the peak of live bytes; fragmentation = arena / peak − 1.

Placed tensors are indexed by time buckets, so a tensor is compared only with tensors that
share a bucket with it instead of with all of them (near-linear on real graphs, where lifetimes
are short; long-lived tensors cost one entry per bucket they span).

Greedy by size is quadratic when thousands of tensors live at once (one Split with 40k
outputs: each new tensor is compared with every placed one). The comparisons are counted; past
a budget far above what real graphs use (WORK_PER_TENSOR per tensor), the remaining tensors are
STACKED instead: each goes on top of the highest tensor placed during its lifetime (a range-max
segment tree over time, O(log n) per tensor). The plan stays valid (no two live tensors share a
byte) and the result says how many tensors were stacked, since the arena is then an upper
bound of the greedy one. Real graphs never reach the budget, so their plan is the greedy one.
"""
from __future__ import annotations

from dataclasses import dataclass

from .liveness import Storage

BUCKET = 32  # nodes per time bucket
# Bucket entries visited per tensor (on average) before stacking: the zoo's ONNX exports visit
# 4 to 25 per tensor, the 100k-node benchmark graph 17.5; a Split with N outputs, N/2.
WORK_PER_TENSOR = 64
WORK_MIN_TENSORS = 4096  # small graphs get the budget of this many tensors


@dataclass(frozen=True)
class ArenaPlan:
    arena_bytes: int
    offsets: tuple[int, ...]   # aligned with the storages given
    stacked: int = 0           # tensors placed by stacking, not greedy by size (see above)
    work: int = 0              # bucket entries the greedy phase visited (bounded by the budget)


def plan_arena(storages: tuple[Storage, ...], alignment: int = 64) -> ArenaPlan:
    order = sorted((i for i, s in enumerate(storages) if s.nbytes > 0),
                   key=lambda i: (-storages[i].nbytes, storages[i].birth, i))
    offsets = [0] * len(storages)
    ends = [0] * len(storages)  # offset + aligned size of each placed tensor
    births = [s.birth for s in storages]
    deaths = [s.death for s in storages]
    buckets: dict[int, list[int]] = {}
    arena = 0
    budget = WORK_PER_TENSOR * max(WORK_MIN_TENSORS, len(order))
    work = 0

    for k, i in enumerate(order):
        size = -(-storages[i].nbytes // alignment) * alignment
        birth, death = births[i], deaths[i]
        b0, b1 = birth // BUCKET, death // BUCKET
        if b0 == b1:  # one bucket: no tensor met twice
            entries = buckets.get(b0, ())
            work += len(entries) + 1
            if work > budget:
                break
            busy = [(offsets[j], ends[j]) for j in entries
                    if births[j] <= death and birth <= deaths[j]]
        else:
            lists = [buckets[b] for b in range(b0, b1 + 1) if b in buckets]
            work += sum(map(len, lists)) + b1 - b0 + 1
            if work > budget:
                break
            seen: set[int] = set()
            busy = []
            for entries in lists:
                for j in entries:
                    if j not in seen:
                        seen.add(j)
                        if births[j] <= death and birth <= deaths[j]:
                            busy.append((offsets[j], ends[j]))
        busy.sort()
        best, best_gap, prev_end = -1, 0, 0
        for lo, hi in busy:
            gap = lo - prev_end
            if gap >= size and (best < 0 or gap < best_gap):
                best, best_gap = prev_end, gap
            if hi > prev_end:
                prev_end = hi
        if best < 0:
            best = prev_end
        end = best + size
        offsets[i] = best
        ends[i] = end
        if end > arena:
            arena = end
        for b in range(b0, b1 + 1):
            buckets.setdefault(b, []).append(i)
    else:
        return ArenaPlan(arena, tuple(offsets), 0, work)
    arena = _stack(storages, order, k, offsets, alignment, arena)
    return ArenaPlan(arena, tuple(offsets), len(order) - k, work)


def _stack(storages, order: list[int], start: int, offsets: list[int], alignment: int,
           arena: int) -> int:
    """Places order[start:] on top of whatever is placed during each one's lifetime."""
    top = _RangeMax(max(s.death for s in storages) + 1)
    for i in order[:start]:
        s = storages[i]
        top.raise_to(s.birth, s.death, offsets[i] + -(-s.nbytes // alignment) * alignment)
    for i in order[start:]:
        s = storages[i]
        size = -(-s.nbytes // alignment) * alignment
        off = top.max(s.birth, s.death)
        offsets[i] = off
        top.raise_to(s.birth, s.death, off + size)
        arena = max(arena, off + size)
    return arena


class _RangeMax:
    """Max over a range of time steps of values raised over ranges, O(log n) each (a
    bottom-up segment tree: ``tag`` = a raise covering the node's whole range, ``high`` = the
    highest value anywhere below)."""

    def __init__(self, n: int):
        self.size = size = 1 << max(1, (n - 1).bit_length())
        self.high = [0] * (2 * size)
        self.tag = [0] * (2 * size)

    def raise_to(self, lo: int, hi: int, value: int) -> None:
        high, tag, size = self.high, self.tag, self.size
        a, b = lo + size, hi + size + 1
        while a < b:
            if a & 1:
                high[a] = max(high[a], value)
                tag[a] = max(tag[a], value)
                a += 1
            if b & 1:
                b -= 1
                high[b] = max(high[b], value)
                tag[b] = max(tag[b], value)
            a >>= 1
            b >>= 1
        for k in (lo + size, hi + size):
            k >>= 1
            while k:
                high[k] = max(tag[k], high[2 * k], high[2 * k + 1])
                k >>= 1

    def max(self, lo: int, hi: int) -> int:
        high, tag, size = self.high, self.tag, self.size
        best = 0
        a, b = lo + size, hi + size + 1
        while a < b:
            if a & 1:
                best = max(best, high[a])
                a += 1
            if b & 1:
                b -= 1
                best = max(best, high[b])
            a >>= 1
            b >>= 1
        for k in (lo + size, hi + size):  # raises covering an ancestor's whole range
            k >>= 1
            while k:
                best = max(best, tag[k])
                k >>= 1
        return best
