"""What an exported program's graph holds beyond the computation, as the joint trace reads it
(analyzer/frontends/torch/exported_run.py): the nodes that only check a value, and the
outputs that a cast the fp32 export saw as none stands for.
"""
from __future__ import annotations

import torch

_CASTS = (torch.ops.aten.to.dtype, torch.ops.aten._to_copy.default)


def uncast_outputs(output: "torch.fx.Node") -> dict:
    """Each output that is a cast the fp32 export saw as no cast -> the tensor it casts.
    ``logits.float()`` on fp32 logits returns ``logits`` itself, so the export records the
    model's returned logits as the cast's result; under autocast the logits are half and the
    cast a copy, which only the loss reads (transformers' ForCausalLMLoss), while the model
    returns, and the loop holds, the half logits."""
    out = {}
    for a in output.all_input_nodes:
        if a.op == "call_function" and a.target in _CASTS and isinstance(a.args[0], torch.fx.Node):
            before, after = a.args[0].meta.get("val"), a.meta.get("val")
            if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor) \
                    and before.dtype == after.dtype:
                out[a] = a.args[0]
    return out


def checks_only(graph: "torch.fx.Graph") -> set[str]:
    """The nodes that compute nothing but a runtime check: ``_assert_scalar``, and the
    numbers only such checks read (XLM's and Flaubert's ``assert lengths.max().item() <=
    slen``: the ``.item()`` and the comparison). The joint trace runs on fake tensors, whose
    values are unknown, so it skips them; the tensors they read are still computed."""
    only = {n for n in graph.nodes if n.op == "call_function"
            and n.target is torch.ops.aten._assert_scalar.default}
    for n in reversed(graph.nodes):
        if n.op == "call_function" and n.users and all(u in only for u in n.users) \
                and not isinstance(n.meta.get("val"), torch.Tensor):
            only.add(n)
    return {n.name for n in only}
