"""Per-stage memory of pipeline parallelism (``torch.distributed.pipelining``): each stage's
program traced at the micro-batch (analyzer/frontends/torch/pipeline_stages.py), its step
laid out by the schedule.

From a stage's single micro-batch step (passes/training/step.py) come: what its forward
leaves saved for the backward (``saved``: the storages made in forward that live into
backward), its forward's and backward's own curves (activations and temporaries node by node,
the gradients apart), its parameters, buffers, gradients and optimizer state. The schedule
orders the micro-batches' forwards (F) and backwards (B) on the stage:

* ``gpipe`` (``ScheduleGPipe``): every forward, then every backward — all m micro-batches'
  saved tensors in flight on every stage;
* ``1f1b`` (``Schedule1F1B``): ``min(m, p − i)`` forwards on stage ``i`` (its warm-up), then a
  backward and a forward in turn, then the remaining backwards — at most ``p − i`` in flight.

At each F or B the stage holds: parameters, buffers and optimizer state; the gradients once a
backward has made them (later backwards accumulate into them); each in-flight micro-batch's
saved tensors, its received input (a non-first stage's hidden states) and its output (a
non-last stage: the root of its backward, ``PipelineStage.fwd_cache``); during a B the
gradient received from the next stage (a non-last stage); on the last stage every finished
micro-batch's output (the logits: ``PipelineStage.output_chunks``, returned by
``schedule.step()``) until the step ends, when ``_merge_outputs`` concatenates them. The stage's
peak is the largest of those moments and of the optimizer step. Nothing else of the
library's is counted (its send and receive buffers beyond those tensors).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..choices import Choice
from ..errors import GraphcostError, opt
from ..ir import FLOAT_DTYPES, Graph, ValueKind
from ..memory.peak import Peak
from ..training.checkpoint import timeline_of
from ..training.memory import TrainingMemory, forward_set


class Schedule(Choice):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage's rank: its blocks, its peak and what sets it."""
    stage: int
    layers: tuple[int, int]         # the blocks it runs: [first, last + 1)
    peak_bytes: int
    in_flight: int                  # micro-batches whose saved tensors it holds at most
    saved_bytes: int                # what one micro-batch's forward leaves for its backward
    param_bytes: int
    optimizer_state_bytes: int
    grad_bytes: int
    output_bytes: int               # the last stage: one micro-batch's output, kept to the end
    # the peak by category, summing to it: activations are everything the micro-batches hold
    # (saved tensors, inputs, outputs, temporaries; the first backward's new gradients)
    breakdown_at_peak: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StageStep:
    """What the schedule needs of one stage's traced micro-batch step."""
    static: int                     # parameters, buffers, optimizer state
    params: int
    optimizer_state: int
    grads: int
    saved: int
    forward_peak: int               # activations and temporaries, forward
    first_backward_peak: int        # with the gradients it makes
    backward_peak: int              # without them (a later backward accumulates)
    step_temporaries: int
    input_bytes: int                # the received hidden states (0 on the first stage)
    output_bytes: int               # what it sends (or, last, the logits it keeps)


def stage_step(graph: Graph, t: TrainingMemory, first: bool, last: bool) -> StageStep:
    """The stage's micro-batch step, read off its traced training step."""
    n, fe = len(graph.nodes), len(forward_set(graph))
    grads = [st for st in t.storages if st.name in t.grad_storages]
    others = [st for st in t.storages if st.name not in t.grad_storages]
    # (node by node; a storage living into the optimizer step ends at index n)
    nongrad, grad = timeline_of(others, n + 1)[:n], timeline_of(grads, n + 1)[:n]
    saved = sum(st.nbytes for st in others if st.birth < fe <= st.death)
    buffers = sum(v.spec.nbytes or 0 for v in graph.values.values() if v.kind == ValueKind.BUFFER)
    inputs = [v.spec.nbytes or 0 for v in graph.values.values()
              if v.kind == ValueKind.INPUT and v.spec.dtype in FLOAT_DTYPES]
    return StageStep(
        static=t.param_bytes + buffers + t.optimizer_state_bytes, params=t.param_bytes,
        optimizer_state=t.optimizer_state_bytes, grads=t.grad_bytes,
        saved=saved, forward_peak=max(nongrad[:fe], default=0),
        first_backward_peak=max((nongrad[k] + grad[k] for k in range(fe, n)), default=0),
        backward_peak=max(nongrad[fe:], default=0), step_temporaries=t.step_temp_bytes,
        input_bytes=0 if first else sum(inputs),
        output_bytes=_output_bytes(graph, fe, last))


def _output_bytes(graph: Graph, fe: int, last: bool) -> int:
    """The stage's output: the hidden states it sends (the forward's last float output) or,
    on the last stage, the logits the loss reads (the largest tensor its forward makes)."""
    made = [graph.values[o].spec.nbytes or 0 for node in graph.nodes[:fe] for o in node.outputs
            if o in graph.values]
    if last:
        return max(made, default=0)
    # the loss traced for a non-last stage sums its output: that sum's input is what it sends
    loss = graph.outputs[0] if graph.outputs else ""
    summed = next((n for n in graph.nodes[:fe] if loss in n.outputs), None)
    source = summed.inputs[0] if summed is not None and summed.inputs else ""
    return (graph.values[source].spec.nbytes or 0) if source in graph.values else 0


def stage_layers(n_layers: int, stage: int, stages: int) -> range:
    """The blocks stage ``stage`` of ``stages`` runs: an even share, the remainder to the
    first stages."""
    per, extra = divmod(n_layers, stages)
    start = stage * per + min(stage, extra)
    return range(start, start + per + (1 if stage < extra else 0))


def events(schedule: str, stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """The stage's forwards and backwards in the order the schedule runs them."""
    if schedule == Schedule.GPIPE:
        return [("F", j) for j in range(micro)] + [("B", j) for j in range(micro)]
    warm = min(micro, stages - stage)
    out, f = [("F", j) for j in range(warm)], warm
    for b in range(micro):
        out.append(("B", b))
        if f < micro:
            out.append(("F", f))
            f += 1
    return out


def stage_peak(s: StageStep, schedule: str, stage: int, stages: int,
               micro: int) -> tuple[int, int, int]:
    """(the stage's peak over the step, the most micro-batches it holds at once, the
    gradients held whole at the peak: 0 where it is the first backward, whose curve makes
    them)."""
    last = stage == stages - 1
    kept_each = s.output_bytes if last else 0
    # a non-last stage keeps each in-flight micro-batch's output (the root of its backward,
    # PipelineStage.fwd_cache) and receives its gradient for the backward
    sent = 0 if last else s.output_bytes
    each = s.saved + s.input_bytes + sent
    held: set[int] = set()
    kept = backwards = most = 0
    moments = []   # (bytes, gradients held whole)
    for op, j in events(schedule, stage, stages, micro):
        grads = s.grads if backwards else 0
        if op == "F":
            moments.append((s.static + kept * kept_each + len(held) * each + s.input_bytes +
                            grads + s.forward_peak, grads))
            held.add(j)
            kept += 1 if last else 0
        else:
            held.discard(j)   # (its saved tensors are in its backward's curve)
            moments.append((s.static + kept * kept_each + len(held) * each + s.input_bytes +
                            2 * sent + grads + (s.backward_peak if backwards
                                                else s.first_backward_peak), grads))
            backwards += 1
        most = max(most, len(held))
    moments += [(s.static + s.grads + 2 * micro * kept_each, s.grads),  # the outputs' cat
                (s.static + s.grads + s.step_temporaries, s.grads)]     # the optimizer step
    peak, grads = max(moments)
    return peak, most, grads


def check_schedule(schedule: str, micro: int, stages: int) -> None:
    if schedule not in Schedule.words():
        raise GraphcostError(f"{opt('parallel.schedule', value=schedule)}: known: "
                             f"{', '.join(Schedule.words())}")
    if not isinstance(micro, int) or micro < 1:
        raise GraphcostError(f"{opt('parallel.microbatches', value=micro)}: a whole number ≥ 1")
    if schedule == Schedule.ONE_F_ONE_B and micro < stages:
        raise GraphcostError(f"{opt('parallel.microbatches', value=micro)}: 1F1B needs at least "
                             f"as many micro-batches as stages ({stages})")


@dataclass(frozen=True)
class PipelineMemory:
    """The report's ``pipeline`` section: every stage's rank under the schedule."""
    schedule: str
    stages: int
    microbatches: int
    micro_batch: int                # sequences in a micro-batch
    per_rank_batch: int             # micro_batch × microbatches: a stage's batch per step
    per_stage: tuple[StageMemory, ...]
    bubble: float                   # (p − 1) / (m + p − 1): the idle share of an even pipeline
    JSON_PROPERTIES = ("peak_bytes", "worst_stage", "unevenness", "peak")

    @property
    def worst_stage(self) -> int:
        return max(self.per_stage, key=lambda s: s.peak_bytes).stage

    @property
    def peak_bytes(self) -> int:
        return max(s.peak_bytes for s in self.per_stage)

    @property
    def unevenness(self) -> float:
        """The largest stage's peak over the smallest's, less 1."""
        low = min(s.peak_bytes for s in self.per_stage)
        return self.peak_bytes / low - 1 if low else 0.0

    @property
    def peak(self) -> Peak:
        """The worst stage's peak (no allocator replay for a stage: reserved not known)."""
        s = self.per_stage[self.worst_stage]
        return Peak(allocated_bytes=s.peak_bytes, reserved_bytes=None, phase="backward",
                    node=None, threads=2, world_size=self.stages,
                    by_category=dict(s.breakdown_at_peak))


def pipeline_memory(steps: list[tuple[StageStep, tuple[int, int]]], schedule: str,
                    micro: int, micro_batch: int) -> PipelineMemory:
    """Every stage's peak under ``schedule`` with ``micro`` micro-batches: ``steps`` gives each
    stage's micro-batch step and its blocks."""
    p = len(steps)
    check_schedule(schedule, micro, p)
    stages = []
    for i, (s, layers) in enumerate(steps):
        peak, most, grads = stage_peak(s, schedule, i, p, micro)
        parts = {"params": s.params, "buffers": s.static - s.params - s.optimizer_state,
                 "optimizer_state": s.optimizer_state, "gradients": grads}
        parts["activations"] = peak - sum(parts.values())
        stages.append(StageMemory(i, layers, peak, most, s.saved, s.params, s.optimizer_state,
                                  s.grads, s.output_bytes if i == p - 1 else 0, parts))
    return PipelineMemory(schedule, p, micro, micro_batch, micro_batch * micro, tuple(stages),
                          round((p - 1) / (micro + p - 1), 4))
