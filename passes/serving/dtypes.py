"""Serving dtypes as an IR transformation: weights, KV cache and activations re-typed.

The serving review prices a model at the dtypes it is deployed in, from the graphs it was
traced in (passes/training/precision.py does the same for mixed-precision training): nothing is
re-traced, every tensor keeps its shape, and the cost, parameter and liveness passes count the
re-typed bytes.

* ``--weight-dtype fp16|bf16`` — weights and activations in that type (a half-precision
  deployment);
* ``--weight-dtype int8|int4|fp8`` — weight-only quantization (W8A16, W4A16, FP8 weights):
  the weight *matrices* (parameters of two or more dims, embeddings included) in that type,
  the one-dimensional ones (norm scales, biases) and the activations in fp16. Quantization
  scales and zero points are not counted (a per-group fp16 scale per 128 int4 weights adds
  1/32 to the int4 bytes);
* ``--kv-dtype fp16|bf16|fp8|int8`` — the KV cache tensors (the cache inputs and outputs of the
  traced steps, and the tensors they are views of); per-token scales of an int8 cache are not
  counted. Default: the activations' type.

Buffers (rotary frequency tables) and integer tensors keep their types.
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Iterable

from ..errors import GraphcostError
from ..ir import FLOAT_DTYPES, Graph, TensorSpec, ValueKind

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "float8e4m3fn",
          "int8": "int8", "int4": "int4"}
WEIGHT_DTYPES = ("fp32", "fp16", "bf16", "int8", "int4", "fp8")
KV_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8")
SHORT = {v: k for k, v in DTYPES.items()}


def short(dtype: str) -> str:
    return SHORT.get(dtype, dtype)


def check_dtype(value, allowed: tuple[str, ...], option: str) -> None:
    if value is not None and value not in allowed:
        raise GraphcostError(f"{option} {value}: expected one of {', '.join(allowed)}")


def traced_dtype(graph: Graph) -> str:
    """The weights' floating type as traced (the most bytes of it), float32 if none."""
    total: dict[str, int] = {}
    for v in graph.values.values():
        if v.kind == ValueKind.PARAM and v.spec.dtype in FLOAT_DTYPES:
            total[v.spec.dtype] = total.get(v.spec.dtype, 0) + (v.spec.nbytes or 0)
    return max(total, key=total.__getitem__) if total else "float32"


def plan(graph: Graph, weight: str | None, kv: str | None) -> tuple[str, str, str]:
    """(weight matrices, activations, KV cache) types, as IR dtypes, for the CLI's names."""
    base = traced_dtype(graph)
    if weight is None:
        weights = compute = base
    else:
        weights = DTYPES[weight]
        compute = weights if weight in ("fp32", "fp16", "bf16") else "float16"
    return weights, compute, DTYPES[kv] if kv else compute


def cache_values(graph: Graph, names: Iterable[str]) -> set[str]:
    """The cache tensors and the storages they are views of (a sliding window's slice)."""
    from ..costs.registry import lookup  # (the CLI reads DTYPES: start light)
    out = set()
    for name in names:
        seen = 0
        while name and seen < 8:
            out.add(name)
            v = graph.values.get(name)
            if v is None or v.producer is None:
                break
            node = graph.nodes[v.producer]
            r = lookup(node.op)
            if r is None or not r.alias or not node.inputs:
                break
            name, seen = node.inputs[0], seen + 1
    return out


def retype(graph: Graph, weights: str, compute: str, kv: str, cache: set[str]) -> Graph:
    """``graph`` with its floating tensors in the planned types (shapes unchanged). A view
    (a rule declared ``alias``: a transposed weight, a reshaped cache) has its source's type."""
    from ..costs.registry import lookup
    target: dict[str, str] = {}
    for name, v in graph.values.items():
        spec = v.spec
        if spec.dtype not in FLOAT_DTYPES or v.kind in (ValueKind.BUFFER, ValueKind.CONST):
            continue
        if name in cache:
            target[name] = kv
        elif v.kind == ValueKind.PARAM and spec.shape is not None and len(spec.shape) >= 2:
            target[name] = weights
        else:
            target[name] = compute
    values = graph.values
    for node in graph.nodes:
        r = lookup(node.op)
        src = node.inputs[0] if node.inputs else ""
        if r is None or not r.alias or src not in target:
            continue
        for out in node.outputs:
            if out and out in target and out not in cache and \
                    values[out].spec.dtype == values[src].spec.dtype:
                target[out] = target[src]
    specs: dict[tuple, TensorSpec] = {}
    new = dict(values)
    changed = False
    for name, dtype in target.items():
        v = values[name]
        if dtype != v.spec.dtype:
            key = (v.spec.shape, dtype)
            spec = specs.get(key)
            if spec is None:
                spec = specs[key] = TensorSpec(v.spec.shape, dtype)
            new[name] = replace(v, spec=spec)
            changed = True
    return replace(graph, values=MappingProxyType(new)) if changed else graph


def deployed(graph: Graph, cache: Iterable[str], weight: str | None, kv: str | None) -> Graph:
    """``graph`` at the dtypes asked (the graph the report shows)."""
    return retype(graph, *plan(graph, weight, kv), cache_values(graph, cache))
