"""Precision recipes, by the names Lightning gives them.

``bf16-mixed`` / ``16-mixed`` (Lightning's, the HF Trainer's ``bf16=True``, accelerate's
``mixed_precision="bf16"``, timm's ``--amp``): ``torch.autocast`` around the forward — fp32
weights, gradients and optimizer state; the ops on autocast's lists run in half and save
half tensors. The casts are traced into the joint graph (analyzer/frontends/torch/
autocast_casts.py); nothing is re-typed here. ``16-mixed`` adds the GradScaler's scale (a
few bytes). ``bf16-master`` / ``16-master`` (the Apex-O2 / Megatron recipe): the model's
weights, activations and gradients in half precision; the optimizer keeps an fp32 master
copy of the weights and fp32 state, and steps on fp32 copies of the gradients (added by the
training pass). ``16-true`` / ``bf16-true`` (torchtune's default): the module cast to half —
weights, activations, gradients and optimizer state all half, no master copy. A PyTorch
model is traced cast to half for the re-typing recipes (analyzer/load/resolve.py
``in_recipe_dtype``), so the model's own float32 upcasts stay float32 as they run (a Llama's
RMSNorm: 17 float32 copies of the hidden state saved for the backward); an ONNX graph, which
has no module to cast, has its floating tensors re-typed here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

from ..errors import GraphcostError
from ..ir import Graph, TensorSpec, Value, ValueKind

# recipe -> (the dtype the graph's floating tensors take, None: as traced; fp32 master copy)
RECIPES = {"fp32": (None, False), "bf16-mixed": (None, False), "16-mixed": (None, False),
           "bf16-master": ("bfloat16", True), "16-master": ("float16", True),
           "16-true": ("float16", False), "bf16-true": ("bfloat16", False)}
# the recipes traced under torch.autocast, and its half dtype
AUTOCAST = {"bf16-mixed": "bfloat16", "16-mixed": "float16"}
# the same recipes by the other names users know them by (Lightning's 32-true; fp16-mixed
# is 16-mixed's name in torch.amp's documentation)
ALIASES = {"32-true": "fp32", "fp16-mixed": "16-mixed"}
PRECISIONS = {name: dtype for name, (dtype, _) in RECIPES.items()}
CHOICES = (*RECIPES, *ALIASES)


@dataclass(frozen=True)
class AutocastSpec:
    """``torch.autocast(device_type, dtype)`` around a training step's forward:
    ``device_type`` "cpu" or "cuda" (whose op lists apply), ``dtype`` "bfloat16" or
    "float16"."""
    device_type: str
    dtype: str


def canonical(precision: str) -> str:
    """The recipe ``precision`` names (an alias resolved); unknown names are left for the
    argument checks to refuse."""
    return ALIASES.get(precision, precision)


def master_weights(precision: str) -> bool:
    """Whether the recipe's optimizer keeps an fp32 master copy (and fp32 state)."""
    return RECIPES[canonical(precision)][1]


def compute_dtype(precision: str) -> str | None:
    """The half dtype the recipe computes in (None: fp32)."""
    name = canonical(precision)
    return AUTOCAST.get(name) or PRECISIONS.get(name)
_WIDE = {"float32", "float64"}
_HALF = {"bfloat16", "float16"}


def _traced_in(graph: Graph, dtype: str) -> bool:
    """Whether ``graph`` was traced from a module already cast to ``dtype`` (its floating
    parameters all ``dtype``): its float32 tensors are the model's own upcasts, kept."""
    floats = [v.spec.dtype for v in graph.values.values()
              if v.kind == ValueKind.PARAM and v.spec.dtype in (_WIDE | _HALF)]
    return bool(floats) and all(d == dtype for d in floats)


def cast_floats(graph: Graph, precision: str) -> Graph:
    if precision not in PRECISIONS:
        raise GraphcostError(f"unknown precision {precision!r}; known: " + ", ".join(PRECISIONS))
    dtype = PRECISIONS[precision]
    if dtype is None or _traced_in(graph, dtype):
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
