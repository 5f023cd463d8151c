"""``torch.where`` with a Python scalar, on a model built on the meta device: traced with the
scalar as the 0-dim tensor eager wraps it in.

AOTAutograd's joint trace gives no gradient through ``aten.where.ScalarOther`` (or
``ScalarSelf``) when its tensor is on the meta device: ``torch.where(mask, bias, -1e9)``
over a meta parameter, then a loss, and aot_export_module refuses the parameter ("Found a
parameter that did not receive a gradient"); on the CPU, or with the scalar as a meta
0-dim tensor (``where.self``), the gradient is there (torch 2.8, 2.13 and 2.14 alike). T5's
decoder does exactly this: transformers' SDPA mask puts its learned relative-position bias
where the causal mask allows and the dtype's minimum elsewhere. Eager's kernel wraps the
scalar in a 0-dim tensor too (``wrapped_scalar_tensor``), so the joint graph computes what
eager does, with one 0-dim ``full`` more."""
from __future__ import annotations

import torch

aten = torch.ops.aten
_SCALAR = {aten.where.ScalarOther: 2, aten.where.ScalarSelf: 1}   # op -> the scalar's place


def as_tensor_where(target, args: tuple, kwargs: dict):
    """``where(cond, a, b)`` with its scalar as a 0-dim tensor where the other is a meta
    tensor that requires grad (None: run it as it is)."""
    at = _SCALAR.get(target)
    if at is None or kwargs or len(args) != 3:
        return None
    tensor = args[3 - at]
    if not isinstance(tensor, torch.Tensor) or not tensor.is_meta or not tensor.requires_grad:
        return None
    scalar = torch.full((), args[at], dtype=tensor.dtype, device=tensor.device)
    return aten.where.self(*[scalar if i == at else a for i, a in enumerate(args)])
