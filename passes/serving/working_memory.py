"""A serving step's working memory (passes/serving/analysis.py): what the liveness pass finds
live at the step's peak beyond the weights and the cache tensors — the figure a step's
``peak_bytes`` reports and the fits line adds to the weights and the batch's cache."""
from __future__ import annotations

from ..ir import Graph
from ..memory.liveness import Liveness, analyze_liveness


def working_peak(graph: Graph, cache: set[str],
                 copied: frozenset[str] | set[str] = frozenset()) -> int:
    """The liveness peak of the step minus the cache tensors live at each point (a view of a
    larger tensor counts its own bytes: the rest of that storage is working memory). The cache
    tensors on one storage count no more than it: a recurrent state updated in place and its
    update are one storage, counted once; a fused projection's key and value slices, their
    bytes (its query's are work). ``copied``: the step's cache inputs a concatenating cache
    replaces (``_copied_peak``)."""
    live = analyze_liveness(graph, include_inputs=True, eager=graph.source == "fx")
    if copied:
        return _copied_peak(graph, live, cache - copied, copied)
    n = len(live.timeline)
    diff = [0] * (n + 1)
    held: dict[int, int] = {}
    for name in cache:
        k = live.value_storage.get(name)
        if k is not None:
            size = min(graph.values[name].spec.nbytes or 0, live.storages[k].nbytes)
            held[k] = min(held.get(k, 0) + size, live.storages[k].nbytes)
    for k, size in held.items():
        s = live.storages[k]
        diff[s.birth] += size
        diff[min(s.death, n - 1) + 1] -= size
    peak = running = 0
    for i, total in enumerate(live.timeline):
        running += diff[i]
        peak = max(peak, total - running)
    return peak


def _copied_peak(graph: Graph, live: Liveness, after: set[str],
                 copied: frozenset[str] | set[str]) -> int:
    """A decode step whose cache is copied (transformers' DynamicCache: each layer's keys
    made anew by a cat of the old and the token's, the old then dropped): the step's live
    bytes — each old tensor until its last reader, as the cache lets go of it — at their peak,
    less the cache after the step (``after``; the old tensors ``copied``). So one layer's old
    keys or values beside their copy are working memory, as in transformers' own step
    (measured: tests/test_serving.py)."""
    n = len(live.timeline)
    last: dict[int, int] = {}
    for nd in graph.nodes:
        for name in nd.inputs:
            k = live.value_storage.get(name)
            if k is not None:
                last[k] = max(last.get(k, 0), nd.index)
    gone = [0] * (n + 1)
    for k in {live.value_storage[v] for v in copied if v in live.value_storage}:
        if k in last and last[k] + 1 < n:
            gone[last[k] + 1] += live.storages[k].nbytes
    kept = {live.value_storage[v]: graph.values[v].spec.nbytes or 0 for v in after
            if v in live.value_storage}
    freed = peak = 0
    for i, total in enumerate(live.timeline):
        freed += gone[i]
        peak = max(peak, total - freed)
    return max(0, peak - sum(min(b, live.storages[k].nbytes) for k, b in kept.items()))
