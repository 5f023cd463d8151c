"""PyTorch's CUDA caching allocator, replayed: what ``torch.cuda.max_memory_reserved()`` (what
runs out) and ``max_memory_allocated()`` would say for a sequence of allocations and frees.

The rules are DeviceCachingAllocator's in pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp
(read at commit 001074d2; each function below names the one it models):

- a request is rounded up to a multiple of 512 B (``round_size``); requests ≤ 1 MiB come from
  the small pool, larger ones from the large pool (``get_pool``);
- a free block is reused best-fit: the smallest that fits, then the lowest address (the pool's
  ``std::set`` ordered by size, then address; ``get_free_block``'s ``lower_bound``);
- with no block free, a new segment is reserved (``alloc_block``): 2 MiB for the small pool,
  20 MiB for large requests under 10 MiB, else the request rounded up to 2 MiB
  (``get_allocation_size``);
- the block handed out is split when the remainder is ≥ 512 B (small pool, or expandable
  segments) or > 1 MiB (large pool, and only for requests under ``max_split_size``;
  ``should_split``); an unsplit block counts whole in the allocated bytes;
- a freed block merges with free neighbours of its segment (``free_block``, ``try_merge_blocks``);
  segments stay reserved (no ``empty_cache()``);
- ``max_split_size_mb``: a request under it never takes a free block at or over it, and one at
  or over it takes a free block only if less than 20 MiB larger (``get_free_block``; kLargeBuffer
  there, ``max_non_split_rounding_mb`` in newer releases, default 20 MiB);
- ``expandable_segments:True``: one segment per pool whose mapped part grows in pages of 2 MiB
  (small) or 20 MiB (large) at its end (``find_expandable_block``, ``map_block``,
  ``try_allocate_expandable_block``); the free block at that end is taken last, since it can
  grow (``get_free_block``'s ``expandable_size``);
- with a ``capacity``, a segment that does not fit first frees cached oversize segments
  (``release_available_cached_blocks``), then every cached whole segment, and retries
  (``release_cached_blocks``, counted as a retry) before an OutOfMemoryError.

- streams: a block serves only requests on the stream it was allocated on (the pools order
  blocks by stream first and ``get_free_block`` takes none of another stream), so each stream
  has its own small and large pools and (expandable) segments: ``Alloc.stream``.

Left out: ``record_stream`` delays (a block is reused as soon as it is freed), CUDA-graph
private pools, ``roundup_power2_divisions``, ``garbage_collection_threshold``,
``large_segment_size_mb``, and the unmapping of free pages that expandable segments do before an
OutOfMemoryError (there a mapping over the capacity is out of memory at once). Segments are laid
out in creation order: addresses only break ties between free blocks of equal size.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import final

K_MIN_BLOCK_SIZE = 512        # kMinBlockSize: "all sizes are rounded to at least 512 bytes"
K_SMALL_SIZE = 1 << 20        # kSmallSize: "largest 'small' allocation is 1 MiB"
K_SMALL_BUFFER = 2 << 20      # kSmallBuffer: "'small' allocations are packed in 2 MiB blocks"
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: "between 1 and 10 MiB may use kLargeBuffer"
K_LARGE_BUFFER = 20 << 20     # kLargeBuffer: "'large' allocations may be packed in 20 MiB blocks"
K_ROUND_LARGE = 2 << 20       # kRoundLarge: "round up large allocations to 2 MiB"
_UNLIMITED = 1 << 64          # max_split_size unset: SIZE_MAX in CUDAAllocatorConfig


@dataclass(frozen=True)
class AllocatorConfig:
    """The settings of ``PYTORCH_CUDA_ALLOC_CONF`` the replay models: ``expandable_segments``
    and ``max_split_size_mb`` (as bytes; None: unset). The default is PyTorch's."""
    expandable: bool = False
    max_split_size: int | None = None

    @property
    def words(self) -> str:
        """The settings as PYTORCH_CUDA_ALLOC_CONF spells them ("" for the default)."""
        parts = (["expandable_segments:True"] if self.expandable else []) + \
            ([f"max_split_size_mb:{self.max_split_size >> 20}"]
             if self.max_split_size is not None else [])
        return ",".join(parts)


@final  # final, so that `type(ev) is Alloc` narrows the else branch to Free for the checker
@dataclass(frozen=True, slots=True)
class Alloc:
    """A tensor's storage is allocated: ``size`` bytes as requested (before rounding)."""
    id: Hashable
    size: int
    step: int = -1    # the caller's clock (a node index); results name the step of a peak
    stream: int = 0   # the stream it is allocated on (0: the default stream)


@final
@dataclass(frozen=True, slots=True)
class Free:
    id: Hashable
    step: int = -1


Event = Alloc | Free


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    pool: str         # "small" | "large"
    size: int         # bytes reserved (an expandable segment: its mapped pages)
    expandable: bool


@dataclass(frozen=True)
class AllocatorResult:
    requested_peak: int      # requested bytes live at once: the liveness peak, no rounding
    allocated_peak: int      # max_memory_allocated(): blocks handed out, rounded and unsplit
    reserved_peak: int       # max_memory_reserved(): segments (mapped pages) held
    reserved_peak_step: int  # the step of the event that first reached it (-1: none did)
    allocated_end: int
    reserved_end: int
    segments: tuple[SegmentInfo, ...]  # held at the end, in creation order
    device_allocs: int       # cudaMalloc calls (expandable: page mappings); num_device_alloc
    alloc_retries: int       # cached segments freed to retry a cudaMalloc; num_alloc_retries
    oom_event: int | None    # index of the event PyTorch would fail (the replay stops there)
    expandable: bool
    max_split_size: int | None
    reserved_timeline: tuple[int, ...] = ()   # after each event (``timeline=True``)
    allocated_timeline: tuple[int, ...] = ()
    # per window of events (``window_ends``): (reserved at its end, the most allocated in it)
    windows: tuple[tuple[int, int], ...] = ()

    @property
    def fragmentation(self) -> float:
        """reserved peak / requested peak − 1: what rounding, segment sizes and cached free
        blocks add (0 for an empty replay)."""
        return round(self.reserved_peak / self.requested_peak - 1.0, 6) \
            if self.requested_peak else 0.0


class ReplayBelowPeak(RuntimeError):
    """A replay reserved less than the run's own tensor peak: some allocation of the run is
    missing from its events. Impossible on a real allocator (it reserves every byte it hands
    out), so a bug of graphcost's, raised rather than reported as an optimistic fit."""


def covering(reserved: int, peak: int, what: str) -> int:
    """``reserved``, checked to cover ``peak`` (the same run's tensors, counted without the
    allocator): reserved ≥ allocated is an invariant of every replay (ReplayBelowPeak)."""
    if reserved < peak:
        raise ReplayBelowPeak(f"{what}: the caching-allocator replay reserved {reserved:,} B, "
                              f"below the peak of the tensors it replays ({peak:,} B)")
    return reserved


def round_size(size: int) -> int:
    """``round_size`` without roundup_power2_divisions: up to a multiple of kMinBlockSize (so
    at least 512 B for any request of one byte or more)."""
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment reserved for a (rounded) request no block serves."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


class _Block:
    """One block of a segment (``struct Block``): neighbours by address, for merging."""
    __slots__ = ("addr", "size", "prev", "next", "allocated", "requested")

    def __init__(self, addr: int, size: int):
        self.addr, self.size, self.allocated, self.requested = addr, size, False, 0
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _Pool:
    """A ``BlockPool``: its free blocks as (size, address, block), sorted: ``lower_bound`` is a
    bisection. ``last``/``end``: an expandable segment's last mapped block and mapped end."""
    __slots__ = ("name", "small", "free", "page", "last", "base", "end")

    def __init__(self, small: bool, base: int):
        self.name = "small" if small else "large"
        self.small = small
        self.free: list[tuple] = []
        # find_expandable_block: "segment_size = pool->is_small ? kSmallBuffer : kLargeBuffer"
        self.page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        self.last: _Block | None = None
        self.base = self.end = base

    def take(self, b: _Block) -> None:
        del self.free[bisect_left(self.free, (b.size, b.addr))]

    def put(self, b: _Block) -> None:
        insort(self.free, (b.size, b.addr, b))


class _Allocator:
    """``DeviceCachingAllocator`` for one device and one stream, with ``torch.cuda`` stats."""

    def __init__(self, expandable: bool, max_split_size: int | None, rounding: int,
                 capacity: int | None):
        self.expandable = expandable
        self.mss = _UNLIMITED if max_split_size is None else max_split_size
        self.rounding = rounding
        self.capacity = capacity
        self.pools: dict[tuple[int, bool], _Pool] = {}   # (stream, small) -> its pool
        self.next_addr = 1 << 40      # cudaMalloc'd segments, laid out in creation order
        self.segments: dict[int, tuple[_Pool, int]] = {}  # base address -> (pool, size)
        self.reserved = self.allocated = self.requested = 0
        self.device_allocs = self.retries = 0
        self.live: dict[Hashable, tuple[_Pool, _Block] | None] = {}
        self.peaks, self.peak_step = (0, 0, 0), -1   # requested, allocated, reserved

    def pool(self, stream: int, small: bool) -> _Pool:
        """The stream's small or large pool (an expandable segment's address space each)."""
        pool = self.pools.get((stream, small))
        if pool is None:
            pool = self.pools[stream, small] = _Pool(small, (len(self.pools) + 1) << 56)
        return pool

    def malloc(self, orig: int, stream: int = 0) -> tuple[_Pool, _Block] | None:
        """``malloc``: None when PyTorch would raise OutOfMemoryError."""
        size = round_size(orig)
        pool = self.pool(stream, size <= K_SMALL_SIZE)
        block = self._free_block(pool, size)
        if block is None:
            block = self._expand(pool, size) if self.expandable else self._segment(pool, size)
            if block is None:
                return None
        self._hand_out(pool, block, size, orig)
        return pool, block

    def _free_block(self, pool: _Pool, size: int) -> _Block | None:
        """``get_free_block``: best fit, within the max_split_size rules."""
        free = pool.free
        i = bisect_left(free, (size, -1))
        if i == len(free):
            return None
        # expandable: the block at the mapped end counts as its size plus the unmapped rest
        # of the address space, so any other block that fits is taken first
        if free[i][2] is pool.last and i + 1 < len(free):
            i += 1
        found = free[i][0]
        if size < self.mss <= found:     # "Do not return an oversized block for a large request"
            return None
        if size >= self.mss and found >= size + self.rounding:  # "rounded up but within a limit"
            return None
        return free.pop(i)[2]

    def _segment(self, pool: _Pool, size: int) -> _Block | None:
        """``alloc_block`` with its two retries in ``malloc``; None: out of memory."""
        alloc = allocation_size(size)
        if not self._fits(alloc) and not (self._release_oversize(pool, size)
                                          and self._fits(alloc)):
            self._release_cached()    # the last try: a retry in torch.cuda.memory_stats()
            self.retries += 1
            if not self._fits(alloc):
                return None
        block = _Block(self.next_addr, alloc)
        self.next_addr += alloc
        self.segments[block.addr] = (pool, alloc)
        self.reserved += alloc
        self.device_allocs += 1
        return block

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _release_oversize(self, pool: _Pool, size: int) -> bool:
        """``release_available_cached_blocks``: with max_split_size set, free the smallest
        cached oversize segment that covers the request, else the largest ones until they do."""
        if self.mss == _UNLIMITED:
            return False
        key = max(size, self.mss)
        free = pool.free
        i = bisect_left(free, (key, -1))
        if i < len(free):
            return self._release(pool, free[i][2])
        total = 0
        for size_, _, block in reversed(free[:]):
            if total >= key or size_ < self.mss:
                break
            if self._release(pool, block):
                total += size_
        return total >= key

    def _release(self, pool: _Pool, block: _Block) -> bool:
        """``release_block``: cudaFree a cached whole segment."""
        if block.prev is not None or block.next is not None:
            return False       # part of a segment in use: never released
        pool.take(block)
        del self.segments[block.addr]
        self.reserved -= block.size
        return True

    def _release_cached(self) -> None:
        """``release_cached_blocks``: every cached whole segment, large pools first."""
        for pool in sorted(self.pools.values(), key=lambda p: p.small):
            for _, _, block in pool.free[:]:
                self._release(pool, block)

    def _expand(self, pool: _Pool, size: int) -> _Block | None:
        """``try_allocate_expandable_block``: take (and grow) the free block at the mapped end,
        or map a new block there; pages are mapped whole (``ExpandableSegment::map``)."""
        last = pool.last
        grow = last if last is not None and not last.allocated else None  # the free end block
        need = size - grow.size if grow is not None else size
        if grow is not None and need <= 0:
            pool.take(grow)
            return grow
        mapped = -(-need // pool.page) * pool.page
        if not self._fits(mapped):
            return None
        # one segment per pool, keyed by its base address
        self.segments[pool.base] = (pool, self.segments.get(pool.base, (pool, 0))[1] + mapped)
        self.reserved += mapped
        self.device_allocs += 1
        pool.end += mapped
        if grow is not None:
            pool.take(grow)
            grow.size += mapped
            return grow
        block = _Block(pool.end - mapped, mapped)
        block.prev = last
        if last is not None:
            last.next = block
        pool.last = block
        return block

    def _hand_out(self, pool: _Pool, block: _Block, size: int, orig: int) -> None:
        """``should_split`` + ``alloc_found_block``."""
        rest = block.size - size
        if pool.small or self.expandable:
            split = rest >= K_MIN_BLOCK_SIZE
        else:
            split = size < self.mss and rest > K_SMALL_SIZE
        if split:
            tail = _Block(block.addr + size, rest)
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            if pool.last is block:
                pool.last = tail
            pool.put(tail)
        block.allocated, block.requested = True, orig
        self.allocated += block.size
        self.requested += orig

    def free(self, pool: _Pool, block: _Block) -> None:
        """``free_block``: merge with free neighbours, cache the result."""
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            pool.take(prev)
            block.addr, block.size, block.prev = prev.addr, block.size + prev.size, prev.prev
            if prev.prev is not None:
                prev.prev.next = block
        if nxt is not None and not nxt.allocated:
            pool.take(nxt)
            block.size, block.next = block.size + nxt.size, nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
            if pool.last is nxt:
                pool.last = block
        pool.put(block)

    def on_alloc(self, k: int, ev: Alloc) -> bool:
        """One Alloc event; False: out of memory."""
        if ev.id in self.live or ev.size < 0:
            raise ValueError(f"event {k}: {ev.id!r} allocated twice or of a negative size")
        if ev.size == 0:
            self.live[ev.id] = None
            return True
        held = self.live[ev.id] = self.malloc(ev.size, ev.stream)
        if held is None:
            return False
        req, alloc, res = self.peaks
        self.peaks = (max(req, self.requested), max(alloc, self.allocated),
                      max(res, self.reserved))
        if self.reserved > res:
            self.peak_step = ev.step
        return True

    def on_free(self, k: int, ev: Free) -> bool:
        try:
            held = self.live.pop(ev.id)
        except KeyError:
            raise ValueError(f"event {k}: {ev.id!r} freed but not allocated") from None
        if held is not None:
            self.free(*held)
        return True


def replay(events: Iterable[Event], *, expandable: bool = False,
           max_split_size: int | None = None, max_non_split_rounding: int = K_LARGE_BUFFER,
           capacity: int | None = None, timeline: bool = False,
           window_ends: Sequence[int] = ()) -> AllocatorResult:
    """Replay ``events`` through the allocator (one device, one stream, fresh process).

    ``expandable``: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. ``max_split_size``
    and ``max_non_split_rounding`` in bytes (``max_split_size_mb:N`` is N MiB, at least 20
    MiB, CUDAAllocatorConfig's minimum). ``capacity``: the bytes the allocator can reserve
    (None: unlimited). ``timeline``: keep reserved and allocated bytes after every event.
    ``window_ends``: the indices of the events that end windows (ascending), each window's
    reserved bytes at its end and its allocated peak kept.
    A zero-byte tensor allocates nothing (``allocate`` skips ``malloc`` for size 0)."""
    if max_split_size is not None and max_split_size < K_LARGE_BUFFER:
        raise ValueError(f"max_split_size {max_split_size:,} B: PyTorch refuses values under "
                         f"{K_LARGE_BUFFER:,} B (max_split_size_mb:20)")
    a = _Allocator(expandable, max_split_size, max_non_split_rounding, capacity)
    reserved_tl: list[int] = []
    allocated_tl: list[int] = []
    oom = None
    windows: list[tuple[int, int]] = []
    ends = iter(window_ends)
    end, peak = next(ends, -1), 0
    for k, ev in enumerate(events):
        if not (a.on_alloc(k, ev) if type(ev) is Alloc else a.on_free(k, ev)):
            oom = k
            break
        if timeline:
            reserved_tl.append(a.reserved)
            allocated_tl.append(a.allocated)
        if end >= 0:
            peak = max(peak, a.allocated)
            if k == end:
                windows.append((a.reserved, peak))
                end, peak = next(ends, -1), a.allocated
    return AllocatorResult(
        requested_peak=a.peaks[0], allocated_peak=a.peaks[1], reserved_peak=a.peaks[2],
        reserved_peak_step=a.peak_step, allocated_end=a.allocated, reserved_end=a.reserved,
        segments=tuple(SegmentInfo(p.name, n, expandable) for p, n in a.segments.values()),
        device_allocs=a.device_allocs, alloc_retries=a.retries,
        oom_event=oom, expandable=expandable, max_split_size=max_split_size,
        reserved_timeline=tuple(reserved_tl), allocated_timeline=tuple(allocated_tl),
        windows=tuple(windows))
