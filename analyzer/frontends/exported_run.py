"""An exported program's graph as a module AOTAutograd traces forward and backward through
(torch_capture.export_joint): the joint graph comes from what ``torch.export`` traced, not
from the eager module, and keeps each forward node's module path."""
from __future__ import annotations

import re

import torch


class ExportedRun(torch.nn.Module):
    """The exported program's graph as a module AOTAutograd can trace: the parameters are
    the program's (``self.gm``, named as in the user's model under ``model.``), the forward
    interprets the graph node by node, and every joint-graph node that a forward node
    creates is given that node's module path (from the export's ``nn_module_stack``: the
    tracer of the joint graph records no module of its own, the graph calls none).

    A weight tied under two names (GPT-2's ``lm_head`` and token embedding) is one graph
    input read by one of them; the other name is dropped so AOTAutograd, which lists
    parameters with duplicates, does not find one that receives no gradient."""

    def __init__(self, program: "torch.export.ExportedProgram", scopes: dict[str, str]):
        super().__init__()
        gm = program.module()
        gm.graph.eliminate_dead_code()  # unread get_attr nodes (the tied duplicates)
        read = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
        for fqn, tensor in list(gm.named_parameters(remove_duplicate=False)):
            if fqn not in read and any(t is tensor for other, t in
                                       gm.named_parameters(remove_duplicate=False)
                                       if other in read):
                owner, _, attr = fqn.rpartition(".")
                delattr(gm.get_submodule(owner), attr)
        gm.recompile()
        self.gm = gm
        self._scopes = scopes

    def flat_inputs(self, args: tuple, kwargs: dict | None) -> tuple:
        """The tensors among the graph's inputs (AOTAutograd traces tensors only); the other
        inputs (``use_cache=False``) are kept and put back in their places by forward."""
        self._leaves = torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs or {})))
        return tuple(x for x in self._leaves if isinstance(x, torch.Tensor))

    def forward(self, *tensors):
        it = iter(tensors)
        flat = [next(it) if isinstance(x, torch.Tensor) else x for x in self._leaves]
        return tuple(_ScopedInterpreter(self.gm, self._scopes).run(*flat))


class _ScopedInterpreter(torch.fx.Interpreter):
    """Runs the exported graph under the joint tracer, bracketing each forward node's run by
    the tracer graph's last node so the nodes created in between get its module path.

    A dropout that drops nothing (p = 0) is its input, as ATen's dropout returns it in
    eager; torch's Python kernel for it (the one tracing reaches) would copy the tensor."""

    def __init__(self, gm, scopes: dict[str, str]):
        super().__init__(gm)
        self._scopes = scopes

    def call_function(self, target, args, kwargs):
        if target is torch.ops.aten.dropout.default:
            p, train = (list(args[1:]) + [kwargs.get("p"), kwargs.get("train")])[:2]
            if not train or p == 0:
                return args[0]
        return super().call_function(target, args, kwargs)

    def run_node(self, n):
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        mode = get_proxy_mode()
        stack = n.meta.get("nn_module_stack") or {}
        if mode is None or not stack or n.op != "call_function":
            return super().run_node(n)
        graph = mode.tracer.graph
        stop = next(iter(reversed(graph.nodes)), None)
        out = super().run_node(n)
        path = _module_path(next(reversed(stack.values()))[0])
        for node in reversed(graph.nodes):
            if node is stop:
                break
            self._scopes.setdefault(node.name, path)
        return out


def _module_path(export_path: str) -> str:
    """An export module path ("model.layers.0.mlp", "model.block@1") as the user's
    model names it: the ``_SumLoss`` wrapper's ``model.`` and call counts removed."""
    path = re.sub(r"@\d+", "", export_path)
    return path.removeprefix("model.") if path != "model" else ""
