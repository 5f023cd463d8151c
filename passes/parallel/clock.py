"""The clock a data-parallel step is priced on, and what its tensors add up to.

The moments of one step are the joint graph's nodes with the strategy's events between them
(an all-gather, its copy-out, a reduce-scatter: ``before(i, …)`` registers one just before
node i, in the order the strategy runs them); node n, past the last, is the optimizer step.
Tensors are intervals of moments, each with a detail that names what it is ("unsharded_params",
"reduce_scatter_inputs" …) and belongs to one of the report's categories. The memory curve is a
difference array and a running sum over the moments (as passes/memory/liveness.py does over nodes),
folded to one value per node (the highest moment at or just before it) for the timeline.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

CATEGORIES = ("params", "buffers", "grads", "optimizer_state", "activations", "comm_buffers",
              "temporaries")
DETAILS: Mapping[str, str] = {
    "params": "params", "sharded_params": "params", "buffers": "buffers",
    "grads": "grads", "unsharded_grads": "grads", "sharded_grads": "grads",
    "optimizer_state": "optimizer_state", "activations": "activations",
    "ddp_buckets": "comm_buffers", "unsharded_params": "comm_buffers",
    "all_gather_buffers": "comm_buffers", "reduce_scatter_inputs": "comm_buffers",
    "backward_temporaries": "temporaries", "step_temporaries": "temporaries",
    "offload_staging": "temporaries", "reduce_dtype_casts": "temporaries",
}


class Clock:
    """The moments of one step (see the module docstring)."""

    def __init__(self, n: int):
        self.n = n
        self.gaps: list[list[tuple]] = [[] for _ in range(n + 1)]
        self.intervals: list[tuple[int, int, int, str]] = []
        # per interval: the bytes of each tensor it is, and the CUDA stream they are allocated
        # on (what the caching-allocator replay needs: passes/parallel/reserved.py)
        self.tensors: list[tuple[tuple[int, ...], int]] = []

    def before(self, i: int, order: int, label: str) -> tuple:
        """An event just before node i; events of one gap run by ``order``, then as
        registered."""
        ev = (i, order, len(self.gaps[i]), label)
        self.gaps[i].append(ev)
        return ev

    def freeze(self) -> None:
        """Number the moments (after every event is registered)."""
        self.node_pos: list[int] = []
        self.ev_pos: dict[tuple, int] = {}
        self.labels: list[str] = []
        p = 0
        for gap in self.gaps:
            for ev in sorted(gap, key=lambda e: (e[1], e[2])):
                self.ev_pos[ev] = p
                self.labels.append(ev[3])
                p += 1
            self.node_pos.append(p)
            self.labels.append("")
            p += 1
        self.size = p

    def node(self, i: int) -> int:
        return self.node_pos[i]

    def at(self, ev: tuple) -> int:
        return self.ev_pos[ev]

    def add(self, start: int, end: int, nbytes: int, detail: str,
            pieces: Sequence[int] | None = None, stream: int = 0) -> None:
        """``nbytes`` of ``detail`` live from moment ``start`` up to, not including, ``end``:
        the tensors of ``pieces`` bytes (None: one tensor), allocated on ``stream``."""
        if nbytes and end > start:
            self.intervals.append((start, end, nbytes, detail))
            self.tensors.append((tuple(pieces) if pieces is not None else (nbytes,), stream))

    def totals(self) -> list[int]:
        diff = [0] * (self.size + 1)
        for s, e, b, _ in self.intervals:
            diff[s] += b
            diff[e] -= b
        out, run = [], 0
        for d in diff[:-1]:
            run += d
            out.append(run)
        return out


@dataclass(frozen=True)
class Priced:
    peak_bytes: int
    first_step_peak_bytes: int      # without the optimizer state before the step
    peak_node: int                  # the node at (or just after) the peak; n: the step
    peak_label: str                 # the event at the peak ("" at a node)
    at_step: bool                   # the peak is the optimizer step
    breakdown: dict[str, int]       # CATEGORIES
    detail: dict[str, int]          # DETAILS present at the peak
    timeline: tuple[int, ...]       # per node, then the step
    step_detail: dict[str, int]     # DETAILS present at the optimizer step
    first_step_detail: dict[str, int]   # at the first step's peak


def price(clock: Clock) -> Priced:
    totals = clock.totals()
    opt_at = clock.node(clock.n)
    peak_at = max(range(len(totals)), key=totals.__getitem__)
    detail: dict[str, int] = {}
    at_step: dict[str, int] = {}
    state = 0
    for s, e, b, d in clock.intervals:
        if s <= peak_at < e:
            detail[d] = detail.get(d, 0) + b
        if s <= opt_at < e:
            at_step[d] = at_step.get(d, 0) + b
        if d == "optimizer_state":
            state += b
    breakdown: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
    for d, b in detail.items():
        breakdown[DETAILS[d]] += b
    # the first step: forward and backward run before step() creates the state
    first_at = max(range(opt_at + 1), key=lambda p: totals[p] - (state if p < opt_at else 0))
    first = totals[first_at] - (state if first_at < opt_at else 0)
    first_detail: dict[str, int] = {}
    for s, e, b, d in clock.intervals:
        if s <= first_at < e and not (d == "optimizer_state" and first_at < opt_at):
            first_detail[d] = first_detail.get(d, 0) + b
    timeline, prev = [], 0
    for p in clock.node_pos:
        timeline.append(max(totals[prev:p + 1]))
        prev = p + 1
    node = next(i for i, p in enumerate(clock.node_pos) if p >= peak_at)
    return Priced(totals[peak_at], first, node, clock.labels[peak_at], peak_at == opt_at,
                  breakdown, dict(sorted(detail.items())), tuple(timeline),
                  dict(sorted(at_step.items())), dict(sorted(first_detail.items())))
