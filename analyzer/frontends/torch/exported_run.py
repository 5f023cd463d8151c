"""An exported program's graph as a module AOTAutograd traces forward and backward through
(torch_capture.export_joint): the joint graph comes from what ``torch.export`` traced, not
from the eager module, and keeps each forward node's module path."""
from __future__ import annotations

import re
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.utils._pytree  # (torch.utils does not import it for the type checker)

from ....passes.attention_dispatch import AttentionTarget
from ....passes.precision import AutocastSpec
from .attention_kernels import call_kernel, is_sdpa
from .autocast_casts import Autocaster
from .dead_ends import dead_end


class ExportedRun(torch.nn.Module):
    """The exported program's graph as a module AOTAutograd can trace: the parameters are
    the program's (``self.gm``, named as in the user's model under ``model.``), the forward
    interprets the graph node by node, and every joint-graph node that a forward node
    creates is given that node's module path (from the export's ``nn_module_stack``: the
    tracer of the joint graph records no module of its own, the graph calls none).

    A weight tied under two names (GPT-2's ``lm_head`` and token embedding) is one graph
    input read by one of them; the other name is dropped so AOTAutograd, which lists
    parameters with duplicates, does not find one that receives no gradient.

    The forward returns the loss, then each dead end's result detached (dead_ends.py):
    AOTAutograd eliminates dead code, and eager computes them; detached, they take no part
    in the backward (lower_joint drops them again)."""

    def __init__(self, program: "torch.export.ExportedProgram",
                 attention: AttentionTarget | None = None, autocast: AutocastSpec | None = None):
        super().__init__()
        self.attention = attention  # None: SDPA dispatches by itself
        self.autocast = autocast    # None: no autocast region
        self.kernels: list[tuple[str, str, str]] = []  # (module path, kernel, why), in order
        gm = program.module()
        self._dead = {n.name for n in gm.graph.nodes if dead_end(n)}
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
        self.gm = gm
        self._paths: dict = {}    # tracer node -> module path, of the latest trace
        self._graph = None        # that trace's graph

    @contextmanager
    def unreached_frozen(self) -> Iterator[None]:
        """Meanwhile, each parameter no gradient reaches (grad_reach.py) does not require
        grad: eager leaves its ``.grad`` None, so an optimizer keeps no state for it, where
        AOTAutograd refuses a parameter that requires a gradient and gets none."""
        from .grad_reach import unreached_parameters

        frozen = [p for p in unreached_parameters(self.gm) if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in frozen:
                p.requires_grad_(True)

    def flat_inputs(self, args: tuple, kwargs: dict | None) -> tuple:
        """The tensors among the graph's inputs (AOTAutograd traces tensors only); the other
        inputs (``use_cache=False``) are kept and put back in their places by forward."""
        self._leaves = torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs or {})))
        return tuple(x for x in self._leaves if isinstance(x, torch.Tensor))

    def forward(self, *tensors):
        it = iter(tensors)
        flat = [next(it) if isinstance(x, torch.Tensor) else x for x in self._leaves]
        self._paths = {}
        self.kernels = []
        caster = Autocaster(self.autocast) if self.autocast is not None else None
        run = _ScopedInterpreter(self.gm, self._paths, self.attention, self.kernels, caster,
                                 self._dead)
        out = tuple(run.run(*flat))
        self._graph = run.traced
        return (*out, *(t.detach() for t in run.dead_values))

    def scopes(self, joint: "torch.fx.Graph") -> dict[str, str]:
        """Each node of the finished joint graph that a forward node created, by name, with
        that node's module path. Matched by what a node computes (its op and the nodes it
        reads, recursively), not by name: AOTAutograd adds nodes after the trace and the
        names shift (torch 2.14 inserts an ``alias`` per saved tensor where 2.13 wrote a
        ``detach``, and the traced ``alias_1`` becomes ``alias_2``). An added alias of a
        tensor computes what the traced one does and takes its path."""
        if self._graph is None:
            return {}
        interned: dict = {}  # one numbering for both graphs
        traced = _structural_keys(self._graph, interned)
        by_key: dict[int, list[str]] = {}  # equal nodes (a constant in every block): in order
        for n, k in traced.items():
            if n in self._paths:
                by_key.setdefault(k, []).append(self._paths[n])
        out, seen = {}, Counter()
        for n, k in _structural_keys(joint, interned).items():
            if k in by_key:
                paths = by_key[k]
                out[n.name] = paths[min(seen[k], len(paths) - 1)]
                seen[k] += 1
        return out


class _ScopedInterpreter(torch.fx.Interpreter):
    """Runs the exported graph under the joint tracer, bracketing each forward node's run by
    the tracer graph's last node so the nodes created in between get its module path.

    A dropout that drops nothing (p = 0) is its input, as ATen's dropout returns it in
    eager; torch's Python kernel for it (the one tracing reaches) would copy the tensor. With
    an attention target, each ``scaled_dot_product_attention`` runs as the kernel chosen for
    it (attention_kernels.py), recorded with the module path of the node being run; with an
    autocast spec, each op's inputs are first cast as autocast casts them (autocast_casts.py)."""

    def __init__(self, gm, paths: dict, attention: AttentionTarget | None = None,
                 kernels: list | None = None, caster: Autocaster | None = None,
                 dead: frozenset[str] | set[str] = frozenset()):
        super().__init__(gm)
        self._dead, self.dead_values = dead, []  # the dead ends' names, their results
        self._caster = caster
        self._paths = paths
        self.traced = None  # the tracer graph the nodes were created in
        self._attention, self._kernels = attention, kernels if kernels is not None else []
        self._path = ""     # the module path of the node being run

    def call_function(self, target, args, kwargs):
        if target is torch.ops.aten.dropout.default:
            p, train = (list(args[1:]) + [kwargs.get("p"), kwargs.get("train")])[:2]
            if not train or p == 0:
                return args[0]
        if self._caster is not None:
            args, kwargs = self._caster.cast(target, args, kwargs)
        if self._attention is not None and is_sdpa(target):
            out, kernel, why = call_kernel(self._attention, args, kwargs)
            self._kernels.append((self._path, kernel, why))
            return out
        return super().call_function(target, args, kwargs)

    def get_attr(self, target, args, kwargs):
        value = super().get_attr(target, args, kwargs)
        if self._caster is not None and isinstance(value, torch.Tensor):
            self._caster.weights.add(id(value))  # a weight: its half copy is cached
        return value

    def run_node(self, n):
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        mode = get_proxy_mode()
        stack = n.meta.get("nn_module_stack") or {}
        self._path = _module_path(next(reversed(stack.values()))[0]) if stack else ""
        if n.name in self._dead:
            self.dead_values.append(out := self._run_scoped(n, mode, stack))
            return out
        return self._run_scoped(n, mode, stack)

    def _run_scoped(self, n, mode, stack):
        if mode is None or not stack or n.op != "call_function":
            return super().run_node(n)
        graph = self.traced = mode.tracer.graph
        stop = next(iter(reversed(graph.nodes)), None)
        out = super().run_node(n)
        path = _module_path(next(reversed(stack.values()))[0])
        for node in reversed(graph.nodes):
            if node is stop:
                break
            self._paths.setdefault(node, path)
        return out


def _structural_keys(graph: "torch.fx.Graph", interned: dict) -> dict:
    """node -> a small int (numbered in ``interned``) that two nodes share exactly when they
    compute the same thing: the same op on the same arguments (nodes by their own keys,
    placeholders by position)."""
    keys: dict = {}
    placeholders = 0
    for n in graph.nodes:
        if n.op == "placeholder":
            shape = ("placeholder", placeholders)
            placeholders += 1
        else:
            args = torch.fx.map_arg((n.args, n.kwargs), lambda a: _Ref(keys[a]))
            shape = (n.op, str(n.target), repr(args))
        keys[n] = interned.setdefault(shape, len(interned))
    return keys


class _Ref(int):
    """A node's key inside another node's arguments (repr'd apart from a plain int)."""

    def __repr__(self) -> str:
        return f"%{int(self)}"


def _module_path(export_path: str) -> str:
    """An export module path ("model.layers.0.mlp", "model.block@1") as the user's
    model names it: the ``_SumLoss`` wrapper's ``model.`` and call counts removed."""
    path = re.sub(r"@\d+", "", export_path)
    return path.removeprefix("model.") if path != "model" else ""
