"""The tensor-parallel dimension of a rank's step: its communication.

The graph a tensor-parallel rank runs is already its own (the module rewritten into the
rank's program before the trace: analyzer/frontends/torch/tensor_parallel.py), so its
activations, sharded parameters and gradients are the traced step's; what this adds is the
volume of the collectives the program calls, each a node of the graph (passes/costs/
collectives.py, which counts them and says what a ring sends for each).
"""
from __future__ import annotations

from ..costs.collectives import ring_wire, tp_collectives
from ..ir import Graph
from .comm import CommVolume, with_dimension


def with_tensor_parallel(comm: CommVolume, graph: Graph, tp: int,
                         recomputed: frozenset[int] = frozenset()) -> CommVolume:
    """``comm`` with the tensor-parallel collectives of ``graph`` over ``tp`` ranks (those
    of ``recomputed`` nodes twice)."""
    if tp <= 1:
        return comm
    c = tp_collectives(graph, recomputed)
    wire = ring_wire(c, tp)
    return with_dimension(comm, "tp", wire, c["calls"], all_gather=c["all_gather"],
                          reduce_scatter=c["reduce_scatter"], all_reduce=c["all_reduce"])
