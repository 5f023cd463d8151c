"""Which parameters a training step's gradient reaches, read off the exported forward.

Eager autograd leaves ``.grad`` None on a parameter no gradient reaches — an unused head, a
layer only a dead end reads (dead_ends.py), a table read under ``torch.no_grad()``
(LayoutLMv3's relative positions), a projection that only shapes a ``zeros_like`` (MRA's
attention on CPU), an indexer whose top-k indices are all that is used (HY-V4) — and an
optimizer keeps no state for it. AOTAutograd refuses such a parameter ("did not receive a
gradient"), so the joint trace is retried with these traced as frozen (exported_run.py).

A result requires grad when grad mode is on where it is computed, it is floating, and one of
its inputs requires grad, unless the op cuts the gradient (a detach, a new tensor shaped like
its input). An in-place write of a result that requires grad makes the tensor written to (the
root of the views it goes through) require grad from there on: the gated delta rule fills a
``zeros_like`` chunk by chunk. A parameter is reached when a path of such results leads from
it to the loss (the program's first output), a written tensor leading back to what was
written into it.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves


def unreached_parameters(gm: "torch.fx.GraphModule") -> list:
    """The parameters of ``gm`` from which no gradient reaches its outputs."""
    named = dict(gm.named_parameters(remove_duplicate=False))
    root: dict = {}     # node -> the node whose storage it views (itself if none)
    needs: set = set()  # nodes (and written roots) whose value requires grad
    writes: dict = {}   # written root -> the in-place nodes that wrote into it
    enabled = True      # grad mode, as the forward set it
    for node in gm.graph.nodes:
        root[node] = _viewed(node, root)
        if node.op == "get_attr" and getattr(named.get(node.target), "requires_grad", False):
            needs.add(node)
        elif node.op == "call_function" and node.target is torch._C._set_grad_enabled:
            enabled = bool(node.args[0])
        elif node.op == "call_function" and enabled and not _cuts_grad(node) \
                and _floating(node.meta.get("val")) \
                and any(a in needs or root[a] in needs for a in node.all_input_nodes):
            needs.add(node)
            for written in _written(node):
                needs.add(root[written])
                writes.setdefault(root[written], []).append(node)
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    # (from the loss alone, the program's first output: what it returns beside it, the
    # training loop holds — a model's own outputs beside its own loss, LLaVA's — and no
    # gradient flows from them)
    loss = next(n for n in tree_leaves(out.args) if isinstance(n, torch.fx.Node))
    seen, todo = set(), [loss]
    while todo:
        node = todo.pop()
        if node in seen or not (node in needs or root[node] in needs):
            continue
        seen.add(node)
        todo.extend(node.all_input_nodes)
        todo.extend(writes.get(root[node], ()))
    reached = {id(named[n.target]) for n in seen if n.op == "get_attr" and n.target in named}
    return [p for p in gm.parameters() if id(p) not in reached]


def _schema(node: "torch.fx.Node"):
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


def _viewed(node: "torch.fx.Node", root: dict):
    """The node whose storage ``node`` shares: through a view op's (or an in-place op's)
    first argument; a detach is a root of its own (no gradient flows through it)."""
    schema = _schema(node)
    viewing = schema is not None and bool(schema.returns) \
        and schema.returns[0].alias_info is not None
    if not viewing or _cuts_grad(node) or not node.args \
            or not isinstance(node.args[0], torch.fx.Node):
        return node
    return root.get(node.args[0], node.args[0])


def _written(node: "torch.fx.Node") -> list:
    """The arguments an in-place op writes into (``copy_``'s destination)."""
    schema = _schema(node)
    if schema is None or not schema.is_mutable:
        return []
    return [a for a, arg in zip(node.args, schema.arguments)
            if isinstance(a, torch.fx.Node) and arg.alias_info is not None
            and arg.alias_info.is_write]


def _cuts_grad(node: "torch.fx.Node") -> bool:
    """A detach, a new tensor shaped like its input (``zeros_like``, ``new_ones``: no
    gradient flows to the input), or a region traced with grad disabled (``torch.no_grad()``
    in the forward: ``wrap_with_set_grad_enabled(False, ...)``)."""
    name = getattr(_schema(node), "name", "")
    if name == "aten::detach" or name.endswith("_like") or name.startswith("aten::new_"):
        return True
    return "wrap_with_set_grad_enabled" in str(node.target) and node.args[:1] == (False,)


def _floating(val) -> bool:
    if isinstance(val, (tuple, list)):
        return any(_floating(v) for v in val)
    return isinstance(val, torch.Tensor) and (val.is_floating_point() or val.is_complex())
