"""The graphs of the last few named models loaded in this process, kept for the next analysis
that loads the same one the same way.

A trace is most of an analysis's time (torch.export and the joint graph: seconds for a small
model), and a session often loads one model again under other settings that leave the trace
alone: a notebook's analyses under two devices or optimizers, ``plan``'s "what would fit"
retries, a pipeline's stage programs under another schedule or micro-batch count. Only models
named by graphcost's own registries are kept — ``zoo:NAME`` and ``timm:NAME``, whose
definitions are code already imported into this process; a file, a hub id or a module object
may change between two calls and is loaded again every time (a str subclass is not a name,
whatever it says). The key is the name and every field of the LoadOptions — their ``repr``:
all of them take part — and for a serving review its ServeSpec; the graphs are frozen
(passes/ir.py) and the passes never write to them, so one load serves every analysis.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Sequence, TypeVar

from .resolve import TIMM_PREFIX, ZOO_PREFIX

T = TypeVar("T")
KEPT = 8   # loads: a 405B stage program is tens of MB of nodes; a small model's, kilobytes

_kept: OrderedDict[tuple[str, str], Any] = OrderedDict()


def cached_load(model, how: str, example_inputs: Sequence[Any] | None,
                make: Callable[[], T]) -> T:
    """``make()``'s result (a graph, or a serving review's graph and traces), or the one kept
    from an earlier load of ``model`` the same way (``how``: the repr of every option the
    load reads)."""
    if example_inputs is not None or type(model) is not str or \
            not model.startswith((ZOO_PREFIX, TIMM_PREFIX)):
        return make()
    key = (model, how)
    kept = _kept.pop(key, None)   # (put back last: the newest; two threads at most trace twice)
    kept = make() if kept is None else kept
    _kept[key] = kept
    while len(_kept) > KEPT:
        _kept.popitem(last=False)
    return kept


def forget() -> None:
    """Every kept load dropped (a test that patches how models are traced calls it)."""
    _kept.clear()
