"""How the autograd engine gathers gradients, as eager runs it.

AccumulateGrad's copy: the gradient a parameter's ``.grad`` receives is the backward's own
tensor only when its strides are the parameter's (PyTorch's "gradient layout contract",
torch/csrc/autograd/utils/grad_layout_contract.h ``obeys_layout_contract``); otherwise
AccumulateGrad copies it into a tensor laid out as the parameter (``clone_obey_contract``) as
soon as the backward makes it, the backward's tensor freed after. A position table read
through a permute (RADIO's, resized to the patch grid) gets its gradient as a transposed
view: eager holds it and its copy at once, 16 MB each there. AOTAutograd returns the
backward's tensor as the gradient; the joint graph gets the copy as a node of its own, right
after the gradient is made (``obey_layout_contract``).

The engine's sums of a tensor's several gradients, in place (``summed_in_place``), and the
copies its formulas write into a tensor they made (``copied_in_place``)."""
from __future__ import annotations

from typing import Any

import torch

from .compat import non_overlapping_and_dense


def _obeys(grad: torch.Tensor, param: torch.Tensor) -> bool:
    """``obeys_layout_contract``: a dense parameter's strides on the gradient's dimensions
    larger than one (a zero stride of a size-one dimension breaks it too); otherwise a
    contiguous gradient."""
    if not non_overlapping_and_dense(param):
        return grad.is_contiguous()
    for size, stride, want in zip(grad.shape, grad.stride(), param.stride()):
        if (size != 1 and stride != want) or (size == 1 and stride == 0):
            return False
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
        copy.meta["val"] = grad_val.new_empty_strided(param_val.shape, param_val.stride()) \
            if non_overlapping_and_dense(param_val) else grad_val.new_empty(param_val.shape)
        out.replace_input_with(node, copy)
        renamed[node.name] = copy.name
    for old, new in renamed.items():
        grads[new] = grads.pop(old)
    if renamed:
        gm.recompile()


def summed_in_place(graph: "torch.fx.Graph") -> dict[str, str]:
    """The autograd engine's sums of a tensor's gradients that eager writes in place: each
    such ``add`` -> the gradient it adds into. A tensor read by several ops gets a gradient
    from each op's backward; the engine's InputBuffer adds each one as it comes onto the
    first, in place when it holds the last reference to a dense, unshared tensor
    (torch/csrc/autograd/input_buffer.cpp ``can_accumulate_inplace``). In the joint graph such
    a sum is an ``add`` of two gradients that two other autograd nodes made (their
    ``autograd_node`` marks, aot_joint.py, differ from each other and from
    the add's), or of such a sum and a third; the first read by that add alone and no view.
    Summed out of place, a RepVGG-style block's input (TextNet's: four branches) got an
    extra input-sized tensor for each sum."""
    from .fx_references import is_view

    made_by = {n: n.meta.get("autograd_node") for n in graph.nodes}
    found: dict[str, str] = {}
    for node in graph.nodes:
        if node.target is not torch.ops.aten.add.Tensor or len(node.all_input_nodes) != 2:
            continue
        first, second = node.args[0], node.args[1]
        if not isinstance(first, torch.fx.Node) or not isinstance(second, torch.fx.Node):
            continue
        # (a third gradient is added onto the sum of the first two: that sum is the buffer)
        marks = {"sum" if first.name in found else made_by[first], made_by[second]}
        if None in marks or len(marks) != 2 or made_by[node] in marks \
                or len(first.users) != 1 or first.op != "call_function" or is_view(first):
            continue
        val = first.meta.get("val")
        if isinstance(val, torch.Tensor) and non_overlapping_and_dense(val) \
                and val.shape == node.meta["val"].shape:
            found[node.name] = first.name
    return found


def copied_in_place(graph: "torch.fx.Graph") -> dict[str, str]:
    """The copies a backward formula writes in place: each ``copy`` an autograd node's formula
    made (its ``autograd_node`` mark) -> the tensor it writes into. Functionalization turns
    a formula's ``dst.copy_(src)`` into a ``copy`` that returns a new tensor; eager writes
    ``dst``'s storage. CopySlices, the backward of an in-place write into a view (``h[mask]
    = v``, ``x[:, 0] += y``), makes ``result`` with ``new_empty_strided``, copies the incoming
    gradient into it and the view's gradient back into a slice of it
    (torch/csrc/autograd/functions/tensor.cpp). Counted as new tensors, each copy added a
    tensor of the written one's size to the backward's peak."""
    return {n.name: n.args[0].name for n in graph.nodes
            if n.target is torch.ops.aten.copy.default and "autograd_node" in n.meta
            and isinstance(n.args[0], torch.fx.Node)}
