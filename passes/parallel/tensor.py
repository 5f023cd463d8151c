"""The tensor-parallel dimension of a rank's step: its communication.

The graph a tensor-parallel rank runs is already its own (the module rewritten into the
rank's program before the trace: analyzer/frontends/torch/tensor_parallel.py), so its
activations, sharded parameters and gradients are the traced step's; what this adds is the
volume of the collectives the program calls, each a node of the graph (passes/costs/
collectives.py): with the ring algorithms an all-reduce of S bytes sends 2·(T−1)/T·S over
the rank's link, an all-gather whose output is S bytes and a reduce-scatter whose input is S
bytes (T−1)/T·S each.
"""
from __future__ import annotations

from ..costs.collectives import COLLECTIVES, ROW_ALL_REDUCES
from ..ir import Graph
from .comm import CommVolume, with_dimension


def tp_collectives(graph: Graph, recomputed: frozenset[int] = frozenset()) -> dict[str, int]:
    """Bytes of each collective the graph's nodes run (all_reduce, all_gather,
    reduce_scatter: the buffer NCCL's tests size them by), and ``calls``; a node among
    ``recomputed`` (a checkpoint's forward, run again in backward) twice."""
    out = dict(all_reduce=0, all_gather=0, reduce_scatter=0, calls=0)
    for node in (*graph.nodes, *(graph.nodes[i] for i in sorted(recomputed))):
        per_row = ROW_ALL_REDUCES.get(node.op, 0)
        if per_row:   # one value of each row of its first input, fp32, per all-reduce
            spec = graph.values[node.inputs[0]].spec
            last = spec.shape[-1] if spec.shape else None
            rows = (spec.numel or 0) // last if isinstance(last, int) and last else 0
            out["all_reduce"] += per_row * 4 * rows
            out["calls"] += per_row
        kind = COLLECTIVES.get(node.op)
        if kind is None:
            continue
        ends = node.inputs[:1] if kind == "reduce_scatter" else node.outputs
        out[kind] += sum(graph.values[v].spec.nbytes or 0 for v in ends)
        out["calls"] += 1
    return out


def with_tensor_parallel(comm: CommVolume, graph: Graph, tp: int,
                         recomputed: frozenset[int] = frozenset()) -> CommVolume:
    """``comm`` with the tensor-parallel collectives of ``graph`` over ``tp`` ranks (those
    of ``recomputed`` nodes twice)."""
    if tp <= 1:
        return comm
    c = tp_collectives(graph, recomputed)
    wire = round((tp - 1) / tp * (2 * c["all_reduce"] + c["all_gather"] + c["reduce_scatter"]))
    return with_dimension(comm, "tp", wire, c["calls"], all_gather=c["all_gather"],
                          reduce_scatter=c["reduce_scatter"], all_reduce=c["all_reduce"])
