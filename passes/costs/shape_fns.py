"""Small building blocks of the rules' shape functions (``Rule.shapes`` / ``bound_shapes``).

A shape function receives a ``registry.ShapeView`` and returns one ``(dtype, shape)`` per output
(None: unknown; a None dtype means input 0's). Dims may be ints, symbols or None (unknown).
"""
from __future__ import annotations

from typing import Any

from ..costs.registry import ShapeView


def like(i: int = 0, n_out: int = 1):
    """Every output has input ``i``'s shape and dtype (fused elementwise ops, norms)."""
    def fn(v: ShapeView):
        return [(v.dtype(i), v.shape(i))] * n_out
    return fn


def broadcast(a, b):
    """Numpy broadcasting of two shapes (None when a rank is unknown)."""
    if a is None or b is None:
        return None
    a, b = tuple(a), tuple(b)
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        out.append(y if x == 1 else x if y == 1 or x == y or y is None else
                   (x if isinstance(x, int) else y))
    return tuple(out)


def matmul(a, b):
    """Numpy matmul of two shapes (batch dims broadcast); None when a rank is unknown."""
    if a is None or b is None:
        return None
    a, b = tuple(a), tuple(b)
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(a) == 1:
        return b[:-2] + b[-1:]
    if len(b) == 1:
        return a[:-1]
    batch = broadcast(a[:-2], b[:-2]) or ()
    return batch + (a[-2], b[-1])


def const_int(v: ShapeView, i: int, default: Any = None) -> Any:
    """The first value of a constant input as an int (a scalar setting), else ``default``."""
    arr = v.const(i)
    if arr is None or arr.size == 0:
        return default
    return int(arr.reshape(-1)[0])


def attr_int(v: ShapeView, name: str, default: int = 0) -> int:
    x = v.attr(name, default)
    return int(x) if x is not None else default
