"""Mixed precision as an IR transformation: every floating tensor of the graph re-typed.

``fp16-mixed`` / ``bf16-mixed`` (the Apex-O2 / Megatron recipe): the model's weights,
activations and gradients in half precision; the optimizer keeps an fp32 master copy of the
weights and fp32 state, and steps on fp32 copies of the gradients. The graph's tensors are
re-typed here; the fp32 master side is added by the training pass. Nothing is re-traced.
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from graphcost.analyzer.errors import GraphcostError
from graphcost.analyzer.ir import Graph, TensorSpec, Value

PRECISIONS = {"fp32": None, "fp16-mixed": "float16", "bf16-mixed": "bfloat16"}
_WIDE = {"float32", "float64"}


def cast_floats(graph: Graph, precision: str) -> Graph:
    if precision not in PRECISIONS:
        raise GraphcostError(f"unknown precision {precision!r}; known: " + ", ".join(PRECISIONS))
    dtype = PRECISIONS[precision]
    if dtype is None:
        return graph
    specs: dict[TensorSpec, TensorSpec] = {}
    values = {}
    for name, v in graph.values.items():
        spec = v.spec
        if spec.dtype in _WIDE:
            new = specs.get(spec)
            if new is None:
                new = specs[spec] = TensorSpec(spec.shape, dtype)
            v = Value(v.name, new, v.kind, v.producer)
        values[name] = v
    return replace(graph, values=MappingProxyType(values))
