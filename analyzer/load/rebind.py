"""One model, many batch sizes, two traces: a traced graph re-bound to another batch.

Tracing a PyTorch model is most of an analysis (a GPT-2 training step: about a second; the
passes a tenth of that), and ``--max-batch`` looks at a dozen batches. The graph's structure
does not depend on the batch, only its sizes do, and every size a model computes from its
batch is affine in it (``b``, ``b·seq``, ``b·heads``): two traces at batches b1 ≠ b2 give each
dim's line, d(b) = d1 + (d2 − d1)·(b − b1)/(b2 − b1), and any other batch is that graph with
its dims re-bound — no trace. When the two traces differ in anything but sizes, or a dim is
not a whole number on its line, there is no family (``None``) and the caller traces each batch.
``--max-batch`` checks the family against one more real trace at its answer.
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Callable

from ...passes.ir import Graph, TensorSpec, Value


def batch_family(g1: Graph, b1: int, g2: Graph, b2: int) -> Callable[[int], Graph] | None:
    """``f(b)``: ``g1`` re-bound to batch ``b``, or None when the traces are not one family."""
    if b1 == b2 or not _same_structure(g1, g2):
        return None
    lines: dict[str, tuple[tuple[int, int], ...]] = {}  # value -> per dim (d1, slope numerator)
    for name, v1 in g1.values.items():
        s1, s2 = v1.spec.shape, g2.values[name].spec.shape
        if s1 == s2:
            continue
        if s1 is None or s2 is None or len(s1) != len(s2):
            return None
        dims = [(a, b) for a, b in zip(s1, s2) if type(a) is int and type(b) is int]
        if len(dims) != len(s1):
            return None
        lines[name] = tuple((a, b - a) for a, b in dims)
    db = b2 - b1

    def at(b: int) -> Graph:
        if b == b1:
            return g1
        values = dict(g1.values)
        specs: dict[tuple, TensorSpec] = {}
        for name, dims in lines.items():
            shape = []
            for d1, rise in dims:
                num = rise * (b - b1)
                if num % db:
                    raise ValueError(f"{name}: a dim is not whole at batch {b}")
                shape.append(d1 + num // db)
            v = g1.values[name]
            key = (tuple(shape), v.spec.dtype)
            spec = specs.get(key)
            if spec is None:
                spec = specs[key] = TensorSpec(key[0], key[1])
            values[name] = Value(v.name, spec, v.kind, v.producer)
        dims = {k: (b if k == "batch" else v) for k, v in g1.dims.items()}
        return replace(g1, values=MappingProxyType(values), batch=b,
                       dims=MappingProxyType(dims))
    return at


def _same_structure(g1: Graph, g2: Graph) -> bool:
    if (len(g1.nodes), g1.inputs, g1.outputs, g1.values.keys()) != \
            (len(g2.nodes), g2.inputs, g2.outputs, g2.values.keys()):
        return False
    return all((a.op, a.inputs, a.outputs, a.repeat) == (b.op, b.inputs, b.outputs, b.repeat)
               for a, b in zip(g1.nodes, g2.nodes))
