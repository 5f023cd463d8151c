"""The schedule of FSDP2 (``fully_shard``): zero3 / fsdp, and zero2 (its
``reshard_after_forward=False``), on the step's clock (passes/parallel/clock.py).

What torch/distributed/fsdp/_fully_shard does, per unit, in the order it does it:

* forward, pre-forward: all-gather into a flat buffer (N × the padded shard; the local shard is
  copied into its slot), then copy out into the unsharded parameters. The flat buffer is held
  through the next unit's copy-out (``all_gather_state``, dropped by the next
  ``wait_for_unshard``, whose local variable keeps it until that copy-out returns); the root's
  post-forward frees the last one. The root is gathered first and never
  resharded until the end of backward; a block is resharded after its forward (zero3) or at
  its post-backward (zero2).
* backward, pre-backward (as the gradient reaches the unit's output): copy out the all-gather
  prefetched by the unit that ran before in backward (the root prefetches the last block),
  freeing its flat buffer at once, then prefetch the next one in reverse post-forward order
  (a nested unit, which ends its forward first, after the unit around it).
* post-backward (as the gradient of the unit's input is ready; at the end of backward for the
  root and units whose inputs need no gradient, root first): reshard, release the previous
  reduce-scatter input, copy the unsharded gradients into a padded reduce-scatter input (then
  freed), reduce-scatter into the sharded gradient. That input is held until the next
  post-backward, the last one until backward ends.
* the optimizer steps on shards; rank 0 holds the largest (torch.chunk's first chunk).

With one rank nothing is all-gathered (the shard is copied into the unsharded parameters).

Under ``MixedPrecisionPolicy(param_dtype=half, reduce_dtype=fp32)`` (a master recipe; the
graph is re-typed to half) the all-gather, the unsharded parameters and their gradients are
half (the graph's sizes) and the shards, the reduce-scatter input (the gradients cast to
``reduce_dtype``), the sharded gradients and the optimizer fp32: ``plan.master`` times the
graph's bytes; at each reduce-scatter copy-in the unit's gradients exist a moment longer as
fp32 copies (``foreach_reduce`` casts them to ``reduce_dtype`` before copying them in).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..choices import Offload, Strategy
from .clock import Clock
from .comm import comm_volume, with_dimension
from .units import ROOT, Unit, gathered_bytes, gathered_in_float8, padded_bytes

# The CUDA streams FSDP2 allocates on (FSDPCommContext): all-gather outputs on the copy-in
# stream (``_get_all_gather_streams``: implicit prefetching in forward and pre-backward), the
# reduce-scatter output (the sharded gradients' storage) inside
# ``torch.cuda.stream(reduce_scatter_stream)`` (``foreach_reduce``); its input, the copy-out,
# the gradients and the optimizer on the default stream. A block cached on one stream serves
# no other (passes/memory/caching_allocator.py). Read off PyTorch 2.11's allocator trace on an H200
# (benchmarks/results/cuda_traces_h200.json.gz: the reduce-scatter inputs are default-stream
# blocks there).
DEFAULT_STREAM, ALL_GATHER_STREAM, REDUCE_SCATTER_STREAM = 0, 1, 2


def sharded_step(plan, clock: Clock, world: int):
    """Place one rank's tensors on ``clock``; returns (units, host bytes, comm volume).
    ``plan``: passes.parallel.step's _Plan (the step's tensors, the units, the spec)."""
    fsdp = _Fsdp.of(plan, world)
    ev, clear_ev = _events(fsdp, clock)
    clock.freeze()
    pos = {k: clock.at(e) for k, e in ev.items()}
    _place_params(fsdp, clock, pos)
    _place_reduce_scatters(fsdp, clock, pos, clock.at(clear_ev))
    host = _place_grads_and_optimizer(fsdp, clock, pos)
    return tuple(fsdp.units), host, _comm(fsdp)


@dataclass(frozen=True)
class _Fsdp:
    """One rank's units at ``world`` ranks and the spec's choices: what every phase reads.
    The lists hold units.Unit, left unparameterized: a block's forward span and a gathered
    unit's backward span are always set, which Unit's Optional fields cannot say."""
    plan: Any
    world: int
    units: list                 # the blocks, then the root
    trainable: set[str]
    reshard: bool               # zero3 / fsdp: blocks resharded after their forward
    offload: bool               # the shards live on the host
    gathered: list              # the blocks gathered again for their backward
    during: list                # reduce-scattered during backward, in its order
    final: list                 # reduce-scattered at the end of backward, root first
    float8: frozenset[str] = frozenset()   # weights gathered in float8 (units.py)

    @classmethod
    def of(cls, plan, world: int) -> _Fsdp:
        trainable = set(plan.trainable)
        float8 = gathered_in_float8(plan.graph)
        units = [u.sized(plan.graph, trainable, u.group(world), float8) for u in plan.units]
        blocks = [u for u in units if u.name != ROOT]
        gathered = [u for u in blocks if u.backward is not None]
        during = sorted((u for u in gathered if not u.post_backward_deferred),
                        key=lambda u: -u.backward[1])
        return cls(plan, world, units, trainable, plan.spec.strategy != Strategy.ZERO2,
                   plan.spec.offload == Offload.PARAMS, gathered, during,
                   [units[-1]] + [u for u in blocks if u not in during], float8)

    @property
    def root(self) -> Unit:
        return self.units[-1]

    @property
    def blocks(self) -> list:
        return [u for u in self.units if u.name != ROOT]

    def shard_of(self, u: Unit):
        """A parameter's padded shard in the unit, by its spec (``master`` not applied)."""
        n = u.group(self.world)
        return lambda s: padded_bytes(s, n) // n

    def each(self, u: Unit, size, only_trainable: bool = False) -> list[int]:
        """Per parameter of a unit: its tensor's bytes, ``size`` of its spec."""
        values = self.plan.graph.values
        return [size(values[p].spec) for p in u.members
                if not only_trainable or p in self.trainable]


def _events(fsdp: _Fsdp, clock: Clock) -> tuple[dict[tuple[str, str], tuple], tuple]:
    """Each unit's collectives as clock events (unit, kind) -> event, and the release of the
    reduce-scatter inputs."""
    n, fwd_end = clock.n, fsdp.plan.forward_end
    # events, in the order a gap runs them: post-backward (0), the root's prefetch and the
    # forward gathers (1), a unit's backward copy-out (2), the prefetch it then issues (3)
    ev = {(ROOT, "ag"): clock.before(0, 1, "root: all-gather"),
          (ROOT, "out"): clock.before(0, 1, "root: copy-out")}
    for u in fsdp.blocks:
        ev[u.name, "ag"] = clock.before(u.forward[0], 1, f"{u.name}: all-gather")
        ev[u.name, "out"] = clock.before(u.forward[0], 1, f"{u.name}: copy-out")
    if fsdp.reshard:
        prev = None
        # in reverse post-forward order (FSDP2's ``post_forward_order``): a unit nested in
        # another (an expert-parallel layer's experts in its block) ends its forward first,
        # so the block's pre-backward prefetches the experts, whose pre-backward prefetches
        # the block before
        for u in sorted(fsdp.gathered, key=lambda u: -u.forward[1]):
            at, order = (min(fwd_end, n), 1) if prev is None else (prev.backward[0], 3)
            ev[u.name, "bag"] = clock.before(at, order, f"{u.name}: prefetch all-gather")
            ev[u.name, "bout"] = clock.before(u.backward[0], 2, f"{u.name}: backward copy-out")
            prev = u
    for u in fsdp.during:
        ev[u.name, "rs0"] = clock.before(u.backward[1] + 1, 0,
                                         f"{u.name}: reduce-scatter copy-in")
        ev[u.name, "rs1"] = clock.before(u.backward[1] + 1, 0, f"{u.name}: reduce-scatter")
    for u in fsdp.final:
        ev[u.name, "rs0"] = clock.before(n, 0, f"{u.name}: reduce-scatter copy-in "
                                               "(end of backward)")
        ev[u.name, "rs1"] = clock.before(n, 0, f"{u.name}: reduce-scatter (end of backward)")
    return ev, clock.before(n, 1, "reduce-scatter inputs released")


def _place_params(fsdp: _Fsdp, clock: Clock, pos: dict[tuple[str, str], int]) -> None:
    """The shards, the buffers, and each unit's all-gathers and unsharded parameters in
    forward and (prefetched) in backward."""
    plan, world, m, end = fsdp.plan, fsdp.world, fsdp.plan.master, clock.size
    if not fsdp.offload:       # FSDPParam: one padded shard per parameter
        clock.add(0, end, m * sum(u.shard_bytes for u in fsdp.units), "sharded_params",
                  [m * b for u in fsdp.units for b in fsdp.each(u, fsdp.shard_of(u))])
    clock.add(0, end, plan.buffer_bytes, "buffers", plan.buffer_sizes)
    # the root's post-forward frees the last all-gather: after its own last forward op
    fwd_end = plan.forward_end
    last_fwd = max((i for i in range(fwd_end) if plan.graph.nodes[i].scope),
                   default=fwd_end - 1)
    seq = [fsdp.root, *fsdp.blocks]
    for k, u in enumerate(seq):
        group = u.group(world)
        flat = group > 1  # with one rank nothing is all-gathered
        a, o = pos[u.name, "ag"], pos[u.name, "out"]
        # freed by the next unit's wait_for_unshard, which still holds it through its copy-out
        held = pos[seq[k + 1].name, "out"] + 1 if k + 1 < len(seq) else \
            clock.node(last_fwd) + 1
        # the copy-out's unsharded parameters: one all-gather output per parameter (one
        # byte an element for a weight gathered in float8)
        unsharded = [gathered_bytes(plan.graph.values[p].spec, group, p in fsdp.float8)
                     for p in u.members]
        if flat:
            clock.add(a, held, u.gathered_bytes, "all_gather_buffers",
                      stream=ALL_GATHER_STREAM)
        if fsdp.offload:        # the host shard copied to the device for the all-gather
            clock.add(a, o + 1, m * u.shard_bytes, "offload_staging")
        off = pos[u.name, "rs0"] if u is fsdp.root or not fsdp.reshard else \
            clock.node(u.forward[1]) + 1
        clock.add(o, off, u.gathered_bytes, "unsharded_params", unsharded)
        if (u.name, "bag") in pos:
            b0, b1 = pos[u.name, "bag"], pos[u.name, "bout"]
            if flat:
                clock.add(b0, b1 + 1, u.gathered_bytes, "all_gather_buffers",
                          stream=ALL_GATHER_STREAM)
            if fsdp.offload:
                clock.add(b0, b1 + 1, m * u.shard_bytes, "offload_staging")
            clock.add(b1, pos[u.name, "rs0"], u.gathered_bytes, "unsharded_params", unsharded)


def _place_reduce_scatters(fsdp: _Fsdp, clock: Clock, pos: dict[tuple[str, str], int],
                           clear: int) -> None:
    """Each unit's reduce-scatter input (held until the next one's copy-in), its
    ``reduce_dtype`` casts and its output, the sharded gradients."""
    m, world = fsdp.plan.master, fsdp.world
    order = [*fsdp.during, *fsdp.final]
    for k, u in enumerate(order):
        if not u.grad_padded_bytes:
            continue
        r0, r1 = pos[u.name, "rs0"], pos[u.name, "rs1"]
        until = pos[order[k + 1].name, "rs0"] if k + 1 < len(order) else clear
        clock.add(r0, until, m * u.grad_padded_bytes, "reduce_scatter_inputs")
        if m > 1:
            casts = fsdp.each(u, lambda s: m * (s.nbytes or 0), only_trainable=True)
            clock.add(r0, r0 + 1, sum(casts), "reduce_dtype_casts", casts)
        # the reduce-scatter's output: the unit's sharded gradients are views into it
        clock.add(r1, r1 + 1 if fsdp.offload else clock.size,
                  m * u.grad_padded_bytes // u.group(world), "sharded_grads",
                  stream=REDUCE_SCATTER_STREAM)


def _place_grads_and_optimizer(fsdp: _Fsdp, clock: Clock,
                               pos: dict[tuple[str, str], int]) -> dict[str, int]:
    """The unsharded gradients (each until its unit's reduce-scatter) and the optimizer on
    the shards; returns the host bytes."""
    plan, m, world = fsdp.plan, fsdp.plan.master, fsdp.world
    rs1 = {p: pos[u.name, "rs1"] for u in fsdp.units for p in u.members}
    plan.place_storages(clock, lambda ps: max(rs1[p] for p in ps), "unsharded_grads")
    shard = {p: fsdp.shard_of(u) for u in fsdp.units for p in u.members}
    sizes = [m * shard[p](plan.graph.values[p].spec) for p in plan.trainable]
    host = plan.place_optimizer(clock, sizes)
    if fsdp.offload:
        host.update(params=m * sum(u.shard_bytes for u in fsdp.units),
                    grads=m * sum(u.grad_padded_bytes // u.group(world) for u in fsdp.units))
    return host


def _comm(fsdp: _Fsdp):
    """The step's all-gather and reduce-scatter volume (the regather: zero3's backward):
    the dense units' over dp_shard, an expert-parallel rank's experts' over efsdp."""
    experts = [u for u in fsdp.units if u.ep > 1]
    comm = _group_comm(fsdp, [u for u in fsdp.units if u.ep == 1], fsdp.world, "dp_shard")
    if not experts:
        return comm
    c = _group_comm(fsdp, experts, experts[0].group(fsdp.world), "efsdp")
    return with_dimension(comm, "efsdp", c.wire_bytes, c.collectives,
                          all_gather=c.all_gather_bytes, reduce_scatter=c.reduce_scatter_bytes)


def _group_comm(fsdp: _Fsdp, units: list, world: int, dim: str):
    gathered = [u for u in fsdp.gathered if u in units] if fsdp.reshard else []
    m = fsdp.plan.master
    calls = len(units) + len(gathered) + sum(1 for u in units if u.grad_padded_bytes)
    return comm_volume(world, sum(u.gathered_bytes for u in units + gathered),
                       m * sum(u.grad_padded_bytes for u in units), 0, calls,
                       fsdp.plan.spec.interconnect, dim)
