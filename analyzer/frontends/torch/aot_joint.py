"""AOTAutograd's joint graph of a module whose first output is its loss, as
``aot_export_module(trace_joint=True, output_loss_index=0)`` returns it — without the retrace
that function ends with.

``aot_export_module`` traces the joint graph once (``_aot_export_function``: the metadata run,
then forward and backward under functionalization), then traces that graph again with
``make_fx`` to drop its unused tangent input and its pytree calling convention and to keep
only the gradients of inputs that require one. The retrace is a full fake-tensor run of every
node: measured on a small Llama's training step (torch 2.13), 1.2 s of the 4.3 s trace; over
the test suite, 18% of its time. Here the first graph is rewritten in place instead — its
tangent placeholders (unused: the loss's gradient is a constant 1) removed, its outputs the
forward's followed by the gradients of the inputs that require one, a flat calling convention —
and ``create_graph_signature`` describes it as it describes the retraced graph. The nodes are
the first trace's, so each backward node still carries the sequence number of the autograd
node whose formula made it (``meta["seq_nr"]``), which the retrace lost; it is copied to
``meta["autograd_node"]`` (passes/memory/liveness.py runs such a formula's nodes as one call).

Reached through AOTAutograd's private ``_aot_export_function``, ``create_functional_call``
and ``create_graph_signature`` (the same from torch 2.8 to 2.14).
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
from torch.fx.graph import CodeGen
from torch.fx.node import map_arg
from torch.utils import _pytree as pytree


def aot_joint(module: torch.nn.Module, args: tuple, decompositions) -> tuple:
    """(graph module, GraphSignature) of ``module``'s joint forward and backward on ``args``
    (fake or meta tensors), its first output the loss, traced with ``decompositions``."""
    import torch._functorch.aot_autograd as aot_autograd
    aot: Any = aot_autograd   # (its private functions, which its stubs do not export)

    params = dict(module.named_parameters(remove_duplicate=False))
    buffers = dict(module.named_buffers(remove_duplicate=False))
    flat, spec = pytree.tree_flatten({**params, **buffers})
    call = aot.create_functional_call(module, spec, len(flat), store_orig_mod=True)
    outputs: list[int] = []

    def forward(*inputs):
        out = call(*inputs)
        out = (out,) if isinstance(out, torch.Tensor) else out
        outputs.append(len(out))
        return out
    full = (*flat, *args)
    # (torch 2.8's has no ``trace_joint``: inputs that require a gradient make it a joint)
    joint = {"trace_joint": True} if "trace_joint" in \
        inspect.signature(aot._aot_export_function).parameters else {}
    gm, metadata, in_spec, out_spec = aot._aot_export_function(
        forward, full, decompositions=decompositions, num_params_buffers=len(flat),
        no_tangents=True, **joint)
    _flattened(gm, full)
    _eager_view_strides(gm)
    return gm, aot.create_graph_signature(
        gm, metadata, in_spec, out_spec, user_args_flat=pytree.arg_tree_leaves(*args),
        params_and_buffers_flat=list(flat), param_names=list(params),
        buffer_names=list(buffers), trace_joint=True, num_user_fw_outs=outputs[-1],
        loss_index=0)


def _flattened(gm: torch.fx.GraphModule, inputs: tuple) -> None:
    """The joint graph ``gm`` (``(primals, tangents) -> (forward outputs, a gradient or None
    per input)``) rewritten in place as aot_export_module's retrace returns it: ``(*primals)
    -> (*forward outputs, *the gradients of the inputs that require one)``; its backward nodes
    marked with their autograd node."""
    graph = gm.graph
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    spec = graph._codegen.pytree_info.out_spec  # pyright: ignore[reportAttributeAccessIssue]
    forward, grads = pytree.tree_unflatten(list(out.args[0]), spec)   # (their (forward, grads))
    kept = []
    for value, grad in zip(inputs, grads, strict=True):
        if isinstance(value, torch.Tensor) and value.requires_grad:
            if grad is None:   # (aot_export_module's words: capture.py reads them)
                raise AssertionError("Found a parameter that did not receive a gradient.")
            kept.append(grad)
    out.args = ((*forward, *kept),)
    for node in [n for n in graph.nodes if n.op == "placeholder"][len(inputs):]:
        if node.users:
            raise AssertionError(f"the joint graph reads its tangent {node.name}")
        graph.erase_node(node)
    for node in graph.nodes:
        if node.meta.get("partitioner_tag") == "is_backward" and "seq_nr" in node.meta:
            node.meta["autograd_node"] = node.meta["seq_nr"]
    graph._codegen = CodeGen()
    gm.recompile()


VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def _eager_view_strides(gm: torch.fx.GraphModule) -> None:
    """The values (``meta["val"]``) of ``gm``'s views strided as eager strides them, and of
    every node downstream of one that changed, run again on fake tensors. The retrace ran
    every node so, under compat.eager_view_strides; the first trace's functionalization
    strides a view through torch's reference helper, otherwise than eager where a dimension
    has size one — and a kernel reads the strides: an upsample's backward guessed a
    channels-last layout, and AccumulateGrad's copy of a resized position table's gradient
    went missing (tests/test_accumulate_grad.py). A node that cannot run again keeps its
    value. (The first trace's views hit the fake mode's dispatch cache, filled by torch's
    own view kernel: run again without it.)"""
    from torch._guards import detect_fake_mode

    changed: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        old = node.meta.get("val")
        if node.op != "call_function" or not isinstance(old, torch.Tensor) or not (
                node.target in VIEWS or any(a in changed for a in node.all_input_nodes)):
            continue
        try:
            args, kwargs = map_arg((node.args, node.kwargs), lambda a: a.meta.get("val"))
            with _uncached(detect_fake_mode((old,))):
                new = node.target(*args, **kwargs)
        except Exception:   # (an unbacked size, an op fake tensors do not run: as traced)
            continue
        if isinstance(new, torch.Tensor) and new.stride() != old.stride():
            node.meta["val"] = new
            changed.add(node)


@contextlib.contextmanager
def _uncached(mode):
    """``mode`` (a FakeTensorMode, or None: nothing) entered with its dispatch cache off."""
    if mode is None:
        yield
        return
    cached = getattr(mode, "cache_enabled", False)
    mode.cache_enabled = False
    try:
        with mode:
            yield
    finally:
        mode.cache_enabled = cached
