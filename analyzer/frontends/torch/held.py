"""``graphcost::held``: a point of a traced program where tensors a Python function still
holds are let go. A joint graph frees each tensor after its last use; eager PyTorch frees it
when the last reference dies — a local reassigned on the next loop step, a buffer a pending
collective keeps, a saved output the autograd engine holds until its node runs. Where that is
later than the tensor's last use, and the bytes count at a peak, the traced program reads the
tensor here (its rule: passes/costs/collectives.py, an alias of the first input)."""
from __future__ import annotations

import torch


@torch.library.custom_op("graphcost::held", mutates_args=())
def held(x: torch.Tensor, kept: list[torch.Tensor]) -> torch.Tensor:
    """``x`` itself (its rule: an alias), with each of ``kept`` read here."""
    return x.clone()


@held.register_fake
def _(x: torch.Tensor, kept: list[torch.Tensor]) -> torch.Tensor:
    return torch.empty_like(x)


def hold(x: torch.Tensor, *kept: torch.Tensor | None) -> torch.Tensor:
    """``x``, the tensors of ``kept`` (None: nothing held there) held to this point."""
    alive = [t for t in kept if t is not None]
    return held(x, alive) if alive else x
