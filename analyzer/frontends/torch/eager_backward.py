"""Ops whose backward eager runs as one kernel, which AOTAutograd would trace as the formula
for a second derivative.

tools/autograd/derivatives.yaml picks SiLU's gradient by grad mode (Mish's too; its forward
is decomposed here, so its backward follows the decomposition):
``GradMode::is_enabled() ? infinitely_differentiable_silu_backward(grad, self) :
silu_backward(grad, self)``. A training step's backward runs with grad mode off (no
``create_graph``): one ``silu_backward`` kernel. AOTAutograd traces the joint graph with it on,
and SiLU's gradient became sigmoid, 1 − s, x·(1 − s), 1 +, s·, grad· — activation-sized
temporaries eager never makes (a small decoder's step +8.8% against MemTracker, at its MLP's
widest activation). Each such op runs here as an autograd Function whose backward is eager's
one kernel, saving what eager's node saves: the input. The kernel has a
CompositeImplicitAutograd kernel too (math_silu_backward), which functionalization under export
would run instead (frontend.kept_whole keeps EAGER_KERNELS whole), and so would the Autograd key
for tensors that require grad: it is called on detached ones.
"""
from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


class _Silu(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return aten.silu.default(x)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor) -> torch.Tensor:
        (grad,), (x,) = grad_outputs, ctx.saved_tensors
        return aten.silu_backward.default(grad.detach(), x.detach())  # (see the module docstring)


_AS_EAGER = {aten.silu.default: _Silu}
# the kernels their backward runs, which functionalization must keep whole (compat.py)
EAGER_KERNELS = frozenset({aten.silu_backward.default})


def as_eager_backward(target, args: tuple, kwargs: dict):
    """``target`` run with eager's one-kernel backward (None: run it as it is)."""
    fn = _AS_EAGER.get(target)
    x = args[0] if args else None
    if fn is None or kwargs or len(args) != 1 or not isinstance(x, torch.Tensor) \
            or not x.requires_grad:
        return None
    return fn.apply(x)
