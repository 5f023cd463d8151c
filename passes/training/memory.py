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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from ..choices import Optimizer, OptimizerImpl
from ..errors import GraphcostError, opt
from ..ir import INTERNAL, Graph, ValueKind
from ..memory.liveness import analyze_liveness
from ..memory.peak import Peak
from .checkpoint import Segment, checkpointed_storages, timeline_of
from .optimizer import (
    STATE_MULTIPLIER,
    optimizer_tensors,
    step_temporaries,
    trainable_params,
)

if TYPE_CHECKING:
    from ..device.fits import Flushing
    from ..memory.allocator_events import PhaseReserve


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
    # the forward nodes run again in backward (a collective among them runs again too)
    recomputed: frozenset[int] = field(default=frozenset(), metadata=INTERNAL)
    # the checkpointed step's two steps replayed through the caching allocator
    # (passes/training/reserved.py)
    reserved_peak_bytes: int | None = None


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
    # schedule (passes.memory.allocator_events; None: not modelled, as under a checkpoint plan)
    reserved_peak_bytes: int | None = None
    # what it had reserved by the end of each phase: the parameters, then each step's forward,
    # backward and optimizer step (passes/training/reserved.py)
    reserved_by_phase: "tuple[PhaseReserve, ...]" = ()
    # with a device, where the two steps reserve more than it leaves the allocator: the replay
    # held to it, the allocator emptying its cache (passes/device/fits.py Flushing; None: no
    # need, or out of memory even so)
    flushing: "Flushing | None" = None
    forward_nodes: int = field(default=0, metadata=INTERNAL)
    storages: tuple = field(default=(), metadata=INTERNAL)  # the step's lifetimes (liveness)
    # each gradient -> the storage it lives in, by name: a gradient is often a view (a
    # transposed mm output, a vocabulary-parallel embedding's rows of its whole gradient),
    # whose storage liveness names after the value that allocated it
    grad_storage_of: Mapping[str, str] = field(default_factory=dict, metadata=INTERNAL)
    # the loss the step backpropagates, in words (the joint graph's: Graph.loss)
    loss: str = ""
    JSON_PROPERTIES = ("peak",)

    @property
    def grad_storages(self) -> frozenset[str]:
        """The storages the gradients live in, by name."""
        return frozenset(self.grad_storage_of.values())

    @property
    def run(self) -> "TrainingMemory":
        """The step that runs: the checkpointed one under a checkpoint plan, else this one."""
        return self.checkpoint.checkpointed if self.checkpoint is not None else self

    @property
    def peak(self) -> Peak:
        """The step's peak (passes/memory/peak.py): the step that runs (the checkpointed one
        under a checkpoint plan) against its two-step reserved replay."""
        if self.checkpoint is not None:
            return self.run.peak
        return Peak(allocated_bytes=self.peak_bytes, reserved_bytes=self.reserved_peak_bytes,
                    phase=self.peak_phase, node=self.peak_node, flushing=self.flushing,
                    by_category=dict(self.breakdown_at_peak), threads=2)


def forward_set(graph: Graph) -> set[int]:
    """The forward: every node up to the one producing the loss (the graph's first output).
    AOTAutograd's joint graph runs the whole forward, including the detaches of tensors saved
    for backward, before the first backward op."""
    v = graph.values.get(graph.outputs[0]) if graph.outputs else None
    last = v.producer if v is not None and v.producer is not None else -1
    return set(range(last + 1))


def _grad_bytes(storage_of: Mapping[str, str], values, live) -> int:
    """The bytes the gradients hold: each storage they live in once (a vocabulary-parallel
    embedding's gradient: the rank's rows of a whole table the rank keeps)."""
    size = {st.name: st.nbytes for st in live.storages}
    held = {name: size.get(name, values[g].spec.nbytes or 0) for g, name in storage_of.items()}
    return sum(held.values())


# long: one schedule of the step's tensors (params, grads, state, temporaries)
def training_memory(graph: Graph, optimizer: str = Optimizer.ADAM,
                    segments: list[Segment] | None = None,
                    master_weights: bool = False, inplace: bool = False,
                    include_inputs: bool = True, impl: str = "forloop") -> TrainingMemory:
    """``master_weights``: the graph runs in half precision (passes.training.precision) and the
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
    storage_of = {g: live.storages[of[g]].name if g in of else g for g in grads}
    grad_storages = frozenset(storage_of.values())
    grad_bytes = _grad_bytes(storage_of, values, live)
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
        grad_storage_of=storage_of)
