"""A gated short convolution (LFM2's ``Lfm2ShortConv``) as a serving engine's tensor-parallel
rank holds it: vLLM's ``ShortConv`` (vllm/model_executor/layers/mamba/short_conv.py) splits
it by channel — ``in_proj`` column-parallel in its three parts (B, C and x, H/T rows each),
the depthwise convolution over the rank's H/T channels (and its state), ``out_proj``
row-parallel, its output all-reduced. transformers' plans leave it out: it was refused.
Derived from vLLM's code, not measured; checked by hand arithmetic (tests/test_serving_tp.py).
"""
from __future__ import annotations

import torch

from .tp_heads import divides
from .tp_shards import ColwiseLinear, RowwiseLinear, rank_conv


def short_convs(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules of ``model`` laid out as LFM2's short convolution: a depthwise ``conv``
    over the width, ``in_proj`` to three times it, ``out_proj`` back."""
    found = []
    for name, m in model.named_modules():
        conv, inp, out = (getattr(m, a, None) for a in ("conv", "in_proj", "out_proj"))
        if isinstance(conv, torch.nn.Conv1d) and isinstance(inp, torch.nn.Linear) and \
                isinstance(out, torch.nn.Linear) and conv.groups == conv.in_channels and \
                inp.out_features == 3 * conv.in_channels == 3 * out.in_features:
            found.append((name, m))
    return found


def shard_short_conv(model: torch.nn.Module, group: int) -> set[str]:
    """``model``'s short convolutions cut to one of ``group`` ranks' share, in place; their
    names."""
    found = short_convs(model)
    for name, m in found:
        conv: torch.nn.Conv1d = getattr(m, "conv")
        width = conv.in_channels
        divides(f"{name}.conv", width, group)
        m.in_proj = ColwiseLinear(getattr(m, "in_proj"), group, rows=3 * width // group)
        m.conv = rank_conv(conv, width // group)
        m.out_proj = RowwiseLinear(getattr(m, "out_proj"), group)
    return {name for name, _ in found}
