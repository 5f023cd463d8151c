"""The collectives a tensor-parallel rank's program calls (tensor_parallel.py), as custom ops
with fake kernels and autograd formulas, so ``torch.export`` and AOTAutograd trace them into
the joint graph as nodes (their rules: passes/costs/collectives.py). Their eager kernels run
one rank alone (nothing crosses a link); graphcost only traces them.

Each op returns a new tensor, as PyTorch's functional collectives (``funcol``) do, and each
backward is the collective DTensor's redistribution runs for the gradient:

==================  ===============================  =====================================
op                  forward                          backward
==================  ===============================  =====================================
tp_copy             the same tensor (rule: alias)    all-reduce (a partial gradient)
tp_all_reduce       all-reduce (partial -> whole)    the gradient passed through
tp_gather_last      all-gather on the last dim       the rank's slice (a clone)
tp_gather_seq       all-gather on dim 1 (sequence)   reduce-scatter on dim 1
tp_scatter_seq      reduce-scatter on dim 1          all-gather on dim 1
==================  ===============================  =====================================
"""
from __future__ import annotations

import torch


@torch.library.custom_op("graphcost::tp_copy", mutates_args=())
def tp_copy(x: torch.Tensor, group: int) -> torch.Tensor:
    """A replicated input handed to sharded work (a custom op may not return its input, so
    the kernel copies; the rule says it is the same tensor)."""
    return x.clone()


@torch.library.custom_op("graphcost::tp_all_reduce", mutates_args=())
def tp_all_reduce(x: torch.Tensor, group: int) -> torch.Tensor:
    """The sum over the ``group`` ranks, a new tensor."""
    return x.clone()


@torch.library.custom_op("graphcost::tp_gather_last", mutates_args=())
def tp_gather_last(x: torch.Tensor, group: int) -> torch.Tensor:
    """The ranks' slices of the last dim gathered."""
    return x.repeat(*([1] * (x.dim() - 1)), group)


@torch.library.custom_op("graphcost::tp_gather_seq", mutates_args=())
def tp_gather_seq(x: torch.Tensor, group: int) -> torch.Tensor:
    """The ranks' sequence shards (dim 1) gathered."""
    return x.repeat(1, group, *([1] * (x.dim() - 2)))


@torch.library.custom_op("graphcost::tp_scatter_seq", mutates_args=())
def tp_scatter_seq(x: torch.Tensor, group: int) -> torch.Tensor:
    """The ranks' partial sums reduced, each keeping its sequence shard (dim 1)."""
    return x.narrow(1, 0, x.shape[1] // group).clone()


@tp_copy.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(x)


@tp_all_reduce.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(x)


@tp_gather_last.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] * group))


@tp_gather_seq.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], x.shape[1] * group, *x.shape[2:]))


@tp_scatter_seq.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], x.shape[1] // group, *x.shape[2:]))


def _keep_group(ctx, inputs, output) -> None:
    ctx.group = inputs[1]


def _copy_backward(ctx, grad):
    return tp_all_reduce(grad, ctx.group), None


def _reduce_backward(ctx, grad):
    return grad, None


def _gather_last_backward(ctx, grad):
    return torch.chunk(grad, ctx.group, dim=-1)[0].clone(
        memory_format=torch.contiguous_format), None


def _gather_seq_backward(ctx, grad):
    return tp_scatter_seq(grad, ctx.group), None


def _scatter_seq_backward(ctx, grad):
    return tp_gather_seq(grad, ctx.group), None


tp_copy.register_autograd(_copy_backward, setup_context=_keep_group)
tp_all_reduce.register_autograd(_reduce_backward, setup_context=_keep_group)
tp_gather_last.register_autograd(_gather_last_backward, setup_context=_keep_group)
tp_gather_seq.register_autograd(_gather_seq_backward, setup_context=_keep_group)
tp_scatter_seq.register_autograd(_scatter_seq_backward, setup_context=_keep_group)
