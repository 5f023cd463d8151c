"""A pipeline stage's rank's collectives a step (the report's ``pipeline.comm``): its
micro-batch step (passes/parallel/pipeline.py) under the whole layout's mesh."""
from __future__ import annotations

from typing import Mapping

from .comm import CommVolume, across_replicas, comm_volume, with_dimension
from .pipeline import StageStep
from .units import expert_shards


def stage_comm(s: StageStep, per_micro: tuple[CommVolume, ...], mesh: Mapping[str, int],
               micro: int, first: bool, last: bool, tied: int = 0) -> CommVolume:
    """One stage's rank's collectives a step: fully_shard's all-gathers and reduce-scatters
    once (the gathered parameters stay for every micro-batch), HSDP's all-reduce of the
    gradient shards (an experts unit's over efsdp), ``per_micro`` (one micro-batch's
    collectives of one mesh dimension each: tp's, ep's all-to-alls, cp's ring) ``micro``
    times,
    and the stage's sends and receives (pp): each micro-batch's hidden states forward and
    their gradient back, to and from each neighbour stage; on the first and the last stage
    the all-reduce of a tied table's gradient (``tied`` bytes, after the last backward) with
    the other end's rank — a ring of two: each sends its bytes once (dimension ``tied``)."""
    # (fully_shard over dp_shard × cp, torchtitan's; ep carved out of them and tp's ranks)
    shard, replicas = mesh.get("dp_shard", 1) * mesh.get("cp", 1), mesh.get("dp_replicate", 1)
    efsdp = expert_shards(shard, mesh.get("tp", 1), mesh.get("ep", 1))
    c = comm_volume(shard, s.all_gather - s.expert_gather, s.reduce_scatter - s.expert_reduce,
                    0, s.gather_calls + s.reduce_calls - s.expert_calls, None)
    if s.expert_calls:
        e = comm_volume(efsdp, s.expert_gather, s.expert_reduce, 0, s.expert_calls, None)
        c = with_dimension(c, "efsdp", e.wire_bytes, e.collectives,
                           all_gather=s.expert_gather, reduce_scatter=s.expert_reduce)
    c = across_replicas(c, replicas, (s.reduce_scatter - s.expert_reduce) // shard
                        + s.expert_reduce // efsdp, s.reduce_calls)
    for one in per_micro:      # (each one dimension's alone: its totals are the dimension's)
        for dim, wire in one.by_dim.items():
            c = with_dimension(c, dim, micro * wire, micro * one.calls_by_dim[dim],
                               all_gather=micro * one.all_gather_bytes,
                               reduce_scatter=micro * one.reduce_scatter_bytes,
                               all_reduce=micro * one.all_reduce_bytes,
                               all_to_all=micro * one.all_to_all_bytes)
    sent = (0 if last else s.output_bytes) + (0 if first else s.input_bytes)
    if sent and mesh.get("pp", 1) > 1:
        c = with_dimension(c, "pp", micro * sent,
                           2 * micro * ((not first) + (not last)))
    if tied and (first or last):
        c = with_dimension(c, "tied", tied, 1, all_reduce=tied)
    return c

