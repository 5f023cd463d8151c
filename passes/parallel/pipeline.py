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
from ..training.optimizer import state_tensors, step_temporaries, trainable_params
from .comm import CommVolume
from .experts import expert_modules
from .mesh import CARVED
from .pipeline_reserved import (
    StageTrace,
    sharded_trace,
    stage_trace,
    stages_reserved,
)
from .schedules import Order, check_schedule, events, rank_stages
from .units import fsdp_units, half_ends, padded_bytes, unit_names

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
    # gradients); W's peak, the first W's (its gradients made) and a later one's
    split: int | None = None
    input_peak: int = 0
    between: int = 0
    first_weight_peak: int = 0
    weight_peak: int = 0


@dataclass(frozen=True)
class Shards:
    """A stage's rank under FSDP2's ``fully_shard`` over ``world`` ranks, as torchtitan
    applies it with pipelining: ``master`` fp32 bytes per graph byte of what it keeps in fp32
    (2 under a master recipe's ``MixedPrecisionPolicy``, else 1)."""
    world: int
    master: int = 1
    # expert parallelism: each layer's experts a unit of their own over world · tp / ep ranks
    # (torchtitan's efsdp, carved out of dp_shard × tp; the experts the rank program holds
    # are already its slice)
    ep: int = 1
    tp: int = 1   # (its ranks carve the ep group with dp_shard's: efsdp spans them too)

    @property
    def dtensor(self) -> bool:
        """Tensor parallelism beside: the unsharded parameters are DTensors, whose in-place
        add of a later backward's half gradient into the fp32 one makes an fp32 copy of it
        first."""
        return self.tp > 1


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
        step = _split(step, split, fe, nongrad, grad, made,
                      sum(st.nbytes for st in others if st.birth < split <= st.death))
    return step if shards is None else sharded(step, graph, t, shards, nongrad)


def _split(s: StageStep, wi: int, fe: int, nongrad: list[int], grad: list[int],
           made: list[int], between: int) -> StageStep:
    """A zero-bubble step's I and W figures: I runs nodes [fe, wi) (no gradient of a weight
    among them), W the rest; ``between``: the bytes alive from one to the other."""
    n = len(nongrad)
    return replace(s, split=wi, between=between,
                   input_peak=max([between, *nongrad[fe:wi]]),
                   first_weight_peak=max((nongrad[k] + grad[k] for k in range(wi, n)),
                                         default=between),
                   weight_peak=max((nongrad[k] + made[k] for k in range(wi, n)),
                                   default=between))


def sharded(s: StageStep, graph: Graph, t: TrainingMemory, shards: Shards,
            nongrad: list[int]) -> StageStep:
    """The stage's step on one of ``shards.world`` ranks of fully_shard as torchtitan runs it
    in a pipeline: each block and the stage a unit, ``reshard_after_forward=False``, and
    ``PipelineStage.backward_maybe_with_nosync``'s no-reshard, no-reduce backwards until the
    last (torch/distributed/pipelining/stage.py). So the stage's gathered parameters stay from
    the first forward's all-gathers to ``perform_reduce_grad`` after the last backward; each
    backward's gradients accumulate unsharded (FSDPParam ``to_accumulated_grad_if_needed``:
    in ``reduce_dtype``, fp32, under a master recipe — each unit's half gradients exist until
    its post-backward adds them in: ``_backwards``); then each unit reshards and
    reduce-scatters (a padded input in ``reduce_dtype``) into the sharded gradients the
    optimizer steps on, with the shards (fp32 under a master recipe) and their state.
    ``nongrad``: the traced step's bytes node by node, gradients apart."""
    world, m = shards.world, shards.master
    fwd = forward_set(graph)
    trainable = set(trainable_params(graph))
    units = _units(graph, fwd, trainable, shards)
    group = {p: u.group(world) for u in units for p in u.members}
    values = graph.values
    params = [v for v in values.values() if v.kind == ValueKind.PARAM]
    shard = [m * padded_bytes(v.spec, n) // n for v in params
             for n in (group.get(v.name, world),)]
    experts = [u for u in units if u.ep > 1]
    steps_on = [b for v, b in zip(params, shard) if v.name in trainable]
    state = sum(state_tensors(steps_on, t.optimizer))
    buffers = s.static - s.params - s.optimizer_state
    if m > 1:
        first, later = _backwards(graph, t, units, nongrad, m, shards.dtensor)
        s = replace(s, first_backward_peak=first, backward_peak=later)
        if s.split is not None:   # (W's, as a zero-bubble schedule splits the backward)
            first, later = _backwards(graph, t, units, nongrad, m, shards.dtensor, s.split)
            s = replace(s, first_weight_peak=first, weight_peak=later)
    return replace(
        s, trace=sharded_trace(s.trace, graph, t, units, shard, m, shards.dtensor),
        static=sum(shard) + buffers + state, params=sum(shard), optimizer_state=state,
        grads=m * s.grads, gathered=sum(v.spec.nbytes or 0 for v in params),
        step_temporaries=step_temporaries(steps_on, t.optimizer, t.optimizer_impl),
        gather_buffer=max((u.padded_bytes for u in units), default=0),
        reduce_input=m * max((u.grad_padded_bytes for u in units), default=0),
        step_grads=sum(steps_on), all_gather=sum(u.padded_bytes for u in units),
        reduce_scatter=m * sum(u.grad_padded_bytes for u in units),
        gather_calls=len(units), reduce_calls=sum(1 for u in units if u.grad_padded_bytes),
        expert_gather=sum(u.padded_bytes for u in experts),
        expert_reduce=m * sum(u.grad_padded_bytes for u in experts),
        expert_calls=len(experts) + sum(1 for u in experts if u.grad_padded_bytes))


def _units(graph: Graph, fwd: set[int], trainable: set[str], shards: Shards) -> list:
    """The stage's fully_shard units, each sized over the ranks it shards on: each block and
    the stage; beside expert parallelism each layer's experts first (torchtitan's order),
    over efsdp."""
    experts = expert_modules(graph) if shards.ep > 1 else []
    units = fsdp_units(graph, fwd, [*experts, *unit_names(graph, fwd, None)])[0]
    units = [replace(u, ep=shards.ep, tp=shards.tp) if u.name in experts else u for u in units]
    return [u.sized(graph, trainable, u.group(shards.world)) for u in units]


def _backwards(graph: Graph, t: TrainingMemory, units: list, nongrad: list[int],
               m: int, dtensor: bool = False, start: int | None = None) -> tuple[int, int]:
    """(the first backward's peak, a later one's) under a master recipe's fully_shard: a
    unit's half gradients live from their making to the unit's post-backward (its last
    backward node), which adds them into its fp32 accumulated gradients — made at the first
    backward's post-backward, ``m`` times their bytes, held from then on (the later
    backwards' are apart: ``grads``). ``dtensor``: a later post-backward's add makes an fp32
    copy of the half gradients first (measured beside tensor parallelism: DTensor's
    ``add_`` runs ``to`` on its argument; a plain tensor's casts as it adds). ``start``: the
    backward's nodes from there on (a zero-bubble schedule's W)."""
    n, fe = len(nongrad), len(forward_set(graph))
    fe = fe if start is None else start
    ends = half_ends(graph, t, units)
    made = [st for st in t.storages if st.name in t.grad_storages]
    half = [replace(st, death=ends[st.name]) for st in made]
    kept = [replace(st, nbytes=m * st.nbytes, birth=h.death + 1, death=n)
            for st, h in zip(made, half) if h.death < n]
    # each post-backward's largest gradient (it adds them in one at a time)
    largest = {h.death: h for h in sorted(half, key=lambda h: h.nbytes)
               if dtensor and h.death < n}
    copies = [replace(h, nbytes=m * h.nbytes, birth=h.death) for h in largest.values()]
    now, acc = timeline_of(half, n + 1)[:n], timeline_of(kept, n + 1)[:n]
    later = timeline_of(half + copies, n + 1)[:n]
    return (max((nongrad[k] + now[k] + acc[k] for k in range(fe, n)), default=0),
            max((nongrad[k] + later[k] for k in range(fe, n)), default=0))


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
    kept = most = 0
    moments = []
    for k, op, j in order:
        s = steps[k]
        grads = sum(st.grads for st, b in zip(steps, backwards) if b)  # (a first B makes its)
        if op == "F":
            acts = s.forward_peak + (s.gather_buffer if j == 0 else 0) - each(k)
            held[k].add(j)
        elif op == "I":   # (a zero-bubble schedule's: its saved tensors in I's curve, then
            held[k].discard(j)   # what W needs held to it)
            acts = 2 * sent(k) + s.input_peak
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
    all_grads = sum(st.grads for st in steps)
    step_grads = sum(st.grads if st.step_grads is None else st.step_grads for st in steps)
    shards = sum(st.params for st in steps)
    if any(st.gathered for st in steps):   # fully_shard's reduce after the last backward
        moments.append({**state, "params": params, "gradients": all_grads,
                        "activations": micro * kept_each +
                        max(st.reduce_input for st in steps)})
    moments += [{**state, "params": shards, "gradients": step_grads,   # the outputs' cat
                 "activations": 2 * micro * kept_each},
                {**state, "params": shards, "gradients": step_grads,   # the optimizer step
                 "activations": sum(st.step_temporaries for st in steps)}]
    return max(moments, key=lambda d: sum(d.values())), most


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
