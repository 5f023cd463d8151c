"""One tensor-parallel rank's program: the module rewritten into what the rank runs under
torchtitan's / Megatron-LM's plan for a Llama-style decoder, then traced like any module.

PyTorch's own DTensor plan cannot be traced here (``aot_export_module`` refuses tensor
subclasses such as DTensor parameters, and ``torch.export`` cannot carry a DTensorSpec), so
the plan is applied as DTensor applies it to the rank's local tensors (``--parallel tp=T``):

* **column-wise** (``ColwiseParallel``: q/k/v_proj, gate/up_proj): the weight's rows (and
  bias) sharded, the input replicated — identity forward, its gradient all-reduced in
  backward (DTensor's ``from_local`` of a Replicate input; Megatron's ``f``);
* **row-wise** (``RowwiseParallel``: o_proj, down_proj): the weight's columns sharded, the
  partial output all-reduced in forward (a new tensor, as ``funcol.all_reduce`` makes),
  identity in backward (Megatron's ``g``); a bias is added after the reduction;
* **the token embedding** row-wise (``RowwiseParallel`` on an ``nn.Embedding``: vocabulary
  rows sharded): ids outside the rank's rows masked to 0, looked up, the masked rows zeroed,
  the partial output all-reduced (DTensor's ``MaskPartial``);
* **the LM head** column-wise with a replicated output (``ColwiseParallel(output_layouts=
  Replicate())``): the rank's vocabulary slice of the logits, all-gathered on dim 0 and
  re-cut onto the last dim (``funcol.all_gather_tensor``: a gathered copy, then the cat), so
  the loss sees the whole vocabulary;
* attention's head counts (``n_head``/``n_kv``-style attributes) divided by T: the local
  q/k/v hold T times fewer heads. Norms and everything else stay replicated.

The collectives are two custom ops (``graphcost::tp_all_reduce``, ``graphcost::tp_all_gather``)
with fake kernels: they show in the IR as nodes whose rule (passes/costs/collectives.py) moves
their bytes and does no arithmetic, and the parallel pass sums them into the ``tp``
dimension's communication. Not modelled yet: sequence parallelism, loss parallelism, tied
embeddings, fused q/k/v (GPT-2's ``c_attn``): refused by name.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F

from ....passes.errors import GraphcostError, opt

COLWISE = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWWISE = ("o_proj", "down_proj")
HEAD_COUNTS = ("n_head", "n_kv", "n_heads", "n_kv_heads", "num_heads", "num_key_value_heads")


@torch.library.custom_op("graphcost::tp_copy", mutates_args=())
def tp_copy(x: torch.Tensor, group: int) -> torch.Tensor:
    """A replicated input handed to sharded work: the same tensor (its rule is an alias; a
    custom op may not return its input, so the kernel copies); its gradient all-reduced."""
    return x.clone()


@torch.library.custom_op("graphcost::tp_all_reduce", mutates_args=())
def tp_all_reduce(x: torch.Tensor, group: int) -> torch.Tensor:
    """The sum over the ``group`` ranks, a new tensor (``funcol.all_reduce``); its gradient
    passed through."""
    return x.clone()


@torch.library.custom_op("graphcost::tp_gather_last", mutates_args=())
def tp_gather_last(x: torch.Tensor, group: int) -> torch.Tensor:
    """The ranks' slices of the last dim gathered (``funcol.all_gather_tensor``); the
    gradient's own slice taken back (DTensor's Replicate -> Shard(-1): a clone)."""
    return x.repeat(*([1] * (x.dim() - 1)), group)


@tp_copy.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(x)


@tp_all_reduce.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(x)


@tp_gather_last.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] * group))


def _keep_group(ctx, inputs, output) -> None:
    ctx.group = inputs[1]


def _copy_backward(ctx, grad):
    return tp_all_reduce(grad, ctx.group), None


def _reduce_backward(ctx, grad):
    return grad, None


def _gather_backward(ctx, grad):
    return torch.chunk(grad, ctx.group, dim=-1)[0].clone(
        memory_format=torch.contiguous_format), None


tp_copy.register_autograd(_copy_backward, setup_context=_keep_group)
tp_all_reduce.register_autograd(_reduce_backward, setup_context=_keep_group)
tp_gather_last.register_autograd(_gather_backward, setup_context=_keep_group)


class ColwiseLinear(torch.nn.Linear):
    """A column-wise sharded linear: this rank's ``out_features`` (of ``full_out``)."""

    def __init__(self, base: torch.nn.Linear, group: int, gather: bool = False):
        rows = math.ceil(base.out_features / group)
        super().__init__(base.in_features, rows, bias=base.bias is not None,
                         device=base.weight.device, dtype=base.weight.dtype)
        self.group, self.gather, self.full_out = group, gather, base.out_features
        _same_grad(self, base)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # (Linear's parameter name)
        y = F.linear(tp_copy(input, self.group), self.weight, self.bias)
        return tp_gather_last(y, self.group) if self.gather else y


class RowwiseLinear(torch.nn.Linear):
    """A row-wise sharded linear: this rank's ``in_features``; the output all-reduced."""

    def __init__(self, base: torch.nn.Linear, group: int):
        super().__init__(math.ceil(base.in_features / group), base.out_features,
                         bias=base.bias is not None, device=base.weight.device,
                         dtype=base.weight.dtype)
        self.group = group
        _same_grad(self, base)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # (Linear's parameter name)
        y = tp_all_reduce(F.linear(input, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class VocabEmbedding(torch.nn.Embedding):
    """A vocabulary-sharded embedding (rank 0's rows, the largest share): ``full_rows``."""

    def __init__(self, base: torch.nn.Embedding, group: int):
        super().__init__(math.ceil(base.num_embeddings / group), base.embedding_dim,
                         device=base.weight.device, dtype=base.weight.dtype)
        self.group, self.full_rows = group, base.num_embeddings
        _same_grad(self, base)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # (Embedding's parameter name)
        outside = (input < 0) | (input >= self.num_embeddings)   # rank 0: rows [0, rows)
        out = F.embedding(input.masked_fill(outside, 0), self.weight)
        return tp_all_reduce(out.masked_fill(outside.unsqueeze(-1), 0.0), self.group)


def _same_grad(new: torch.nn.Module, base: torch.nn.Module) -> None:
    for (_, p), (_, q) in zip(new.named_parameters(), base.named_parameters()):
        p.requires_grad_(q.requires_grad)


def tensor_parallel(module: torch.nn.Module, group: int) -> torch.nn.Module:
    """A copy of ``module`` as one of ``group`` tensor-parallel ranks runs it (checked: a
    Llama-style decoder whose sharded sizes divide)."""
    model = copy.deepcopy(module)
    tokens, head = vocab_layers(model)
    if tokens is not None and head is not None and head.weight is tokens.weight:
        raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: the LM head is tied to "
                             "the token embedding; tensor parallelism of tied embeddings is "
                             "not modelled")
    sharded = 0
    for name, child in list(model.named_modules()):
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(child, torch.nn.Linear) and leaf in COLWISE + ROWWISE:
            _divides(name, child.out_features if leaf in COLWISE else child.in_features, group)
            new = ColwiseLinear(child, group) if leaf in COLWISE else RowwiseLinear(child, group)
            model.set_submodule(name, new)
            sharded += 1
    if not sharded:
        raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: graphcost shards "
                             f"Llama-style blocks ({', '.join(COLWISE + ROWWISE)} linears, as "
                             "torchtitan's plan names them); this model has none")
    _shard_vocab(model, tokens, head, group)
    local_head_counts(model, group)
    return model


def local_head_counts(model: torch.nn.Module, group: int) -> None:
    """Attention modules that say their head counts (``n_head``, ``num_key_value_heads``, …)
    told the rank's share, as torchtitan once did (``attn.n_heads //= tp``): their q/k/v
    views then shape the local heads."""
    for name, child in model.named_modules():
        for attr in HEAD_COUNTS:
            count = getattr(child, attr, None)
            if isinstance(count, int) and not isinstance(count, bool) and count > 1:
                _divides(f"{name}.{attr}", count, group)
                setattr(child, attr, count // group)


def _shard_vocab(model, tokens, head, group: int) -> None:
    names = {id(m): n for n, m in model.named_modules()}
    if tokens is not None:
        model.set_submodule(names[id(tokens)], VocabEmbedding(tokens, group))
    if head is not None:
        model.set_submodule(names[id(head)], ColwiseLinear(head, group, gather=True))


def vocab_layers(model: torch.nn.Module):
    """(the token embedding, the LM head projecting back onto its vocabulary), either None."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    tokens = get_in() if callable(get_in) else None
    head = get_out() if callable(get_out) else None
    if tokens is None:
        tables = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
        tokens = max(tables, key=lambda m: m.num_embeddings, default=None)
    if head is None and isinstance(tokens, torch.nn.Embedding):
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        head = linears[-1] if linears and linears[-1].out_features == tokens.num_embeddings \
            else None
    return (tokens if isinstance(tokens, torch.nn.Embedding) else None,
            head if isinstance(head, torch.nn.Linear) else None)


def _divides(what: str, size: int, group: int) -> None:
    if size % group:
        raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: {what} ({size:,}) does "
                             f"not divide into {group} ranks")
