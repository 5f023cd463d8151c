"""The cost pass: per-node MACs, FLOPs and bytes from the rule registry, plus coverage.

Importing this package registers every rule family exactly once.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from ..costs import (  # noqa: F401
    backward,
    collectives,
    contrib,
    detection,
    elementwise,
    linear,
    ml,
    movement,
    normalization,
    pooling,
    quantized,
    recurrent,
    sequence,
    signal,
    training_ops,
)
from ..costs.registry import (  # noqa: F401
    ZERO,
    Cost,
    OpView,
    ShapeUnknown,
    lookup,
    node_cost,
    registered,
)
from ..ir import Graph

OK, UNSUPPORTED, UNKNOWN_SHAPE = "ok", "unsupported", "unknown_shape"


@dataclass(frozen=True, slots=True)
class NodeCost:
    cost: Cost          # already multiplied by the node's repeat count
    status: str         # ok | unsupported | unknown_shape
    bound: str = ""     # set when the cost is an upper bound: what it assumes


@dataclass(frozen=True, slots=True)
class OpTotals:
    """One op type's nodes and their summed cost."""
    count: int
    macs: int
    flops: int
    bytes_read: int
    bytes_written: int


@dataclass(frozen=True)
class Coverage:
    nodes: int
    covered: int
    unsupported: Mapping[str, int]      # op -> nodes with no cost rule
    unknown_shape: Mapping[str, int]    # op -> nodes whose shapes stayed unknown
    bounded: Mapping[str, int] = field(default_factory=dict)  # op -> nodes costed at a bound
    JSON_PROPERTIES = ("percent",)

    @property
    def percent(self) -> float:
        return 100.0 * self.covered / self.nodes if self.nodes else 100.0


@dataclass(frozen=True)
class CostReport:
    nodes: tuple[NodeCost, ...]               # aligned with graph.nodes
    totals: Cost
    by_op_type: Mapping[str, OpTotals]        # sorted by op
    coverage: Coverage


def count_costs(graph: Graph) -> CostReport:
    results: list[NodeCost] = []
    per_op: dict[str, list[int]] = {}  # op -> [count, macs, flops, read, written]
    unsupported: Counter[str] = Counter()
    unknown: Counter[str] = Counter()
    bounded: Counter[str] = Counter()
    unsupported_cost = NodeCost(ZERO, UNSUPPORTED)
    unknown_cost = NodeCost(ZERO, UNKNOWN_SHAPE)
    covered = 0
    for node in graph.nodes:
        r = lookup(node.op)
        if r is None:
            unsupported[node.op] += 1
            nc = unsupported_cost
        else:
            try:
                view = OpView(node, graph, r)
                c = node_cost(r, view)
                if node.repeat != 1:
                    c = c.scaled(node.repeat)
                # sizes from a bound (the frontend's), a worst-case count (the rule's), or both
                why = "; ".join(w for w in (node.bound, view.bound) if w)
                if why:
                    bounded[node.op] += 1
                nc = NodeCost(c, OK, why)
                covered += 1
            except ShapeUnknown:
                unknown[node.op] += 1
                nc = unknown_cost
        results.append(nc)
        c = nc.cost
        slot = per_op.get(node.op)
        if slot is None:
            per_op[node.op] = [1, c.macs, c.flops, c.bytes_read, c.bytes_written]
        else:
            slot[0] += 1
            slot[1] += c.macs
            slot[2] += c.flops
            slot[3] += c.bytes_read
            slot[4] += c.bytes_written
    by_op = {k: OpTotals(*v) for k, v in sorted(per_op.items())}
    total = Cost(*(sum(v[i] for v in per_op.values()) for i in range(1, 5)))
    coverage = Coverage(len(graph.nodes), covered, dict(sorted(unsupported.items())),
                        dict(sorted(unknown.items())), dict(sorted(bounded.items())))
    return CostReport(tuple(results), total, by_op, coverage)
