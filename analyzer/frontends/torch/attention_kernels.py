"""``scaled_dot_product_attention`` traced as the kernel PyTorch would dispatch on the target
(passes/graph/attention_dispatch.py chooses it), so the joint graph holds that kernel and its
backward — what it keeps for the backward is then the kernel's own autograd formula's.

On this CPU the trace would dispatch by itself, but a model on the meta device (a 7B decoder)
dispatches the math kernel, and a GPU's kernels are not this machine's: each call is made
to the chosen kernel directly (their meta functions give the shapes; nothing runs)."""
from __future__ import annotations

from typing import Any

import torch

from ....passes.choices import Attention
from ....passes.errors import GraphcostError, opt
from ....passes.graph.attention_dispatch import AttentionCall, AttentionTarget, choose

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
                         gqa and k.shape[-3] != q.shape[-3],
                         mask is not None and mask.requires_grad,
                         None if mask is None else tuple(mask.shape))
    if target.ring > 1:
        from .context_parallel import ring_attention
        return ring_attention(target, call, q, k, v, scale)
    kernel, why = choose(target, call)
    if call.mask_grad and kernel in (Attention.FLASH, Attention.CUDNN):
        raise GraphcostError(
            f"{opt('attention')} is '{kernel}', but an attention mask requires grad (a learned "
            f"bias), which the {kernel} kernel has no gradient for (PyTorch refuses it too): "
            "ask for 'efficient' (a GPU) or 'math', or leave it 'auto'")
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
        # (a boolean mask as the kernel gets it: each call converts it, the kernel's
        # backward keeps that float copy — a sliding window's, a padded batch's, per layer)
        return aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout, causal, attn_mask=mask if mask is None else _float_mask(mask, q),
            scale=scale)[0], kernel, why
    grad = call.grad
    if kernel == Attention.FLASH:
        out = aten._scaled_dot_product_flash_attention(q, k, v, dropout, causal, False,
                                                       scale=scale)
    elif kernel == Attention.EFFICIENT:
        # the log-sum-exp is the backward's, which a learned mask's gradient needs too
        # (PyTorch PR 188302; before it eager read an empty one when only the mask had grad)
        out = aten._scaled_dot_product_efficient_attention(
            q, k, v, None if mask is None else _efficient_mask(mask, q, k),
            grad or call.mask_grad, dropout, causal, scale=scale)
    else:
        # (a boolean mask converted by each call too: convert_boolean_attn_mask_cudnn)
        mask = mask if mask is None else _float_mask(mask, q)
        out = aten._scaled_dot_product_cudnn_attention(q, k, v, mask, grad, dropout, causal,
                                                       False, scale=scale)
    return out[0], kernel, why


def _efficient_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The mask as SDPA hands it to the efficient kernel (attention.cpp): a boolean one as
    0 / −inf in q's dtype (convert_boolean_attn_mask), padded to a multiple of 8 and sliced
    back where its rows are not aligned to 8, then expanded to b×h×Sq×Sk (preprocess_mask).
    The kernel's backward makes the mask's gradient at that expanded shape, which autograd
    then sums down to the mask's own."""
    mask = _float_mask(mask, q)
    aligned = mask.stride(-1) == 1 and all(s % 8 == 0 for s in mask.stride()[:-1])
    if not aligned:
        last = mask.shape[-1]
        mask = torch.ops.aten.constant_pad_nd(mask, [0, 8 - last % 8])[..., :last]
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _float_mask(mask: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """A boolean mask as SDPA converts it before the CPU's flash, the efficient and the cuDNN
    kernels (attention.cpp convert_boolean_attn_mask, and _cudnn's, which writes −65504 for
    −inf): 0 where it attends, −inf elsewhere, in q's dtype, made anew by each call (eager's
    dispatch hands the CPU kernel that copy)."""
    if mask.dtype != torch.bool:
        return mask
    inf = torch.full((), float("-inf"), dtype=q.dtype, device=q.device)
    return torch.where(mask, torch.zeros((), dtype=q.dtype, device=q.device), inf)
