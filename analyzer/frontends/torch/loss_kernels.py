"""A model's own loss, traced as eager runs it.

Which output is the loss (``split_loss``): the ``loss`` of a mapping output (a
transformers ``ModelOutput`` given ``labels``), else the one scalar floating output of a
tuple that holds the loss beside the logits (nanoGPT's ``(logits, loss)``), else every
floating output summed (a model with no loss of its own: the sum's backward reaches every
parameter they depend on and makes no large tensor).

Cross-entropy and NLL (``as_kernels``): ``cross_entropy_loss``, ``nll_loss_nd``, ``nll_loss``
and ``nll_loss2d`` are composite ops, which eager runs as ``log_softmax`` and the
``nll_loss_forward`` / ``nll_loss2d_forward`` kernels (aten/src/ATen/native/LossNLL.cpp,
``cross_entropy_loss_symint`` and ``nll_loss_nd_symint``). On a model built on the meta device
AOTAutograd traces the composites to a loss no gradient leaves ("Found a parameter that did
not receive a gradient", torch 2.8 to 2.14); the kernels themselves carry their backward, so
the exported graph's composite is run as those kernels, in eager's order. Soft (probability)
targets and label smoothing run as exported.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree  # (torch.utils does not import it for the type checker)

aten = torch.ops.aten
MEAN = 1   # at::Reduction::Mean (None 0, Sum 2)
NONE = 0


def split_loss(out: Any) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """(the scalar a training step of a model returning ``out`` backpropagates, the tensors
    the training loop holds beside it through the backward). A model's own loss comes with
    what it returned beside it (its logits), which a loop such as nanoGPT's
    ``logits, loss = model(x, y); loss.backward()`` or ``out = model(**batch);
    out.loss.backward()`` holds until the backward ends; a sum of the outputs holds nothing
    (its backward saves none of them)."""
    leaves = floating_leaves(out)
    loss = returned_loss(out)
    if loss is not None:
        held = tuple(t for t in leaves if t is not loss)
        return (loss if loss.dim() == 0 else loss.sum()), held  # (sum: a 1-element loss)
    return summed(leaves), ()


def floating_leaves(out: Any) -> list[torch.Tensor]:
    """The floating tensors a model returned, in order."""
    return [t for t in torch.utils._pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def returned_loss(out: Any) -> torch.Tensor | None:
    """The loss a model returned: a mapping's ``loss``, or the one scalar of a tuple that
    holds more (nanoGPT's ``(logits, loss)``); None where it returned none."""
    if isinstance(out, Mapping):  # (it names its loss: a router's aux_loss is not the loss)
        loss = out.get("loss")
        return loss if isinstance(loss, torch.Tensor) else None
    leaves = floating_leaves(out)
    scalars = [t for t in leaves if t.dim() == 0]
    return scalars[0] if len(scalars) == 1 and len(leaves) > 1 else None


def summed(leaves: list[torch.Tensor]) -> torch.Tensor:
    """Every tensor summed, one sum each, added in order (the ``sum`` loss)."""
    total = leaves[0].sum()
    for t in leaves[1:]:
        total = total + t.sum()
    return total


def _nll_nd(x, target, weight=None, reduction: int = MEAN, ignore_index: int = -100):
    """``nll_loss_nd_symint``: 1-D and 2-D inputs by ``nll_loss_forward``, 4-D by
    ``nll_loss2d_forward``, any other as a 4-D view of itself."""
    if x.dim() in (1, 2):
        return aten.nll_loss_forward(x, target, weight, reduction, ignore_index)[0]
    if x.dim() == 4:
        return aten.nll_loss2d_forward(x, target, weight, reduction, ignore_index)[0]
    n, c = x.shape[0], x.shape[1]
    out_size = (n, *x.shape[2:])
    out = aten.nll_loss2d_forward(x.contiguous().view(n, c, 1, -1),
                                  target.contiguous().view(n, 1, -1), weight, reduction,
                                  ignore_index)[0]
    return out if reduction != NONE else out.view(out_size)


def _cross_entropy(x, target, weight=None, reduction: int = MEAN, ignore_index: int = -100,
                   label_smoothing: float = 0.0):
    """``cross_entropy_loss_symint``'s class-index path; None for the others."""
    if label_smoothing > 0.0 or target.is_floating_point():
        return None
    return _nll_nd(aten.log_softmax.int(x, 0 if x.dim() == 1 else 1, x.dtype), target,
                   weight, reduction, ignore_index)


_COMPOSITES = {aten.cross_entropy_loss.default: _cross_entropy,
               aten.nll_loss_nd.default: _nll_nd, aten.nll_loss.default: _nll_nd,
               aten.nll_loss2d.default: _nll_nd}


def is_loss(target) -> bool:
    return target in _COMPOSITES


def as_kernels(target, args: tuple, kwargs: Mapping[str, Any]):
    """The composite loss ``target`` run as eager's kernels (None: run it as it is). Empty
    inputs run as exported (the composite's own empty-batch views)."""
    kwargs = dict(kwargs)
    if "self" in kwargs:  # (the schema's name of the input)
        args = (kwargs.pop("self"), *args)
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.numel() == 0 or x.dim() < 1:
        return None
    return _COMPOSITES[target](*args, **kwargs)
