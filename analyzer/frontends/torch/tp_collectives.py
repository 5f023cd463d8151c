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
tp_split_last       the rank's slice of the last     all-gather on the last dim
                    dim (a clone)
tp_gather_seq       all-gather on dim 1 (sequence)   reduce-scatter on dim 1
tp_scatter_seq      reduce-scatter on dim 1          all-gather on dim 1
tp_partial_rows     the rank's rows as the whole     the whole table's gradient kept,
                    table (rule: alias)              the rank's rows a view of it
                                                     (tp_rows_of, rule: alias)
==================  ===============================  =====================================

``tp_partial_rows`` is DTensor's vocabulary-parallel embedding: its output gradient is
replicated (the backward of the output's all-reduce or reduce-scatter), so
``embedding_dense_backward`` makes the whole table's gradient on every rank, alike
(``Replicate``: nothing crosses the link), and autograd keeps it whole as the gradient of the
``Shard(0)`` parameter — on torch 2.8 and 2.13, a 1,000-row table's gradient on each of 2
ranks is (1,000, 128), not (500, 128); the optimizer reads the rank's rows of it.
"""
from __future__ import annotations

import torch

from .held import hold


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


@torch.library.custom_op("graphcost::tp_partial_rows", mutates_args=())
def tp_partial_rows(x: torch.Tensor, rows: int, group: int) -> torch.Tensor:
    """The rank's rows of a table read as the whole table of ``rows`` rows (the kernel
    copies; the rule says it is the same tensor: the rows beyond are never looked up)."""
    return x.repeat(group, *([1] * (x.dim() - 1)))[:rows].clone()


@torch.library.custom_op("graphcost::tp_rows_of", mutates_args=())
def tp_rows_of(x: torch.Tensor, group: int) -> torch.Tensor:
    """The rank's rows (dim 0; rank 0's, the largest share) of a table every rank holds
    whole: a view of it (its rule: an alias; the kernel copies)."""
    return x.narrow(0, 0, -(-x.shape[0] // group)).clone()


@torch.library.custom_op("graphcost::tp_split_last", mutates_args=())
def tp_split_last(x: torch.Tensor, group: int) -> torch.Tensor:
    """The rank's slice of a replicated tensor's last dim (rank 0's), a contiguous copy:
    DTensor's ``Replicate() -> Shard(-1)``, transformers' ``rowwise_split_input``."""
    return x.narrow(-1, 0, x.shape[-1] // group).clone(memory_format=torch.contiguous_format)


@tp_split_last.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // group))


@tp_partial_rows.register_fake
def _(x: torch.Tensor, rows: int, group: int) -> torch.Tensor:
    return x.new_empty((rows, *x.shape[1:]))


@tp_rows_of.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.new_empty((-(-x.shape[0] // group), *x.shape[1:]))


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


def _keep_rows_group(ctx, inputs, output) -> None:
    ctx.group = inputs[2]


def _partial_rows_backward(ctx, grad):
    return tp_rows_of(grad, ctx.group), None, None


def _copy_backward(ctx, grad):
    return tp_all_reduce(grad, ctx.group), None


def _reduce_backward(ctx, grad):
    return grad, None


def _gather_last_backward(ctx, grad):
    return torch.chunk(grad, ctx.group, dim=-1)[0].clone(
        memory_format=torch.contiguous_format), None


def _split_last_backward(ctx, grad):
    return tp_gather_last(grad, ctx.group), None


def _gather_seq_backward(ctx, grad):
    return tp_scatter_seq(grad, ctx.group), None


def _scatter_seq_backward(ctx, grad):
    return tp_gather_seq(grad, ctx.group), None


tp_copy.register_autograd(_copy_backward, setup_context=_keep_group)
tp_all_reduce.register_autograd(_reduce_backward, setup_context=_keep_group)
tp_gather_last.register_autograd(_gather_last_backward, setup_context=_keep_group)
tp_split_last.register_autograd(_split_last_backward, setup_context=_keep_group)
tp_gather_seq.register_autograd(_gather_seq_backward, setup_context=_keep_group)
tp_scatter_seq.register_autograd(_scatter_seq_backward, setup_context=_keep_group)
tp_partial_rows.register_autograd(_partial_rows_backward, setup_context=_keep_rows_group)


# Loss parallelism (torchtitan's default with tensor parallelism: ``loss_parallel()``): the
# logits stay sharded on the vocabulary and cross-entropy runs on each rank's slice, as
# DTensor's handlers in torch/distributed/tensor/parallel/loss.py compute it: a log-softmax
# whose row max and sum of exponentials are all-reduced, saved by autograd; an NLL whose
# backward computes the log-softmax's gradient too, ``(one_hot_masked + exp(logp)) * grad``,
# while the log-softmax's output is still held (its own backward only passes the gradient
# on). One op here, returning the loss and the saved log-probabilities.

@torch.library.custom_op("graphcost::tp_cross_entropy", mutates_args=())
def tp_cross_entropy_op(logits: torch.Tensor, target: torch.Tensor,
                        group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the mean NLL of the targets, each read on the rank holding it; the fp32
    log-probabilities of the rank's vocabulary slice)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    rows = logp.shape[-1]
    inside = (target >= 0) & (target < rows)
    picked = logp.gather(-1, target.clamp(0, rows - 1).unsqueeze(-1)).squeeze(-1)
    return -(picked * inside).sum() / max(target.numel(), 1), logp


@tp_cross_entropy_op.register_fake
def _(logits: torch.Tensor, target: torch.Tensor, group: int):
    return logits.new_empty((), dtype=torch.float32), \
        torch.empty_like(logits, dtype=torch.float32)


def _keep_logp(ctx, inputs, output) -> None:
    ctx.save_for_backward(output[1], inputs[1])
    ctx.dtype = inputs[0].dtype


def _cross_entropy_backward(ctx, grad, _grad_logp):
    logp, target = ctx.saved_tensors
    rows = logp.shape[-1]
    inside = ((target >= 0) & (target < rows)).to(logp.dtype)
    one_hot = torch.zeros_like(logp).scatter(-1, target.clamp(0, rows - 1).unsqueeze(-1),
                                             -inside.unsqueeze(-1))
    grad_logits = (one_hot + torch.exp(logp)) * (grad / max(target.numel(), 1))
    # the log-softmax's autograd node holds logp until it passes the gradient on
    return hold(grad_logits, logp).to(ctx.dtype), None, None


tp_cross_entropy_op.register_autograd(_cross_entropy_backward, setup_context=_keep_logp)


def tp_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, group: int) -> torch.Tensor:
    """torchtitan's ``cross_entropy_loss`` under ``loss_parallel()``: ``logits`` (batch, seq,
    V/group), this rank's slice; ``labels`` (batch, seq)."""
    return tp_cross_entropy_op(logits.flatten(0, 1), labels.flatten(0, 1), group)[0]
