"""The tensor-parallel dimension of a rank's step: its communication.

The graph a tensor-parallel rank runs is already its own (the module rewritten into the
rank's program before the trace: analyzer/frontends/torch/tensor_parallel.py), so its
activations, sharded parameters and gradients are the traced step's; what this adds is the
volume of the collectives the program calls, each a node of the graph (passes/costs/
collectives.py): an all-reduce of S bytes sends 2·(T−1)/T·S over the rank's link with the
ring algorithm, an all-gather whose output is S bytes (T−1)/T·S.
"""
from __future__ import annotations

from dataclasses import replace

from ..costs.collectives import COLLECTIVES
from ..ir import Graph
from .comm import CommVolume


def tp_collectives(graph: Graph) -> tuple[int, int, int]:
    """(bytes all-reduced, bytes all-gathered, calls) by the graph's collective nodes."""
    reduced = gathered = calls = 0
    for node in graph.nodes:
        kind = COLLECTIVES.get(node.op)
        if kind is None:
            continue
        size = sum(graph.values[o].spec.nbytes or 0 for o in node.outputs)
        calls += 1
        if kind == "all_reduce":
            reduced += size
        else:
            gathered += size
    return reduced, gathered, calls


def with_tensor_parallel(comm: CommVolume, graph: Graph, tp: int) -> CommVolume:
    """``comm`` with the tensor-parallel collectives of ``graph`` over ``tp`` ranks."""
    if tp <= 1:
        return comm
    reduced, gathered, calls = tp_collectives(graph)
    wire = round((tp - 1) / tp * (2 * reduced + gathered))
    total = comm.wire_bytes + wire
    return replace(comm, all_reduce_bytes=comm.all_reduce_bytes + reduced,
                   all_gather_bytes=comm.all_gather_bytes + gathered,
                   wire_bytes=total, collectives=comm.collectives + calls,
                   seconds=total / comm.bandwidth if comm.bandwidth else None,
                   by_dim={**comm.by_dim, "tp": wire})
