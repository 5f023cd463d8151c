"""Which stack of blocks a model has, and the model with that stack cut to three blocks for
the trace; repeat_layers.py grows the traced graph back.

A stack is the model's longest ``ModuleList`` of ``REPEAT_AT`` or more layers whose kinds —
class, parameter and buffer shapes and, for transformers, the layer type — repeat: after a
head of layers unlike the rest (DeepSeek's dense first layers before its mixtures of
experts), with a period (Gemma-2's sliding and full attention alternate: period 2), more than
three whole periods, and a tail of fewer layers than a period that continues the pattern
(Gemma-3's 62 layers: five sliding and one full, ten times, then two sliding). One block is
one period of layers. The trace keeps the head, three blocks and the tail: the first
``head + 3 · period + tail`` layers, whose kinds are the same as the whole stack's ends.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import NamedTuple

import torch

TRACED = 3
REPEAT_AT = 8  # stacks shorter than this are traced whole (three layers save little)


class Stack(NamedTuple):
    """A model's stack: the ModuleList's path, its length, the period of its layers' kinds
    (1: all one kind), the layers before the repeating blocks and after them."""
    path: str
    layers: int
    period: int = 1
    head: int = 0
    tail: int = 0

    @property
    def blocks(self) -> int:
        """How many blocks of ``period`` layers repeat."""
        return (self.layers - self.head - self.tail) // self.period

    @property
    def traced(self) -> int:
        """How many layers the trace keeps: the head, three blocks, the tail."""
        return self.head + TRACED * self.period + self.tail


def layers_note(stack: Stack) -> str:
    n, p, h = stack.layers, stack.period, stack.head
    first, last = h + 2 * p, h + (stack.blocks - 1) * p - 1  # the copies' layers
    if p == 1:
        copies = f"layers {first}–{last} are" if last > first else f"layer {first} is"
        return (f"{stack.traced} of {n} layers traced; {copies} layer {h + 1} repeated in "
                "the IR (identical blocks)")
    return (f"{stack.traced} of {n} layers traced; layers {first}–{last} are layers "
            f"{h + p}–{h + 2 * p - 1} repeated in the IR (layer kinds repeat every {p} "
            "layers)")


def find_stack(model: torch.nn.Module, at_least: int) -> Stack | None:
    """The model's longest ModuleList if it holds ``at_least`` layers whose kinds repeat
    (the module's docstring), with its shortest head, then its shortest period."""
    best = None
    for path, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) >= at_least and \
                (best is None or len(mod) > best[1]):
            best = (path, len(mod))
    if best is None:
        return None
    stack = model.get_submodule(best[0])
    assert isinstance(stack, torch.nn.ModuleList)  # (found as one above)
    config = _config_of(model, best[0])
    if config is not None and (getattr(config, "num_hidden_layers", best[1]) != best[1]
                               or not _count_settable(config)):
        return None
    types = list(getattr(config, "layer_types", None) or [None] * best[1])
    if len(types) != best[1]:
        return None
    kinds: dict = {}  # each distinct kind numbered, so that the search compares numbers
    keys = [kinds.setdefault((_layout(b), t), len(kinds)) for b, t in zip(stack, types)]
    shape = _repeating(keys)
    if shape is None:
        return None  # layers in no repeating order: trace them all
    return Stack(best[0], best[1], *shape)


def _config_of(model: torch.nn.Module, path: str):
    """The transformers config of the nearest module holding the stack at ``path``: a
    multimodal model's text config (Gemma-3's layer types are its text model's), or None."""
    parts = path.split(".")
    for k in range(len(parts) - 1, -1, -1):
        config = getattr(model.get_submodule(".".join(parts[:k])), "config", None)
        if config is not None:
            return config
    return None


def _count_settable(config) -> bool:
    """Whether ``config`` takes a new layer count, as ``truncated`` tells it the cut's:
    ProphetNet's ``num_hidden_layers`` is a property that refuses one (NotImplementedError:
    "Please set `num_encoder_layers` and `num_decoder_layers`"); its stack is traced whole."""
    if getattr(config, "num_hidden_layers", None) is None:
        return True
    try:
        config.num_hidden_layers = config.num_hidden_layers
    except (NotImplementedError, AttributeError):
        return False
    return True


def _repeating(keys: list[int]) -> tuple[int, int, int] | None:
    """(period, head, tail) of the layers' kinds ``keys``: the fewest leading layers after
    which the rest repeat with a period more than three whole times, the rest of a period
    the tail; None when no such pattern exists."""
    n = len(keys)
    for head in range(n - TRACED):
        rest = keys[head:]
        for p in range(1, len(rest) // (TRACED + 1) + 1):
            if all(k == rest[i % p] for i, k in enumerate(rest)):
                return p, head, len(rest) % p
    return None


def _layout(block: torch.nn.Module):
    return (type(block), tuple((n, tuple(t.shape), t.dtype) for n, t in
                               (*block.named_parameters(), *block.named_buffers())))


@contextmanager
def truncated(model: torch.nn.Module, stack: Stack):
    """The model with its stack cut to its first ``stack.traced`` layers (the head, three
    blocks and as many as the tail) and a transformers config saying so, put back as it was
    afterwards."""
    path, keep = stack.path, stack.traced
    _capturing_hooks_on_every_layer(model)
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path)
    full = getattr(parent, attr)
    config = _config_of(model, path)
    saved = {k: getattr(config, k) for k in ("num_hidden_layers", "layer_types")
             if config is not None and getattr(config, k, None) is not None
             and settable(config, k)}
    setattr(parent, attr, torch.nn.ModuleList(list(full)[:keep]))
    try:
        if config is not None and "num_hidden_layers" in saved:
            config.num_hidden_layers = keep
        if config is not None and "layer_types" in saved:
            config.layer_types = list(saved["layer_types"])[:keep]
        yield
    finally:
        setattr(parent, attr, full)
        for k, v in saved.items():
            setattr(config, k, v)


def settable(config, name: str) -> bool:
    """Whether ``config``'s ``name`` is its own to set: not a property derived from the others
    (MambaConfig's ``layer_types``, from its layer count; Bamba's, which its attribute map
    names ``layers_block_type``, from its layer count and attention layers)."""
    name = getattr(type(config), "attribute_map", {}).get(name, name)
    prop = getattr(type(config), name, None)
    return not isinstance(prop, property) or prop.fset is not None


def _capturing_hooks_on_every_layer(model: torch.nn.Module) -> None:
    """transformers installs the hooks that capture a model's hidden states (its
    output_capturing) on the first forward that asks for them, on the layers the model has
    then, and never again: installed on the whole list before it is cut, every layer keeps its
    own. (DPT's neck reads the hidden states of layers a cut list lacks; traced whole after
    that, its layers past the third had no hook and it found none of theirs.)"""
    if "transformers" not in sys.modules:   # (then no model of its)
        return
    try:
        from transformers.utils.output_capturing import (
            _CAN_RECORD_REGISTRY,
            maybe_install_capturing_hooks,
        )
    except ImportError:   # (a release without them)
        return
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel) and _CAN_RECORD_REGISTRY.get(module):
            maybe_install_capturing_hooks(module)
