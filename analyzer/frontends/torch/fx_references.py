"""What the model's Python did, carried from the exported graph onto its decomposition.

torch_capture.export_module records, in the exported graph's names, how long the model's
Python held each tensor and which ops it ran in place (``relu_``). Decomposition renames and
splits those nodes; this module maps both facts onto the decomposed graph (each decomposed
node knows the exported node it came from: ``meta["from_node"]``), so the FX frontend can
hand them to the IR as ``eager_refs`` and ``eager_inplace``. Apart from the frontend because
it is one job — provenance through a decomposition — with no lowering in it.
"""
from __future__ import annotations

from typing import Mapping

import torch


def origin(node) -> str:
    """The name of the node of the exported graph that ``node`` was decomposed from."""
    name, source = node.name, node.meta.get("from_node")
    while source:
        last = source[-1]
        name, source = last.name, last.from_node
    return name


def decomposed_references(before: "torch.fx.Graph", after: "torch.fx.Graph",
                           references: Mapping[str, str]
                           ) -> tuple[dict[str, str], dict[str, str]]:
    """What the exported graph says of the model's Python, moved onto the decomposed graph:
    ``references`` (a tensor is the last node its op decomposed into; a point of the trace
    the last node decomposed from that op or, if none was — an op that lowers to nothing —
    from the nearest op before it), and the ops the model ran in place (``relu_``, ``add_``:
    the decomposition writes a new tensor) as new value -> the value written into."""
    order = {n.name: i for i, n in enumerate(before.nodes)}
    last_from: dict[int, str] = {}
    for n in after.nodes:
        k = order.get(origin(n))
        if k is not None:
            last_from[k] = n.name
    reached: dict[int, str] = {}
    current = None
    for k in range(len(order)):
        current = last_from.get(k, current)
        if current is not None:
            reached[k] = current
    held = {}
    for value, point in references.items():
        v, p = order.get(value), order.get(point)
        if v in last_from and p in reached:
            held[last_from[v]] = reached[p]
    written = {}
    for k, n in enumerate(before.nodes):
        if not writes_in_place(n) or k not in last_from:
            continue
        source = last_from.get(order[n.args[0].name])
        if source is not None and source != last_from[k]:
            written[last_from[k]] = source
    return held, written


def writes_in_place(node: "torch.fx.Node") -> bool:
    """Whether ``node`` runs an op that writes its first argument, a node (``relu_``,
    ``copy_``; not an ``out=`` variant), by the op's schema."""
    schema = getattr(node.target, "_schema", None)
    first = node.args[0] if node.op == "call_function" and node.args else None
    return schema is not None and isinstance(first, torch.fx.Node) and bool(schema.arguments) \
        and schema.arguments[0].alias_info is not None \
        and schema.arguments[0].alias_info.is_write \
        and getattr(node.target, "_overloadname", "") != "out"


def storage_root(node: "torch.fx.Node") -> "torch.fx.Node":
    """The node whose tensor ``node``'s result shares storage with: followed back through ops
    that return an alias of their first argument (views, in-place ops), by their schemas."""
    while True:
        first = node.args[0] if node.op == "call_function" and node.args else None
        if _returned_alias(node) is None or not isinstance(first, torch.fx.Node):
            return node
        node = first


def is_view(node: "torch.fx.Node") -> bool:
    """Whether ``node``'s op returns a view of its input (an alias it does not write)."""
    alias = _returned_alias(node)
    return alias is not None and not alias.is_write


def _returned_alias(node: "torch.fx.Node"):
    """The alias information of the op's first result, from its schema (None: a new tensor)."""
    schema = getattr(node.target, "_schema", None)
    return schema.returns[0].alias_info if schema is not None and schema.returns else None
