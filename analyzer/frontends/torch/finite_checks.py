"""A model's check that its values are finite, answered as a healthy step answers it
(``FiniteChecks``, used by bounded_trace.BoundedSizes while torch.export traces).

Detection and quantized models guard their training forward with Python that reads a tensor's
values: RT-DETR's, D-FINE's and Mask2Former's encoder layers run ``if not
torch.isfinite(hidden_states).all(): clamp``, I-BERT's quantizers ``assert
x_max.isnan().sum() == 0``. torch.export cannot trace that branch (a value read from a fake
tensor: "Could not guard on data-dependent expression"), so graphcost refused these models.
A step the user runs has finite activations (a step that overflows is not the step to size),
so such a check is answered as it is then: ``isfinite`` is all true, ``isnan`` and ``isinf``
are all false, and what a full reduction or a comparison with a number makes of that. Only
those facts are carried; any other value read from a tensor still fails as before. The
answer is said in the report's warnings, with the model's line that asked.
"""
from __future__ import annotations

import operator
import os
import sys
from typing import Any, Mapping

import torch

# Elementwise checks: the value every element has in a step whose values are finite.
_CHECKS = {torch.isfinite: True, torch.Tensor.isfinite: True,
           torch.isnan: False, torch.Tensor.isnan: False,
           torch.isinf: False, torch.Tensor.isinf: False,
           torch.isposinf: False, torch.isneginf: False}
# Full reductions of a tensor whose elements are all ``v`` (of at least one element).
_REDUCE = {torch.all: bool, torch.Tensor.all: bool, torch.any: bool, torch.Tensor.any: bool,
           torch.sum: int, torch.Tensor.sum: int}
_NOT = (torch.logical_not, torch.Tensor.logical_not, torch.Tensor.__invert__)
_COMPARE = {torch.Tensor.__eq__: operator.eq, torch.eq: operator.eq, torch.Tensor.eq: operator.eq,
            torch.Tensor.__ne__: operator.ne, torch.ne: operator.ne, torch.Tensor.ne: operator.ne}
# Reading the value: Python's ``if``/``assert``/``not`` (``__bool__``) or ``.item()``.
_READS = (torch.Tensor.__bool__, torch.Tensor.item)


class FiniteChecks:
    """The tensors known to hold one value everywhere because they check finiteness
    (``isfinite(x)``: True) or come from such a check (``.all()``, ``.sum() == 0``, ``~``).
    ``answer`` gives the value a read of one of them returns; ``asked`` lists where."""

    def __init__(self):
        from torch.utils.weak import WeakIdKeyDictionary
        self._known = WeakIdKeyDictionary()  # tensor -> the value of each of its elements
        self.asked: list[str] = []  # "modeling_rt_detr.py:513", one per line that read one

    def answer(self, func, args: tuple) -> Any:
        """The value ``func`` (a read) returns on a known tensor; None when not such a read."""
        if func not in _READS or not args or not isinstance(args[0], torch.Tensor) \
                or args[0] not in self._known or args[0].numel() != 1:
            return None
        where = asking_line()
        if where not in self.asked:
            self.asked.append(where)
        value = self._known[args[0]]
        return bool(value) if func is torch.Tensor.__bool__ else value

    def record(self, func, args: tuple, kwargs: Mapping[str, Any], out) -> None:
        if not isinstance(out, torch.Tensor) or not args or not isinstance(args[0], torch.Tensor):
            return
        value = self._value(func, args, kwargs)
        if value is not None:
            self._known[out] = value

    def _value(self, func, args: tuple, kwargs: Mapping[str, Any]) -> Any:
        x = args[0]
        if func in _CHECKS:
            return _CHECKS[func]  # (an integer tensor's elements are all finite too)
        if x not in self._known:
            return None
        v = self._known[x]
        if func in _REDUCE and len(args) == 1 and not kwargs and _has_elements(x):
            return _REDUCE[func](v) if _REDUCE[func] is bool else v * x.numel()
        if func in _NOT and len(args) == 1:
            return not v
        if func in _COMPARE and len(args) == 2 and isinstance(args[1], (bool, int, float)):
            return _COMPARE[func](v, args[1])
        return None


def _has_elements(x: torch.Tensor) -> bool:
    """A static, non-zero element count (``any`` of nothing is False, ``all`` True)."""
    n = x.numel()
    return isinstance(n, int) and n > 0


def asking_line() -> str:
    """``file:line`` of the model's code that read the value: the innermost frame outside
    torch and graphcost's analyzer/."""
    inside = (os.path.dirname(torch.__file__),  # torch, and graphcost's analyzer/
              os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
