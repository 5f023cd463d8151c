"""The expert-parallel dimension of a rank's step: its experts' FSDP units and its
all-to-alls.

The graph an expert-parallel rank runs is already its own (each layer's experts rewritten
into the rank's slice and torchtitan's token exchange before the trace: analyzer/frontends/
torch/expert_parallel.py), so its expert weights, activations and exchange buffers are the
traced step's. What this adds: which FSDP units hold the experts — torchtitan wraps each
layer's experts in a ``fully_shard`` of its own on the efsdp mesh (dp_shard · tp / ep ranks:
those holding the same slice), before the blocks — and the volume of the all-to-alls (each a node
of the graph: passes/costs/collectives.py), the ``ep`` dimension's communication. At
balanced routing a rank keeps 1/ep of what it sends and receives: (ep − 1)/ep of each
buffer crosses the link.
"""
from __future__ import annotations

from ..costs.collectives import all_to_all_bytes
from ..costs.registry import lookup
from ..errors import GraphcostError, opt
from ..ir import Graph
from .comm import CommVolume, with_dimension


def check_ep(ep, sharded: bool, world: int | None, tp: int = 1) -> None:
    """``ep``: a whole number ≥ 1; above 1 carved out of a sharding strategy's ``world``
    ranks (None: searched) and the ``tp`` ranks beside each, dividing them."""
    if not isinstance(ep, int) or ep < 1 or \
            (ep > 1 and (not sharded or ((world or ep) * tp) % ep)):
        raise GraphcostError(f"{opt('parallel', value=f'ep={ep}')}: the ep group is carved "
                             "out of a sharding strategy's ranks (zero2, zero3, fsdp) and "
                             "the tensor-parallel ones beside them: a whole number dividing "
                             "the world size")


def expert_modules(graph: Graph) -> list[str]:
    """The module paths of the experts (the scopes of the grouped matmuls that route rows to
    experts), in forward order."""
    found: dict[str, None] = {}
    for node in graph.nodes:
        r = lookup(node.op)
        if r is not None and r.routing == "experts" and node.scope:
            found.setdefault(node.scope)
    return list(found)


def with_expert_parallel(comm: CommVolume, graph: Graph, ep: int,
                         recomputed: frozenset[int] = frozenset()) -> CommVolume:
    """``comm`` with the all-to-alls of ``graph`` over ``ep`` ranks (those of ``recomputed``
    nodes twice)."""
    if ep <= 1:
        return comm
    volume, calls = all_to_all_bytes(graph, recomputed)
    return with_dimension(comm, "ep", round((ep - 1) / ep * volume), calls,
                          all_to_all=volume)
