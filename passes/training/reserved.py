"""A training step replayed through PyTorch's CUDA caching allocator
(passes/memory/caching_allocator.py): its reserved peak, over two steps, from the step's storages
(passes/training/step.py) and, on a GPU, what its kernels allocate besides them
(passes/device/gpu_workspaces.py); the allocations in order are passes/memory/allocator_events.py's."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..choices import OptimizerImpl
from ..device.fits import Flushing
from ..ir import Graph
from ..memory.allocator_events import (
    PhaseReserve,
    cublas_storages,
    held_replay,
    replay_by_phase,
    resident_tensors,
    training_events,
    transient_storages,
)
from ..memory.caching_allocator import Alloc, AllocatorConfig, covering
from .memory import TrainingMemory
from .optimizer import ADAPTIVE, optimizer_tensors, trainable_params

if TYPE_CHECKING:
    from ..device.gpu_workspaces import GpuWorkspaces


def training_reserved(graph: Graph, t: TrainingMemory, master_weights: bool,
                      config: AllocatorConfig | None = None,
                      workspaces: "GpuWorkspaces | None" = None, capacity: int | None = None
                      ) -> tuple[int, tuple[PhaseReserve, ...], Flushing | None]:
    """The reserved peak of ``t``'s step on PyTorch's CUDA caching allocator, over two steps
    (passes.memory.allocator_events.training_events): each parameter, buffer and (mixed precision)
    fp32 master copy its own tensor; the optimizer state one tensor per parameter per state
    kind, plus Adam's 4-byte step counters; the step's temporaries per parameter; with
    master weights, the fp32 copies of the gradients the step runs on; ``workspaces``' kernel
    temporaries at their nodes in both steps, its cuBLAS workspaces from step 1's first GEMMs
    on. With its phases: the parameters, then each step's forward, backward and optimizer
    step; and where ``capacity`` (what the device leaves the allocator: passes/device/fits.py
    ``allocator_capacity``) is under the reserved peak, the replay held to it (Flushing; None
    where it runs out of memory even so)."""
    params = [graph.values[p] for p in trainable_params(graph)]
    sizes, states = optimizer_tensors(params, t.optimizer, master_weights)
    resident = resident_tensors(graph)
    if master_weights:
        resident += [(f"{v.name} (fp32 master)", b) for v, b in zip(params, sizes)]
    adam = t.optimizer in ADAPTIVE
    storages = list(t.storages) + transient_storages(workspaces)
    events = training_events(storages, resident=resident, grads=t.grad_storages,
                             state=states, step_sizes=sizes if adam else [],
                             foreach=t.optimizer_impl == OptimizerImpl.FOREACH,
                             master_grads=sizes if master_weights else [],
                             once=cublas_storages(workspaces))
    forward = t.forward_nodes

    def phase(ev: Alloc) -> str:
        tag = ev.id[0] if isinstance(ev.id, tuple) else None
        if tag == "resident":
            return "parameters"
        if tag in (1, 2):        # the joint graph's storages, tagged by step (node clock)
            return f"step {tag} " + ("forward" if ev.step < forward else "backward")
        step = ev.id[1] if isinstance(ev.id, tuple) and tag != "state" else 1
        return f"step {step} optimizer"   # the state, the step's temporaries, fp32 grads
    config = config or AllocatorConfig()
    reserved, phases = replay_by_phase(events, phase, config)
    reserved = covering(reserved, max(t.peak_bytes, t.first_step_peak_bytes), "the training step")
    return reserved, phases, held_replay(events, config, reserved, capacity)
