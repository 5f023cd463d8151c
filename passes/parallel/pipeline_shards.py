"""A pipeline stage's rank under FSDP2's ``fully_shard``, as torchtitan applies it with
pipelining (passes/parallel/pipeline.py's stage step, sharded): its shards, the gathered stage
and the accumulated gradients, the units' collectives, and under a master recipe the half
gradients each unit's post-backward adds in; and what the allocator replay of its schedule
(passes/parallel/pipeline_reserved.py) allocates besides the traced step (``ShardTrace``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..ir import Graph, ValueKind
from ..training.checkpoint import timeline_of
from ..training.memory import TrainingMemory, forward_set
from ..training.optimizer import state_tensors, step_temporaries, trainable_params
from .experts import expert_modules
from .units import fsdp_units, grad_of, half_ends, padded_bytes, unit_names

if TYPE_CHECKING:
    from .pipeline import StageStep
    from .pipeline_reserved import StageTrace


@dataclass(frozen=True)
class ShardTrace:
    """A stage's rank under fully_shard: what the replay allocates besides the traced step."""
    gathered: tuple[int, ...]       # each parameter whole, first forward to the reduce
    gather_buffer: int              # the largest unit's all-gather output, its first forward
    # each unit in turn: its reduce-scatter input, the gradient storages it reads (then
    # freed), its parameters' gradient shards (kept to zero_grad)
    reduces: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]
    master: int = 1                 # the accumulated gradients' bytes per traced byte
    # under a master recipe, (a gradient storage, the node of its unit's post-backward):
    # the half gradient lives to it, which then adds it into the fp32 accumulated one
    half_ends: tuple[tuple[int, int], ...] = ()
    # beside tensor parallelism a later backward's post-backward adds each half gradient in
    # through an fp32 copy of it (DTensor's add_: passes/parallel/pipeline.py ``_backwards``)
    upcast: bool = False


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


def sharded_trace(trace: StageTrace | None, graph: Graph, t: TrainingMemory, units: list,
                  shard: list[int], m: int, dtensor: bool = False) -> StageTrace | None:
    """The allocator replay's view of the stage's rank under fully_shard (passes/parallel/
    pipeline.py's ``sharded``; ``shard``: each parameter's bytes): its shards and buffers
    resident, the shards' state and step, what the gathers and reduces allocate; under a
    master recipe each half gradient until its unit's post-backward."""
    values = graph.values
    params = [v for v in values.values() if v.kind == ValueKind.PARAM]
    buffers = [v.spec.nbytes or 0 for v in values.values() if v.kind == ValueKind.BUFFER]
    ends = half_ends(graph, t, units) if m > 1 else {}
    index = {st.name: k for k, st in enumerate(t.storages)}
    storage_of = {p: index[g] for p, g in grad_of(graph).items() if g in index}
    trainable = set(trainable_params(graph))
    shard_of = {v.name: b for v, b in zip(params, shard) if v.name in trainable}
    steps_on = tuple(shard_of.values())
    reduces = tuple((m * u.grad_padded_bytes,
                     tuple(storage_of[p] for p in u.members if p in storage_of),
                     tuple(shard_of[p] for p in u.members if p in shard_of)) for u in units)
    return None if trace is None else replace(
        trace, resident=(*shard, *buffers),
        state=tuple(state_tensors(list(steps_on), t.optimizer)), master_grads=(),
        step_sizes=steps_on if trace.step_sizes else (),
        shard=ShardTrace(tuple(v.spec.nbytes or 0 for v in params),
                         max((u.padded_bytes for u in units), default=0), reduces, m,
                         tuple((index[name], end) for name, end in ends.items()),
                         upcast=dtensor and m > 1))
