"""``scaled_dot_product_attention`` traced as the kernel PyTorch would dispatch on the target
(passes/attention_dispatch.py chooses it), so the joint graph holds that kernel and its
backward — what it keeps for the backward is then the kernel's own autograd formula's.

On this CPU the trace would dispatch by itself, but a model on the meta device (a 7B decoder)
dispatches the math kernel, and a GPU's kernels are not this machine's: each call is made
to the chosen kernel directly (their meta functions give the shapes; nothing runs)."""
from __future__ import annotations

from typing import Any

import torch

from ....passes.attention_dispatch import AttentionCall, AttentionTarget, choose
from ....passes.choices import Attention

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")


def is_sdpa(target: Any) -> bool:
    return target is _SDPA


def call_kernel(target: AttentionTarget, args: tuple,
                kwargs: dict) -> tuple[torch.Tensor, str, str]:
    """(SDPA's output computed by the chosen kernel, the kernel, why not the ones before it)."""
    a = {**dict(zip(_NAMES, args)), **kwargs}
    q, k, v, mask = a["query"], a["key"], a["value"], a.get("attn_mask")
    dropout, causal = float(a.get("dropout_p", 0.0) or 0.0), bool(a.get("is_causal", False))
    scale, gqa = a.get("scale"), bool(a.get("enable_gqa", False))
    call = AttentionCall(tuple(q.shape), tuple(k.shape), tuple(v.shape),
                         str(q.dtype).removeprefix("torch."), mask is not None, dropout, causal,
                         any(t.requires_grad for t in (q, k, v)),
                         gqa and k.shape[-3] != q.shape[-3])
    kernel, why = choose(target, call)
    aten = torch.ops.aten
    if call.gqa and kernel in (Attention.MATH, Attention.EFFICIENT):
        # the math kernel repeats grouped heads itself (repeat_interleave), as graphcost does
        # here; the efficient kernel's formulas (its backward's meta function) want them
        # repeated. Flash and cuDNN read grouped heads as they are.
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    if kernel == Attention.MATH:
        return aten._scaled_dot_product_attention_math(
            q, k, v, mask, dropout, causal, scale=scale)[0], kernel, why
    if target.backend == "cpu" and kernel == Attention.FLASH:
        return aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout, causal, attn_mask=mask, scale=scale)[0], kernel, why
    grad = call.grad
    if kernel == Attention.FLASH:
        out = aten._scaled_dot_product_flash_attention(q, k, v, dropout, causal, False,
                                                       scale=scale)
    elif kernel == Attention.EFFICIENT:
        out = aten._scaled_dot_product_efficient_attention(q, k, v, mask, grad, dropout, causal,
                                                           scale=scale)
    else:
        out = aten._scaled_dot_product_cudnn_attention(q, k, v, mask, grad, dropout, causal,
                                                       False, scale=scale)
    return out[0], kernel, why
