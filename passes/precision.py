"""Precision recipes as an IR transformation: every floating tensor of the graph re-typed.

``fp16-mixed`` / ``bf16-mixed`` (the Apex-O2 / Megatron recipe, also named ``16-master`` /
``bf16-master``): the model's weights, activations and gradients in half precision; the
optimizer keeps an fp32 master copy of the weights and fp32 state, and steps on fp32 copies of
the gradients. ``16-true`` / ``bf16-true`` (Lightning's names; torchtune's default): the
module cast to half — weights, activations, gradients and optimizer state all half, no master
copy. The graph's tensors are re-typed here; the fp32 master side is added by the training
pass. Nothing is re-traced. (Lightning's ``bf16-mixed`` is autocast, not modelled yet.)
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from .errors import GraphcostError
from .ir import Graph, TensorSpec, Value

# recipe -> (the dtype the graph's floating tensors take, None: as traced; fp32 master copy)
RECIPES = {"fp32": (None, False), "fp16-mixed": ("float16", True),
           "bf16-mixed": ("bfloat16", True), "16-true": ("float16", False),
           "bf16-true": ("bfloat16", False)}
# the same recipes by the other names users know them by (Lightning's 32-true)
ALIASES = {"32-true": "fp32", "16-master": "fp16-mixed", "bf16-master": "bf16-mixed"}
PRECISIONS = {name: dtype for name, (dtype, _) in RECIPES.items()}
CHOICES = (*RECIPES, *ALIASES)


def canonical(precision: str) -> str:
    """The recipe ``precision`` names (an alias resolved); unknown names are left for the
    argument checks to refuse."""
    return ALIASES.get(precision, precision)


def master_weights(precision: str) -> bool:
    """Whether the recipe's optimizer keeps an fp32 master copy (and fp32 state)."""
    return RECIPES[canonical(precision)][1]
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
