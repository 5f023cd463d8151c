"""The collectives a context-parallel rank's ring attention calls (context_parallel.py), as
custom ops with fake kernels, so AOTAutograd traces them into the joint graph as nodes (their
rules: passes/costs/collectives.py). Their eager kernels run one rank alone (nothing crosses
a link); graphcost only traces them. They are called inside the ring's own autograd
function, which says their backward.

- ``cp_all_gather``: PyTorch's all-gather rotater (``_AllGatherRotater``, the default
  ``rotate_method``): every rank's keys and values, flattened, gathered once into a new
  buffer of ``group`` times the rank's.
- ``cp_ring_pass``: the all-to-all rotater (``_AllToAllRotater``, ``permute_tensor``) the
  ring's backward passes each step's key and value gradients on with (and, under the
  "alltoall" ``rotate_method``, the keys and values themselves): a buffer of the same size
  from the previous rank.
"""
from __future__ import annotations

import torch


@torch.library.custom_op("graphcost::cp_all_gather", mutates_args=())
def cp_all_gather(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x`` (1-D) of each of the ``group`` ranks, one after another, a new tensor."""
    return x.repeat(group)


@cp_all_gather.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.new_empty((group * x.shape[0],))


@torch.library.custom_op("graphcost::cp_ring_pass", mutates_args=())
def cp_ring_pass(x: torch.Tensor, group: int) -> torch.Tensor:
    """The previous rank's ``x``, a new tensor of its shape."""
    return x.clone()


@cp_ring_pass.register_fake
def _(x: torch.Tensor, group: int) -> torch.Tensor:
    return torch.empty_like(x)
