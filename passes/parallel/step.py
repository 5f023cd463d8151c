"""Per-rank memory of one data-parallel training step: DDP, ZeRO-1/2/3 and FSDP2, with offload.

Every rank runs the joint forward+backward graph of its own micro-batch (the graph passed in
is traced at the per-rank batch), so activations, the gradients autograd makes and their
lifetimes come from the single-device step (passes/training/step.py); what a strategy changes is
which parameters, gradients and optimizer state a rank holds, and the buffers its collectives
allocate, each placed on the step's clock: the joint graph's nodes, with the strategies' own
events (an all-gather, its copy-out, a reduce-scatter) between them. What PyTorch allocates:

* ``ddp`` (DistributedDataParallel): everything replicated, plus gradient buckets as large as
  the trainable parameters (filled by copies; ``bucket_cap_mb`` sets how many, not their bytes).
* ``zero1`` (DDP + ZeroRedundancyOptimizer): as DDP, but each rank keeps the optimizer state of
  whole tensors assigned greedily by size (passes/parallel/units.py); the worst rank is
  reported. Its local step visits its tensors largest first.
* ``zero3`` / ``fsdp`` (``fully_shard`` per unit, then on the root): parameters, gradients and
  optimizer state sharded on dim 0, padded to a multiple of N. A unit's forward all-gathers it
  into a flat buffer held until the next unit's all-gather (to overlap the copy-out), then
  copies it out into the unsharded parameters, freed after its forward. In backward the unit
  is gathered again (the next one prefetched as it starts), its gradients are copied into a
  padded reduce-scatter input held until the next reduce-scatter, and the shard that comes out
  is the gradient. The root group is never resharded until the end of backward.
* ``zero2`` (``fully_shard(reshard_after_forward=False)``): as fsdp, but a unit stays gathered
  from its forward to its backward (no second all-gather).

``offload``: ``optimizer`` moves the optimizer state, its step and temporaries to host memory,
with host copies of the rank's parameter and gradient shards the step reads and writes (ZeRO-
Offload); ``params`` (zero3/fsdp: FSDP2's CPUOffloadPolicy) also moves the sharded parameters
and gradients there. What leaves the device is ``host_bytes``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from ..choices import Offload, OptimizerImpl, Strategy
from ..device.fits import Flushing, Overhead, allocator_capacity
from ..device.gpu_workspaces import GpuWorkspaces, gpu_workspaces
from ..device_rates import DeviceRates
from ..errors import GraphcostError, opt
from ..ir import INTERNAL, Graph, ValueKind
from ..memory.caching_allocator import AllocatorConfig, Event, covering
from ..memory.peak import Peak
from ..training.memory import TrainingMemory, forward_set
from ..training.optimizer import state_tensors, step_temporaries, trainable_params
from .clock import Clock, price
from .comm import CommVolume, across_replicas, comm_volume
from .context import with_context_parallel
from .experts import expert_modules, with_expert_parallel
from .fsdp import sharded_step
from .mesh import Mesh, mesh_of
from .reserved import rank_events, rank_flushing, rank_reserved_peak
from .spec import MAX_WORLD, SHARDED, ParallelSpec, check_spec
from .tensor import with_tensor_parallel
from .units import (
    Unit,
    ddp_buckets,
    fsdp_units,
    origins,
    unit_names,
    zero1_partition,
)


@dataclass(frozen=True)
class ParallelMemory:
    """The report's ``parallel`` section: one rank's step (the worst rank's)."""
    strategy: str
    world_size: int
    per_rank_batch: int
    global_batch: int
    optimizer_impl: str
    offload: str | None
    per_rank_peak_bytes: int        # steady state (optimizer state allocated)
    # two steps replayed through the CUDA caching allocator (with a device, its workspaces
    # and kernels' temporaries too: passes/device/gpu_workspaces.py)
    reserved_peak_bytes: int
    first_step_peak_bytes: int      # step 1: forward and backward before the state exists
    single_device_peak_bytes: int   # the same micro-batch on one device, for comparison
    peak_phase: str                 # forward | backward | optimizer
    peak_node: str | None           # the joint-graph node at (or just after) the peak
    peak_event: str                 # the strategy's event at the peak ("" at a node)
    worst_rank: int
    breakdown_at_peak: Mapping[str, int]   # passes.parallel.clock.CATEGORIES
    detail_at_peak: Mapping[str, int]      # the same, finer (parallel_clock.DETAILS)
    detail_at_step: Mapping[str, int]      # what the optimizer step holds, finer
    first_step_detail: Mapping[str, int]   # at the first step's peak, finer
    host_bytes: int                 # offloaded to host memory
    host_breakdown: Mapping[str, int]
    timeline: tuple[int, ...]       # this rank's bytes at each joint node, then the step
    units: tuple[Unit, ...]         # FSDP units (zero2/zero3/fsdp)
    ddp_buckets: int                # DDP gradient buckets (ddp/zero1)
    comm: CommVolume
    world_size_search: tuple[tuple[int, int], ...] = ()   # auto: (N, per-rank peak) tried
    # the layout as a device mesh: dimension -> size (passes/parallel/mesh.py)
    mesh: Mapping[str, int] = field(default_factory=dict)
    spec: ParallelSpec | None = field(default=None, metadata=INTERNAL)
    # with a device, where the two steps reserve more than it leaves the allocator: the same
    # replay held to it, the allocator emptying its cache (None: no device, no need, or out of
    # memory even so)
    flushing: Flushing | None = None
    JSON_PROPERTIES = ("peak",)

    @property
    def layout(self) -> str:
        """The layout in the words it was asked in: a data-parallel strategy by its name
        (``fsdp``), a mesh of another dimension or of more than one as the command line spells
        it (``dp_shard=2,tp=2``: not "fsdp over 4 ranks")."""
        if len(self.mesh) <= 1 and set(self.mesh) <= {"dp_shard", "dp_replicate"}:
            return self.strategy
        return Mesh(tuple(self.mesh.items())).words

    @property
    def peak(self) -> Peak:
        """The rank's peak (passes/memory/peak.py), against its two-step reserved replay; its
        categories in the peak's words (``grads``: gradients)."""
        return Peak(allocated_bytes=self.per_rank_peak_bytes,
                    reserved_bytes=self.reserved_peak_bytes, phase=self.peak_phase,
                    node=self.peak_node, threads=2, world_size=self.world_size,
                    flushing=self.flushing,
                    by_category={"gradients" if k == "grads" else k: v
                                 for k, v in self.breakdown_at_peak.items()})


def parallel_step(graph: Graph, training: TrainingMemory, spec: ParallelSpec,
                  device: DeviceRates | None = None, overhead: Overhead | None = None,
                  master_weights: bool = False,
                  allocator: AllocatorConfig = AllocatorConfig(),
                  workspaces: GpuWorkspaces | None = None) -> ParallelMemory:
    """One rank's step under ``spec``; with ``world_size`` None, the smallest world size
    whose per-rank peak, with ``overhead``, fits ``device``'s memory. ``master_weights``
    (a master recipe, the graph re-typed to half): FSDP2's ``MixedPrecisionPolicy(
    param_dtype=half, reduce_dtype=fp32)`` — the shards, their gradients, the reduce-scatter
    inputs and the optimizer stay fp32; the gathered parameters and the step run in half.
    ``allocator``: the caching allocator's settings the reserved peak is replayed with;
    ``workspaces``: ``device``'s kernels' workspaces over ``graph`` where the caller has them
    (a plan's layouts share one graph: passes/device/gpu_workspaces.py), else made here."""
    check_spec(spec)
    if master_weights and spec.strategy not in SHARDED:
        raise GraphcostError(f"a master-weights {opt('precision')} with "
                             f"{opt('parallel', value=spec.strategy)}: modelled for fully_shard's "
                             "MixedPrecisionPolicy (zero2, zero3, fsdp); with ddp or zero1 use "
                             "an autocast or a true recipe (bf16-mixed, bf16-true)")
    if device is not None and workspaces is None:
        workspaces = gpu_workspaces(graph, device, len(forward_set(graph)))
    plan = _Plan(graph, training, spec, 2 if master_weights else 1, allocator, device,
                 overhead, workspaces)
    if spec.world_size is not None:
        return plan.at(spec.world_size)
    if device is None:
        raise GraphcostError(f"{opt('parallel.world_size', value='auto')} needs {opt('device')} (the memory "
                             "of each rank)")
    return _smallest(plan, lambda r: r.peak.fit(device, overhead=overhead).fits)


def _smallest(plan: "_Plan", fits: Callable[[ParallelMemory], bool]) -> ParallelMemory:
    tried: dict[int, ParallelMemory] = {}

    def at(n: int) -> ParallelMemory:
        if n not in tried:
            tried[n] = plan.at(n)
        return tried[n]

    def ok(n: int) -> bool:
        return fits(at(n))

    hi = 1
    while not ok(hi):
        if plan.spec.strategy == Strategy.DDP or hi >= MAX_WORLD:
            r = at(hi)
            why = ("ddp replicates the whole step on every rank" if plan.spec.strategy == Strategy.DDP
                   else f"even {hi:,} ranks leave {r.per_rank_peak_bytes:,} B per rank "
                        f"(activations, {'gathered units, ' if plan.sharded else ''}"
                        "and what is not sharded)")
            raise GraphcostError(f"{opt('parallel.world_size', value='auto')}: no world size fits the device: {why}; "
                                 f"one rank needs {at(1).per_rank_peak_bytes:,} B")
        hi *= 2
    lo = hi // 2   # does not fit (or hi == 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    best = at(hi)
    return replace(best, world_size_search=tuple(sorted(
        (n, r.per_rank_peak_bytes) for n, r in tried.items())))


class _Plan:
    """What does not depend on the world size: the step's tensors and (sharded strategies)
    the units; ``at(N)`` prices one world size."""

    def __init__(self, graph: Graph, training: TrainingMemory, spec: ParallelSpec,
                 master: int = 1, allocator: AllocatorConfig = AllocatorConfig(),
                 device: DeviceRates | None = None, overhead: Overhead | None = None,
                 workspaces: GpuWorkspaces | None = None):
        self.graph, self.spec, self.training = graph, spec, training
        self.allocator, self.device, self.overhead = allocator, device, overhead
        self.master = master  # fp32 bytes per graph (half) byte of what FSDP2 keeps in fp32
        self.step = training.run
        self.sharded = spec.strategy in SHARDED
        fwd = forward_set(graph)
        self.forward_end = len(fwd)
        # what a CUDA device's kernels allocate besides the tensors (the reserved replay's)
        self.workspaces = workspaces
        values = graph.values
        self.trainable = trainable_params(graph)
        self.param_bytes = sum(v.spec.nbytes or 0 for v in values.values()
                               if v.kind == ValueKind.PARAM)
        self.buffer_bytes = training.buffer_bytes
        self.buffer_sizes = [v.spec.nbytes or 0 for v in values.values()
                             if v.kind == ValueKind.BUFFER]
        origin, _ = origins(graph)
        grads = dict(graph.grads) or dict(zip(self.trainable, graph.outputs[1:]))
        self.grad_storage: dict[str, list[str]] = {}
        for p, g in grads.items():
            self.grad_storage.setdefault(origin.get(g, g), []).append(p)
        self.units: list[Unit] = []
        if self.sharded:
            names = unit_names(graph, fwd, list(spec.units) if spec.units else None)
            experts = expert_modules(graph) if spec.ep > 1 else []
            units, _ = fsdp_units(graph, fwd, [*experts, *names])
            self.units = [replace(u, ep=spec.ep, tp=spec.tp) if u.name in experts else u
                          for u in units]

    def at(self, world: int) -> ParallelMemory:
        clock = Clock(len(self.graph.nodes))
        if self.sharded:
            units, host, comm = sharded_step(self, clock, world)
            # (each unit's gradient shard: an expert-parallel rank's experts' over efsdp)
            comm = across_replicas(comm, self.spec.replicate,
                                   self.master * sum(u.grad_padded_bytes // u.group(world)
                                                     for u in units),
                                   sum(1 for u in units if u.grad_padded_bytes))
            rank, buckets = 0, 0
        else:
            rank, host, comm, buckets = self._replicated(clock, world)
            units = ()
        p = price(clock)
        t, n = self.training, clock.n
        foreach = t.optimizer_impl == OptimizerImpl.FOREACH
        events = rank_events(clock, foreach, self.workspaces)
        reserved = covering(rank_reserved_peak(events, self.allocator),
                            max(p.peak_bytes, p.first_step_peak_bytes),
                            f"a rank of {world * self.spec.replicate * self.spec.tp}")
        plan = self.training.checkpoint
        recomputed = plan.recomputed if plan else frozenset()
        comm = with_tensor_parallel(comm, self.graph, self.spec.tp, recomputed)
        comm = with_expert_parallel(comm, self.graph, self.spec.ep, recomputed)
        comm = with_context_parallel(comm, self.graph, self.spec.cp, recomputed)
        # (the tensor-parallel ranks share a batch; the context-parallel ones each sequence)
        data = world * self.spec.replicate
        return ParallelMemory(
            strategy=self.spec.strategy, world_size=data * self.spec.tp,
            per_rank_batch=self.graph.batch,
            global_batch=self.graph.batch * data // self.spec.cp, optimizer_impl=t.optimizer_impl,
            offload=self.spec.offload, per_rank_peak_bytes=p.peak_bytes,
            reserved_peak_bytes=reserved,
            first_step_peak_bytes=p.first_step_peak_bytes,
            single_device_peak_bytes=self.step.peak_bytes,
            peak_phase="optimizer" if p.at_step else
            "forward" if p.peak_node < self.forward_end else "backward",
            peak_node=self.graph.nodes[p.peak_node].name if p.peak_node < n else None,
            peak_event=p.peak_label, worst_rank=rank, breakdown_at_peak=p.breakdown,
            detail_at_peak=p.detail, detail_at_step=p.step_detail,
            first_step_detail=p.first_step_detail, host_bytes=sum(host.values()),
            host_breakdown=host, timeline=p.timeline, units=units, ddp_buckets=buckets, comm=comm,
            mesh={name: n or 0 for name, n in
                  mesh_of(self.spec.strategy, world, self.spec.replicate, self.spec.tp,
                          self.spec.ep, self.spec.cp).dims},
            spec=self.spec, flushing=self._flushing(events, reserved, data))

    def _flushing(self, events: list[Event], reserved: int, ranks: int) -> Flushing | None:
        """Where the two steps reserve more than the device leaves the allocator: the replay
        held to that, as PyTorch's allocator empties its cache and retries (None: no device,
        it fits unlimited, or the held replay runs out of memory too)."""
        if self.device is None or self.workspaces is None:
            return None
        capacity = allocator_capacity(self.device, threads=2, overhead=self.overhead,
                                      world=ranks * self.spec.tp)
        return rank_flushing(events, self.allocator, reserved, capacity)

    # ------------------------------------------------------------------ shared pieces

    def _state(self, sizes: list[int]) -> int:
        return sum(state_tensors(sizes, self.training.optimizer))

    def _temps(self, sizes: list[int]) -> int:
        return step_temporaries(sizes, self.training.optimizer, self.training.optimizer_impl)

    def place_storages(self, clock: Clock, grad_end: Callable[[list[str]], int],
                       grad_detail: str) -> None:
        """The joint graph's tensors: gradients (until ``grad_end`` of their parameters),
        activations (made in forward) and backward temporaries."""
        for st in self.step.storages:
            base = st.name.removesuffix("@recompute")
            start = clock.node(st.birth)
            ps = self.grad_storage.get(base)
            if ps:
                clock.add(start, grad_end(ps), st.nbytes, grad_detail)
            else:
                clock.add(start, clock.node(st.death) + 1, st.nbytes,
                          "activations" if st.birth < self.forward_end
                          else "backward_temporaries")

    def place_optimizer(self, clock: Clock, sizes: list[int]) -> dict[str, int]:
        """The optimizer state and the step's temporaries for tensors of ``sizes`` bytes, in
        the order the step visits them: on the device, or with offload on the host, with host
        copies of the shards the step reads and writes (returned: what goes to the host)."""
        state, temps = self._state(sizes), self._temps(sizes)
        if self.spec.offload:
            host = dict(optimizer_state=state, temporaries=temps)
            if self.spec.offload == Offload.OPTIMIZER:
                host.update(params=sum(sizes), grads=sum(sizes))
            return host
        opt_at = clock.node(clock.n)
        clock.add(0, clock.size, state, "optimizer_state", self._state_tensors(sizes))
        clock.add(opt_at, opt_at + 1, temps, "step_temporaries", sizes)
        return {}

    def _state_tensors(self, sizes: list[int]) -> list[int]:
        return state_tensors(sizes, self.training.optimizer)

    # ------------------------------------------------------------------ ddp / zero1

    def _replicated(self, clock: Clock, world: int):
        spec = self.spec
        clock.freeze()
        end, opt_at = clock.size, clock.node(clock.n)
        values = self.graph.values
        grad_sizes = [values[p].spec.nbytes or 0 for p in self.trainable]
        buckets = [] if spec.unwrapped else \
            ddp_buckets(grad_sizes, int(spec.bucket_cap_mb * (1 << 20)))
        clock.add(0, end, self.param_bytes, "params",
                  [v.spec.nbytes or 0 for v in values.values() if v.kind == ValueKind.PARAM])
        clock.add(0, end, self.buffer_bytes, "buffers", self.buffer_sizes)
        clock.add(0, end, sum(buckets), "ddp_buckets", buckets)
        self.place_storages(clock, lambda ps: end, "grads")    # gradients live to the step
        if spec.strategy == Strategy.DDP:
            ranks = [list(range(len(grad_sizes)))]
        else:
            ranks = zero1_partition([values[p].spec.numel or 0 for p in self.trainable], world)
        # the ranks differ only by their optimizer state and step: find the worst
        common = clock.totals()
        before_step = max(common[:opt_at], default=0)
        rank, worst = 0, -1
        for r, owned in enumerate(ranks):
            sizes = [grad_sizes[i] for i in owned]
            state, temps = (0, 0) if spec.offload else (self._state(sizes), self._temps(sizes))
            peak = max(before_step + state, common[opt_at] + state + temps)
            if peak > worst:
                rank, worst = r, peak
        host = self.place_optimizer(clock, [grad_sizes[i] for i in ranks[rank]])
        gathered = sum(grad_sizes) if spec.strategy == Strategy.ZERO1 else 0
        comm = comm_volume(world, gathered, 0, sum(buckets),
                           len(buckets) + (len(grad_sizes) if gathered else 0),
                           spec.interconnect, "dp_replicate" if spec.strategy == Strategy.DDP
                           else "dp_shard")
        return rank, host, comm, len(buckets)
