"""The training section of a report: one step's memory (passes/training/memory.py), the
checkpoint plan asked for (checkpoint_search.py), the what-ifs of the usual memory savers, and
on a GPU the caching allocator's reserved bytes (reserved.py).
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..device.fits import Overhead, allocator_capacity
from ..device.gpu_workspaces import gpu_workspaces
from ..ir import Graph
from ..memory.caching_allocator import AllocatorConfig
from .checkpoint import CheckpointSpec, repeated_blocks
from .checkpoint_search import plan_checkpoints
from .memory import TrainingMemory, WhatIf, forward_set, training_memory
from .precision import cast_floats, master_weights
from .reserved import training_reserved

if TYPE_CHECKING:
    from ..device_rates import DeviceRates


def what_ifs(graph: Graph, optimizer: str, node_flops: list[int], precision: str,
             include_inputs: bool = True, impl: str = "forloop",
             every_block: bool = True,
             plain: TrainingMemory | None = None) -> dict[str, WhatIf]:
    """The step's peak under the usual memory savers, each by re-running the passes on the
    same joint graph: in-place activations, the bf16 master-weights recipe (re-typing the
    graph; autocast would need another trace), and (``every_block``: not the plan asked
    for already) checkpointing every repeated block (``plain``: the step without it, where the
    caller has it)."""
    mixed = master_weights(precision)

    def of(t: TrainingMemory, recompute: int | None = None) -> WhatIf:
        return WhatIf(t.peak_bytes, t.peak_phase, t.peak_node, recompute)

    out = {"inplace_activations": of(training_memory(
        graph, optimizer, master_weights=mixed, inplace=True, include_inputs=include_inputs,
        impl=impl))}
    # (re-typing the fp32 graph to half cannot show a loss's upcast of half logits to fp32:
    # a copy the half trace makes and the fp32 one has no node for — that what-if would be
    # optimistic, so a cross-entropy step has none: trace bf16-master itself)
    if precision == "fp32" and "fp32" not in graph.loss:
        out["bf16_master"] = of(training_memory(cast_floats(graph, "bf16-master"), optimizer,
                                               master_weights=True, impl=impl,
                                               include_inputs=include_inputs))
    if every_block and repeated_blocks(graph, forward_set(graph)):
        plan = plan_checkpoints(graph, optimizer, node_flops, every=1, master_weights=mixed,
                                include_inputs=include_inputs, impl=impl, plain=plain)
        out["checkpoint_every_block"] = of(plan.checkpointed, plan.recompute_flops)
    return out


def plain_step(graph: Graph, optimizer: str, precision: str = "fp32",
               include_inputs: bool = True, impl: str = "forloop") -> TrainingMemory:
    """The step without a checkpoint plan, what-ifs or replay: what every plan of ``graph``
    under these settings is compared with."""
    return training_memory(graph, optimizer, master_weights=master_weights(precision),
                           include_inputs=include_inputs, impl=impl)


def training_step(graph: Graph, optimizer: str, node_flops: list[int], *,
                  precision: str = "fp32", checkpoint: CheckpointSpec | None = None,
                  what_if: bool = True, include_inputs: bool = True,
                  impl: str = "forloop",
                  allocator: AllocatorConfig | None = None,
                  device: "DeviceRates | None" = None, replay: bool = True,
                  overhead: Overhead | None = None,
                  plain: TrainingMemory | None = None) -> TrainingMemory:
    """The training section of a report: the step's memory, with the checkpoint plan asked
    for and the what-ifs (``graph`` already re-typed by passes.training.precision for mixed precision,
    whose fp32 master side is added here); on a GPU ``device`` the reserved replay holds the
    cuBLAS workspaces and the kernels' temporaries (passes.device.gpu_workspaces). Without
    ``replay`` (a layout's ranks are replayed instead) no reserved figure. ``plain``: the step
    without a plan (``plain_step``) where the caller keeps it for the graph's other plans —
    the plan and the what-ifs read it rather than lay the same step out again."""
    mixed = master_weights(precision)
    t = plain_step(graph, optimizer, precision, include_inputs, impl) if plain is None \
        else plain
    plan = plan_checkpoints(graph, optimizer, node_flops, master_weights=mixed,
                            include_inputs=include_inputs, impl=impl,
                            names=list(checkpoint.names) if checkpoint.names else None,
                            every=checkpoint.every, sqrt=checkpoint.sqrt,
                            budget=checkpoint.budget, sac=checkpoint.sac,
                            nth=checkpoint.nth, plain=t) if checkpoint else None
    # (the what-if of checkpointing every block would repeat that plan when it is the one asked)
    savers = what_ifs(graph, optimizer, node_flops, precision, include_inputs, impl,
                      every_block=checkpoint != CheckpointSpec(every=1),
                      plain=t) if what_if else {}
    if not replay:
        return replace(t, checkpoint=plan, what_if=savers, loss=graph.loss)
    ws = gpu_workspaces(graph, device, t.forward_nodes) if device is not None else None
    # (under a plan the step that runs is replayed, its recomputed tensors where the plan
    # puts them: the plan's figure; the plain step beside it is not run)
    # (``overhead``: what the device leaves the allocator, where a replay held to it decides)
    capacity = allocator_capacity(device, threads=2, overhead=overhead) \
        if device is not None and ws is not None else None
    reserved, phases, flushing = training_reserved(
        graph, plan.checkpointed if plan else t, mixed, allocator, ws, capacity)
    if plan is not None:
        plan = replace(plan, reserved_peak_bytes=reserved, checkpointed=replace(
            plan.checkpointed, reserved_peak_bytes=reserved, reserved_by_phase=phases,
            flushing=flushing))
        reserved, phases, flushing = None, (), None
    return replace(t, checkpoint=plan, what_if=savers, reserved_peak_bytes=reserved,
                   reserved_by_phase=phases, loss=graph.loss, flushing=flushing)
