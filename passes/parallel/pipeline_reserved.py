"""A pipeline stage's rank replayed through PyTorch's CUDA caching allocator
(passes/memory/caching_allocator.py): its reserved peak over two steps of its schedule, from
each of its stages' traced micro-batch step (``StageTrace``), as the single-device training
step's is (passes/training/reserved.py).

The rank's tensors are allocated in the order the schedule runs its forwards (F) and
backwards (B) (passes/parallel/schedules.py), as passes/parallel/pipeline.py counts them:
each parameter, buffer and fp32 master copy its own tensor before the first step, kept; at an
F, the received hidden states (a non-first stage), then the forward's storages node by node —
what the forward leaves for the backward, and the output (``PipelineStage.fwd_cache``; the
last stage's logits, ``output_chunks``, to the step's end) kept; at a B, the gradient received
(a non-last stage), then the backward's storages — the first backward of a stage in a step
makes its gradients, kept to the optimizer step; a later one's each new gradient until it is
added in (AccumulateGrad) — and at its end the micro-batch's input and output freed. After
the schedule, the last stage's outputs concatenated (``_merge_outputs``) and dropped; then the
optimizer step as the single-device replay runs it (passes/memory/allocator_events.py): the
state created in step 1, the fp32 gradient copies of a master recipe, the step's
temporaries, and ``zero_grad(set_to_none=True)``. A zero-bubble schedule's backward runs as
its two halves (passes/parallel/zero_bubble.py: the trace's backward laid out as I's nodes,
then W's): at I the gradient received and I's nodes; at W W's nodes, then the micro-batch's
input, output and received gradient freed (``PipelineStage.backward_state`` holds them).

Under fully_shard (``ShardTrace``: FSDP2 as torchtitan applies it in a pipeline, as
passes/parallel/pipeline.py's ``sharded`` counts it) the rank keeps each parameter's shard
(fp32 under a master recipe) and its state; the stage's first forward in a step gathers each
parameter whole, kept to the reduce after its last backward (``reshard_after_forward=False``,
no reduce until the last backward), the largest unit's all-gather output through that
forward; each backward's gradients accumulate unsharded (fp32 under a master recipe); after
the last, each unit's reduce-scatter input in turn, then each parameter's gradient shard,
kept to ``zero_grad``, and the whole gradients and parameters freed.

A long stage's analysis is read off two short programs (analyzer/app/pipeline_stages.py): its
rank is replayed with the longer, and its reserved bytes are the long stage's peak times that
replay's reserved-to-allocated ratio — an extrapolation, as the stage's other figures are.
(What the allocator reserves beyond the tensors of 2- and 3-block programs differs by more
than a block's worth, either way: grown by that difference per block, Llama 3.1 405B's
16-block stages swung by tens of GiB.)"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..choices import OptimizerImpl
from ..device.gpu_workspaces import gpu_workspaces
from ..ir import Graph
from ..memory.allocator_events import (
    resident_tensors,
    step_temporary_events,
    transient_storages,
)
from ..memory.caching_allocator import (
    Alloc,
    AllocatorConfig,
    Event,
    Free,
    covering,
    replay,
)
from ..memory.liveness import Storage
from ..training.memory import TrainingMemory
from ..training.optimizer import (
    ADAPTIVE,
    optimizer_tensors,
    trainable_params,
)
from .schedules import Order

if TYPE_CHECKING:
    from ..device_rates import DeviceRates
    from .pipeline_shards import ShardTrace


@dataclass(frozen=True, eq=False)
class StageTrace:
    """What the replay needs of one stage program's traced micro-batch step."""
    storages: tuple[Storage, ...]   # its lifetimes, node by node (the training step's liveness)
    forward: int                    # the forward's nodes: [0, forward)
    nodes: int
    grads: frozenset[str]           # the storages the gradients live in
    resident: tuple[int, ...]       # each parameter, buffer and fp32 master copy
    state: tuple[int, ...]          # the optimizer state, created in step 1's step()
    step_sizes: tuple[int, ...]     # the bytes its step runs over, per parameter
    foreach: bool
    master_grads: tuple[int, ...]   # a master recipe's fp32 gradient copies, per parameter
    input_bytes: int                # the hidden states it receives (0: the first stage)
    output: int | None              # the index of the storage it sends (or, last, keeps)
    output_bytes: int
    # on a CUDA device (passes/device/gpu_workspaces.py; its kernels' temporaries are among
    # the storages): the node of each matmul thread's first GEMM, forward's and autograd's,
    # where the thread's cuBLAS workspace is allocated, kept, in the rank's first step
    cublas: tuple[int, ...] = ()
    cublas_bytes: int = 0
    shard: ShardTrace | None = None  # under fully_shard (``resident`` its shards, buffers)
    # a zero-bubble schedule's step: its backward traced as I's nodes, then W's from this one
    # (passes/parallel/zero_bubble.py)
    split: int | None = None

    def born(self) -> list[list[int]]:
        """The storages each node allocates (unknown sizes left out)."""
        out: list[list[int]] = [[] for _ in range(self.nodes + 1)]
        for k, s in enumerate(self.storages):
            if s.nbytes > 0:
                out[min(s.birth, self.nodes)].append(k)
        return out

    def dying(self) -> list[list[int]]:
        """The storages each node uses for the last time (a gradient's, and those that live
        into the optimizer step, apart)."""
        out: list[list[int]] = [[] for _ in range(self.nodes + 1)]
        for k, s in enumerate(self.storages):
            if s.nbytes > 0 and s.name not in self.grads:
                out[min(s.death, self.nodes)].append(k)
        return out


def stage_trace(graph: Graph, t: TrainingMemory, input_bytes: int, output: str,
                output_bytes: int, device: "DeviceRates | None" = None,
                split: int | None = None) -> StageTrace:
    """What the replay needs of a stage's traced step ``t`` (its run: a checkpoint plan's
    when there is one) whose output is the value ``output``: its tensors as the single-device
    replay takes them (passes/training/reserved.py), on a CUDA ``device`` with what its
    kernels allocate besides them."""
    master = t.breakdown_at_peak.get("master_weights", 0) > 0
    params = [graph.values[p] for p in trainable_params(graph)]
    sizes, states = optimizer_tensors(params, t.optimizer, master)
    resident = [b for _, b in resident_tensors(graph)] + (sizes if master else [])
    ws = gpu_workspaces(graph, device, t.forward_nodes) if device is not None else None
    storages = tuple(t.storages)
    return StageTrace((*storages, *transient_storages(ws)), t.forward_nodes, len(graph.nodes),
                      t.grad_storages, tuple(resident), tuple(states),
                      tuple(sizes) if t.optimizer in ADAPTIVE else (),
                      t.optimizer_impl == OptimizerImpl.FOREACH,
                      tuple(sizes) if master else (), input_bytes,
                      _storage_of(graph, storages, output), output_bytes,
                      ws.cublas_nodes if ws else (), ws.cublas_bytes if ws else 0,
                      split=split)


def _storage_of(graph: Graph, storages: tuple[Storage, ...], value: str) -> int | None:
    """The index of the storage ``value`` lives in: its own, or (a view) its input's."""
    index = {s.name: k for k, s in enumerate(storages)}
    seen = set()
    while value and value not in index and value not in seen:
        seen.add(value)
        v = graph.values.get(value)
        node = graph.nodes[v.producer] if v is not None and v.producer is not None else None
        value = node.inputs[0] if node is not None and node.inputs else ""
    return index.get(value)


def rank_reserved(traces: list[StageTrace], lasts: list[bool], order: Order, micro: int,
                  peak: int, grown: bool = False,
                  config: AllocatorConfig = AllocatorConfig()) -> int:
    """The reserved peak of a rank running ``order`` over its stages' traced steps, checked to
    cover ``peak``, the rank's allocated peak. ``grown``: a stage of the rank is longer than
    its trace (its figures grown per block from two short programs: analyzer/app/
    pipeline_stages.py), so the replay's reserved-to-allocated ratio, with the longer short
    program, is applied to ``peak``, the long stage's — an extrapolation."""
    r = replay(rank_events(traces, lasts, order, micro), expandable=config.expandable,
               max_split_size=config.max_split_size)
    if grown and r.requested_peak:
        return -(-peak * r.reserved_peak // r.requested_peak)
    return covering(r.reserved_peak, peak, "a pipeline stage's rank")


def stages_reserved(traces: "list[StageTrace | None]", lasts: list[bool], order: Order,
                    micro: int, peak: int, grown: bool, allocator: AllocatorConfig
                    ) -> int | None:
    """``rank_reserved`` of a rank whose every stage has its trace (else None)."""
    found = [t for t in traces if t is not None]
    if len(found) < len(traces):
        return None
    return rank_reserved(found, lasts, order, micro, peak, grown, allocator)


def rank_events(traces: list[StageTrace], lasts: list[bool], order: Order,
                micro: int) -> list[Event]:
    """The allocations and frees of two steps of the rank (see the module docstring)."""
    born, dying = [t.born() for t in traces], [t.dying() for t in traces]
    events: list[Event] = [Alloc(("resident", k, i), b) for k, t in enumerate(traces)
                           for i, b in enumerate(t.resident) if b > 0]
    threads: set[str] = set()   # the matmul threads whose cuBLAS workspace is allocated
    for step in (1, 2):
        made: set[int] = set()   # the stages whose first backward made their gradients
        halved: set[int] = set()   # (and whose first input half, its few: zero bubble)
        ran: set[int] = set()    # the stages whose first forward gathered their parameters
        for k, op, j in order:
            t, tag = traces[k], (step, k, j)
            run = (born[k], dying[k], tag, threads)
            if op == "F":
                events += _forward(t, run, gather=(step, k) if k not in ran else None)
                ran.add(k)
            elif op == "I":   # (a zero-bubble schedule's input half: a weight's gradient
                # only where one node makes it beside the input's, a fused grouped matmul's)
                events += _backward(t, run, lasts[k], (step, k) if k not in halved else None,
                                    op)
                halved.add(k)
            else:
                events += _backward(t, run, lasts[k], (step, k) if k not in made else None, op)
                made.add(k)
                if t.shard is not None and j == micro - 1:
                    events += _reduce(t, (step, k))
        events += _merge_outputs(traces, lasts, step, micro)
        events += _optimizer(traces, step)
    return events


def _forward(t: StageTrace, run, gather: tuple[int, int] | None = None) -> list[Event]:
    """One micro-batch's forward: the received input, then its storages node by node, what
    the backward reads (and the output) kept; ``gather``: the tag of the stage's first
    forward in a step under fully_shard, which gathers its parameters."""
    born, dying, tag, threads = run
    out: list[Event] = [Alloc((tag, "in"), t.input_bytes)] if t.input_bytes else []
    sh = t.shard if gather is not None else None
    if sh is not None:
        out += [Alloc((gather, "whole", i), b) for i, b in enumerate(sh.gathered) if b]
        out += [Alloc((gather, "gather"), sh.gather_buffer)] if sh.gather_buffer else []
    for i in range(t.forward):
        out += [Alloc((tag, k), t.storages[k].nbytes, i) for k in born[i]]
        out += _cublas(t, i, threads)
        out += [Free((tag, k), i) for k in dying[i] if k != t.output]
    return out + ([Free((gather, "gather"))] if sh is not None and sh.gather_buffer else [])


def _reduce(t: StageTrace, tag: tuple[int, int]) -> list[Event]:
    """After a fully_shard stage's last backward: each unit's reduce-scatter input in turn,
    the gradient shards (kept to zero_grad), then the whole gradients and parameters freed
    (``tag``: the step's and the stage's, as its first forward and backward made them)."""
    sh = t.shard
    assert sh is not None
    out: list[Event] = []
    held = {k for k, s in enumerate(t.storages) if s.name in t.grads and s.nbytes > 0}
    for u, (b, grads, shards) in enumerate(sh.reduces):
        out += [Alloc((tag, "reduce", u), b)] if b else []
        out += [Free((tag, "grad", k)) for k in grads if k in held]
        held -= set(grads)
        out += [Alloc((tag, "shard grad", u, i), g) for i, g in enumerate(shards) if g]
        out += [Free((tag, "reduce", u))] if b else []
    out += [Free((tag, "grad", k)) for k in sorted(held)]
    return out + [Free((tag, "whole", i)) for i, b in enumerate(sh.gathered) if b]


def _cublas(t: StageTrace, node: int, threads: set[str]) -> list[Event]:
    """At ``node``: its thread's cuBLAS workspace, if this is the rank's first GEMM on it
    (the forward's thread, or autograd's)."""
    thread = "forward" if node < t.forward else "backward"
    if node not in t.cublas or thread in threads:
        return []
    threads.add(thread)
    return [Alloc(("cuBLAS", thread), t.cublas_bytes, node)]


def _backward(t: StageTrace, run, last: bool, first_of: tuple[int, int] | None,
              part: str = "B") -> list[Event]:
    """One micro-batch's backward (``first_of``: the tag of the step's first on this stage,
    which makes the gradients kept to the optimizer step); ``part`` "I" or "W": a zero-bubble
    schedule's half of it, the received gradient, the input and the output held from I to
    the end of W (``PipelineStage.backward_state``)."""
    born, dying, tag, threads = run
    out: list[Event] = [] if last or part == "W" else [Alloc((tag, "grad in"), t.output_bytes)]
    halves = _halves(t)
    split = t.split if t.split is not None else t.forward
    nodes = range(t.forward, split) if part == "I" else \
        range(split if part == "W" else t.forward, t.nodes + 1)
    # (to node ``nodes``: what lives into the optimizer step in the traced step — the loss —
    # ends with the backward, as does a half gradient no unit's post-backward took)
    for i in nodes:
        for k in born[i]:
            if t.storages[k].name not in t.grads:
                out.append(Alloc((tag, k), t.storages[k].nbytes, i))
            elif k in halves.get(-1, ()):   # (a half gradient, to its unit's post-backward)
                out.append(Alloc((tag, k), t.storages[k].nbytes, i))
            elif first_of is not None:
                out.append(Alloc((first_of, "grad", k), t.storages[k].nbytes, i))
            else:   # (added into the gradient held, then gone)
                out += [Alloc((tag, k), t.storages[k].nbytes, i), Free((tag, k), i)]
        out += _upcast(t, halves.get(i, ()), tag, i) if first_of is None else []
        for k in halves.get(i, ()):   # (added into the fp32 one: the first makes it; the
            out.append(Free((tag, k), i))   # real step's peak holds no two of one, MemTracker)
            out += [Alloc((first_of, "grad", k), _grad_bytes(t, k), i)] if first_of else []
        out += _cublas(t, i, threads)
        for k in dying[i]:
            if k != t.output:
                out.append(Free((tag, k), i))
    if part == "I":
        return out
    if t.output is not None and not last:
        out.append(Free((tag, t.output)))
    out += [] if last else [Free((tag, "grad in"))]
    return out + ([Free((tag, "in"))] if t.input_bytes else [])


def _upcast(t: StageTrace, ending, tag, i: int) -> list[Event]:
    """A later backward's fp32 copy of the largest half gradient its post-backward at node
    ``i`` adds in (one at a time), beside tensor parallelism."""
    if not ending or t.shard is None or not t.shard.upcast:
        return []
    big = max(ending, key=lambda k: t.storages[k].nbytes)
    return [Alloc((tag, "upcast", i), _grad_bytes(t, big), i), Free((tag, "upcast", i), i)]


def _grad_bytes(t: StageTrace, k: int) -> int:
    return t.storages[k].nbytes * (t.shard.master if t.shard is not None else 1)


def _halves(t: StageTrace) -> dict[int, list[int]]:
    """Under fully_shard with a master recipe: the half gradients ending at each node (and
    under -1, every one)."""
    out: dict[int, list[int]] = {}
    for k, end in t.shard.half_ends if t.shard is not None else ():
        out.setdefault(min(end, t.nodes), []).append(k)   # (one living on: at the end)
        out.setdefault(-1, []).append(k)
    return out


def _merge_outputs(traces: list[StageTrace], lasts: list[bool], step: int,
                   micro: int) -> list[Event]:
    """The last stage's kept outputs concatenated (``schedule.step()``'s return), then all
    dropped."""
    out: list[Event] = []
    for k, (t, last) in enumerate(zip(traces, lasts)):
        if not last or t.output is None:
            continue
        out.append(Alloc((step, k, "merged"), micro * t.output_bytes))
        out += [Free(((step, k, j), t.output)) for j in range(micro)]
        out.append(Free((step, k, "merged")))
    return out


def _optimizer(traces: list[StageTrace], step: int) -> list[Event]:
    """The optimizer step over the rank's stages (their parameters in stage order), then
    zero_grad, as passes/memory/allocator_events.py's training_events, but for a master
    recipe's half gradients: freed once their fp32 copies are made, before the step's
    temporaries, as the step's memory counts them (passes/training/memory.py: the most of
    half and fp32 gradients together, or fp32 gradients and temporaries)."""
    out: list[Event] = []
    if step == 1:
        out += [Alloc(("state", k, i), b) for k, t in enumerate(traces)
                for i, b in enumerate(t.state) if b > 0]
    copies = [(k, i, b) for k, t in enumerate(traces) for i, b in enumerate(t.master_grads)
              if b > 0]
    out += [Alloc(("fp32 grad", step, k, i), b) for k, i, b in copies]
    halves = [_zero_grad(t, k, step) for k, t in enumerate(traces) if t.master_grads]
    out += [ev for h in halves for ev in h]
    sizes = [b for t in traces for b in t.step_sizes]
    out += step_temporary_events(step, sizes, any(t.foreach for t in traces))
    out += [Free(("fp32 grad", step, k, i)) for k, i, _ in copies]
    return out + [ev for k, t in enumerate(traces) if not t.master_grads
                  for ev in _zero_grad(t, k, step)]


def _zero_grad(t: StageTrace, k: int, step: int) -> list[Event]:
    """The frees of stage ``k``'s gradients (under fully_shard, its gradient shards)."""
    if t.shard is not None:
        return [Free(((step, k), "shard grad", u, i))
                for u, (_, _, shards) in enumerate(t.shard.reduces)
                for i, g in enumerate(shards) if g]
    return [Free(((step, k), "grad", i)) for i, s in enumerate(t.storages)
            if s.name in t.grads and s.nbytes > 0]
