"""The context-parallel dimension of a rank's step: its ring attention's collectives.

The graph a context-parallel rank runs is already its own (its shard of each sequence, each
attention call PyTorch's ring over the cp ranks, traced: analyzer/frontends/torch/
context_parallel.py), so its activations and the ring's buffers are the traced step's; the
cp ranks join dp_shard's in fully_shard (torchtitan's dp_shard × cp mesh), which the FSDP
pass shards over. What this adds is the ``cp`` dimension's communication: per attention call
one all-gather of the keys and values in the forward and another in the backward (a rank
receives (cp − 1)/cp of each) and, in the backward, each ring step's key/value gradients
passed on (an all-to-all, all of it on the wire).
"""
from __future__ import annotations

from ..choices import Rotate
from ..costs.collectives import ring_bytes
from ..errors import GraphcostError, opt
from ..ir import Graph
from .comm import CommVolume, with_dimension


def check_cp(cp, sharded: bool, world: int | None, rotate: str = Rotate.ALL_GATHER) -> None:
    """``cp``: a whole number ≥ 1; above 1 within a sharding strategy's ``world`` ranks
    (None: searched), dividing it; ``rotate`` one of Rotate's, another than the default only
    beside a ring."""
    if not isinstance(cp, int) or cp < 1 or (cp > 1 and (not sharded or (world or cp) % cp)):
        raise GraphcostError(f"{opt('parallel', value=f'cp={cp}')}: the cp ranks shard the "
                             "weights with dp_shard's (torchtitan's dp_shard × cp, under "
                             "zero2, zero3 or fsdp): a whole number dividing the sharding "
                             "ranks")
    if rotate not in Rotate.words():
        raise GraphcostError(f"{opt('parallel.cp_rotate', value=rotate)}: known: "
                             f"{', '.join(Rotate.words())}")
    if rotate != Rotate.ALL_GATHER and cp == 1:
        raise GraphcostError(f"{opt('parallel.cp_rotate', value=rotate)} says how context "
                             "parallelism's ring hands on keys and values: a mesh with cp")


def with_context_parallel(comm: CommVolume, graph: Graph, cp: int,
                          recomputed: frozenset[int] = frozenset()) -> CommVolume:
    """``comm`` with the ring attention's collectives of ``graph`` over ``cp`` ranks (those
    of ``recomputed`` nodes twice)."""
    if cp <= 1:
        return comm
    gathered, passed, calls = ring_bytes(graph, recomputed)
    return with_dimension(comm, "cp", round((cp - 1) / cp * gathered) + passed, calls,
                          all_gather=gathered, all_to_all=passed)
