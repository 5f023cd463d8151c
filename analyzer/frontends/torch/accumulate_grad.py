"""AccumulateGrad's copy: the gradient a parameter's ``.grad`` receives is the backward's own
tensor only when its strides are the parameter's (PyTorch's "gradient layout contract",
torch/csrc/autograd/utils/grad_layout_contract.h ``obeys_layout_contract``); otherwise
AccumulateGrad copies it into a tensor laid out as the parameter (``clone_obey_contract``) as
soon as the backward makes it, the backward's tensor freed after. A position table read
through a permute (RADIO's, resized to the patch grid) gets its gradient as a transposed
view: eager holds it and its copy at once, 16 MB each there.

AOTAutograd returns the backward's tensor as the gradient; the joint graph gets the copy as a
node of its own, right after the gradient is made, as eager runs it."""
from __future__ import annotations

from typing import Any

import torch


def _obeys(grad: torch.Tensor, param: torch.Tensor) -> bool:
    """``obeys_layout_contract``: a dense parameter's strides on the gradient's dimensions
    larger than one (a zero stride of a size-one dimension breaks it too); otherwise a
    contiguous gradient."""
    if not _dense(param):
        return grad.is_contiguous()
    for size, stride, want in zip(grad.shape, grad.stride(), param.stride()):
        if (size != 1 and stride != want) or (size == 1 and stride == 0):
            return False
    return True


def _dense(t: torch.Tensor) -> bool:
    """``is_non_overlapping_and_dense``: some order of its dimensions is contiguous."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def obey_layout_contract(gm: "torch.fx.GraphModule", sig: Any) -> None:
    """Each gradient output of ``gm`` (AOTAutograd's joint graph, signature ``sig``) that
    breaks the layout contract with its parameter replaced by the copy AccumulateGrad makes
    of it (``aten.clone`` into the parameter's layout), in place; ``sig``'s gradient names
    follow. A gradient that obeys it (nearly all) is left as it is."""
    graph = gm.graph
    params = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    grads = sig.backward_signature.gradients_to_parameters
    param_of = {fqn: ph for ph, fqn in sig.inputs_to_parameters.items()}
    out = next(n for n in graph.nodes if n.op == "output")
    renamed: dict[str, str] = {}
    for node in out.all_input_nodes:
        fqn = grads.get(node.name)
        param = params.get(param_of.get(fqn, ""))
        grad_val, param_val = node.meta.get("val"), param and param.meta.get("val")
        if not isinstance(grad_val, torch.Tensor) or not isinstance(param_val, torch.Tensor) \
                or _obeys(grad_val, param_val):
            continue
        with graph.inserting_after(node):
            copy = graph.call_function(torch.ops.aten.clone.default, (node,))
        copy.meta["val"] = grad_val.new_empty_strided(
            param_val.shape, param_val.stride() if _dense(param_val) else
            torch.empty(param_val.shape, device="meta").stride())
        out.replace_input_with(node, copy)
        renamed[node.name] = copy.name
    for old, new in renamed.items():
        grads[new] = grads.pop(old)
    if renamed:
        gm.recompile()
