"""Training-step memory over the joint forward+backward graph.

Memory of one steady-state training step (optimizer state already allocated by earlier steps,
gradients freed by ``zero_grad(set_to_none=True)`` before the step):

  persistent  = parameters + buffers + optimizer state
  joint graph = activations (kept for backward or transient) + gradients as backward produces
                them; liveness over the real backward schedule (dataflow lifetimes: autograd
                frees a saved tensor once its last backward consumer ran), gradients live on to
                the optimizer step
  step        = gradients + the optimizer step's temporaries

Optimizer state: sgd 0, momentum 1×, adam/adamw 2× the trainable parameters, plus Adam's
per-tensor ``step`` counter (a 4-byte float32 scalar each). A frozen parameter
(requires_grad=False: the graph has no gradient for it, ``Graph.grads``) gets neither gradient
nor state. That state exists from the second step on: PyTorch creates it inside the first
``step()``, so the first step's forward and backward run without it (``first_step_peak_bytes``).

Step temporaries depend on the implementation (``impl``; PyTorch's default is ``forloop`` on
CPU, ``foreach`` on GPU): SGD and momentum update in place (none) either way. Adam/AdamW's
for-loop computes ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`` per
parameter, two tensors of its size, while the previous parameter's ``denom`` is still
referenced (freed when the name is rebound): max over the parameters, in the optimizer's
order, of previous + 2 × current. The foreach implementation computes
``torch._foreach_sqrt(exp_avg_sqs)`` for all parameters at once: 1 × all trainable ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Mapping

from .caching_allocator import AllocatorConfig
from .checkpoint import (
    CheckpointSpec,
    Segment,
    checkpointed_storages,
    group_every,
    merge,
    repeated_blocks,
    segments_by_name,
    sqrt_groups,
    timeline_of,
)
from .checkpoint_plan import block_table, cheapest_plan, plan_segments
from .choices import Optimizer, OptimizerImpl
from .errors import GraphcostError, opt
from .ir import INTERNAL, Graph, ValueKind
from .liveness import analyze_liveness

if TYPE_CHECKING:
    from .allocator_events import PhaseReserve
    from .roofline import DeviceRates

# state tensors per parameter (momentum: one buffer; Adam's family: exp_avg and exp_avg_sq)
ADAPTIVE = tuple(o for o in Optimizer if o.adaptive)
STATE_MULTIPLIER: dict[str, int] = {Optimizer.NONE: 0, Optimizer.SGD: 0, Optimizer.MOMENTUM: 1,
                    Optimizer.ADAM: 2, Optimizer.ADAMW: 2}


def step_temporaries(sizes: list[int], optimizer: str, impl: str = "forloop") -> int:
    """Bytes the optimizer step allocates beyond its state, for parameters of ``sizes`` bytes
    in the order the optimizer visits them (see the module docstring)."""
    if optimizer not in ADAPTIVE or not sizes:
        return 0
    if impl == OptimizerImpl.FOREACH:
        return sum(sizes)
    return max(prev + 2 * cur for prev, cur in zip([0, *sizes], sizes))


def optimizer_tensors(params, optimizer: str, master_weights: bool
                      ) -> tuple[list[int], list[int]]:
    """The bytes the optimizer steps per parameter (fp32 with a master copy, else the
    parameter's own), and its state, one tensor each: STATE_MULTIPLIER per parameter, plus
    Adam's 4-byte ``step`` counter per parameter."""
    sizes = [4 * (v.spec.numel or 0) if master_weights else v.spec.nbytes or 0 for v in params]
    states = [b for b in sizes for _ in range(STATE_MULTIPLIER[optimizer])]
    if optimizer in ADAPTIVE:
        states += [4] * len(params)
    return sizes, states


def trainable_params(graph: Graph) -> list[str]:
    """The parameters that get a gradient, in the graph's (``named_parameters()``) order. A
    graph made without the gradient map (hand-built) treats every parameter as trainable."""
    params = [v.name for v in graph.values.values() if v.kind == ValueKind.PARAM]
    if graph.grads or len(graph.outputs) <= 1:
        return [p for p in params if p in graph.grads]
    return params


@dataclass(frozen=True)
class WhatIf:
    """The step's peak under one memory saver, and where that peak is."""
    peak_bytes: int
    peak_phase: str
    peak_node: str | None
    recompute_flops: int | None = None   # checkpointing: the forward FLOPs run twice


@dataclass(frozen=True)
class CheckpointPlan:
    """A checkpoint plan: the step's peak without and with it, and what it costs."""
    mode: str                       # names | every | sqrt | auto
    segments: tuple[str, ...]       # each segment as "a" or "a+b+c" (blocks merged)
    peak_without_bytes: int
    peak_bytes: int
    recompute_flops: int
    recompute_pct: float            # of the whole step's FLOPs
    budget_bytes: int | None
    timeline: tuple[int, ...]
    peak_phase: str                 # where the checkpointed step peaks
    plain: "TrainingMemory" = field(metadata=INTERNAL)
    checkpointed: "TrainingMemory" = field(metadata=INTERNAL)


@dataclass(frozen=True)
class TrainingMemory:
    """One training step's memory: the report's ``training`` section."""
    optimizer: str
    param_bytes: int
    buffer_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    step_temp_bytes: int
    peak_bytes: int                 # the steady-state step (optimizer state allocated)
    first_step_peak_bytes: int      # the first step: its forward/backward run without state
    peak_phase: str                 # forward | backward | optimizer
    peak_node: str | None           # the joint-graph node at the peak (None: optimizer step)
    breakdown_at_peak: Mapping[str, int]  # params, buffers, master_weights, optimizer_state,
                                          # gradients, activations, temporaries
    include_inputs: bool            # whether the input batch counts among the activations
    timeline: tuple[int, ...]       # total bytes at each joint node, then at the optimizer step
    phases: tuple[str, ...]         # the phase of each timeline point
    checkpoint: CheckpointPlan | None = None
    what_if: Mapping[str, WhatIf] = field(default_factory=dict)
    optimizer_impl: str = "forloop"       # forloop (PyTorch's CPU default) | foreach (GPU)
    frozen_param_bytes: int = 0           # parameters with no gradient (requires_grad=False)
    # what PyTorch's CUDA caching allocator would reserve over two steps of this step's plain
    # schedule (passes.allocator_events; None: not modelled, as under a checkpoint plan)
    reserved_peak_bytes: int | None = None
    # what it had reserved by the end of each phase: the parameters, then each step's forward,
    # backward and optimizer step (passes/training_reserved.py)
    reserved_by_phase: "tuple[PhaseReserve, ...]" = ()
    forward_nodes: int = field(default=0, metadata=INTERNAL)
    storages: tuple = field(default=(), metadata=INTERNAL)  # the step's lifetimes (liveness)
    # the storages the gradients live in, by name: a gradient is often a view (a transposed
    # mm output), whose storage liveness names after the value that allocated it
    grad_storages: frozenset[str] = field(default=frozenset(), metadata=INTERNAL)


def forward_set(graph: Graph) -> set[int]:
    """The forward: every node up to the one producing the loss (the graph's first output).
    AOTAutograd's joint graph runs the whole forward, including the detaches of tensors saved
    for backward, before the first backward op."""
    v = graph.values.get(graph.outputs[0]) if graph.outputs else None
    last = v.producer if v is not None and v.producer is not None else -1
    return set(range(last + 1))


# long: one schedule of the step's tensors (params, grads, state, temporaries)
def training_memory(graph: Graph, optimizer: str = Optimizer.ADAM,
                    segments: list[Segment] | None = None,
                    master_weights: bool = False, inplace: bool = False,
                    include_inputs: bool = True, impl: str = "forloop") -> TrainingMemory:
    """``master_weights``: the graph runs in half precision (passes.precision) and the
    optimizer works on an fp32 master copy: 4 B per parameter for the copy, fp32 state, and at
    the step the fp32 gradients (made while the half ones still exist, which are freed before
    the update) plus the update's temporaries, in fp32. ``impl``: the optimizer's
    implementation (choices.OptimizerImpl), which sets the step's temporaries."""
    if optimizer not in STATE_MULTIPLIER:
        raise GraphcostError(f"unknown optimizer {optimizer!r}; known: "
                             + ", ".join(STATE_MULTIPLIER))
    if impl not in OptimizerImpl.words():
        raise GraphcostError(f"{opt('optimizer_impl')} {impl}: known: " + ", ".join(OptimizerImpl.words()))
    values = graph.values
    params = [values[p] for p in trainable_params(graph)]
    param_bytes = sum(v.spec.nbytes or 0 for v in values.values() if v.kind == ValueKind.PARAM)
    frozen = param_bytes - sum(v.spec.nbytes or 0 for v in params)
    buffer_bytes = sum(v.spec.nbytes or 0 for v in values.values()
                       if v.kind == ValueKind.BUFFER)
    grads = set(graph.outputs[1:])
    grad_bytes = sum(values[g].spec.nbytes or 0 for g in grads)
    numel = sum(v.spec.numel or 0 for v in params)
    # the optimizer's own copy of the weights, and the bytes per element it works in
    master = 4 * numel if master_weights else 0
    sizes, states = optimizer_tensors(params, optimizer, master_weights)
    state = sum(states)
    temp = step_temporaries(sizes, optimizer, impl)
    persistent = param_bytes + buffer_bytes + master + state

    live = analyze_liveness(graph, include_inputs=include_inputs, inplace=inplace,
                            python_refs=True)
    fwd = forward_set(graph)
    storages = list(live.storages)
    if segments:
        storages = checkpointed_storages(graph, live, fwd, segments)
    of = live.value_storage
    grad_storages = frozenset(live.storages[of[g]].name if g in of else g for g in grads)
    n = len(graph.nodes)
    timeline = [persistent + b for b in timeline_of(storages, n)]
    phases = ["forward" if i in fwd else "backward" for i in range(n)]
    if master_weights:  # fp32 gradients beside the half ones, then beside the update's temps
        fp32_grads = 4 * numel
        step_grads = max(grad_bytes + fp32_grads, fp32_grads + temp)
        step_temp = step_grads - grad_bytes
    else:
        step_grads, step_temp = grad_bytes + temp, temp
    timeline.append(persistent + step_grads)
    phases.append("optimizer")
    peak_i = max(range(len(timeline)), key=timeline.__getitem__)
    if peak_i == n:
        breakdown = dict(gradients=grad_bytes, activations=0, temporaries=step_temp)
        node = None
    else:
        at = [st for st in storages if st.birth <= peak_i <= st.death]
        g = sum(st.nbytes for st in at if st.name in grad_storages)
        breakdown = dict(gradients=g, activations=sum(st.nbytes for st in at) - g,
                         temporaries=0)
        node = graph.nodes[peak_i].name
    breakdown = dict(params=param_bytes, buffers=buffer_bytes, master_weights=master,
                     optimizer_state=state, **breakdown)
    # The first step: no optimizer state until its step() creates it.
    first = max(max(timeline[:-1], default=0) - state, timeline[-1])
    return TrainingMemory(
        optimizer=optimizer, param_bytes=param_bytes, buffer_bytes=buffer_bytes,
        grad_bytes=grad_bytes, optimizer_state_bytes=state, step_temp_bytes=step_temp,
        peak_bytes=timeline[peak_i], first_step_peak_bytes=first, peak_phase=phases[peak_i],
        peak_node=node, breakdown_at_peak=breakdown, include_inputs=include_inputs,
        timeline=tuple(timeline), phases=tuple(phases), optimizer_impl=impl,
        frozen_param_bytes=frozen, forward_nodes=len(fwd), storages=tuple(storages),
        grad_storages=grad_storages)


def _plan(mode: str, segs: list[Segment], plain: TrainingMemory, got: TrainingMemory,
          node_flops: list[int], budget: int | None) -> CheckpointPlan:
    recompute = sum(node_flops[i] for s in segs for i in s.nodes)
    return CheckpointPlan(
        mode=mode, segments=tuple(s.name for s in segs), peak_without_bytes=plain.peak_bytes,
        peak_bytes=got.peak_bytes, recompute_flops=recompute,
        recompute_pct=round(100.0 * recompute / max(1, sum(node_flops)), 3),
        budget_bytes=budget, timeline=got.timeline, peak_phase=got.peak_phase, plain=plain,
        checkpointed=got)


def plan_checkpoints(graph: Graph, optimizer: str, node_flops: list[int], *,
                     names: list[str] | None = None, every: int | None = None,
                     sqrt: bool = False, budget: int | None = None,
                     master_weights: bool = False, include_inputs: bool = True,
                     impl: str = "forloop") -> CheckpointPlan:
    """Build a checkpoint plan and evaluate it; ``budget`` alone asks for the plan with the
    least recompute that fits. ``node_flops``: the cost pass's FLOPs per joint-graph node."""
    fwd = forward_set(graph)

    def step(segs: list[Segment] | None = None) -> TrainingMemory:
        return training_memory(graph, optimizer, segs, master_weights,
                               include_inputs=include_inputs, impl=impl)

    plain = step()
    if names:
        segs, mode = segments_by_name(graph, fwd, names), "names"
    elif every is not None or sqrt:
        blocks = repeated_blocks(graph, fwd)
        if not blocks:
            raise GraphcostError("no repeated blocks found to checkpoint: name the modules "
                                 f"with {opt('checkpoint')} NAME[,NAME…]")
        groups = sqrt_groups(blocks) if sqrt else group_every(blocks, every or 1)
        segs = [merge("+".join(g), segments_by_name(graph, fwd, g)) for g in groups]
        mode = "sqrt" if sqrt else "every"
    elif budget is not None:
        return _auto(graph, fwd, plain, budget, step, node_flops)
    else:
        raise GraphcostError(f"{opt('checkpoint')} needs module names, sqrt, auto (with "
                             f"{opt('checkpoint.budget')}), or {opt('checkpoint.every')} N")
    return _plan(mode, segs, plain, step(segs), node_flops, budget)


def _auto(graph, fwd, plain, budget, step, node_flops) -> CheckpointPlan:
    """The plan with the least recompute that fits: exact under Chen et al.'s memory model
    over segments of consecutive repeated blocks (passes/checkpoint_plan.py), each answer
    checked by the liveness pass; the greedy search below is the fallback where the model
    keeps missing."""
    floor = plain.param_bytes + plain.buffer_bytes + plain.optimizer_state_bytes + \
        plain.grad_bytes + plain.breakdown_at_peak["master_weights"]
    if budget < floor:
        raise GraphcostError(f"no checkpoint plan can fit {budget:,} B: parameters, gradients "
                             f"and optimizer state alone take {floor:,} B")
    if plain.peak_bytes <= budget:
        return _plan("auto", [], plain, plain, node_flops, budget)
    blocks = repeated_blocks(graph, fwd)
    if blocks:
        table = block_table(graph, analyze_liveness(graph, include_inputs=plain.include_inputs,
                                                    python_refs=True),
                            fwd, blocks, node_flops, plain.timeline)
        target = budget
        for _ in range(6):   # lower the target by each shortfall of the model
            ranges = cheapest_plan(table, target)
            if ranges is None:
                break
            segs = plan_segments(table, ranges)
            got = step(segs)
            if got.peak_bytes <= budget:
                return _plan("auto", segs, plain, got, node_flops, budget)
            target -= got.peak_bytes - budget
    return _auto_greedy(graph, fwd, plain, budget, step, node_flops, floor)


def _auto_greedy(graph, fwd, plain, budget, step, node_flops, floor) -> CheckpointPlan:
    """Greedy over the repeated blocks: checkpoint the blocks that free the most memory per
    recomputed FLOP first, and stop at the first plan whose peak fits the budget."""
    blocks = repeated_blocks(graph, fwd)
    segs = segments_by_name(graph, fwd, blocks) if blocks else []
    scored = []
    for seg in segs:
        saved = plain.peak_bytes - step([seg]).peak_bytes
        scored.append((-saved / max(1, sum(node_flops[i] for i in seg.nodes)), seg))
    scored.sort(key=lambda t: t[0])
    chosen: list[Segment] = []
    best = plain
    for _, seg in scored:
        chosen.append(seg)
        best = step(chosen)
        if best.peak_bytes <= budget:
            return _plan("auto", chosen, plain, best, node_flops, budget)
    # the most any plan over the blocks frees: every block checkpointed as one segment
    whole = step([merge("all", segs)]) if segs else plain
    lowest = min(best.peak_bytes, whole.peak_bytes)
    raise GraphcostError(f"no checkpoint plan fits {budget:,} B: checkpointing the repeated "
                         f"blocks reaches {lowest:,} B at best (parameters, gradients and "
                         f"optimizer state take {floor:,} B)")


def what_ifs(graph: Graph, optimizer: str, node_flops: list[int], precision: str,
             include_inputs: bool = True, impl: str = "forloop") -> dict[str, WhatIf]:
    """The step's peak under the usual memory savers, each by re-running the passes on the
    same joint graph: in-place activations, the bf16 master-weights recipe (re-typing the
    graph; autocast would need another trace), and checkpointing every repeated block."""
    from .precision import cast_floats, master_weights

    mixed = master_weights(precision)

    def of(t: TrainingMemory, recompute: int | None = None) -> WhatIf:
        return WhatIf(t.peak_bytes, t.peak_phase, t.peak_node, recompute)

    out = {"inplace_activations": of(training_memory(
        graph, optimizer, master_weights=mixed, inplace=True, include_inputs=include_inputs,
        impl=impl))}
    if precision == "fp32":
        out["bf16_master"] = of(training_memory(cast_floats(graph, "bf16-master"), optimizer,
                                               master_weights=True, impl=impl,
                                               include_inputs=include_inputs))
    if repeated_blocks(graph, forward_set(graph)):
        plan = plan_checkpoints(graph, optimizer, node_flops, every=1, master_weights=mixed,
                                include_inputs=include_inputs, impl=impl)
        out["checkpoint_every_block"] = of(plan.checkpointed, plan.recompute_flops)
    return out


def training_step(graph: Graph, optimizer: str, node_flops: list[int], *,
                  precision: str = "fp32", checkpoint: CheckpointSpec | None = None,
                  what_if: bool = True, include_inputs: bool = True,
                  impl: str = "forloop",
                  allocator: AllocatorConfig | None = None,
                  device: "DeviceRates | None" = None) -> TrainingMemory:
    """The training section of a report: the step's memory, with the checkpoint plan asked
    for and the what-ifs (``graph`` already re-typed by passes.precision for mixed precision,
    whose fp32 master side is added here); on a GPU ``device`` the reserved replay holds the
    cuBLAS workspaces and the kernels' temporaries (passes.gpu_workspaces)."""
    from .gpu_workspaces import gpu_workspaces
    from .precision import master_weights
    from .training_reserved import training_reserved

    mixed = master_weights(precision)
    t = training_memory(graph, optimizer, master_weights=mixed, include_inputs=include_inputs,
                        impl=impl)
    plan = plan_checkpoints(graph, optimizer, node_flops, master_weights=mixed,
                            include_inputs=include_inputs, impl=impl,
                            names=list(checkpoint.names) if checkpoint.names else None,
                            every=checkpoint.every, sqrt=checkpoint.sqrt,
                            budget=checkpoint.budget) if checkpoint else None
    savers = what_ifs(graph, optimizer, node_flops, precision, include_inputs, impl) \
        if what_if else {}
    ws = gpu_workspaces(graph, device, t.forward_nodes) if device is not None else None
    reserved, phases = (None, ()) if plan else \
        training_reserved(graph, t, mixed, allocator, ws)
    return replace(t, checkpoint=plan, what_if=savers, reserved_peak_bytes=reserved,
                   reserved_by_phase=phases)

