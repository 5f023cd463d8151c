"""Parameter counting: each weight counted once, however many nodes share it.

A weight is attributed to the first node (in execution order) that consumes it; a weight read by
several nodes (tied embeddings) is listed in ``shared``. Values the frontend marked PARAM that
are consumed only at an op's buffer positions (BatchNormalization's running mean/var) are
buffers, not trainable parameters — as ``nn.Module.parameters()`` counts them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from analyzer.ir import Graph, ValueKind
from passes.costs.registry import lookup


@dataclass(frozen=True)
class ParamReport:
    params: int                      # trainable parameter elements
    param_bytes: int
    buffers: int                     # non-trainable state elements (running stats, buffers)
    buffer_bytes: int
    const_bytes: int                 # integer index/shape constants (not parameters)
    per_node: Mapping[int, int]      # node index -> parameter elements attributed to it
    shared: Mapping[str, tuple[int, ...]]  # weight name -> node indices reading it (≥ 2)
    names: tuple[str, ...]           # trainable parameter value names, sorted


def count_params(graph: Graph) -> ParamReport:
    weight_kinds = (ValueKind.PARAM, ValueKind.BUFFER)
    consumers: dict[str, list[int]] = {}
    trainable_use: set[str] = set()
    values = graph.values
    for node in graph.nodes:
        r = lookup(node.op)
        buffer_pos = r.buffer_inputs if r is not None else ()
        for pos, name in enumerate(node.inputs):
            v = values.get(name) if name else None
            if v is None or v.kind not in weight_kinds:
                continue
            lst = consumers.setdefault(name, [])
            if not lst or lst[-1] != node.index:
                lst.append(node.index)
            if pos not in buffer_pos:
                trainable_use.add(name)

    params = param_bytes = buffers = buffer_bytes = const_bytes = 0
    per_node: dict[int, int] = {}
    names = []
    for name, v in values.items():
        n = v.spec.numel or 0
        b = v.spec.nbytes or 0
        if v.kind == ValueKind.CONST:
            const_bytes += b
            continue
        if v.kind not in weight_kinds:
            continue
        is_param = v.kind == ValueKind.PARAM and (name in trainable_use or name not in consumers)
        if is_param:
            params += n
            param_bytes += b
            names.append(name)
            users = consumers.get(name)
            if users:
                per_node[users[0]] = per_node.get(users[0], 0) + n
        else:
            buffers += n
            buffer_bytes += b
    shared = {k: tuple(v) for k, v in sorted(consumers.items()) if len(v) > 1}
    return ParamReport(params, param_bytes, buffers, buffer_bytes, const_bytes,
                       per_node, shared, tuple(sorted(names)))
