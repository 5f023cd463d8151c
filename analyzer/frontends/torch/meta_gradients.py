"""Ops whose gradient AOTAutograd's joint trace drops when their tensors are on the meta
device, traced here so that a model built on meta (every config.json, a hub id) gets the
backward a CPU-built one gets.

Measured (aot_export_module, a meta parameter through the op into a loss; torch 2.8, 2.13 and
2.14 alike; on the CPU the same modules trace in full): ``aten.where.ScalarOther`` /
``ScalarSelf`` (a where with a Python scalar) gives its tensor no gradient, so that a
parameter behind it is refused ("Found a parameter that did not receive a gradient"): T5's
decoder hands SDPA where(causal mask, its relative-position bias, dtype min). ``var`` and
``std`` (each overload) silently leave their backward out (the joint graph of a meta
LayerNorm written with ``x.var`` has 12 nodes where the CPU's has 19): xLSTM's multi-head
norm, Gemma-3n's activation sparsity.

Each runs here as it would on the CPU, op for op as the CPU's joint graph has it: the where
with its scalar as the 0-dim tensor eager wraps it in (``scalar_tensor``); var and std as
autograd Functions whose forward is the op itself and whose backward is eager's formula
(tools/autograd/FunctionsManual.cpp ``var_backward``, ``std_backward``)."""
from __future__ import annotations

import functools
from typing import Any

import torch

aten = torch.ops.aten
_SCALAR = {aten.where.ScalarOther: 2, aten.where.ScalarSelf: 1}   # op -> the scalar's place


def as_cpu_gradient(target, args: tuple, kwargs: dict):
    """``target`` run so that its meta gradient is the CPU's (None: run it as it is)."""
    if target in _SCALAR:
        return _tensor_where(target, args, kwargs)
    if getattr(target, "overloadpacket", None) in _upsampling():
        return _upsampled(target, args, kwargs)
    if getattr(target, "_overloadname", None) not in ("correction", "dim", "default"):
        return None   # (not an op overload, or var's named-dimension and out= ones)
    fn = _REDUCTIONS.get(target.overloadpacket)
    x = args[0] if args else None
    if fn is None or not isinstance(x, torch.Tensor) or not x.is_meta or not x.requires_grad:
        return None
    return fn.apply(x, lambda t: target(t, *args[1:], **kwargs),
                    _reduction(target, args[1:], kwargs))


def _reduction(target, rest: tuple, kwargs: dict) -> tuple:
    """(dim, correction, keepdim) of a var or std call: its ``.correction`` overload
    (dim, *, correction, keepdim), ``.dim`` (dim, unbiased, keepdim) or ``.default``
    (unbiased)."""
    name = target._overloadname
    if name == "correction":
        a = {"dim": rest[0] if rest else None, **kwargs}
        return a.get("dim"), a.get("correction"), bool(a.get("keepdim", False))
    names = ("dim", "unbiased", "keepdim") if name == "dim" else ("unbiased",)
    a = {"dim": None, "unbiased": True, "keepdim": False, **dict(zip(names, rest)), **kwargs}
    return a["dim"], 1 if a["unbiased"] else 0, bool(a["keepdim"])


def _tensor_where(target, args: tuple, kwargs: dict):
    at = _SCALAR[target]
    if kwargs or len(args) != 3:
        return None
    tensor = args[3 - at]
    if not isinstance(tensor, torch.Tensor) or not tensor.is_meta or not tensor.requires_grad:
        return None
    scalar = aten.scalar_tensor.default(args[at], dtype=tensor.dtype, device=tensor.device)
    return aten.where.self(*[scalar if i == at else a for i, a in enumerate(args)])


def _var_backward(grad, x, dim, correction, keepdim: bool):
    """Eager's ``var_backward``: (2 / (N − correction)) · grad · (x − mean(x))."""
    c = 1.0 if correction is None else float(correction)
    if x.dim() == 0 or dim is None:
        return aten.mul.Scalar(grad, 2.0 / (x.numel() - c)) * (x - x.mean())
    dims = [d % x.dim() for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
    if not keepdim and x.dim() > 1:
        for d in sorted(dims):
            grad = grad.unsqueeze(d)
    n = 1
    for d in dims:
        n *= x.shape[d]
    return aten.mul.Scalar(grad, 2.0 / (n - c)) * (x - x.mean(dims, keepdim=True))


class _Var(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x, op, reduction):
        ctx.save_for_backward(x)
        ctx.reduction = reduction
        return op(x)

    @staticmethod
    def backward(ctx: Any, *grads):
        (x,) = ctx.saved_tensors
        return _var_backward(grads[0], x, *ctx.reduction), None, None


class _Std(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x, op, reduction):
        out = op(x)
        ctx.save_for_backward(x, out)
        ctx.reduction = reduction
        return out

    @staticmethod
    def backward(ctx: Any, *grads):
        # eager's std_backward: var_backward((grad / (2 · result)), 0 where result is 0)
        x, out = ctx.saved_tensors
        grad = (grads[0] / aten.mul.Scalar(out, 2)).masked_fill(out == 0, 0)
        return _var_backward(grad, x, *ctx.reduction), None, None


_REDUCTIONS = {aten.var: _Var, aten.std: _Std}

# the upsampling ops (F.interpolate's): the kernels of each mode and dimension; the linear and
# cubic ones take align_corners after the sizes
_UPSAMPLING = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
               "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
               "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
               "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bilinear2d_aa",
               "_upsample_bicubic2d_aa")


@functools.cache   # (asked of every op an exported program runs)
def _upsampling() -> dict:
    """Each upsampling op's packet -> (its backward kernel, whether it takes align_corners),
    for the ops this torch has."""
    return {getattr(aten, name): (getattr(aten, f"{name}_backward").default,
                                  "nearest" not in name)
            for name in _UPSAMPLING if hasattr(aten, name) and hasattr(aten, f"{name}_backward")}


def _upsampled(target, args: tuple, kwargs: dict):
    """An upsampling of a meta tensor that requires grad: its meta joint trace gives the input
    no gradient (F.interpolate in SegFormer's, UperNet's and DPT's heads: every parameter
    before it refused), so it runs as a Function whose backward is eager's kernel
    (``upsample_bilinear2d_backward``, …) at the same sizes."""
    backward, corners = _upsampling()[target.overloadpacket]
    x = args[0] if args else None
    if kwargs or not isinstance(x, torch.Tensor) or not x.is_meta or not x.requires_grad \
            or (corners and len(args) < 3):
        return None
    return _Upsample.apply(x, lambda t: target(t, *args[1:]), backward,
                           args[2] if corners else None)


class _Upsample(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x, op, backward, align_corners):
        ctx.sizes, ctx.backward, ctx.corners = list(x.shape), backward, align_corners
        return op(x)

    @staticmethod
    def backward(ctx: Any, *grads):
        grad = grads[0]
        corners = () if ctx.corners is None else (ctx.corners,)
        return ctx.backward(grad, list(grad.shape[2:]), ctx.sizes, *corners), None, None, None
