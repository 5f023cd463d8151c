"""One rank's data-parallel step replayed through PyTorch's CUDA caching allocator
(passes/memory/caching_allocator.py): its reserved peak, as the single-device training step's is
(passes/memory/allocator_events.py), from the tensors the strategy placed on the step's clock
(passes/parallel/clock.py), each with its own bytes and stream.

Two steps, from an empty cache: parameters (or their shards), buffers and DDP's gradient
buckets are allocated before the first (``model.to("cuda")``, ``fully_shard``, the DDP
constructor) and kept; the optimizer state is created inside the first ``step()``, before the
step's temporaries, and kept; what lives to the end of a step (gradients, sharded gradients)
is freed by the next step's ``zero_grad(set_to_none=True)``, first thing. At each moment of
the clock what ends there is freed before what starts there is allocated (a node's dead
inputs go before the next node's outputs, as in events_from_liveness). The optimizer step's
temporaries are the same sequence the single-device replay uses (allocator_events)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..device.fits import Flushing
from ..memory.allocator_events import held_replay, step_temporary_events
from ..memory.caching_allocator import Alloc, AllocatorConfig, Event, Free, replay
from .clock import Clock

if TYPE_CHECKING:
    from ..device.gpu_workspaces import GpuWorkspaces

KEPT = frozenset({"params", "sharded_params", "buffers", "ddp_buckets"})
STATE, STEP_TEMPS = "optimizer_state", "step_temporaries"


def rank_reserved_peak(events: list[Event],
                       config: AllocatorConfig = AllocatorConfig()) -> int:
    """The reserved peak of a rank's two steps (``rank_events``)."""
    return replay(events, expandable=config.expandable,
                  max_split_size=config.max_split_size).reserved_peak


def rank_flushing(events: list[Event], config: AllocatorConfig, reserved: int,
                  capacity: int | None) -> Flushing | None:
    """``rank_reserved_peak``'s two steps held to ``capacity`` where they reserved more
    (``reserved``) than it (passes/memory/allocator_events.py ``held_replay``): the same
    events, made once."""
    return held_replay(events, config, reserved, capacity)


def rank_events(clock: Clock, foreach: bool,
                workspaces: "GpuWorkspaces | None" = None) -> list[Event]:
    """The allocations and frees of two steps of the rank priced on ``clock`` (frozen, every
    tensor placed; see the module docstring); ``foreach``: the optimizer's implementation
    (its temporaries); ``workspaces`` (a CUDA device's, passes.device.gpu_workspaces): the
    kernels' temporaries at their nodes and each matmul thread's cuBLAS workspace from step
    1's first GEMM on, allocated after what their node's moment allocates."""
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}
    events: list[Event] = []
    for k, (start, end, _, detail) in enumerate(clock.intervals):
        if detail in KEPT:
            events += _allocs(clock, k, ("kept", k))
        elif detail not in (STATE, STEP_TEMPS):
            starts.setdefault(start, []).append(k)
            ends.setdefault(end, []).append(k)
    opt_at = clock.node(clock.n)
    at_node = {} if workspaces is None else {
        clock.node(i): i for i in (*workspaces.transients, *workspaces.cublas_nodes)}
    for step in (1, 2):
        if step == 2:       # zero_grad(set_to_none=True): what step 1 kept to its end
            events += _frees(clock, ends.get(clock.size, ()), 1)
        for p in range(clock.size):
            events += _frees(clock, ends.get(p, ()), step)
            for k in starts.get(p, ()):
                events += _allocs(clock, k, (step, k))
            if p in at_node:
                events += _workspaces(workspaces, at_node[p], step)
            if p == opt_at:
                events += _optimizer(clock, step, foreach)
    return events


def _workspaces(ws: "GpuWorkspaces | None", node: int, step: int) -> list[Event]:
    """At ``node``: its kernel's temporaries, allocated and freed; in step 1 the cuBLAS
    workspace of a thread whose first GEMM it is, kept."""
    if ws is None:
        return []
    out: list[Event] = []
    for j, b in enumerate(ws.transients.get(node, ())):
        out += [Alloc(("workspace", step, node, j), b), Free(("workspace", step, node, j))]
    if step == 1 and node in ws.cublas_nodes:
        out.append(Alloc(("cuBLAS", node), ws.cublas_bytes))
    return out


def _allocs(clock: Clock, k: int, key: tuple) -> list[Event]:
    pieces, stream = clock.tensors[k]
    return [Alloc((*key, j), b, stream=stream) for j, b in enumerate(pieces) if b > 0]


def _frees(clock: Clock, ks, step: int) -> list[Event]:
    return [Free((step, k, j)) for k in ks for j, b in enumerate(clock.tensors[k][0]) if b > 0]


def _optimizer(clock: Clock, step: int, foreach: bool) -> list[Event]:
    """The state (created in step 1, kept), then the step's temporaries."""
    out: list[Event] = []
    for k, (_, _, _, detail) in enumerate(clock.intervals):
        if detail == STATE and step == 1:
            out += _allocs(clock, k, ("state", k))
        elif detail == STEP_TEMPS:
            out += step_temporary_events(step, list(clock.tensors[k][0]), foreach)
    return out
