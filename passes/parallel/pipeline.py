"""Per-stage memory of pipeline parallelism (``torch.distributed.pipelining``): each stage's
program traced at the micro-batch (analyzer/frontends/torch/pipeline_stages.py), its step
laid out by the schedule.

From a stage's single micro-batch step (passes/training/step.py) come: what its forward
leaves saved for the backward (``saved``: the storages made in forward that live into
backward), its forward's and backward's own curves (activations and temporaries node by node,
the gradients apart), its parameters, buffers, gradients and optimizer state. The schedule
orders the micro-batches' forwards (F) and backwards (B) on the stage (passes/parallel/
schedules.py: GPipe, 1F1B, interleaved 1F1B's rank of several stages).

At each F or B the stage holds: parameters, buffers and optimizer state; the gradients once a
backward has made them (later backwards accumulate into them); each in-flight micro-batch's
saved tensors, its received input (a non-first stage's hidden states) and its output (a
non-last stage: the root of its backward, ``PipelineStage.fwd_cache``); during a B the
gradient received from the next stage (a non-last stage); on the last stage every finished
micro-batch's output (the logits: ``PipelineStage.output_chunks``, returned by
``schedule.step()``) until the step ends, when ``_merge_outputs`` concatenates them. Under a
zero-bubble schedule a backward is its input half (I) and, later, its weight half (W)
(passes/parallel/zero_bubble.py): from one to the other the micro-batch holds what its I left
for its W (the retained graph's saved tensors, the captured gradients), its input, output and
received gradient. The stage's peak is the largest of those moments and of the optimizer
step. Nothing else of the library's is counted (its send and receive buffers beyond those
tensors).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import prod
from typing import TYPE_CHECKING, Mapping

from ..ir import FLOAT_DTYPES, Graph, ValueKind
from ..memory.caching_allocator import AllocatorConfig
from ..memory.peak import Peak
from ..training.checkpoint import timeline_of
from ..training.memory import TrainingMemory, forward_set
from .comm import CommVolume
from .mesh import CARVED
from .pipeline_reserved import StageTrace, stage_trace, stages_reserved
from .pipeline_shards import Shards, sharded
from .schedules import Order, check_schedule, events, rank_stages
from .zero_bubble import split_figures

if TYPE_CHECKING:
    from ..device_rates import DeviceRates


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
    # an interleaved schedule's rank (``stage`` is then the rank): the blocks of each of its
    # stages, ``layers`` the first's (its other figures sum its stages')
    chunks: tuple[tuple[int, int], ...] = ()
    # what PyTorch's CUDA caching allocator reserves over two steps of the rank
    # (passes/parallel/pipeline_reserved.py); extrapolated: a stage of the rank is longer
    # than its trace, its replay's reserved-to-allocated ratio applied to the peak
    reserved_bytes: int | None = None
    reserved_extrapolated: bool = False


@dataclass(frozen=True)
class StageStep:
    """What the schedule needs of one stage's traced micro-batch step (the stage's rank:
    under fully_shard, its shards; see ``sharded``)."""
    static: int                     # parameters (or their shards), buffers, optimizer state
    params: int
    optimizer_state: int
    grads: int                      # held from the first backward on (accumulated)
    saved: int
    forward_peak: int               # activations and temporaries, forward
    first_backward_peak: int        # with the gradients it makes
    backward_peak: int              # a later one's: each new gradient until it is added in
    step_temporaries: int
    input_bytes: int                # the received hidden states (0 on the first stage)
    output_bytes: int               # what it sends (or, last, the logits it keeps)
    # fully_shard in a pipeline (``sharded``): the gathered parameters held from the first
    # forward to the reduce after the last backward, the first forward's all-gather buffer,
    # the reduce-scatter input, and the sharded gradients the optimizer steps on
    gathered: int = 0
    gather_buffer: int = 0
    reduce_input: int = 0
    step_grads: int | None = None   # None: ``grads``
    # its collectives a step: the all-gathers' outputs and the reduce-scatters' inputs (both
    # padded), and their calls
    all_gather: int = 0
    reduce_scatter: int = 0
    gather_calls: int = 0
    reduce_calls: int = 0
    # of those, the experts' units' (over efsdp: world · tp / ep ranks), and their calls
    expert_gather: int = 0
    expert_reduce: int = 0
    expert_calls: int = 0
    # what the allocator's replay reads of the traced step (passes/parallel/
    # pipeline_reserved.py): its trace, or a long stage's longer short one and the blocks it
    # has more than that
    trace: StageTrace | None = None
    more: int = 0
    # a zero-bubble schedule's split backward (passes/parallel/zero_bubble.py; the step traced
    # with its backward in the order I, then W): W's first node; I's peak; what a micro-batch
    # holds between its I and its W (the retained graph's saved tensors and the captured
    # gradients); W's peak, the first W's (its gradients made) and a later one's; the weight
    # gradients I makes (a fused grouped matmul's experts') and the first I's peak with them
    split: int | None = None
    input_grads: int = 0
    first_input_peak: int = 0
    input_peak: int = 0
    between: int = 0
    first_weight_peak: int = 0
    weight_peak: int = 0


def stage_step(graph: Graph, t: TrainingMemory, first: bool, last: bool,
               shards: Shards | None = None, device: "DeviceRates | None" = None,
               split: int | None = None) -> StageStep:
    """The stage's micro-batch step, read off its traced training step (``shards``: its rank
    under fully_shard, passes ``sharded``; ``device``: a CUDA device, whose kernels'
    workspaces its allocator replay holds; ``split``: a zero-bubble schedule's, its backward
    I's nodes then W's from this index, passes/parallel/zero_bubble.py)."""
    n, fe = len(graph.nodes), len(forward_set(graph))
    grads = [st for st in t.storages if st.name in t.grad_storages]
    others = [st for st in t.storages if st.name not in t.grad_storages]
    # (node by node; a storage living into the optimizer step ends at index n)
    nongrad, grad = timeline_of(others, n + 1)[:n], timeline_of(grads, n + 1)[:n]
    # a later backward's new gradients: each added into the one held (AccumulateGrad, run as
    # soon as it is made), alive at its own node only
    made = timeline_of([replace(st, death=st.birth) for st in grads], n + 1)[:n]
    buffers = sum(v.spec.nbytes or 0 for v in graph.values.values() if v.kind == ValueKind.BUFFER)
    inputs = [v.spec.nbytes or 0 for v in graph.values.values()
              if v.kind == ValueKind.INPUT and v.spec.dtype in FLOAT_DTYPES]
    master_copy = t.breakdown_at_peak.get("master_weights", 0)
    output = _output_value(graph, fe, last)
    out_bytes = (graph.values[output].spec.nbytes or 0) if output in graph.values else 0
    input_bytes = 0 if first else sum(inputs)
    step = StageStep(
        static=t.param_bytes + master_copy + buffers + t.optimizer_state_bytes,
        params=t.param_bytes + master_copy, optimizer_state=t.optimizer_state_bytes,
        grads=t.grad_bytes, saved=sum(st.nbytes for st in others if st.birth < fe <= st.death),
        forward_peak=max(nongrad[:fe], default=0),
        first_backward_peak=max((nongrad[k] + grad[k] for k in range(fe, n)), default=0),
        backward_peak=max((nongrad[k] + made[k] for k in range(fe, n)), default=0),
        step_temporaries=t.step_temp_bytes,
        input_bytes=input_bytes, output_bytes=out_bytes,
        trace=stage_trace(graph, t, input_bytes, output, out_bytes, device, split))
    if split is not None:
        step = replace(step, **split_figures(
            split, fe, nongrad, grad, made,
            sum(st.nbytes for st in others if st.birth < split <= st.death)))
    return step if shards is None else sharded(step, graph, t, shards, nongrad)


def _output_value(graph: Graph, fe: int, last: bool) -> str:
    """The stage's output: the hidden states it sends (the forward's last float output) or,
    on the last stage, the logits the loss reads: the last tensor the stage's module makes
    (``LastStage``'s own nodes, the loss, are at the root scope), in the dtype it makes them
    (a master recipe's half logits; the loss upcasts a copy)."""
    if last:
        made = [node.outputs[0] for node in graph.nodes[:fe]
                if node.scope.startswith("stage") and node.outputs and node.outputs[0]]
        return made[-1] if made else ""
    # the loss traced for a non-last stage sums its output: that sum's input is what it sends
    loss = graph.outputs[0] if graph.outputs else ""
    summed = next((n for n in graph.nodes[:fe] if loss in n.outputs), None)
    return summed.inputs[0] if summed is not None and summed.inputs else ""


def rank_peak(steps: list[StageStep], lasts: list[bool], order: Order,
              micro: int) -> tuple[dict[str, int], int]:
    """(what a rank running ``steps`` — its stages, ``lasts`` saying which is the pipeline's
    last — holds at its peak over the step ``order`` runs, by category; the most micro-batches
    it holds at once)."""
    def sent(k: int) -> int:   # a non-last stage keeps each in-flight micro-batch's output
        return 0 if lasts[k] else steps[k].output_bytes   # (PipelineStage.fwd_cache)

    def each(k: int) -> int:
        return steps[k].saved + steps[k].input_bytes + sent(k)

    kept_each = sum(st.output_bytes for st, last in zip(steps, lasts) if last)
    state = {"buffers": sum(st.static - st.params - st.optimizer_state for st in steps),
             "optimizer_state": sum(st.optimizer_state for st in steps)}
    params = sum(st.params + st.gathered for st in steps)
    held: list[set[int]] = [set() for _ in steps]
    waiting: list[set[int]] = [set() for _ in steps]   # (after their I, before their W)
    backwards = [0] * len(steps)
    inputs = [0] * len(steps)   # (a zero-bubble stage's I halves run: their gradients held)
    kept = most = 0
    moments = []
    for k, op, j in order:
        s = steps[k]
        grads = sum(st.grads if b else st.input_grads * bool(i)   # (a first B makes its)
                    for st, b, i in zip(steps, backwards, inputs))
        if op == "F":
            acts = s.forward_peak + (s.gather_buffer if j == 0 else 0) - each(k)
            held[k].add(j)
        elif op == "I":   # (a zero-bubble schedule's: its saved tensors in I's curve, then
            held[k].discard(j)   # what W needs held to it)
            acts = 2 * sent(k) + (s.input_peak if inputs[k] or backwards[k]
                                  else s.first_input_peak)
            inputs[k] += 1
        elif op == "W":
            waiting[k].discard(j)
            acts = 2 * sent(k) + (s.weight_peak if backwards[k] else s.first_weight_peak)
            backwards[k] += 1
        else:
            held[k].discard(j)   # (its saved tensors are in its backward's curve)
            acts = 2 * sent(k) + (s.backward_peak if backwards[k] else s.first_backward_peak)
            backwards[k] += 1
        flight = sum(len(h) * each(i) for i, h in enumerate(held)) + \
            sum(len(w) * (steps[i].between + steps[i].input_bytes + 2 * sent(i))
                for i, w in enumerate(waiting))
        moments.append({**state, "params": params, "gradients": grads,
                        "activations": kept * kept_each + flight + s.input_bytes + acts})
        kept += 1 if op == "F" and lasts[k] else 0
        if op == "I":
            waiting[k].add(j)
        most = max(most, sum(map(len, held)) + sum(map(len, waiting)))
    moments += _after_backwards(steps, state, micro * kept_each)
    return max(moments, key=lambda d: sum(d.values())), most


def _after_backwards(steps: list[StageStep], state: dict[str, int],
                     outputs: int) -> list[dict[str, int]]:
    """A rank's moments after its last backward (``state``: its buffers and optimizer state;
    ``outputs``: the last stage's kept outputs of every micro-batch): fully_shard's reduce,
    the outputs' cat, the optimizer step."""
    params = sum(st.params + st.gathered for st in steps)
    step_grads = sum(st.grads if st.step_grads is None else st.step_grads for st in steps)
    shards = sum(st.params for st in steps)
    out = []
    if any(st.gathered for st in steps):   # fully_shard's reduce after the last backward
        out.append({**state, "params": params, "gradients": sum(st.grads for st in steps),
                    "activations": outputs + max(st.reduce_input for st in steps)})
    return out + [{**state, "params": shards, "gradients": step_grads,   # the outputs' cat
                   "activations": 2 * outputs},
                  {**state, "params": shards, "gradients": step_grads,   # the optimizer step
                   "activations": sum(st.step_temporaries for st in steps)}]


@dataclass(frozen=True)
class PipelineMemory:
    """The report's ``pipeline`` section: every stage's rank under the schedule."""
    schedule: str
    stages: int
    microbatches: int
    micro_batch: int                # sequences in a micro-batch
    per_rank_batch: int             # micro_batch × microbatches: a stage's batch per step
    per_stage: tuple[StageMemory, ...]
    bubble: float                   # (p − 1) / (v·m + p − 1): the idle share of an even pipeline
    # the whole layout (passes/parallel/mesh.py) and the worst stage's rank's collectives a
    # step, by mesh dimension (passes/parallel/pipeline_comm.py)
    mesh: Mapping[str, int] = field(default_factory=dict)
    comm: CommVolume | None = None
    # an interleaved schedule's stages a rank (``stages`` counts ranks, ``per_stage`` holds them)
    stages_per_rank: int = 1
    JSON_PROPERTIES = ("peak_bytes", "reserved_bytes", "worst_stage", "unevenness", "peak")

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
    def gpus(self) -> int:
        """The GPUs the pipeline runs on (ep carved out of the data ranks: no factor)."""
        return prod(n for k, n in self.mesh.items() if k not in CARVED) or self.stages

    @property
    def reserved_bytes(self) -> int | None:
        """The most a stage's rank reserves (None: not replayed)."""
        found = [s.reserved_bytes for s in self.per_stage]
        return None if None in found else max(r for r in found if r is not None)

    @property
    def peak(self) -> Peak:
        """The worst stage's peak, with the most a rank reserves (the fit's: the ranks'
        orders of allocated and reserved bytes can differ)."""
        s = self.per_stage[self.worst_stage]
        return Peak(allocated_bytes=s.peak_bytes, reserved_bytes=self.reserved_bytes,
                    phase="backward", node=None, threads=2, world_size=self.gpus,
                    by_category=dict(s.breakdown_at_peak))


def pipeline_memory(steps: list[tuple[StageStep, tuple[int, int]]], schedule: str,
                    micro: int, micro_batch: int, orders: list[Order] | None = None,
                    allocator: AllocatorConfig = AllocatorConfig()) -> PipelineMemory:
    """Every stage's peak under ``schedule`` with ``micro`` micro-batches: ``steps`` gives each
    stage's micro-batch step and its blocks. An interleaved schedule's ``orders`` give each
    rank's (its stages: every ``len(orders)``-th from its rank's, or zbv's V: schedules.py
    ``rank_stages``), and its entries are ranks.
    Each rank's reserved bytes are its replay on ``allocator``."""
    p = len(orders) if orders else len(steps)
    v = len(steps) // p
    check_schedule(schedule, micro, p, v)
    orders = orders or [[(0, op, j) for op, j in events(schedule, i, p, micro)]
                        for i in range(p)]
    ranks = []
    for r, order in enumerate(orders):
        held = rank_stages(schedule, r, p, v)
        local = [steps[i] for i in held]
        lasts = [i == len(steps) - 1 for i in held]
        parts, most = rank_peak([st for st, _ in local], lasts, order, micro)
        grown = any(st.more for st, _ in local)   # (a stage longer than its trace)
        reserved = stages_reserved([st.trace for st, _ in local], lasts, order, micro,
                                   sum(parts.values()), grown, allocator)
        ranks.append(StageMemory(
            r, local[0][1], sum(parts.values()), most, sum(st.saved for st, _ in local),
            sum(st.params for st, _ in local), sum(st.optimizer_state for st, _ in local),
            sum(st.grads for st, _ in local),
            sum(st.output_bytes for (st, _), last in zip(local, lasts) if last), parts,
            tuple(layers for _, layers in local) if v > 1 else (), reserved, grown))
    return PipelineMemory(schedule, p, micro, micro_batch, micro_batch * micro, tuple(ranks),
                          round((p - 1) / (v * micro + p - 1), 4), stages_per_rank=v)
