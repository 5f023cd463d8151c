"""Context parallelism as a real measurement runs it (analyzer/measure/parallel.py, Case.cp):
PyTorch's own ring attention (``_templated_ring_attention`` and its backward, the functions
its context-parallel dispatcher calls for each SDPA kernel) around a transformers model's
attention, with gloo's all-gather and all-to-all, each rank holding torchtitan's head-tail
shard of every sequence.

PyTorch's dispatcher hands the ring a CUDA kernel (flash, efficient, cuDNN); this CPU has
none, so the ring is given the CPU's flash kernel and its backward — what SDPA runs here —
and everything else is PyTorch's: the all-gather (or all-to-all) rotater, the fp32 merge,
the load-balanced causal steps, the fp32 gradient accumulation and the all-to-all rotater of
the key/value gradients. What graphcost traces for such a rank is its own mirror of it (analyzer/frontends/
torch/context_parallel.py): this module is what it is measured against.
"""
from __future__ import annotations

from typing import Any

import torch

from ..frontends.torch.compat import ring_attention_parts

NAME = "graphcost_cp_ring"
_RING: list = []    # the ring's 1-D device mesh (one per rank process)


def _ring(function) -> Any:
    """What PyTorch's ring ``function`` takes for the ring: its process group (torch 2.9 and
    later) or its 1-D device mesh (2.8, whose first parameter is ``mesh``)."""
    import inspect
    first = next(iter(inspect.signature(function).parameters))
    return _RING[0] if first == "mesh" else _RING[0].get_group()


def _flash(query, key, value, is_causal, **kwargs):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, scale=kwargs.get("scale"))


def _flash_backward(grad_out, query, key, value, out, logsumexp, is_causal, **kwargs):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, query, key, value, out, logsumexp, 0.0, is_causal, scale=kwargs.get("scale"))


class _Ring(torch.autograd.Function):
    """PyTorch's ring forward and backward, autograd keeping what the kernel's formula keeps
    (the rank's query, key, value, output and log-sum-exp), as its dispatcher does."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        parts = ring_attention_parts()
        ring = parts._templated_ring_attention
        out, lse = ring(_ring(ring), 2, _flash, q, k, v, is_causal=True, scale=scale)[:2]
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor):
        dout = grad_outputs[0]
        q, k, v, out, lse = ctx.saved_tensors
        parts = ring_attention_parts()
        ring = parts._templated_ring_attention_backward
        dq, dk, dv = ring(
            _ring(ring), 2, _flash_backward, grad_out=dout.contiguous(), grad_out_name="grad_out",
            query=q, key=k, value=v, out=out, logsumexp=lse, is_causal=True,
            scale=ctx.scale)[:3]
        return dq, dk, dv, None


def ring_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                   **kwargs):
    """A transformers attention function: transformers' SDPA one (``sdpa_attention_forward``:
    the output transposed to (batch, seq, heads, dim) and made contiguous) with the ring in
    place of SDPA; the model's key/value heads equal its query heads."""
    out = _Ring.apply(query, key, value, scaling)
    return out.transpose(1, 2).contiguous(), None


def apply_context_parallel(model: torch.nn.Module, mesh, rotate: str = "allgather") -> None:
    """The model's attention as a context-parallel rank of ``mesh`` (1-D) runs it, its ring
    handing on keys and values as ``rotate`` says (PyTorch's ``set_rotate_method``)."""
    from transformers import AttentionInterface

    ring_attention_parts().set_rotate_method(rotate)
    _RING[:] = [mesh]
    AttentionInterface.register(NAME, ring_attention)
    model.set_attn_implementation(NAME)  # pyright: ignore[reportCallIssue]


def sequence_shard(t: torch.Tensor, rank: int, group: int) -> torch.Tensor:
    """``t``'s (batch, seq, …) shard of a context-parallel rank under torchtitan's head-tail
    load balancing: chunks ``rank`` and 2·group − 1 − ``rank`` of 2·group."""
    chunks = t.chunk(2 * group, dim=1)
    return torch.cat([chunks[rank], chunks[2 * group - 1 - rank]], dim=1)
