"""The checkpoint plan with the least recompute that fits a memory budget.

Candidates: segments made of consecutive repeated blocks (the module boundaries
torch.utils.checkpoint wraps; a run of blocks merged into one segment also frees the tensors
that cross between them). Cost of a plan: the forward FLOPs of its segments, recomputed once.

Memory model, read off the plain step's liveness: a checkpointed segment frees the tensors it
saves internally (born in it, read in forward only inside it, read again by backward) from
its forward until backward reaches it and recomputes them (Chen et al. 2016). Split the step's
timeline into regions by block — block k's forward, and the stretch of backward after block k
is recomputed and before block k−1 is — and let M[k] be the plain step's highest point in
region k (region n: the loss and the backward of what follows the last block). In region k the
plan has freed exactly the savings of its segments that end before the segment holding k, so

    peak(plan) = max_k ( M[k] − Σ saved(segments ending before k's segment) ).

The constraint at each block depends only on what was freed before it, so a dynamic program
over the block boundaries that keeps, at each boundary, the Pareto front of (recompute FLOPs,
bytes freed) finds the plan with the least recompute whose modelled peak fits — exactly,
under the model. The plan is then evaluated by the real pass (passes.training.step); where the model
was optimistic (a recompute's transient tensors), the target is lowered by the shortfall and
the search repeated.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph
from ..memory.liveness import Liveness
from .checkpoint import Segment, merge, segments_by_name, view_nodes


@dataclass(frozen=True)
class Blocks:
    names: list[str]
    segments: list[Segment]          # one per block, in execution order
    saved: list[list[int]]           # saved[a][b]: bytes freed by checkpointing blocks a..b-1
    flops: list[list[int]]           # flops[a][b]: their forward FLOPs
    region_max: list[int]            # M[k], k = 0..n (see the module docstring)


def block_table(graph: Graph, live: Liveness, forward: set[int], names: list[str],
                node_flops: list[int], timeline: tuple[int, ...]) -> Blocks:
    """``timeline``: the plain step's bytes at each joint node, then at the optimizer step."""
    segs = segments_by_name(graph, forward, names)
    n_blocks = len(segs)
    block_of = {i: k for k, s in enumerate(segs) for i in s.nodes}
    of = live.value_storage
    fwd_uses: dict[int, list[int]] = {}
    first_bwd: dict[int, int] = {}
    views = view_nodes(graph)
    for node in graph.nodes:
        for name in node.inputs:
            s = of.get(name) if name else None
            if s is None:
                continue
            if node.index in forward:
                if node.index not in views:   # (as checkpointed_storages reads them)
                    fwd_uses.setdefault(s, []).append(node.index)
            else:
                first_bwd.setdefault(s, node.index)
    outputs = {of[o] for o in graph.outputs if o in of}
    # count[bb][lb]: bytes saved for backward, born in block bb, last read in forward in lb;
    # recompute[k]: when backward first reads a tensor of block k (its recompute point)
    count = [[0] * n_blocks for _ in range(n_blocks)]
    recompute = [len(graph.nodes)] * n_blocks
    for s, st in enumerate(live.storages):
        bb = block_of.get(st.birth)
        if bb is None or s in outputs or s not in first_bwd:
            continue
        recompute[bb] = min(recompute[bb], first_bwd[s])
        uses = fwd_uses.get(s, [])
        blocks = [b for u in uses if (b := block_of.get(u)) is not None]
        if len(blocks) < len(uses):
            continue                      # read by a node between blocks: never internal
        count[bb][max(blocks, default=bb)] += st.nbytes
    saved = [[0] * (n_blocks + 1) for _ in range(n_blocks + 1)]
    flops = [[0] * (n_blocks + 1) for _ in range(n_blocks + 1)]
    seg_flops = [sum(node_flops[i] for i in s.nodes) for s in segs]
    for a in range(n_blocks):
        for b in range(a + 1, n_blocks + 1):
            saved[a][b] = saved[a][b - 1] + sum(count[bb][b - 1] for bb in range(a, b))
            flops[a][b] = flops[a][b - 1] + seg_flops[b - 1]
    # the region of each timeline point: forward nodes by the next block to start, backward
    # nodes by the earliest block already recomputed, the optimizer step with region 0
    region_max = [0] * (n_blocks + 1)
    k = 0
    for t in range(len(graph.nodes)):
        if t in forward:
            while k < n_blocks and t > max(segs[k].nodes):
                k += 1
            r = k    # the block holding t, or the next one to start
        else:
            r = n_blocks
            while r > 0 and recompute[r - 1] <= t:
                r -= 1
        region_max[r] = max(region_max[r], timeline[t])
    region_max[0] = max(region_max[0], timeline[-1])
    return Blocks(list(names), segs, saved, flops, region_max)


def cheapest_plan(t: Blocks, target: int) -> list[tuple[int, int]] | None:
    """The (a, b) block ranges of the plan with the least recompute whose modelled peak is at
    most ``target``; None if no plan reaches it under the model."""
    n, m = len(t.segments), t.region_max
    # front[j]: Pareto-optimal (flops, freed, plan) of the plans for the blocks before j
    front: list[list[tuple[int, int, tuple]]] = [[] for _ in range(n + 1)]
    front[0] = [(0, 0, ())]
    for j in range(n):
        for f, freed, plan in _pareto(front[j]):
            if freed < m[j] - target:
                continue     # not even block j's own region fits: later blocks cannot help
            front[j + 1].append((f, freed, plan))              # block j not checkpointed
            highest = m[j]
            for k in range(j + 1, n + 1):                      # blocks j..k-1 as one segment
                highest = max(highest, m[k - 1])
                if freed < highest - target:
                    break
                front[k].append((f + t.flops[j][k], freed + t.saved[j][k], plan + ((j, k),)))
    done = [(f, -freed, plan) for f, freed, plan in _pareto(front[n]) if freed >= m[n] - target]
    return list(min(done)[2]) if done else None


def modelled_peak(t: Blocks, ranges: list[tuple[int, int]]) -> int:
    freed_before = [0] * (len(t.segments) + 1)   # freed in region k under the plan
    start_of = list(range(len(t.segments)))
    for a, b in ranges:
        for k in range(a, b):
            start_of[k] = a
    total = 0
    ends = {b: t.saved[a][b] for a, b in ranges}
    for k in range(len(t.segments) + 1):
        total += ends.get(k, 0)
        freed_before[k] = total
    return max(t.region_max[k] - (freed_before[start_of[k]] if k < len(t.segments)
                                  else freed_before[k]) for k in range(len(t.segments) + 1))


def plan_segments(t: Blocks, ranges: list[tuple[int, int]]) -> list[Segment]:
    return [merge("+".join(t.names[a:b]), t.segments[a:b]) if b - a > 1 else t.segments[a]
            for a, b in ranges]


def _pareto(points):
    """Keep the plans no other beats on both least FLOPs and most bytes freed."""
    out, most = [], -1
    for f, freed, plan in sorted(points, key=lambda p: (p[0], -p[1])):
        if freed > most:
            out.append((f, freed, plan))
            most = freed
    return out
