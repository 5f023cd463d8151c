"""One tensor-parallel rank's shard of a linear or an embedding (tensor_parallel.py places
them): a column-wise linear (its rows of the output features), a row-wise one (its columns,
the partial output reduced), a vocabulary-sharded embedding (its rows of the table) and a
norm over a whole sharded projection (its input gathered), each calling its collectives
(tp_collectives.py) and, for torchao's float8 linears, their product (float8_linears.py)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .float8_linears import float8_linear, float8_spec
from .tp_collectives import (
    tp_all_reduce,
    tp_copy,
    tp_gather_last,
    tp_gather_seq,
    tp_partial_rows,
    tp_scatter_seq,
    tp_split_last,
)


class ColwiseLinear(torch.nn.Linear):
    """A column-wise sharded linear: this rank's ``out_features`` (of ``full_out``). Its
    input is replicated (``copy``: the gradient all-reduced) or all-gathered before it
    (sequence parallel: ``gather_seq`` on the head, the module's pre-hook elsewhere)."""

    def __init__(self, base: torch.nn.Linear, group: int, *, copy: bool = True,
                 gather_seq: bool = False, gather_out: bool = False, rows: int = 0):
        # rows: the rank's own count where it is not 1/group of them (vLLM's key/value
        # projection of fewer heads than ranks: one head each, replicated)
        rows = rows or math.ceil(base.out_features / group)
        super().__init__(base.in_features, rows, bias=base.bias is not None,
                         device=base.weight.device, dtype=base.weight.dtype)
        self.group, self.full_out = group, base.out_features
        self.copy, self.gather_seq, self.gather_out = copy, gather_seq, gather_out
        if gather_out:   # its output is whole: model code reading its width sees that
            # (Apertus 1.5's loss views the logits by its head's out_features)
            self.out_features = base.out_features
        self.float8 = float8_spec(base)   # (torchao's Float8ColwiseParallel: its product)
        # the head whose logits stay sharded on the vocabulary: the loss runs on each rank's
        # slice (loss parallelism; lm_loss.py reads this)
        self.loss_parallel = 0
        _same_grad(self, base)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # (Linear's parameter name)
        x = tp_gather_seq(input, self.group) if self.gather_seq else \
            tp_copy(input, self.group) if self.copy else input
        y = float8_linear(x, self.weight, self.bias, self.float8) if self.float8 else \
            F.linear(x, self.weight, self.bias)
        return tp_gather_last(y, self.group) if self.gather_out else y


class RowwiseLinear(torch.nn.Linear):
    """A row-wise sharded linear: this rank's ``in_features``; the partial output all-reduced
    (or reduce-scattered onto the sequence shard: ``scatter_seq``)."""

    def __init__(self, base: torch.nn.Linear, group: int, *, scatter_seq: bool = False,
                 split_input: bool = False, reduce: bool = True):
        super().__init__(math.ceil(base.in_features / group), base.out_features,
                         bias=base.bias is not None, device=base.weight.device,
                         dtype=base.weight.dtype)
        # split_input: its input replicated, the rank's slice taken (transformers'
        # rowwise_split_input, after a colwise_gather_output)
        self.group, self.scatter_seq, self.split_input = group, scatter_seq, split_input
        # reduce False: its partial sum left for a later all-reduce (vLLM's shared expert,
        # reduced with the routed experts' sum: serving_experts.py)
        self.reduce = reduce
        self.float8 = float8_spec(base)   # (torchao's Float8RowwiseParallel: its product)
        _same_grad(self, base)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # (Linear's parameter name)
        x = tp_split_last(input, self.group) if self.split_input else input
        y = float8_linear(x, self.weight, None, self.float8) if self.float8 else \
            F.linear(x, self.weight)
        y = _reduced(y, self.group, self.scatter_seq) if self.reduce else y
        return y if self.bias is None else y + self.bias


class VocabEmbedding(torch.nn.Embedding):
    """A vocabulary-sharded embedding (rank 0's rows, the largest share): ``full_rows``."""

    def __init__(self, base: torch.nn.Embedding, group: int, *, scatter_seq: bool = False):
        super().__init__(math.ceil(base.num_embeddings / group), base.embedding_dim,
                         device=base.weight.device, dtype=base.weight.dtype)
        self.group, self.full_rows, self.scatter_seq = group, base.num_embeddings, scatter_seq
        _same_grad(self, base)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # (Embedding's parameter name)
        outside = (input < 0) | (input >= self.num_embeddings)   # rank 0: rows [0, rows)
        # (a training step: the gradient of the whole table, as DTensor makes it)
        table = tp_partial_rows(self.weight, self.full_rows, self.group) \
            if self.weight.requires_grad and torch.is_grad_enabled() else self.weight
        out = F.embedding(input.masked_fill(outside, 0), table)
        return _reduced(out.masked_fill(outside.unsqueeze(-1), 0.0), self.group,
                        self.scatter_seq)


class WholeNorm(torch.nn.Module):
    """A norm over a whole projection that the plan shards column-wise (OLMo 2's ``q_norm``),
    as vLLM runs it (its ``_apply_qk_norm``): the rank's slice all-gathered, normalized whole
    with the whole weight, the rank's slice of the result taken (a view)."""

    def __init__(self, norm: torch.nn.Module, group: int):
        super().__init__()
        self.norm, self.group = norm, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(tp_gather_last(x, self.group))
        return y.narrow(-1, 0, x.shape[-1])


def _reduced(x: torch.Tensor, group: int, scatter_seq: bool) -> torch.Tensor:
    return tp_scatter_seq(x, group) if scatter_seq else tp_all_reduce(x, group)


def _same_grad(new: torch.nn.Module, base: torch.nn.Module) -> None:
    for (_, p), (_, q) in zip(new.named_parameters(), base.named_parameters()):
        p.requires_grad_(q.requires_grad)


def rank_conv(conv: torch.nn.Conv1d, channels: int) -> torch.nn.Conv1d:
    """A depthwise convolution over a rank's ``channels`` (a gated delta net's, a Mamba
    mixer's short convolution split by channel), marked sharded for tensor_parallel's check."""
    padding = conv.padding if isinstance(conv.padding, str) else conv.padding[0]
    rank = torch.nn.Conv1d(channels, channels, conv.kernel_size[0], groups=channels,
                           padding=padding, bias=conv.bias is not None,
                           device=conv.weight.device, dtype=conv.weight.dtype)
    rank.weight.requires_grad_(conv.weight.requires_grad)
    setattr(rank, "tp_sharded", True)
    return rank


def cut_rows(module: torch.nn.Module, name: str, rows: int) -> None:
    """``module``'s parameter ``name`` (if it has one) cut to its first ``rows`` along dim 0:
    a rank's share of a per-head or per-channel parameter (the rows are not data here)."""
    p = getattr(module, name, None)
    if isinstance(p, torch.nn.Parameter):
        setattr(module, name, torch.nn.Parameter(p.detach()[:rows].clone(), p.requires_grad))
