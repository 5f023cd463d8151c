"""Zoo models as a reference measurement runs them: seeded inputs by argument name, a module
called with no arguments, every parameter trainable.
"""
from __future__ import annotations

import torch

from .registry import get, input_shapes


def example_kwargs(name: str, batch: int = 1, *, seed: int = 0, **dims: int) -> dict:
    """Seeded random inputs of ``zoo:name`` by forward argument name (token ids below the
    vocabulary, features from a normal distribution)."""
    spec = get(name)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for inp, shape in input_shapes(name, batch, **dims).items():
        dtype = spec.input_dtypes[inp]
        if dtype.is_floating_point:
            out[inp] = torch.randn(shape, generator=gen, dtype=dtype)
        elif inp == "attention_mask":
            out[inp] = torch.ones(shape, dtype=dtype)
        else:
            out[inp] = torch.randint(*spec.int_ranges.get(inp, (0, 2)), shape, generator=gen,
                                     dtype=dtype)
    return out


class KeywordCall(torch.nn.Module):
    """``model(**inputs)`` as a module called with no arguments: what PyTorch's MemTracker
    and graphcost.analyzer.measure.verify's measurements (which call ``module(*args)``) can run. The
    model is a submodule, so its parameters are the wrapper's."""

    def __init__(self, model: torch.nn.Module, inputs: dict):
        super().__init__()
        self.model = model
        self.inputs = inputs

    def forward(self):
        return self.model(**self.inputs)


def build_measurable(name: str, **overrides) -> torch.nn.Module:
    """``zoo:name`` with seeded random weights, every parameter trainable: PyTorch's MemTracker
    hooks every parameter and cannot hook a frozen one (Whisper's positions)."""
    torch.manual_seed(0)
    model = get(name).build(**overrides)
    for p in model.parameters():
        p.requires_grad_(True)
    return model
