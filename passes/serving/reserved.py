"""A serving batch replayed through PyTorch's CUDA caching allocator
(passes/memory/caching_allocator.py): the reserved peak of its prefill and its last decode step, in
one process, from an empty cache.

The weights are allocated first, each its own tensor (``model.to("cuda")``), and kept. Then,
as the two kinds of cache run:

* an engine appending in place (``append``: the zoo's decoders, transformers' StaticCache,
  a serving engine's preallocated pages) allocates each cache tensor once, at the full context
  (P + G tokens), before the prefill; the steps write into it, so their cache inputs and outputs
  are no allocations of theirs;
* a cache that concatenates (``concat``: transformers' DynamicCache, ONNX ``present.*``) is
  the prefill's output, kept; the decode step at P + G − 1 tokens then takes the cache as it
  has grown by then (the prefill's copy freed, the grown one allocated: each step's copy is a
  new tensor) and makes the next, each past tensor freed after its last use in the step.

Each step's other tensors follow its liveness (passes/memory/allocator_events.events_from_liveness);
the decode step comes after the prefill, so it reuses what the prefill freed. Steps between
the prefill and the last decode step are not replayed: they hold less cache than the last.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..ir import Graph
from ..memory.allocator_events import (
    PhaseReserve,
    cublas_storages,
    events_from_liveness,
    replay_by_phase,
    resident_tensors,
    transient_storages,
)
from ..memory.caching_allocator import Alloc, AllocatorConfig, Event, Free, covering
from ..memory.liveness import analyze_liveness

if TYPE_CHECKING:
    from ..device_rates import DeviceRates


@dataclass(frozen=True)
class ServingEvents:
    """A serving batch's allocations in order (``events``), with the ids of those that do not
    grow with the batch (``fixed``: the weights, the cuBLAS workspace) and of the cache's
    tensors (``cache``: they grow with the context)."""
    events: tuple[Event, ...]
    fixed: frozenset
    cache: frozenset

    def scaled(self, factor: float, *, cache_only: bool = False) -> list[Event]:
        """The events with every size that grows with the batch (``cache_only``: with the
        context, the cache's) times ``factor``: the batch (or context) that much larger, as
        far as sizes go — the capacities' estimate (a tensor that grows with neither, as a
        causal mask, is scaled too: an overestimate, small beside the cache)."""
        def grows(key) -> bool:
            return key in self.cache if cache_only else key not in self.fixed
        return [Alloc(e.id, int(e.size * factor), e.step, e.stream)
                if type(e) is Alloc and grows(e.id) else e for e in self.events]


PHASES = {"weight": "weights", "cache": "cache", "prefill": "prefill", "decode": "decode step"}


def serving_reserved(events: ServingEvents, config: AllocatorConfig = AllocatorConfig()
                     ) -> tuple[int, tuple[PhaseReserve, ...]]:
    """The reserved peak and its phases: the weights, the cache allocated whole (an appending
    cache), the prefill, the last decode step; checked to cover what the replay allocated
    (weights + the cache after P + G + the larger working peak is an estimate over both steps
    that can pass it: the prefill holds P tokens' cache)."""
    def phase(ev: Alloc) -> str:
        assert isinstance(ev.id, tuple)  # (kind, …): serving_events' ids
        return PHASES[ev.id[0]]
    reserved, phases = replay_by_phase(events.events, phase, config)
    covering(reserved, max((p.allocated_peak_bytes for p in phases), default=0),
             "the serving batch")
    return reserved, phases


# long: the two kinds of cache share the weights, the liveness and the workspaces
def serving_events(prefill: Graph, decode: Graph, prefill_cache: set[str], past: list[str],
                   decode_cache: set[str], appends: bool, cache_after: int,
                   device: "DeviceRates | None" = None) -> ServingEvents:
    """The events of a serving batch (see the module docstring). ``prefill_cache``: the
    prefill's cache outputs; ``past``: the decode step's cache inputs; ``decode_cache``: its
    cache outputs; ``cache_after``: the batch's cache after P + G tokens (bytes). On a GPU
    ``device`` the cuBLAS workspace from the prefill's first matmul on, and each step's
    kernel temporaries (passes/device/gpu_workspaces.py)."""
    from ..device.gpu_workspaces import gpu_workspaces

    weights = [(("weight", n), b) for n, b in resident_tensors(prefill) if b]
    events: list[Event] = [Alloc(key, b) for key, b in weights]
    pre = analyze_liveness(prefill, include_inputs=True, eager=prefill.source == "fx")
    dec = analyze_liveness(decode, include_inputs=True, eager=decode.source == "fx")
    wp, wd = (None, None) if device is None else \
        (gpu_workspaces(prefill, device), gpu_workspaces(decode, device))
    extra = transient_storages(wp) + cublas_storages(wp)    # after the prefill's own
    workspace = frozenset(s.name for s in cublas_storages(wp))
    past_bytes = [decode.values[n].spec.nbytes or 0 for n in past]
    if appends:
        scale = cache_after / max(1, sum(past_bytes))
        cache = [("cache", k) for k, b in enumerate(past_bytes) if b]
        events += [Alloc(("cache", k), int(b * scale)) for k, b in enumerate(past_bytes) if b]
        run = _without(pre, prefill, prefill_cache) + extra
        events += events_from_liveness(run, keep=workspace, tag="prefill")
        events += events_from_liveness(_without(dec, decode, set(past) | decode_cache)
                                       + transient_storages(wd), tag="decode")
    else:
        kept = _storages_of(pre, prefill_cache)
        run = list(pre.storages) + extra
        events += events_from_liveness(run, keep=workspace | {pre.storages[k].name
                                                              for k in kept}, tag="prefill")
        events += [Free(("prefill", k)) for k in sorted(kept) if pre.storages[k].nbytes > 0]
        events += events_from_liveness(list(dec.storages) + transient_storages(wd),
                                       tag="decode")
        cache = [("prefill", k) for k in kept] + \
            [("decode", k) for k in _storages_of(dec, set(past) | decode_cache)]
    fixed = {key for key, _ in weights} | \
        {("prefill", k) for k, s in enumerate(run) if s.name in workspace}
    return ServingEvents(tuple(events), frozenset(fixed), frozenset(cache))


def _storages_of(live, names: set[str]) -> set[int]:
    return {k for n in names if (k := live.value_storage.get(n)) is not None}


def _without(live, graph: Graph, cache: set[str]) -> list:
    """The step's storages less the cache's bytes (a cache value that is part of a larger
    storage leaves the rest of it: working memory, as working_memory.working_peak counts it)."""
    less: dict[int, int] = {}
    for n in cache:
        k = live.value_storage.get(n)
        if k is not None:
            # a view and the value it views are one cache tensor: the larger counts
            less[k] = max(less.get(k, 0), graph.values[n].spec.nbytes or 0)
    return [replace(s, nbytes=max(0, s.nbytes - less[k])) if k in less else s
            for k, s in enumerate(live.storages)]
