"""Per-module aggregation: the node costs summed up the module hierarchy (torchinfo-style).

A node's ``scope`` is its module path (``layer1.0.conv1``); each node counts toward that module
and every ancestor (``layer1.0``, ``layer1`` and the root ``""``). Parameters count toward the
module of the node they are attributed to by the params pass.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..costs import CostReport
from ..ir import INTERNAL, Graph
from .params import ParamReport


@dataclass(frozen=True)
class ModuleCost:
    path: str            # "" is the whole model
    type: str            # the module's class where the frontend knows it (FX), else ""
    depth: int           # number of path components
    nodes: int
    params: int
    macs: int
    flops: int
    output_bytes: int    # bytes written by the module's nodes (views excluded)
    first_node: int = field(default=0, metadata=INTERNAL)  # execution order of its first node


def aggregate_modules(graph: Graph, costs: CostReport, params: ParamReport) -> list[ModuleCost]:
    acc: dict[str, list[int]] = {}  # path -> [first, nodes, params, macs, flops, out_bytes]
    for node, nc in zip(graph.nodes, costs.nodes):
        parts = node.scope.split(".") if node.scope else []
        p = params.per_node.get(node.index, 0)
        c = nc.cost
        for i in range(len(parts) + 1):
            path = ".".join(parts[:i])
            slot = acc.get(path)
            if slot is None:
                slot = acc[path] = [node.index, 0, 0, 0, 0, 0]
            slot[1] += 1
            slot[2] += p
            slot[3] += c.macs
            slot[4] += c.flops
            slot[5] += c.bytes_written
    types = graph.module_types
    rows = [ModuleCost(path, types.get(path, ""), len(path.split(".")) if path else 0,
                       *vals[1:], first_node=vals[0])
            for path, vals in acc.items()]
    rows.sort(key=lambda m: (m.first_node, m.depth))
    return rows
