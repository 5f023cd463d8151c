"""One context-parallel rank's attention (``--parallel dp_shard=D,cp=C``): each
``scaled_dot_product_attention`` call of the rank's program (its sequence shard, S/C tokens
of each sequence) traced as PyTorch's ring attention runs it on that rank.

PyTorch's context parallelism (torch.distributed.tensor.experimental, which torchtitan's
``apply_cp_to_forward`` enables for SDPA models) dispatches each attention kernel to
``_templated_ring_attention``: the rank's keys and values flattened into one buffer and
all-gathered once (the default ``rotate_method``, "allgather"), or passed to the next rank at
each step and the previous rank's received ("alltoall"); the attention kernel run on each
rank's chunk in turn, its output and log-sum-exp merged in fp32 (``_SDPAMerger``); with
torchtitan's head-tail load balancing (each rank holds chunks i and 2C−1−i of the sequence),
a later chunk is attended to by half the queries or with half the keys. Its backward
(``_templated_ring_attention_backward``) gathers (or passes) the keys and values again,
accumulates the gradients in fp32, and passes each step's key/value gradients to the next
rank (an all-to-all rotater). Autograd keeps what the kernel's formula keeps: the rank's own
query, key, value, output and log-sum-exp.

Mirrored here step for step with PyTorch's own merger, causal rule and partial update
(compat.ring_attention_parts), the collectives graphcost's ops (cp_collectives.py), traced
as rank 0 of the ring: under load balancing every rank runs the same kernels on the same
sizes, only in another order. The kernels are the dispatcher's choice for the target
(attention_kernels.py): the CPU's flash kernel, CUDA's flash or cuDNN; context parallelism
runs no other (PyTorch's dispatcher has no ring for them), and a call it cannot take is
refused by name.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ....passes.choices import Attention, Rotate
from ....passes.errors import GraphcostError, opt
from ....passes.graph.attention_dispatch import AttentionCall, AttentionTarget, choose
from .compat import ring_attention_parts
from .cp_collectives import cp_all_gather, cp_ring_pass
from .held import hold

aten = torch.ops.aten
SEQ = 2           # (batch, heads, sequence, head dim): PyTorch's ring's seq_dim
RANK = 0          # the ring position traced
HALVES = 2        # load balancing's round-robin cycle


def _flash_cpu(q, k, v, causal, scale):
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal,
                                                                 scale=scale)
    return out, lse, ()


def _flash_cpu_backward(dout, q, k, v, out, lse, causal, scale, rest):
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, out, lse, 0.0, causal, scale=scale)


def _flash(q, k, v, causal, scale):
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = \
        aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return out, lse, (cum_q, cum_k, max_q, max_k, seed, offset)


def _flash_backward(dout, q, k, v, out, lse, causal, scale, rest):
    cum_q, cum_k, max_q, max_k, seed, offset = rest
    return aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset,
        scale=scale)


def _cudnn(q, k, v, causal, scale):
    out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = \
        aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False,
                                                 scale=scale)
    return out, lse, (seed, offset, cum_q, cum_k, max_q, max_k)


def _cudnn_backward(dout, q, k, v, out, lse, causal, scale, rest):
    seed, offset, cum_q, cum_k, max_q, max_k = rest
    return aten._scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, out, lse, seed, offset, torch.empty(0, device=q.device), cum_q,
        cum_k, max_q, max_k, 0.0, causal, scale=scale)


Kernel = tuple[Callable[..., Any], Callable[..., Any]]


def ring_kernels(target: AttentionTarget, kernel: str) -> Kernel:
    """(forward, backward) of ``kernel`` as the ring calls it on ``target``."""
    if target.backend == "cpu" and kernel == Attention.FLASH:
        return _flash_cpu, _flash_cpu_backward
    if target.backend != "cpu" and kernel == Attention.FLASH:
        return _flash, _flash_backward
    if target.backend != "cpu" and kernel == Attention.CUDNN:
        return _cudnn, _cudnn_backward
    raise GraphcostError(f"{opt('parallel', value=f'cp={target.ring}')}: PyTorch's context "
                         f"parallelism runs attention's flash or cuDNN kernel, and this call "
                         f"dispatches the {kernel} kernel on {target.device} (a half dtype "
                         f"on a GPU, {opt('attention')} flash or cudnn)")


class _Rotater:
    """PyTorch's rotater (``_create_rotater``) as rank 0 of the ring holds it: "allgather"
    gathers every rank's keys and values once and hands out step i's chunk of that buffer;
    "alltoall" passes the rank's current ones on at each step and receives the previous
    rank's, a buffer a step."""

    def __init__(self, method: str, group: int):
        self.method, self.group = method, group
        self.buffer: torch.Tensor | None = None   # the gathered buffer, or the last received
        self.sent: torch.Tensor | None = None     # (alltoall) the buffer the pass still reads

    def exchange(self, flat: torch.Tensor) -> None:
        if self.method == Rotate.ALL_TO_ALL:
            self.buffer, self.sent = cp_ring_pass(flat, self.group), flat
        elif self.buffer is None:
            self.buffer = cp_all_gather(flat, self.group)

    def next(self, i: int, before: torch.Tensor | None) -> torch.Tensor:
        """Step ``i``'s keys and values, flattened: the chunk of the rank ``i`` before this
        one. Under "alltoall" waiting on it lets go of the buffer sent and of ``before``, the
        step before's (the caller's locals reassigned)."""
        assert self.buffer is not None   # (exchanged at step 0)
        if self.method == Rotate.ALL_TO_ALL:
            return hold(self.buffer, self.sent, before)
        return self.buffer.chunk(self.group)[(RANK - i) % self.group]


def _split(buffer: torch.Tensor, k: torch.Tensor, v: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """A rotater's buffer as keys and values of ``k``'s and ``v``'s shapes."""
    return (buffer[:k.numel()].reshape(k.shape),
            buffer[k.numel():k.numel() + v.numel()].reshape(v.shape))


def ring_forward(kernel: Kernel, q, k, v, group: int, scale, rotate: str = Rotate.ALL_GATHER):
    """``_templated_ring_attention`` on rank 0 of ``group`` (causal, load-balanced):
    (output, log-sum-exp, the last step's kernel extras). Its locals hold each step's kernel
    output and log-sum-exp until the next step's are made, and the keys and values of the
    last step (the gathered buffer, or the last received) to its return."""
    parts = ring_attention_parts()
    k, v = k.contiguous(), v.contiguous()
    merger = parts._SDPAMerger(True, seq_dim=SEQ)
    rotater = _Rotater(rotate, group)
    key, value, buffer, rest, made = k, v, None, (), ()
    for i in range(group):
        if i > 0:
            buffer = rotater.next(i, buffer)
            key, value = _split(buffer, k, v)
        if i < group - 1:
            rotater.exchange(torch.cat([key.flatten(), value.flatten()]))
        behaviour = parts._is_causal_behavior(RANK, group, i, True)
        if behaviour == parts._CausalBehavior.SKIP:
            continue
        qi, ki, vi, partial = q, key, value, False
        if i > 0 and i <= RANK:
            ki, vi = key.chunk(HALVES, dim=SEQ)[0], value.chunk(HALVES, dim=SEQ)[0]
        elif i > 0:
            qi, partial = q.chunk(HALVES, dim=SEQ)[1], True
        out, lse, rest = kernel[0](qi, ki, vi, behaviour.value, scale)
        out, made = hold(out, *made), (out, lse)
        merger.step(out, lse, partial)
    out, lse = merger.results()
    return hold(out, *made, rotater.buffer), lse, rest


def _accumulate(total, part, i: int, add_to: int):
    """A gradient's step ``i`` added on: whole, or (load balancing) into half ``add_to``."""
    if i > 0 and add_to >= 0:
        return ring_attention_parts()._partial_update(total, part, dim=SEQ, n_chunks=HALVES,
                                                      idx=add_to, add=True)
    total += part
    return total


def ring_backward(kernel: Kernel, saved, dout, group: int, scale, rest,
                  rotate: str = Rotate.ALL_GATHER):
    """``_templated_ring_attention_backward`` on rank 0 of ``group``: (dq, dk, dv). Its
    locals hold what the traced ring reads at ``hold``: the key/value buffer it sent until the
    next step's replaces it; each step's kernel gradients, and the key/value gradients it
    added them into and passed on, until the next step's kernel has run; all of them to its
    return. Its key/value gradients are passed on whatever ``rotate`` says (PyTorch's)."""
    parts = ring_attention_parts()
    q, k, v, out, lse = saved
    dq, dk, dv = (torch.zeros_like(t, dtype=torch.float32) for t in (q, k, v))
    k, v = k.contiguous(), v.contiguous()
    rotater = _Rotater(rotate, group)
    key, value, buffer, passed, flat, sent, grads = k, v, None, None, None, None, ()
    for i in range(group):
        if i > 0:
            buffer = rotater.next(i, buffer)
            key, value = _split(buffer, k, v)
        if i != group - 1:
            flat = hold(torch.cat([key.flatten(), value.flatten()]), flat)
            rotater.exchange(flat)
        behaviour = parts._is_causal_behavior(RANK, group, i, True)
        later = i > RANK   # (load balancing: half the queries attend to a later chunk)
        qi, ki, vi, oi, di, li = q, key, value, out, dout, lse
        if i > 0 and not later:
            ki, vi = key.chunk(HALVES, dim=SEQ)[0], value.chunk(HALVES, dim=SEQ)[0]
        elif i > 0:
            qi, oi, di = (t.chunk(HALVES, dim=SEQ)[1] for t in (q, out, dout))
            li = lse.chunk(HALVES, dim=SEQ)[1].contiguous()
        dqi, dki, dvi = kernel[1](di, qi, ki, vi, oi, li, behaviour.value, scale, rest)[:3]
        if i > 0:
            assert passed is not None
            passed = hold(passed, sent, *grads, dk, dv)
            dk = passed[:dk.numel()].reshape(dk.shape)
            dv = passed[dk.numel():].reshape(dv.shape)
        grads = (dqi, dki, dvi)
        dk = _accumulate(dk, dki, i, -1 if later else 0)
        dv = _accumulate(dv, dvi, i, -1 if later else 0)
        sent = torch.cat([dk.flatten(), dv.flatten()])
        passed = cp_ring_pass(sent, group)
        dq = _accumulate(dq, dqi, i, 1 if later else -1)
    assert passed is not None
    dq = dq.to(q.dtype)
    passed = hold(passed.to(k.dtype), sent, *grads, dk, dv, flat, rotater.buffer)
    return dq, passed[:dk.numel()].reshape(dk.shape), passed[dk.numel():].reshape(dv.shape)


class RingAttention(torch.autograd.Function):
    """The ring's forward and backward as PyTorch's dispatcher runs them for a context-
    parallel SDPA call: autograd keeps the rank's query, key, value, output and log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, group: int, scale, kernel: Kernel, rotate: str):
        out, lse, rest = ring_forward(kernel, q, k, v, group, scale, rotate)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale, ctx.kernel, ctx.rest = group, scale, kernel, rest
        ctx.rotate = rotate
        return out

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor):
        dout = grad_outputs[0]
        dq, dk, dv = ring_backward(ctx.kernel, ctx.saved_tensors, dout.contiguous(),
                                   ctx.group, ctx.scale, ctx.rest, ctx.rotate)
        return dq, dk, dv, None, None, None, None


def ring_attention(target: AttentionTarget, call: AttentionCall, q, k, v,
                   scale) -> tuple[torch.Tensor, str, str]:
    """(SDPA's output as the ring computes it, the kernel, why not the ones before it)."""
    words = opt("parallel", value=f"cp={target.ring}")
    if not call.causal or call.mask or call.dropout:
        raise GraphcostError(f"{words}: context parallelism is modelled for causal attention "
                             "without a mask or dropout (torchtitan's load-balanced ring); "
                             "this call has " + ("a mask" if call.mask else "dropout"
                                                  if call.dropout else "no causal flag"))
    if q.shape[SEQ] % HALVES:
        raise GraphcostError(f"{words}: each rank's sequence shard splits into head and tail "
                             f"halves (load balancing), and {q.shape[SEQ]} tokens do not")
    kernel, why = choose(target, call)
    ops = ring_kernels(target, kernel)
    out = RingAttention.apply(q, k, v, target.ring, scale, ops, target.rotate)
    return out, kernel, why


def why_no_sdpa(model: torch.nn.Module) -> str:
    """Why ``model`` made no ``scaled_dot_product_attention`` call, in words a user can act on:
    a transformers model built with its 'eager' attention (the zoo's are, as MemTracker and
    FlopCounterMode count them) loads as 'sdpa' from a hub id or config.json, which graphcost
    builds with transformers' default; a class without an 'sdpa' path has none to load."""
    config = getattr(model, "config", None)
    chosen = getattr(config, "_attn_implementation", None)
    if chosen is None:
        return "its attention is written out in matmuls"
    cls = type(model).__name__
    if not getattr(type(model), "_supports_sdpa", False):
        return f"transformers gives {cls} no 'sdpa' attention"
    return (f"built with transformers' {chosen!r} attention: {cls}'s 'sdpa' one is what a hub "
            "id or config.json gets, or a module built with attn_implementation='sdpa'")
