"""How far a serving batch can grow on a device: the most sequences of the traced length, and
the longest context at the traced batch, each searched over the batch's allocator replay
(passes/serving/reserved.py) with its sizes scaled — the same needs as the fits line, which
they meet where they reach the traced batch and context.

Scaling the sizes is the estimate: a batch n times larger allocates every tensor that grows
with the batch n times larger, in the same order, and a longer context allocates a cache that
much longer. A tensor that grows with neither (a causal mask, a rotary table) is scaled too,
an overestimate small beside the cache; the working tensors that grow with the context (the
prefill's scores at a longer prompt) are not: the context line is the cache's, as the
report's memory curve draws it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..device.fits import Fit, scaled_bytes
from ..memory.caching_allocator import AllocatorConfig, Event, replay
from .reserved import ServingEvents


@dataclass(frozen=True)
class Tensors:
    """A serving batch's tensors as the fits line counts them: the weights, the cache after
    the run, the working peak (``--overhead allocator=P`` needs them × (1 + P))."""
    weights: int
    cache: int
    work: int


@dataclass(frozen=True)
class ServingRoom:
    """The bytes a serving batch's allocator may reserve on the device (``room``: what it
    offers less the fits line's parts outside the allocator); ``fraction``: ``--overhead
    allocator=P``, the tensors × (1 + P) in place of the replay."""
    room: int
    config: AllocatorConfig
    fraction: float | None = None

    @classmethod
    def of(cls, answer: Fit, config: AllocatorConfig, fraction: float | None) -> ServingRoom:
        outside = answer.needs - answer.parts[0].bytes
        return cls(answer.offers - outside, config, fraction)

    def replayed(self, events: list[Event]) -> int:
        return replay(events, expandable=self.config.expandable,
                      max_split_size=self.config.max_split_size).reserved_peak

    def sequences(self, ev: ServingEvents, batch: int, t: Tensors) -> int:
        """The most sequences of the traced length that fit: the replay scaled, or with a
        given allocator share, the batch's tensors but the weights."""
        if self.fraction is None:
            return largest_fitting(lambda n: self.replayed(ev.scaled(n / batch)), batch,
                                   self.room)
        f = self.fraction
        return largest_fitting(
            lambda n: scaled_bytes(t.weights + (t.cache + t.work) * n // batch, f), batch,
            self.room)

    def context(self, ev: ServingEvents, growth: int, t0: int, t: Tensors) -> int | None:
        """The longest context at the traced batch (None: the cache stops growing): the
        cache's bytes on its line through (t0, ``t.cache``), ``growth`` a token."""
        if growth <= 0:
            return None

        def needs(c: int) -> int:
            cache = max(0, t.cache + growth * (c - t0))
            if self.fraction is not None:
                return scaled_bytes(t.weights + cache + t.work, self.fraction)
            return self.replayed(ev.scaled(cache / max(1, t.cache), cache_only=True))
        return largest_fitting(needs, t0, self.room)


def largest_fitting(needs: Callable[[int], int], start: int, room: int) -> int:
    """The largest n ≥ 0 with ``needs(n)`` ≤ ``room``, ``needs`` growing with n, searched
    from ``start``, a first guess: doubling to a bracket, then bisection."""
    if needs(0) > room:
        return 0
    lo, hi = 0, max(1, start)
    while needs(hi) <= room:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if needs(mid) <= room else (lo, mid)
    return lo
