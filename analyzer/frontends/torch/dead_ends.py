"""Computations whose result no output reads, kept through the decompositions.

Eager PyTorch runs every op the forward calls and frees a result when Python lets go of it:
a recurrent state updated after the last chunk with no cache to write it to (the gated delta
rule's), a backbone layer no head reads (RF-DETR's DINOv2), a projection a model computes and
does not return (FLAVA's). ``torch.export`` keeps such a call in the program it traces, a
node nothing uses — a dead end — but its decompositions run AOTAutograd, which eliminates
dead code. graphcost costs the forward as eager runs it, so while the program is decomposed
its dead ends are outputs too (the last ones), and the lowering drops them again
(``own_outputs``): the ops stay, their results read by nothing, held as long as the model's
Python held them (fx_references.py).

A dead end is a call of an operator that returns one new tensor: a view of a dead tensor
costs nothing and is left out, and an in-place call is kept by the trace anyway.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch

if TYPE_CHECKING:
    from torch.export import ExportedProgram


def dead_end(node: "torch.fx.Node") -> bool:
    schema = getattr(node.target, "_schema", None)
    if node.op != "call_function" or node.users or schema is None or schema.is_mutable:
        return False
    returns = schema.returns
    return len(returns) == 1 and returns[0].alias_info is None \
        and isinstance(node.meta.get("val"), torch.Tensor)


def _out_spec_with(spec, extra: int):
    """The call's output spec with ``extra`` leaves after the model's outputs as it returns
    them; None for an output class that cannot be rebuilt from placeholder leaves."""
    import torch.utils._pytree as pytree
    try:
        shaped = pytree.tree_unflatten([0] * spec.num_leaves, spec)
        return pytree.tree_structure((shaped, *[0] * extra))
    except Exception:
        return None


def _user_outputs(ep: "ExportedProgram") -> int:
    return sum(1 for s in ep.graph_signature.output_specs if s.kind.name == "USER_OUTPUT")


@contextmanager
def dead_ends_as_outputs(ep: "ExportedProgram") -> Iterator[None]:
    """``ep`` with its dead ends appended to its outputs (graph, signature, call spec)
    meanwhile; put back as it was after."""
    from torch.export.graph_signature import OutputKind, OutputSpec, TensorArgument

    graph = ep.graph
    dead = [n for n in graph.nodes if dead_end(n)]
    root = next((e.signature for e in ep.module_call_graph if e.fqn == ""), None)
    spec = _out_spec_with(root.out_spec, len(dead)) if dead and root is not None else None
    if spec is None or root is None:
        yield  # nothing to keep, or no way to: costed as the decompositions leave it
        return
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    args, specs, call = out.args, list(ep.graph_signature.output_specs), \
        (root.out_spec, list(root.outputs))
    out.args = ((*out.args[0], *dead),)
    ep.graph_signature.output_specs.extend(
        OutputSpec(kind=OutputKind.USER_OUTPUT, arg=TensorArgument(name=n.name), target=None)
        for n in dead)
    root.out_spec = spec
    root.outputs.extend(TensorArgument(name=n.name) for n in dead)
    ep.graph_module.recompile()
    try:
        yield
    finally:
        out.args = args
        ep.graph_signature.output_specs[:] = specs
        root.out_spec, root.outputs[:] = call[0], call[1]
        ep.graph_module.recompile()


def own_outputs(decomposed: "ExportedProgram", exported: "ExportedProgram") -> list[str]:
    """The decomposed program's outputs that are the model's, in their order: its first user
    outputs, as many as ``exported`` (the program it was decomposed from) has; the rest are
    dead ends."""
    user = [getattr(s.arg, "name", "") for s in decomposed.graph_signature.output_specs
            if s.kind.name == "USER_OUTPUT"]
    return user[:_user_outputs(exported)]
