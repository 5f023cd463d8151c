"""Sizes the data decides: the report's ``bounds`` section.

A frontend that meets a size the data decides (an NMS's kept boxes, a ``nonzero``) lowers the
graph with that size at the upper end of its range; every node touching it carries its bound
(``Node.bound``), so the report's costs and memory are upper bounds. This pass lists the sizes
(``Graph.size_bounds``: each range and what declares its maximum) and costs the same graph
once more with every such size at the lower end of its range (``Graph.lower_values``), so each
total and the activation peak are known at both ends.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

from ..costs import count_costs
from ..ir import Graph, SizeBound
from .liveness import analyze_liveness


@dataclass(frozen=True)
class Bounds:
    """The data-dependent sizes and the figures at the lower ends of their ranges (the
    report's totals and memory stand at the upper ends)."""
    sizes: tuple[SizeBound, ...]
    nodes: int                  # nodes whose cost depends on one of the sizes
    lower_macs: int
    lower_flops: int
    lower_bytes_read: int
    lower_bytes_written: int
    lower_activation_peak: int  # the activation peak with every size at its minimum


def size_bounds(graph: Graph, *, include_inputs: bool = True,
                eager: bool = False) -> Bounds | None:
    """None when no size depends on the data."""
    if not graph.size_bounds:
        return None
    lower = replace(graph, values=MappingProxyType({**graph.values, **graph.lower_values}))
    costs = count_costs(lower)
    memory = analyze_liveness(lower, include_inputs=include_inputs, eager=eager)
    t = costs.totals
    return Bounds(graph.size_bounds, sum(1 for n in graph.nodes if n.bound), t.macs, t.flops,
                  t.bytes_read, t.bytes_written, memory.peak_bytes)
