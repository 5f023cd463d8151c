"""Dropout as PyTorch runs it on a CPU: ``at::dropout`` takes the fused ``native_dropout``
(output and a one-byte keep-mask) only on CUDA, XPU, lazy and private-use devices
(``is_fused_kernel_acceptable`` in aten/src/ATen/native/Dropout.cpp, 2.8 to 2.14); elsewhere
it draws ``noise = empty_like(input).bernoulli_(1 − p).div_(1 − p)`` and returns
``input * noise``, whose backward keeps the noise — in the input's dtype. A joint graph
traced with torch.export always writes ``native_dropout``; a step priced for this CPU re-types
its mask to the input's dtype. Measured: zoo:gpt2's training step on this CPU (MemTracker,
second step) holds six dropout noises of 16,384 floats where the graph had bool masks,
393,216 B more in fp32 (16,384 · 3 B each)."""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from ..costs.registry import lookup
from ..ir import Graph, TensorSpec


def cpu_dropout(graph: Graph) -> Graph:
    """``graph`` with each dropout's mask (its rule's ``cpu_noise`` output) in its input's
    dtype."""
    values = dict(graph.values)
    changed = False
    for node in graph.nodes:
        r = lookup(node.op)
        k = r.cpu_noise if r is not None else None
        if k is None or len(node.outputs) <= k or not node.outputs[k] or not node.inputs:
            continue
        src, mask = graph.spec(node.inputs[0]), values.get(node.outputs[k])
        if src is None or mask is None or mask.spec.dtype == src.dtype:
            continue
        values[mask.name] = replace(mask, spec=TensorSpec(mask.spec.shape, src.dtype))
        changed = True
    return replace(graph, values=MappingProxyType(values)) if changed else graph
