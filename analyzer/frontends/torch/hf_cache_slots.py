"""The tensors a transformers cache layer holds, as the serving steps pass them across the
trace (serve.py): each layer's *slots*, in order — an attention layer's ``keys`` and
``values`` (DynamicLayer, its sliding and chunked kinds), a linear-attention layer's states
(``LinearAttentionLayer``: Mamba's, a gated delta net's, a short convolution's — transformers
5.x keeps each as a ``conv_states[i]`` of (batch, channels, kernel) and a ``recurrent_states[i]``
of a fixed size: they do not grow with the context), a hybrid layer's both (Falcon-H1's), and
none for a layer that keeps nothing (``DummyLayer``: Nemotron-H's MLP and MoE layers).

A prefill starts from the model's own empty cache and its layers initialize themselves; what
they hold after it names the slots (``slots_of``). A decode step gets the tensors back in the
same slots (``fill``), the layers marked as having seen the prompt, so the model's own update
runs: a linear-attention layer copies its new states into the given ones (an in-place update,
as vLLM's kernels update them), an attention layer concatenates its keys and values.
"""
from __future__ import annotations

from typing import Any

import torch

Slot = tuple[str, int]   # ("keys", 0), ("values", 0), ("conv_states", i), ("recurrent_states", i)


class SlotRecord:
    """Each cache layer's slots as the last step left them (the prefill's, for the decode)."""

    def __init__(self) -> None:
        self.layers: list[list[Slot]] = []
        # a layer whose keys and values are one tensor (DeepSeek V4's shared key-value
        # attention: ``cache.update(kv, kv, …)``), which the steps' outputs hold once
        self.shared = False


def slots_of(layer: Any) -> list[Slot]:
    """The tensors ``layer`` holds after a step, in the order the steps pass them."""
    slots: list[Slot] = []
    for i in range(getattr(layer, "number_of_states", 0)):
        if layer.is_conv_states_initialized[i]:
            slots.append(("conv_states", i))
        if layer.is_recurrent_states_initialized[i]:
            slots.append(("recurrent_states", i))
    if isinstance(getattr(layer, "keys", None), torch.Tensor):
        slots += [("keys", 0), ("values", 0)]
    return slots


def tensor_in(layer: Any, slot: Slot) -> torch.Tensor:
    name, i = slot
    return getattr(layer, name) if name in ("keys", "values") else getattr(layer, name)[i]


def fill(layer: Any, slots: list[Slot], tensors: list[torch.Tensor], past: int) -> None:
    """``layer`` (a new cache's) holding ``tensors`` in ``slots`` after ``past`` tokens."""
    for (name, i), t in zip(slots, tensors):
        layer.dtype, layer.device = t.dtype, t.device
        if name in ("keys", "values"):
            setattr(layer, name, t)
            layer.is_initialized = True
            if hasattr(layer, "cumulative_length"):   # (a sliding window sizes its mask)
                layer.cumulative_length = past
            continue
        getattr(layer, name)[i] = t
        layer.has_previous_state[i] = True
        if name == "conv_states":
            layer.is_conv_states_initialized[i] = True
            layer.conv_kernel_size[i] = t.shape[-1]
        else:
            layer.is_recurrent_states_initialized[i] = True
