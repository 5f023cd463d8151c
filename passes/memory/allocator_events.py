"""Which tensors a run allocates on the GPU and when, as events for the caching-allocator model
(passes.memory.caching_allocator.replay): an inference run over its liveness timeline, and a training
run as PyTorch steps it — twice, since the reserved bytes a step needs depend on what the step
before it left cached (the optimizer state is created inside the first ``step()``, in blocks
the first step's activations had freed, so the second step's activations need new ones)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..device.fits import Flushing
from ..ir import Graph, ValueKind
from .caching_allocator import Alloc, AllocatorConfig, Event, Free, covering, replay
from .liveness import Storage

if TYPE_CHECKING:
    from ..device.gpu_workspaces import GpuWorkspaces

CUBLAS = "cuBLAS workspace"  # the id of the workspace an inference replay allocates and keeps


def events_from_liveness(storages, *, resident: Iterable[tuple[str, int]] = (),
                         keep: frozenset[str] = frozenset(), tag: object = None
                         ) -> tuple[Event, ...]:
    """The allocations and frees of a liveness timeline (``passes.memory.liveness.Liveness`` or its
    ``storages``, e.g. ``TrainingMemory.storages``), in the order a runtime makes them.

    A storage is live from node ``birth`` to node ``death`` inclusive (``Liveness.timeline``
    counts it at both), so node i first allocates what it produces, then frees what it used
    for the last time: the bytes live after node i's allocations are ``timeline[i]``, and the
    replay's requested peak is the liveness peak. Within a node, storages go in their order
    (the graph's). ``resident``: (name, bytes) allocated before the first node and never
    freed (parameters, optimizer state). ``keep``: storages (by name) left allocated at the
    end (gradients, freed by the next ``zero_grad``). Zero-byte storages (unknown sizes) are
    left out. A storage's id is ``(tag, its index)``, a resident one's ("resident", name);
    steps are node indices."""
    storages = getattr(storages, "storages", storages)
    events: list[Event] = [Alloc(("resident", name), nbytes, 0)
                           for name, nbytes in resident if nbytes > 0]
    steps = max((s.death for s in storages), default=-1) + 1
    born: list[list[int]] = [[] for _ in range(steps)]
    dying: list[list[int]] = [[] for _ in range(steps)]
    for k, s in enumerate(storages):
        if s.nbytes > 0:
            born[s.birth].append(k)
            if s.name not in keep:
                dying[s.death].append(k)
    for i in range(steps):
        events.extend(Alloc((tag, k), storages[k].nbytes, i) for k in born[i])
        events.extend(Free((tag, k), i) for k in dying[i])
    return tuple(events)


@dataclass(frozen=True)
class PhaseReserve:
    """One phase of a replay: what the allocator had reserved by its end (it gives nothing
    back: no ``empty_cache()``, so this only grows, phase to phase, to the reserved peak) and
    the most its blocks held during it (``max_memory_allocated()`` over the phase)."""
    phase: str
    reserved_bytes: int
    allocated_peak_bytes: int


def replay_by_phase(events: Sequence[Event], phase_of: Callable[[Alloc], str | None],
                    config: AllocatorConfig = AllocatorConfig()
                    ) -> tuple[int, tuple[PhaseReserve, ...]]:
    """``events`` replayed (the reserved peak) and cut into phases: ``phase_of`` names each
    allocation's phase (None, and every free: the phase goes on), a phase ending where an
    allocation of another begins."""
    names: list[str] = []
    ends: list[int] = []
    for k, ev in enumerate(events):
        name = phase_of(ev) if type(ev) is Alloc else None
        if name is not None and (not names or name != names[-1]):
            if names:
                ends.append(k - 1)
            names.append(name)
    if names:
        ends.append(len(events) - 1)
    r = replay(events, expandable=config.expandable, max_split_size=config.max_split_size,
               window_ends=ends)
    return r.reserved_peak, tuple(PhaseReserve(n, *w) for n, w in zip(names, r.windows))


def held_replay(events: Sequence[Event], config: AllocatorConfig, reserved: int,
                capacity: int | None) -> Flushing | None:
    """Where ``events``' unlimited replay reserved more (``reserved``) than ``capacity`` (what
    the device leaves the allocator: passes/device/fits.py ``allocator_capacity``), the replay
    held to it, PyTorch's allocator emptying its cache and retrying past it (Flushing); None
    where no capacity is known, the unlimited one fits, or the held one runs out of memory."""
    if capacity is None or reserved <= capacity:
        return None
    held = replay(events, expandable=config.expandable, max_split_size=config.max_split_size,
                  capacity=capacity)
    return None if held.oom_event is not None else \
        Flushing(held.reserved_peak, held.alloc_retries)


def resident_tensors(graph: Graph) -> list[tuple[str, int]]:
    """Every parameter and buffer, each its own allocation (as ``model.to("cuda")`` makes)."""
    return [(v.name, v.spec.nbytes or 0) for v in graph.values.values()
            if v.kind in (ValueKind.PARAM, ValueKind.BUFFER)]


def inference_reserved(graph: Graph, liveness, config: AllocatorConfig = AllocatorConfig(),
                       workspaces: "GpuWorkspaces | None" = None
                       ) -> tuple[int, tuple[PhaseReserve, ...]]:
    """The reserved peak of inference on PyTorch's CUDA caching allocator (``config``: its
    settings), and its phases (the weights, the first batch, the second): parameters and
    buffers allocated before the first node and kept, then two runs of the activations in
    liveness order — the second batch meets the blocks the first left cached. ``workspaces``
    (a CUDA device's; passes.device.gpu_workspaces): cuDNN's transients in both runs, the cuBLAS
    workspace at the first run's first GEMM, kept. Comparable with the report's peak_bytes
    (parameters + buffers + activations), which counts the same tensors unrounded."""
    runs = _with_workspaces(liveness.storages, workspaces)
    kept = frozenset(s.name for s in cublas_storages(workspaces))
    events = list(events_from_liveness(runs[0], resident=resident_tensors(graph), tag=1,
                                       keep=kept))
    events += events_from_liveness(runs[1], tag=2)
    reserved, phases = replay_by_phase(events, _inference_phase, config)
    tensors = sum(b for _, b in resident_tensors(graph)) + liveness.peak_bytes
    return covering(reserved, tensors, "the inference run"), phases


def _inference_phase(ev: Alloc) -> str:
    tag = ev.id[0] if isinstance(ev.id, tuple) else None
    return "weights" if tag == "resident" else f"batch {tag}"


def _with_workspaces(storages, ws: "GpuWorkspaces | None") -> tuple[list, list]:
    """(run 1's storages, run 2's): each with ``ws``'s transients after the node's own
    storages (events_from_liveness keeps list order within a node); run 1 also allocates
    the cuBLAS workspace at its first GEMM, kept."""
    later = list(storages) + transient_storages(ws)
    return later + cublas_storages(ws), later


def cublas_storages(ws: "GpuWorkspaces | None") -> list[Storage]:
    """Each matmul thread's cuBLAS workspace, allocated at its first GEMM (named ``CUBLAS``,
    then ``CUBLAS 1``, …: storages to keep)."""
    if ws is None:
        return []
    return [Storage(f"{CUBLAS} {k}" if k else CUBLAS, ws.cublas_bytes, i, i)
            for k, i in enumerate(ws.cublas_nodes)]


def transient_storages(ws: "GpuWorkspaces | None") -> list[Storage]:
    """``ws``'s transients as storages born and dead at their node, in allocation order."""
    if ws is None:
        return []
    return [Storage(f"workspace {i}.{k}", b, i, i)
            for i, sizes in sorted(ws.transients.items()) for k, b in enumerate(sizes)]


def training_events(storages, *, resident: list[tuple[str, int]], grads: frozenset[str],
                    state: list[int], step_sizes: list[int], foreach: bool,
                    master_grads: Sequence[int] = (), once: Sequence[Storage] = ()
                    ) -> tuple[Event, ...]:
    """Two training steps: each runs the joint graph's storages (``grads`` kept to the
    optimizer step), then the optimizer step — in step 1 it first creates the ``state``
    tensors (bytes each), kept — with its temporaries over parameters of ``step_sizes``
    bytes (passes.training.optimizer.step_temporaries: foreach allocates one per parameter at once;
    the for-loop a sqrt and a denominator per parameter, the previous denominator freed when
    the next exists), then ``zero_grad(set_to_none=True)`` frees the gradients.
    ``master_grads``: the fp32 copies of the gradients a master-weights recipe steps on
    (bytes each), allocated before the step and freed after it. ``once``: storages step 1
    alone allocates, kept (each matmul thread's cuBLAS workspace, at its first GEMM)."""
    events: list[Event] = [Alloc(("resident", n), b) for n, b in resident if b > 0]
    for step in (1, 2):
        run = list(storages) + (list(once) if step == 1 else [])
        kept = grads | {s.name for s in once} if step == 1 else grads
        events += events_from_liveness(run, keep=kept, tag=step)
        if step == 1:
            events += [Alloc(("state", k), b) for k, b in enumerate(state) if b > 0]
        copies = [k for k, b in enumerate(master_grads) if b > 0]
        events += [Alloc(("fp32 grad", step, k), master_grads[k]) for k in copies]
        events += step_temporary_events(step, step_sizes, foreach)
        events += [Free(("fp32 grad", step, k)) for k in copies]
        events += [Free((step, k)) for k, s in enumerate(run)
                   if s.name in grads and s.nbytes > 0]
    return tuple(events)


def step_temporary_events(step: int, sizes: list[int], foreach: bool) -> list[Event]:
    """An adaptive optimizer's step temporaries over parameters of ``sizes`` bytes, in the
    order it visits them (see training_events)."""
    live = [b for b in sizes if b > 0]
    if foreach:
        return ([Alloc(("temp", step, k), b) for k, b in enumerate(live)]
                + [Free(("temp", step, k)) for k in range(len(live))])
    out: list[Event] = []
    for k, b in enumerate(live):
        out += [Alloc(("sqrt", step, k), b), Alloc(("denom", step, k), b),
                Free(("sqrt", step, k))]
        if k:
            out.append(Free(("denom", step, k - 1)))
    return out + ([Free(("denom", step, len(live) - 1))] if live else [])
