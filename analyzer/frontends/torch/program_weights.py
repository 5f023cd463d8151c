"""The exported program's module as AOTAutograd traces it (exported_run.ExportedRun): each
weight its graph reads under one name, none it does not read, and no fake constant.

A weight tied under two names (GPT-2's ``lm_head`` and token embedding) is one graph input
read by one of them; the other name is dropped so AOTAutograd, which lists parameters with
duplicates, does not find one that receives no gradient. A constant the export could not
trace is made a tensor of its shape (lifted_constants.py). A model built on the meta device
(a config's) makes its own tensors there too: LongT5 asks for the CPU where its weights are on
meta (``compute_bias``: "target_device … if … != 'meta' else None"), and its embedding's
backward then meets a meta gradient beside CPU indices; on a GPU both sit on the GPU."""
from __future__ import annotations

import torch

from .lifted_constants import attribute, real_constants, replace_attribute


def traceable_module(program: "torch.export.ExportedProgram") -> torch.fx.GraphModule:
    """``program.module()`` with its unread weights and their duplicate names gone and its
    fake constants made real."""
    gm = program.module()
    real_constants(gm)
    _made_on_meta(gm)
    for node in [n for n in gm.graph.nodes if n.op == "get_attr" and not n.users]:
        gm.graph.erase_node(node)  # unread weights (the tied duplicates)
    read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for fqn, tensor in list(gm.named_parameters(remove_duplicate=False)):
        if fqn not in read and any(t is tensor for other, t in
                                   gm.named_parameters(remove_duplicate=False)
                                   if other in read):
            owner, _, attr = fqn.rpartition(".")
            delattr(gm.get_submodule(owner), attr)
    gm.recompile()
    return gm


def _made_on_meta(gm: torch.fx.GraphModule) -> None:
    """Where every weight of ``gm`` is on the meta device, each tensor its graph makes on the
    CPU (a ``device`` argument) is made on meta, and each CPU constant it reads (DeBERTa's
    ``torch.tensor(head_dim, dtype=torch.float)`` scale, lifted by the export) is moved there:
    the fake step refused a CPU constant beside meta ones ("Tensor device mismatch")."""
    weights = list(gm.parameters())
    if not weights or not all(w.is_meta for w in weights):
        return
    cpu, meta = torch.device("cpu"), torch.device("meta")
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.kwargs.get("device") == cpu:
            node.kwargs = {**node.kwargs, "device": meta}
        value = attribute(gm, str(node.target)) if node.op == "get_attr" else None
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) \
                and value.device == cpu:
            replace_attribute(gm, str(node.target), value.to(meta))
