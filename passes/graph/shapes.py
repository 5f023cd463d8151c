"""Shape checks: which values the frontend could not give a concrete shape.

Costs of nodes touching them are reported as ``unknown_shape`` by the cost pass; this pass
names the values so the report can say where shape inference stopped.
"""
from __future__ import annotations

from ..ir import Graph, ValueKind


def check_shapes(graph: Graph, limit: int = 20) -> list[str]:
    issues = []
    for node in graph.nodes:
        for name in node.outputs:
            v = graph.values.get(name) if name else None
            if v is not None and v.kind == ValueKind.ACTIVATION and not v.spec.known:
                what = "unknown rank" if v.spec.shape is None else f"shape {v.spec.shape_str()}"
                issues.append(f"{node.name} ({node.op}) output {name!r}: {what}")
                if len(issues) >= limit:
                    return issues
    return issues
