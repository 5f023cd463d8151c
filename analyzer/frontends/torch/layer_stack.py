"""Which stack of blocks a model has, and the model with that stack cut to three (or three
periods of its layer types) for the trace; repeat_layers.py grows the traced graph back.

A stack is the model's longest ``ModuleList`` of ``REPEAT_AT`` or more blocks of one class with
the same parameter and buffer shapes and, for transformers, layer types that are one type or
repeat with a period the stack is a whole number of (more than three) times.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import torch

TRACED = 3
REPEAT_AT = 8  # stacks shorter than this are traced whole (three layers save little)


class Stack(NamedTuple):
    """A model's stack of blocks: the ModuleList's path, its length, and the period of its
    layer types (1: all one type)."""
    path: str
    layers: int
    period: int = 1


def layers_note(stack: Stack) -> str:
    n, p = stack.layers, stack.period
    if p == 1:
        return (f"{TRACED} of {n} layers traced; layers 2–{n - 2} are layer 1 repeated "
                "in the IR (identical blocks)")
    return (f"{TRACED * p} of {n} layers traced; layers {2 * p}–{n - p - 1} are layers "
            f"{p}–{2 * p - 1} repeated in the IR (the layer types repeat every {p} layers)")


def find_stack(model: torch.nn.Module, at_least: int) -> Stack | None:
    """The model's longest ModuleList if it holds ``at_least`` blocks of one class with the
    same parameter and buffer shapes and, for transformers, layer types that are one type or
    repeat with a period the stack is a whole number of (more than three) times."""
    best = None
    for path, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) >= at_least and \
                (best is None or len(mod) > best[1]):
            best = (path, len(mod))
    if best is None:
        return None
    stack = model.get_submodule(best[0])
    assert isinstance(stack, torch.nn.ModuleList)  # (found as one above)
    blocks = list(stack)
    layout = [_layout(b) for b in blocks]
    if any(x != layout[0] for x in layout):
        return None
    config = getattr(model, "config", None)
    types = getattr(config, "layer_types", None)
    period = 1 if types is None or len(set(types)) == 1 else _period(list(types))
    if period is None:
        return None  # sliding and full layers in no repeating order: trace them all
    if config is not None and getattr(config, "num_hidden_layers", best[1]) != best[1]:
        return None
    return Stack(best[0], best[1], period)


def _period(types: list) -> int | None:
    """The fewest layers after which ``types`` repeat, where the stack is more than three
    whole periods (else None)."""
    n = len(types)
    for p in range(2, n // (TRACED + 1) + 1):
        if n % p == 0 and all(t == types[i % p] for i, t in enumerate(types)):
            return p
    return None


def _layout(block: torch.nn.Module):
    return (type(block), [(n, tuple(t.shape), t.dtype) for n, t in
                          (*block.named_parameters(), *block.named_buffers())])


@contextmanager
def truncated(model: torch.nn.Module, stack: Stack):
    """The model with its stack cut to its first three blocks (three periods of layers) and
    a transformers config saying so, put back as it was afterwards."""
    path, _, period = stack
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path)
    full = getattr(parent, attr)
    config = getattr(model, "config", None)
    saved = {k: getattr(config, k) for k in ("num_hidden_layers", "layer_types")
             if config is not None and getattr(config, k, None) is not None}
    setattr(parent, attr, torch.nn.ModuleList(list(full)[:TRACED * period]))
    try:
        if config is not None and "num_hidden_layers" in saved:
            config.num_hidden_layers = TRACED * period
        if config is not None and "layer_types" in saved:
            config.layer_types = list(saved["layer_types"])[:TRACED * period]
        yield
    finally:
        setattr(parent, attr, full)
        for k, v in saved.items():
            setattr(config, k, v)
