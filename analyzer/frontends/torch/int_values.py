"""The interval an integer tensor's values lie in, where a trace shows it (``IntValues``):
what bounds ``torch.unique``'s count besides sizes (analyzer/frontends/torch/bounded_trace.py).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.utils._pytree  # (torch.utils does not import it for the type checker)


class IntValues:
    """The interval an integer tensor's values lie in, where the trace shows it: made by
    ``arange``, ``full`` or ``x % k``, carried by the ops that select or rearrange elements
    (``levels[keep]``, ``cat``, ``reshape``). It bounds ``torch.unique``'s count: the class
    ids batched_nms loops over lie in [0, classes), the RPN's levels in [0, levels), while
    their number (the boxes kept) runs to thousands. A tensor written in place, and every
    tensor sharing its storage, loses its interval; any other op's output has none. (A write
    inside a Python-level torch function, which the mode sees as one call, is seen where the
    function returns its target, as ``F.relu(x, inplace=True)`` does.)"""

    def __init__(self):
        from torch.utils.weak import WeakIdKeyDictionary
        self._known = WeakIdKeyDictionary()  # tensor -> (lo, hi, "torch.arange") …

    def get(self, t: torch.Tensor) -> tuple[int, int, str] | None:
        return self._known.get(t)

    def record(self, func, args: tuple, kwargs: Mapping[str, Any], out) -> None:
        if self._known:
            self._forget_written(func, args, kwargs, out)
        made, dtype = _made(func, args, kwargs), None
        if made is None and func in _SELECTS and args and isinstance(args[0], torch.Tensor):
            made, dtype = self._known.get(args[0]), args[0].dtype
        elif made is None and func in _JOINS and args and isinstance(args[0], (list, tuple)):
            made = self._hull(args[0])
        if made is None:
            return
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and _holds(t, made, dtype):
                self._known[t] = made

    def _hull(self, tensors) -> tuple[int, int, str] | None:
        got = [self._known.get(t) if isinstance(t, torch.Tensor) else None for t in tensors]
        if not got or any(g is None for g in got) or len({t.dtype for t in tensors}) != 1:
            return None
        made = sorted({g[2] for g in got if g is not None})
        return (min(g[0] for g in got if g is not None), max(g[1] for g in got if g is not None),
                ", ".join(made))

    def _forget_written(self, func, args, kwargs, out) -> None:
        for w in written_by(func, args, kwargs, out):
            try:
                storage = w.untyped_storage()
                stale = [t for t in self._known if t.untyped_storage()._cdata == storage._cdata]
            except Exception:  # noqa: BLE001 - no storage to compare: forget everything
                stale = list(self._known)
            for t in stale:
                del self._known[t]


def written_by(func, args: tuple, kwargs: Mapping[str, Any], out) -> list[torch.Tensor]:
    """The tensors a call may have written in place: ``x[i] = v`` and ``.data =`` name their
    target first, an op named ``…_`` may write any of its tensors, any other (``out=``,
    ``inplace=True``, ``+=``) returns its target; a view or a selection writes none."""
    ins = [a for a in torch.utils._pytree.tree_leaves((args, kwargs))
           if isinstance(a, torch.Tensor)]
    named = getattr(func, "__name__", "")
    if named in ("__setitem__", "__set__"):
        return ins[:1]
    if named.endswith("_") and not named.startswith("__"):
        return ins  # (_foreach_add_ returns nothing)
    if func in _SELECTS:
        return []  # a view or a copy, never a write (``.to``/``.contiguous`` may return self)
    outs = {id(t) for t in torch.utils._pytree.tree_leaves(out)}
    return [a for a in ins if id(a) in outs]


def _integral(t: torch.Tensor) -> bool:
    return not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool


def _holds(t: torch.Tensor, made: tuple[int, int, str], dtype) -> bool:
    """Whether ``t`` holds the values ``made`` says: an integer tensor of the input's dtype
    (a view as another dtype or ``.to(int8)`` has other values), wide enough for them
    (``arange(300, dtype=torch.uint8)`` wraps)."""
    if not _integral(t) or dtype not in (None, t.dtype):
        return False
    try:
        info = torch.iinfo(t.dtype)
    except TypeError:  # quantized and other dtypes iinfo does not describe
        return False
    return info.min <= made[0] and made[1] <= info.max


def _made(func, args: tuple, kwargs: Mapping[str, Any]) -> tuple[int, int, str] | None:
    """The interval of what ``arange``, ``full`` or ``x % k`` (k a Python int) makes."""
    if func is torch.arange:
        ends = [*args[:3]] + [kwargs[k] for k in ("start", "end", "step") if k in kwargs]
        if not ends or not all(type(e) is int for e in ends):  # (bool, SymInt, float: none)
            return None
        start, end, step = (0, ends[0], 1) if len(ends) == 1 else (*ends[:2], (ends[2:] or [1])[0])
        lo, hi = (start, end - 1) if step > 0 else (end + 1, start)
        return (lo, hi, "torch.arange") if lo <= hi else None
    if func in _FILLS:
        at = 2 if func is torch.Tensor.new_full else 1  # new_full(self, size, fill_value)
        v = kwargs.get("fill_value", args[at] if len(args) > at else None)
        return (v, v, op_name(func)) if type(v) is int else None
    if func in _MODULO and len(args) == 2 and isinstance(args[0], torch.Tensor) \
            and _integral(args[0]) and type(args[1]) is int and args[1] != 0:
        k = args[1]  # Python's sign rule: the remainder takes the divisor's sign
        return (0, k - 1, f"x % {k}") if k > 0 else (k + 1, 0, f"x % {k}")
    return None


# ops whose integer output holds only values of their first input (views, selections, copies)
_SELECTS = frozenset({
    torch.Tensor.__getitem__, torch.Tensor.view, torch.Tensor.reshape, torch.reshape,
    torch.Tensor.flatten, torch.flatten, torch.Tensor.expand, torch.Tensor.expand_as,
    torch.Tensor.unsqueeze, torch.unsqueeze, torch.Tensor.squeeze, torch.squeeze,
    torch.Tensor.unbind, torch.unbind, torch.Tensor.index_select, torch.index_select,
    torch.Tensor.contiguous, torch.Tensor.clone, torch.clone, torch.Tensor.detach,
    torch.Tensor.to, torch.Tensor.permute, torch.Tensor.t, torch.Tensor.transpose})
_JOINS = frozenset({torch.cat, torch.concat, torch.stack})  # the hull of their inputs'
_FILLS = frozenset({torch.full, torch.full_like, torch.Tensor.new_full})
_MODULO = frozenset({torch.remainder, torch.Tensor.remainder, torch.Tensor.__mod__})


def overload(func):
    """The OpOverload a call resolves to (a packet: its one overload), else None."""
    if isinstance(func, torch._ops.OpOverload):
        return func
    if isinstance(func, torch._ops.OpOverloadPacket):
        names = func.overloads()
        if len(names) == 1:
            return getattr(func, names[0])
    return None


def op_name(func) -> str:
    op = overload(func)
    if op is not None:
        return str(op)
    qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
    if "<locals>" in qual:  # a Python wrapper (torch.unique's boolean dispatch)
        module = str(getattr(func, "__module__", "")).split(".")[0]
        return f"{module}.{func.__name__}" if module else func.__name__
    owner, _, name = qual.rpartition(".")
    return {"_VariableFunctionsClass": f"torch.{name}", "TensorBase": f"Tensor.{name}",
            "Tensor": f"Tensor.{name}"}.get(owner, qual)
