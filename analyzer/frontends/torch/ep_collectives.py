"""The collective an expert-parallel rank's program calls (expert_parallel.py), as a custom
op with a fake kernel and an autograd formula, so ``torch.export`` and AOTAutograd trace it
into the joint graph as a node (its rule: passes/costs/collectives.py). Its eager kernel runs
one rank alone (nothing crosses a link); graphcost only traces it.

``ep_all_to_all`` is torchtitan's token exchange (``all_to_all_single`` with the routed
counts as splits) at balanced routing: a rank sends and receives as many rows as it holds,
into a new tensor; its backward is the reverse exchange, another all-to-all of the gradient.
"""
from __future__ import annotations

import torch


@torch.library.custom_op("graphcost::ep_all_to_all", mutates_args=())
def ep_all_to_all(x: torch.Tensor, group: int) -> torch.Tensor:
    """The rows each of the ``group`` ranks sends this one, a new tensor of ``x``'s shape."""
    return x.clone()


@ep_all_to_all.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(x)


def _keep_group(ctx, inputs, output) -> None:
    ctx.group = inputs[1]


def _exchange_back(ctx, grad):
    return ep_all_to_all(grad, ctx.group), None


ep_all_to_all.register_autograd(_exchange_back, setup_context=_keep_group)
