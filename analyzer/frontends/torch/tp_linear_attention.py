"""A gated delta net (Qwen 3.5's and Qwen3-Next's linear attention) as a serving engine's
tensor-parallel rank holds it: vLLM's ``GatedDeltaNetAttention`` splits it by heads
(vllm/model_executor/models/qwen3_next.py, qwen3_5.py) — each rank 1/T of the key heads and
of the value heads:

* the input projections column-parallel, each part split (``in_proj_qkvz``/``in_proj_qkv``:
  the queries', keys', values' (and gates') rows of the rank's heads; ``in_proj_ba``,
  ``in_proj_b``, ``in_proj_a``: the rank's value heads' rows);
* the short convolution over the q/k/v channels split by channel with them (its weight
  loaded as the projection's parts), ``A_log`` and ``dt_bias`` per value head split;
* the gated RMS norm over one head's values whole on every rank (it normalizes within a
  head: no exchange);
* ``out_proj`` row-parallel, its output all-reduced;
* the recurrent state and the convolution state of the rank's heads (the cache, made by the
  model's own code from the rank's tensors).

transformers' plan instead gathers every projection for training (each rank runs every
head), which a serving engine does not. Derived from vLLM's code, not measured (it runs no
model on this CPU); checked by hand arithmetic (tests/test_serving_tp.py). The weights are
not data here, so a part's rows are taken as any 1/T of its rows: the sizes are the rank's.
"""
from __future__ import annotations

import torch

from .tp_heads import divides
from .tp_shards import ColwiseLinear, RowwiseLinear, cut_rows, rank_conv

HEADS = ("num_k_heads", "num_v_heads")
WIDTHS = ("key_dim", "value_dim", "conv_dim")
INPUTS = ("in_proj_qkvz", "in_proj_ba", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")


def gated_delta_nets(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules of ``model`` that are transformers' gated delta nets (their head counts,
    their convolution and their output projection as Qwen3-Next's and Qwen 3.5's)."""
    return [(n, m) for n, m in model.named_modules()
            if all(isinstance(getattr(m, a, None), int) for a in (*HEADS, *WIDTHS))
            and isinstance(getattr(m, "conv1d", None), torch.nn.Conv1d)
            and isinstance(getattr(m, "out_proj", None), torch.nn.Linear)]


def shard_linear_attention(model: torch.nn.Module, group: int) -> None:
    """``model``'s gated delta nets cut to one of ``group`` ranks' share, in place."""
    for name, net in gated_delta_nets(model):
        for attr in HEADS:
            divides(f"{name}.{attr}", getattr(net, attr), group)
        for attr in (*HEADS, *WIDTHS):
            setattr(net, attr, getattr(net, attr) // group)
        for leaf in INPUTS:
            linear = getattr(net, leaf, None)
            if isinstance(linear, torch.nn.Linear):
                setattr(net, leaf, ColwiseLinear(linear, group))
        net.out_proj = RowwiseLinear(getattr(net, "out_proj"), group)
        conv: torch.nn.Conv1d = getattr(net, "conv1d")
        net.conv1d = rank_conv(conv, conv.out_channels // group)
        for attr in ("A_log", "dt_bias"):   # (one a value head)
            cut_rows(net, attr, getattr(net, "num_v_heads"))
