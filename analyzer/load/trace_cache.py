"""The graphs of the last few named models loaded in this process, kept for the next analysis
that loads the same one the same way.

A trace is most of an analysis's time (torch.export and the joint graph: seconds for a small
model), and a session often loads one model again under other settings that leave the trace
alone: a notebook's analyses under two devices or optimizers, ``plan``'s "what would fit"
retries, a pipeline's stage programs under another schedule or micro-batch count. Only models
named by graphcost's own registries are kept — ``zoo:NAME`` and ``timm:NAME``, whose
definitions are code already imported into this process; a file, a hub id or a module object
may change between two calls and is loaded again every time. The key is the name and every
field of the LoadOptions (their ``repr``: all of them take part; a str subclass is not a name, whatever it says); the graph is frozen
(passes/ir.py) and the passes never write to it, so one graph serves every analysis.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Sequence

from ...passes.ir import Graph
from .options import LoadOptions
from .resolve import TIMM_PREFIX, ZOO_PREFIX

KEPT = 8   # graphs: a 405B stage program is tens of MB of nodes; a small model's, kilobytes

_graphs: OrderedDict[tuple[str, str], Graph] = OrderedDict()


def cached_graph(model, load: LoadOptions, example_inputs: Sequence[Any] | None,
                 trace: Callable[[], Graph]) -> Graph:
    """``trace()``'s graph, or the one kept from an earlier load of ``model`` under ``load``."""
    if example_inputs is not None or type(model) is not str or \
            not model.startswith((ZOO_PREFIX, TIMM_PREFIX)):
        return trace()
    key = (model, repr(load))
    graph = _graphs.get(key)
    if graph is None:
        graph = trace()
        _graphs[key] = graph
        while len(_graphs) > KEPT:
            _graphs.popitem(last=False)
    _graphs.move_to_end(key)
    return graph


def forget() -> None:
    """Every kept graph dropped (a test that patches how models are traced calls it)."""
    _graphs.clear()
