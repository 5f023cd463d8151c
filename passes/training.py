"""Training-step memory over the joint forward+backward graph.

Memory of one steady-state training step (optimizer state already allocated by earlier steps,
gradients freed by ``zero_grad(set_to_none=True)`` before the step):

  persistent  = parameters + buffers + optimizer state
  joint graph = activations (kept for backward or transient) + gradients as backward produces
                them; liveness over the real backward schedule (dataflow lifetimes: autograd
                frees a saved tensor once its last backward consumer ran), gradients live on to
                the optimizer step
  step        = gradients + the optimizer step's temporaries

Optimizer state: sgd 0, momentum 1×, adam/adamw 2× the parameters, plus Adam's per-tensor
``step`` counter (a 4-byte float32 scalar each). Step temporaries follow PyTorch's default
single-tensor (for-loop) implementation used on CPU: SGD and momentum update in place (none);
Adam/AdamW compute ``exp_avg_sq.sqrt() / bias_correction`` into two tensors the size of the
parameter being updated, so 2 × the largest parameter tensor. (GPU foreach/fused
implementations differ; not modelled.)
"""
from __future__ import annotations

from dataclasses import dataclass

from analyzer.errors import GraphcostError
from analyzer.ir import Graph, ValueKind
from passes.liveness import analyze_liveness

STATE_MULTIPLIER = {"none": 0, "sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class TrainingMemory:
    optimizer: str
    param_bytes: int
    buffer_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    step_temp_bytes: int
    peak_bytes: int
    peak_phase: str                 # forward | backward | optimizer
    peak_node: str | None           # the joint-graph node at the peak (None: optimizer step)
    breakdown: dict[str, int]       # at the peak: params, buffers, optimizer_state,
                                    # gradients, activations, temporaries
    timeline: tuple[int, ...]       # total bytes at each joint node, then at the optimizer step
    phases: tuple[str, ...]         # the phase of each timeline point
    forward_nodes: int


def forward_set(graph: Graph) -> set[int]:
    """Indices of the nodes the loss (the graph's first output) depends on: the forward."""
    producer = {name: v.producer for name, v in graph.values.items() if v.producer is not None}
    todo = [producer[graph.outputs[0]]] if graph.outputs and graph.outputs[0] in producer else []
    seen: set[int] = set()
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        for name in graph.nodes[i].inputs:
            j = producer.get(name)
            if j is not None and j not in seen:
                todo.append(j)
    return seen


def training_memory(graph: Graph, optimizer: str = "adam") -> TrainingMemory:
    if optimizer not in STATE_MULTIPLIER:
        raise GraphcostError(f"unknown optimizer {optimizer!r}; known: "
                             + ", ".join(STATE_MULTIPLIER))
    params = [v for v in graph.values.values() if v.kind == ValueKind.PARAM]
    param_bytes = sum(v.spec.nbytes or 0 for v in params)
    buffer_bytes = sum(v.spec.nbytes or 0 for v in graph.values.values()
                       if v.kind == ValueKind.BUFFER)
    grads = set(graph.outputs[1:])
    grad_bytes = sum(graph.values[g].spec.nbytes or 0 for g in grads)
    state = STATE_MULTIPLIER[optimizer] * param_bytes
    if optimizer in ("adam", "adamw"):
        state += 4 * len(params)
        temp = 2 * max((v.spec.nbytes or 0 for v in params), default=0)
    else:
        temp = 0
    persistent = param_bytes + buffer_bytes + state

    live = analyze_liveness(graph, include_inputs=False)
    fwd = forward_set(graph)
    timeline = [persistent + b for b in live.timeline]
    phases = ["forward" if i in fwd else "backward" for i in range(len(graph.nodes))]
    step_total = persistent + grad_bytes + temp
    timeline.append(step_total)
    phases.append("optimizer")
    peak_i = max(range(len(timeline)), key=timeline.__getitem__)
    if peak_i == len(graph.nodes):
        breakdown = dict(gradients=grad_bytes, activations=0, temporaries=temp)
        node = None
    else:
        at = live.live_at(peak_i)
        g = sum(s.nbytes for s in at if s.name in grads)
        breakdown = dict(gradients=g, activations=sum(s.nbytes for s in at) - g, temporaries=0)
        node = graph.nodes[peak_i].name
    breakdown = dict(params=param_bytes, buffers=buffer_bytes, optimizer_state=state,
                     **breakdown)
    return TrainingMemory(optimizer, param_bytes, buffer_bytes, grad_bytes, state, temp,
                          timeline[peak_i], phases[peak_i], node, breakdown, tuple(timeline),
                          tuple(phases), len(fwd))
