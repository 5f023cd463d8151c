"""Parameter counting: each weight counted once, however many nodes share it.

A weight is attributed to the first node (in execution order) that consumes it; a weight read by
several nodes (tied embeddings) is listed in ``shared``. A value the frontend marked PARAM is
trainable when some node reads it as an operand. One read only at an op's buffer positions
(BatchNormalization's running mean/var) is a buffer, as ``nn.Module.buffers()`` counts them;
one read only at settings positions (Clip bounds, Pad values, Resize scales) is a constant.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from graphcost.analyzer.ir import Graph, ValueKind
from graphcost.passes.costs.registry import lookup


@dataclass(frozen=True)
class ParamReport:
    params: int                      # trainable parameter elements
    param_bytes: int
    buffers: int                     # non-trainable state elements (running stats, buffers)
    buffer_bytes: int
    const_bytes: int                 # index/shape/settings constants (not parameters)
    per_node: Mapping[int, int]      # node index -> parameter elements attributed to it
    shared: Mapping[str, tuple[int, ...]]  # weight name -> node indices reading it (≥ 2)
    names: tuple[str, ...]           # trainable parameter value names, sorted


def count_params(graph: Graph) -> ParamReport:
    weight_kinds = (ValueKind.PARAM, ValueKind.BUFFER)
    consumers: dict[str, list[int]] = {}
    operand_use: set[str] = set()
    buffer_use: set[str] = set()
    values = graph.values
    for node in graph.nodes:
        r = lookup(node.op)
        buffer_pos = r.buffer_inputs if r is not None else ()
        config_pos = r.config_inputs if r is not None else ()
        for pos, name in enumerate(node.inputs):
            v = values.get(name) if name else None
            if v is None or v.kind not in weight_kinds:
                continue
            lst = consumers.setdefault(name, [])
            if not lst or lst[-1] != node.index:
                lst.append(node.index)
            if pos in buffer_pos:
                buffer_use.add(name)
            elif pos not in config_pos:
                operand_use.add(name)

    params = param_bytes = buffers = buffer_bytes = const_bytes = 0
    per_node: dict[int, int] = {}
    names = []
    for name, v in values.items():
        if v.kind not in weight_kinds:
            if v.kind == ValueKind.CONST:
                const_bytes += v.spec.nbytes or 0
            continue
        n = v.spec.numel or 0
        b = v.spec.nbytes or 0
        unused = name not in consumers
        if v.kind == ValueKind.PARAM and (name in operand_use or unused):
            params += n
            param_bytes += b
            names.append(name)
            if not unused:
                first = consumers[name][0]
                per_node[first] = per_node.get(first, 0) + n
        elif v.kind == ValueKind.BUFFER or name in buffer_use:
            buffers += n
            buffer_bytes += b
        else:
            const_bytes += b
    shared = {k: tuple(v) for k, v in sorted(consumers.items()) if len(v) > 1}
    return ParamReport(params, param_bytes, buffers, buffer_bytes, const_bytes,
                       per_node, shared, tuple(sorted(names)))
