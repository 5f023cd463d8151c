"""Inputs eager's autograd saves for a backward formula that reads only their sizes, held, as
eager holds them, until that formula runs.

``torch.gather``'s formula in PyTorch's derivatives.yaml is ``gather_backward(grad, self,
dim, index, sparse_grad)``: eager's ``GatherBackward0`` saves the whole input (its
``_saved_self`` is the input's storage) and frees it only when it runs, in the backward. The
joint graph's decomposed backward, ``scatter_add(zeros of the input's shape, dim, index,
grad)``, reads no input, so its liveness freed the input after the forward. DeBERTa's
disentangled attention gathers its position scores (the c2p and p2c ``bmm`` outputs, batch ×
heads × seq × 2·span each) in every layer: its step peak, in the backward, was 8% under
MemTracker's. (``masked_select`` saves its input too, a data-dependent size no training trace
follows; the other indexing ops save sizes alone.)"""
from __future__ import annotations

import torch

aten = torch.ops.aten


def held_by_backward(joint: torch.fx.Graph) -> dict[str, str]:
    """Forward node -> the joint node up to which eager's autograd holds its tensor: for each
    gather whose input takes a gradient, its input up to the last node of its formula's
    backward (the nodes marked with that autograd node: aot_joint.py)."""
    last: dict = {}   # autograd node's mark -> the last joint node its formula made
    for node in joint.nodes:
        mark = node.meta.get("autograd_node")
        if mark is not None:
            last[mark] = node.name
    held = {}
    for node in joint.nodes:
        if node.target is not aten.gather.default or node.meta.get("autograd_node") is not None:
            continue
        source, index = node.args[0], node.args[2]
        formula = next((u for u in getattr(index, "users", ())
                        if u.target is aten.scatter_add.default
                        and u.meta.get("autograd_node") is not None), None)
        if formula is not None and isinstance(source, torch.fx.Node):
            held[source.name] = last[formula.meta["autograd_node"]]
    return held
