"""A parallel rank's step on the clock: its kernels (the time estimate of its own program,
passes/device/time_estimate.py), its collectives priced per mesh dimension on the link that
dimension's group crosses, and what of them the compute hides.

Per dimension (``comm.by_dim``: the wire bytes each way, passes/parallel/comm.py):

    seconds = wire / (BUS_SHARE × link bandwidth) + ALPHA_S × its collective calls

— the α–β model of a ring collective (passes/costs/collectives.py ``ring_seconds``).

The link: torchtitan lays a mesh out with ``tp`` innermost (consecutive ranks), then ``cp``,
``dp_shard``, ``dp_replicate``, ``pp`` outermost. A dimension's group spans ``stride × size``
consecutive ranks (``stride``: the inner dimensions' sizes multiplied); within one node of
``gpus_per_node`` GPUs it runs on the node's link (NVLink), else on the network's (one NIC per
GPU), which the ring's slowest hop bounds.

What overlaps (torch/distributed/fsdp/_fully_shard, torch/nn/parallel/distributed.py):

- FSDP2 (zero3/fsdp) prefetches the next unit's all-gather on its own stream and
  reduce-scatters (and, HSDP, all-reduces across replicas) on another while the next unit
  computes: the whole forward and backward are its window, less the first all-gather and the
  last reduce, which nothing can hide (one call each at its dimension's mean call time);
- DDP (and ZeRO-1/2, whose gradients are reduced the same way) all-reduces buckets as the
  backward fills them: the backward (``BACKWARD_SHARE`` of the compute) is its window;
- an FSDP unit of an expert-parallel rank's experts gathers and reduces over efsdp the same
  way; the experts' all-to-alls (``ep``) wait on the router and feed the experts: exposed
  (torchtitan's default dispatcher, no overlap);
- tensor parallelism's collectives sit between the matmuls that need them: all exposed,
  unless asynchronous (``async_tp``: torchtitan's async TP and Megatron's --tp-comm-overlap
  cut each matmul into chunks whose collectives run beside the next chunk's compute), which
  puts them with the data-parallel streams under the compute, every call hidden.

What the window cannot hide is exposed and added to the step. Not modelled: compute slowed by
the collectives sharing its SMs and memory, NCCL's tree and NVLink SHARP algorithms.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod
from typing import Mapping

from ..choices import Strategy
from ..costs.collectives import ring_seconds
from ..device.time_estimate import TimeEstimate
from .comm import CommVolume, InterconnectRates
from .mesh import CARVED
from .schedules import Schedule, rank_stages

BACKWARD_SHARE = 2 / 3   # the backward's share of a step's forward and backward
INNER_TO_OUTER = ("tp", "cp", "ep", "dp_shard", "dp_replicate", "pp")
HIDDEN_BY_COMPUTE = ("dp_shard", "efsdp", "dp_replicate")   # data-parallel streams
# collectives named apart from the mesh dimension whose ranks they span: efsdp's group
# (strided by ep) spans what dp_shard's does, a tied table's two end stages what pp's does
SPANS_OF = {"efsdp": "dp_shard", "tied": "pp"}


@dataclass(frozen=True)
class Links:
    """The links a rank's collectives run on: inside its node and between nodes."""
    intra: InterconnectRates
    inter: InterconnectRates
    gpus_per_node: int = 8


def dim_link(mesh: Mapping[str, int], dim: str, links: Links) -> InterconnectRates:
    """The link the group of mesh dimension ``dim`` crosses. The ep group is consecutive
    ranks carved out of dp_shard × cp (torchtitan's efsdp × ep), no factor of the others' spans;
    the groups of ``SPANS_OF`` span their dimension's."""
    if dim == "ep":   # (its ranks the innermost of dp_shard × cp × tp: consecutive)
        return links.intra if mesh.get("ep", 1) <= links.gpus_per_node else links.inter
    dim = SPANS_OF.get(dim, dim)
    inner = INNER_TO_OUTER[:INNER_TO_OUTER.index(dim)] if dim in INNER_TO_OUTER else ()
    span = prod(mesh.get(d, 1) for d in inner if d not in CARVED) * mesh.get(dim, 1)
    return links.intra if span <= links.gpus_per_node else links.inter


def dim_seconds(comm: CommVolume, mesh: Mapping[str, int], links: Links) -> dict[str, float]:
    """Each mesh dimension's collectives, seconds per step."""
    return {dim: ring_seconds(wire, comm.calls_by_dim.get(dim, 0),
                              dim_link(mesh, dim, links).bandwidth)
            for dim, wire in comm.by_dim.items()}


@dataclass(frozen=True)
class RankStep:
    """What the clock needs of a parallel rank beyond its kernels."""
    comm: CommVolume
    mesh: Mapping[str, int]
    strategy: str
    tokens: int | None          # tokens a step processes over all ranks (None: not a sequence)
    world_size: int             # GPUs
    model_flops: int            # the rank's forward and backward, without recompute
    recompute_flops: int
    peak_flops: float | None    # the device's dense rate of the step's main dtype
    async_tp: bool = False      # tp's collectives overlapped by its matmuls


def rank_step_time(compute: TimeEstimate, rank: RankStep, links: Links) -> TimeEstimate:
    """``compute`` (the rank's kernels and optimizer) with its collectives on the clock."""
    seconds = dim_seconds(rank.comm, rank.mesh, links)
    busy = compute.seconds - compute.optimizer_seconds
    window = busy if rank.strategy in (Strategy.ZERO3, Strategy.FSDP) \
        else busy * BACKWARD_SHARE
    overlapping = HIDDEN_BY_COMPUTE + (("tp",) if rank.async_tp else ())
    exposed = sum(t for d, t in seconds.items() if d not in overlapping)
    edges = hidden = 0.0
    for d in overlapping:
        if d in seconds:
            calls = max(1, rank.comm.calls_by_dim.get(d, 1))
            edge = 0.0 if d == "tp" else seconds[d] * min(1.0, 2 / calls)
            edges += edge
            hidden += seconds[d] - edge
    overlapped = min(hidden, window)
    exposed += edges + hidden - overlapped
    total = compute.seconds + exposed
    return replace(compute, seconds=total, communication_seconds=exposed,
                   overlapped_seconds=overlapped, **utilisation(total, rank))


def utilisation(seconds: float, rank: RankStep) -> dict:
    """tokens/s per GPU, MFU and HFU (recompute counted) of a step that takes ``seconds``."""
    if seconds <= 0:
        return {"tokens_per_second": None, "mfu": None, "hfu": None, "gpus": rank.world_size}
    peak = rank.peak_flops
    return {"gpus": rank.world_size,
            "tokens_per_second": rank.tokens / rank.world_size / seconds
            if rank.tokens else None,
            "mfu": rank.model_flops / (seconds * peak) if peak else None,
            "hfu": (rank.model_flops + rank.recompute_flops) / (seconds * peak)
            if peak else None}


def pipeline_step_time(stages: list[TimeEstimate], microbatches: int, rank: RankStep,
                       comms: list[CommVolume], links: Links, async_tp: bool = False,
                       shard: int = 1, gathered: list[float] | None = None,
                       per_rank: int = 1, weight_shares: list[float] | None = None,
                       schedule: str = "") -> TimeEstimate:
    """A pipeline's step from each stage's estimate for one micro-batch (its forward and
    backward, and its optimizer step) and its rank's collectives a step (``comms``): GPipe
    and 1F1B both run ``microbatches`` + ranks − 1 slots of the slowest rank, the ranks − 1
    beyond the micro-batches being the bubble (the design notes' (p − 1)/(m + p − 1)); an
    interleaved schedule's rank runs ``per_rank`` stages (``stages`` in pipeline order, rank
    ``r`` the ``r``-th, the ``r + p``-th, …), its slot all of theirs, its bubble ``per_rank``
    times shorter ((p − 1)/(v·m + p − 1)). A stage's share of a slot is its kernels with its
    tensor-parallel collectives (exposed, unless ``async_tp``), its expert-parallel
    all-to-alls and context-parallel ring (exposed) and its sends and receives (pp). fully_shard's all-gathers (an
    experts unit's over efsdp too) run in the first micro-batch's forward, hidden by it but
    for the first; its reduce-scatters (and HSDP's all-reduce) after the last backward, where
    nothing hides them (``gathered``: each stage's all-gathers' share of its fully_shard
    bytes; the comms' volumes hold tp's beside them), as nothing hides the end stages'
    all-reduce of a tied table's gradient (``tied``) there. The optimizer steps once on the
    rank's shards (``shard`` ranks share each), the slowest rank's deciding. A zero-bubble
    schedule (``weight_shares``: each stage's share of its kernels in the backward's weight
    half, W) fills the bubble with W, by the zero-bubble paper's bubbles: ZB-H1's, (p − 1)(F +
    I − W) in place of (p − 1)(F + I + W), ``per_rank`` times shorter; ``schedule`` "zbv"
    (its V of two chunks a rank), ZB-H2's (p − 1)(F + I − 2W), none when F = I = W."""
    slots, steps, hidden = [], [], []
    for t, c, share in zip(stages, comms, gathered or [0.0] * len(stages)):
        sec = dim_seconds(c, rank.mesh, links)
        compute = t.seconds - t.optimizer_seconds
        slot_comm = ((0.0 if async_tp else sec.get("tp", 0.0)) + sec.get("pp", 0.0)
                     + sec.get("ep", 0.0) + sec.get("cp", 0.0)) / microbatches
        data = sec.get("dp_shard", 0.0) + sec.get("efsdp", 0.0)
        gather = data * share
        calls = max(1, c.calls_by_dim.get("dp_shard", 1))
        exposed = max(gather * min(1.0, 2 / calls), gather - compute * (1 - BACKWARD_SHARE))
        slots.append((compute + slot_comm, slot_comm))
        steps.append(exposed + data - gather + sec.get("dp_replicate", 0.0)
                     + sec.get("tied", 0.0))
        hidden.append(gather - exposed)
    p = len(stages) // per_rank
    ranks = [rank_stages(schedule, r, p, per_rank) for r in range(p)]
    w = max(range(p), key=lambda r: sum(slots[i][0] for i in ranks[r]))
    local, m = ranks[w], microbatches
    slot, slot_comm = (sum(slots[i][k] for i in local) for k in (0, 1))
    w = sum((stages[i].seconds - stages[i].optimizer_seconds) * (weight_shares or
                                                                  [0.0] * len(stages))[i]
            for i in local)
    bubble = (p - 1) * max(0.0, slot - (3 if schedule == Schedule.ZBV else 2) * w) / per_rank
    optimizer = max(sum(stages[i].optimizer_seconds for i in rk) for rk in ranks) / shard
    after = max(sum(steps[i] for i in rk) for rk in ranks)
    total = m * slot + bubble + optimizer + after

    def each(name: str) -> float:
        return m * sum(getattr(stages[i], name) for i in local)
    return replace(stages[local[0]], seconds=total, arithmetic_seconds=each("arithmetic_seconds"),
                   memory_seconds=each("memory_seconds"), launch_seconds=each("launch_seconds"),
                   host_seconds=each("host_seconds"),
                   recompute_seconds=each("recompute_seconds"), kernels=round(each("kernels")),
                   optimizer_seconds=optimizer, bubble_seconds=bubble,
                   communication_seconds=m * slot_comm + after,
                   overlapped_seconds=sum(hidden[i] for i in local), **utilisation(total, rank))
