"""An exported program's graph as a module AOTAutograd traces forward and backward through
(torch_capture.export_joint): the joint graph comes from what ``torch.export`` traced, not
from the eager module, and keeps each forward node's module path."""
from __future__ import annotations

import re
from collections import Counter
from contextlib import contextmanager
from typing import Iterator, Mapping

import torch
import torch.utils._pytree  # (torch.utils does not import it for the type checker)

from ....passes.graph.attention_dispatch import AttentionTarget
from ....passes.training.precision import AutocastSpec
from .attention_kernels import call_kernel, is_sdpa
from .autocast_casts import Autocaster
from .dead_ends import dead_end
from .eager_backward import as_eager_backward
from .exported_checks import checks_only, uncast_outputs
from .float8_linears import (
    is_float8_gather,
    is_float8_matmul,
    run_float8_gather,
    run_float8_matmul,
)
from .fx_references import is_view, storage_root, writes_in_place
from .loss_kernels import as_kernels, is_loss
from .meta_gradients import as_cpu_gradient
from .program_weights import traceable_module


class ExportedRun(torch.nn.Module):
    """The exported program's graph as a module AOTAutograd can trace: the parameters are
    the program's (``self.gm``, named as in the user's model under ``model.``), the forward
    interprets the graph node by node, and every joint-graph node that a forward node
    creates is given that node's module path (from the export's ``nn_module_stack``: the
    tracer of the joint graph records no module of its own, the graph calls none).

    Its weights are the program's module's as program_weights.py prepares them (a tied one
    under one name, no fake constant).

    The forward returns the loss, then each dead end's result detached (dead_ends.py):
    AOTAutograd eliminates dead code, and eager computes them; detached, they take no part
    in the backward (lower_joint drops them again). Each is detached as soon as it is made,
    so the detach is its last read: eager frees it when the model's Python lets go of it.

    ``references`` (python_references.PythonReferences', recorded while the program was exported:
    node -> node the trace had reached when the model's Python let go of its tensor) are
    carried to the joint graph by ``python_facts``, with the ops the program runs in place."""

    def __init__(self, program: "torch.export.ExportedProgram",
                 attention: AttentionTarget | None = None, autocast: AutocastSpec | None = None,
                 references: Mapping[str, str] | None = None):
        super().__init__()
        self._references = dict(references or {})
        self.attention = attention  # None: SDPA dispatches by itself
        self.autocast = autocast    # None: no autocast region
        self.kernels: list[tuple[str, str, str]] = []  # (module path, kernel, why), in order
        gm = traceable_module(program)
        self._dead = {n.name for n in gm.graph.nodes if dead_end(n)}
        # what the program returns beside the loss (loss_kernels.split_loss): the training
        # loop holds it through the backward
        output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        casts = uncast_outputs(output) if autocast is not None else {}
        self._held_to_end = [casts.get(n, n).name for n in
                             torch.utils._pytree.tree_leaves(output.args)[1:]
                             if isinstance(n, torch.fx.Node)]
        self.gm = gm
        self._paths: dict = {}    # tracer node -> module path, of the latest trace
        self._graph = None        # that trace's graph
        self._tensors: dict = {}  # program node -> the tracer node of its tensor
        self._reached: dict = {}  # program node -> the tracer graph's last node after its run
        self._cached: list = []   # the tracer nodes of autocast's cached half weights
        self._end = None          # the tracer graph's last node after the program ran
        self._matched = None      # (joint graph, the keys of both: ``_keys``)

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
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        it = iter(tensors)
        flat = [next(it) if isinstance(x, torch.Tensor) else x for x in self._leaves]
        self._paths = {}
        self.kernels = []
        caster = Autocaster(self.autocast) if self.autocast is not None else None
        run = _ScopedInterpreter(self.gm, self._paths, self.attention, self.kernels, caster,
                                 self._dead)
        out = tuple(run.run(*flat))
        self._graph, self._tensors, self._reached = run.traced, run.tensors, run.reached
        out = out[:1]  # the loss; what the program returns beside it, the loop holds
        self._matched = None
        self._cached, self._end = [], None
        if self._graph is not None:  # autocast's cached copies: held to the region's end
            mode = get_proxy_mode()
            self._cached = [_traced_node(t, mode) for t in (caster.cached() if caster else ())]
            self._end = next(iter(reversed(self._graph.nodes)), None)
        return (*out, *run.dead_values)

    def python_facts(self, joint: "torch.fx.Graph") -> tuple[dict[str, str], dict[str, str]]:
        """What the model's Python did, in the names of the finished joint graph, as
        fx_lowering takes it. ``held``: node -> the node up to which Python held its tensor
        (a point: the last node of the trace then that is in the joint graph); autocast's
        cached half weights are held to the loss, where a step's autocast region ends.
        ``written``: the node an in-place op of the program became -> the node whose storage
        it wrote into, through the views it wrote by (functionalized, ``core[:, i] = x``
        makes a new tensor in the joint graph; eager writes the one it had). A reference
        only ever extends a forward tensor's life: what is saved lives into the backward."""
        if self._graph is None:
            return {}, {}
        names = self._joint_names(joint)
        at: dict = {}  # tracer node -> the nearest joint node at or before it
        current = None
        for t in self._graph.nodes:
            current = names.get(t, current)
            at[t] = current
        held = {}
        for value, point in self._references.items():
            v, p = names.get(self._tensors.get(value)), at.get(self._reached.get(point))
            if v is not None and p is not None:
                held[v] = p
        last = next((n.name for n in reversed(joint.nodes) if n.op != "output"), None)
        for value in self._held_to_end:
            v = names.get(self._tensors.get(value))
            if v is not None and last is not None:
                held[v] = last
        end = at.get(self._end)  # the loss: the autocast region of a step ends after it
        for node in self._cached:
            if names.get(node) is not None and end is not None:
                held[names[node]] = end
        written = {}
        for node in self.gm.graph.nodes:
            if writes_in_place(node):
                out = names.get(self._tensors.get(node.name))
                into = names.get(self._tensors.get(storage_root(node.args[0]).name))
                if out is not None and into is not None and out != into:
                    written[out] = into
        return held, written

    def _joint_names(self, joint: "torch.fx.Graph") -> dict:
        """Tracer node -> the name of a joint-graph node computing what it does (matched as
        in ``scopes``: equal ones in order; a tracer node the joint graph has fewer of, such
        as a view functionalization made twice, the last of them)."""
        if self._graph is None:
            return {}
        traced, joined = self._keys(joint)
        found: dict[int, list[str]] = {}
        for n, k in joined.items():
            found.setdefault(k, []).append(n.name)
        names: dict = {}
        seen: Counter = Counter()
        for n, k in traced.items():
            if k in found:
                names[n] = found[k][min(seen[k], len(found[k]) - 1)]
                seen[k] += 1
        return names

    def _keys(self, joint: "torch.fx.Graph") -> tuple[dict, dict]:
        """The structural keys of the traced graph and of ``joint``, in one numbering: walked
        once per joint graph (``scopes`` and ``python_facts`` both match by them)."""
        assert self._graph is not None  # (its callers return first without a trace)
        if self._matched is None or self._matched[0] is not joint:
            interned: dict = {}
            self._matched = (joint, _structural_keys(self._graph, interned),
                             _structural_keys(joint, interned))
        return self._matched[1], self._matched[2]

    def scopes(self, joint: "torch.fx.Graph") -> dict[str, str]:
        """Each node of the finished joint graph that a forward node created, by name, with
        that node's module path. Matched by what a node computes (its op and the nodes it
        reads, recursively), not by name: AOTAutograd adds nodes after the trace and the
        names shift (torch 2.14 inserts an ``alias`` per saved tensor where 2.13 wrote a
        ``detach``, and the traced ``alias_1`` becomes ``alias_2``). An added alias of a
        tensor computes what the traced one does and takes its path."""
        if self._graph is None:
            return {}
        traced, joined = self._keys(joint)
        by_key: dict[int, list[str]] = {}  # equal nodes (a constant in every block): in order
        for n, k in traced.items():
            if n in self._paths:
                by_key.setdefault(k, []).append(self._paths[n])
        out, seen = {}, Counter()
        for n, k in joined.items():
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
    autocast spec, each op's inputs are first cast as autocast casts them (autocast_casts.py).
    Two things a backward trace cannot follow are traced as what they equal: a write through
    one boolean mask as a ``where`` (_masked_write), a check of a tensor's value not at all
    (exported_checks.checks_only). Each run records the tracer node of its result and how far the tracer
    graph had got (``tensors``, ``reached``: ExportedRun.python_facts)."""

    def __init__(self, gm, paths: dict, attention: AttentionTarget | None = None,
                 kernels: list | None = None, caster: Autocaster | None = None,
                 dead: frozenset[str] | set[str] = frozenset()):
        super().__init__(gm)
        # (fx appends "While executing …" to an error's message: a GraphcostError's is the
        # user's one line, and any other's is reduced to one by capture.py)
        self.extra_traceback = False
        self._dead, self.dead_values = dead, []  # the dead ends' names, their results
        self._checks = checks_only(gm.graph)
        self.tensors: dict = {}  # node -> the tracer node of the tensor its run returned
        #                          (an in-place op: of the tensor it wrote)
        self.reached: dict = {}  # node -> the tracer graph's last node after its run
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
        if target in _MASK_WRITES and _by_one_mask(*args, **kwargs):
            return _masked_write(target, *args, **kwargs)
        if self._caster is not None:
            if target is torch.ops.aten._assert_tensor_metadata.default:
                return None  # (a dtype the fp32 export saw: autocast's run has its own)
            args, kwargs = self._caster.cast(target, args, kwargs)
        out = as_eager_backward(target, args, kwargs)  # (SiLU's: eager_backward.py)
        if out is None:   # (a meta model's where, var, std: meta_gradients.py)
            out = as_cpu_gradient(target, args, kwargs)
        if out is not None:
            return out
        if is_loss(target):  # (as eager's kernels: loss_kernels.py)
            out = as_kernels(target, args, kwargs)
            if out is not None:
                return out
        if is_float8_matmul(target):  # (torchao's own function: float8_linears.py)
            if self._caster is not None:
                args = self._caster.float8_args(args)
            return run_float8_matmul(args, kwargs)
        if is_float8_gather(target):   # (torchao's float8 tensor-parallel input: the same)
            return run_float8_gather(args, kwargs)
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
        if n.name in self._checks:
            return None
        if n.name in self._dead:
            out = self._run_scoped(n, mode, stack)
            # detached here: a detach at the forward's end would read it there, and hold it
            self.dead_values.append(out.detach())
            return out
        return self._run_scoped(n, mode, stack)

    def _run_scoped(self, n, mode, stack):
        if mode is None or n.op != "call_function":
            return super().run_node(n)
        graph = self.traced = mode.tracer.graph
        stop = next(iter(reversed(graph.nodes)), None)
        out = super().run_node(n)
        made = []
        for node in reversed(graph.nodes):
            if node is stop:
                break
            made.append(node)
        made.reverse()
        self.reached[n.name] = made[-1] if made else stop
        self.tensors[n.name] = _traced_node(out, mode)
        if writes_in_place(n):  # functionalized: the last new tensor is the one written
            # (``core[:, i] = x`` makes the whole ``core`` anew, then views of it again)
            self.tensors[n.name] = next((t for t in reversed(made) if not is_view(t)),
                                        self.tensors[n.name])
        if stack:
            path = _module_path(next(reversed(stack.values()))[0])
            for node in made:
                self._paths.setdefault(node, path)
        return out


_MASK_WRITES = (torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default)


def _by_one_mask(x, indices, values, accumulate: object = False) -> bool:
    """``x[mask] = values`` with one boolean mask over x's leading dims and values that
    broadcast over the rest (wav2vec2's and HuBERT's SpecAugment: a time mask, the learned
    embedding written into each masked frame)."""
    mask = indices[0] if len(indices) == 1 else None
    return isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and not accumulate \
        and mask.dim() <= x.dim() and tuple(mask.shape) == tuple(x.shape[:mask.dim()]) \
        and isinstance(values, torch.Tensor) and values.dim() <= x.dim() - mask.dim()


def _masked_write(target, x, indices, values, accumulate: object = False):
    """The masked write as a ``where``: indexing by a boolean mask takes its ``nonzero`` (how
    many elements the data decides), which a backward trace cannot follow, and the values
    written and the gradients are the same (``index_put_`` stays in place: ``copy_``)."""
    mask = indices[0].reshape(*indices[0].shape, *([1] * (x.dim() - indices[0].dim())))
    out = torch.where(mask, values.to(x.dtype), x)
    return x.copy_(out) if target is torch.ops.aten.index_put_.default else out


def _traced_node(out, mode) -> "torch.fx.Node | None":
    """The tracer's node for ``out`` (a node's result; its first tensor if several). Traced
    functionalized, the tensor the graph sees is a FunctionalTensor around the one the tracer
    follows, whose node is the tensor's value now (after an in-place op: the op's result)."""
    from torch._subclasses.functional_tensor import FunctionalTensor
    from torch.fx.experimental.proxy_tensor import get_proxy_slot

    t = next((x for x in torch.utils._pytree.tree_leaves(out) if isinstance(x, torch.Tensor)),
             None)
    if t is None:
        return None
    if isinstance(t, FunctionalTensor):
        t = torch._from_functional_tensor(t.elem)  # pyright: ignore[reportPrivateImportUsage]
    slot = get_proxy_slot(t, mode.tracer, None)
    return getattr(getattr(slot, "proxy", None), "node", None)


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
    model names it: the ``StepLoss`` wrapper's ``model.`` and call counts removed."""
    path = re.sub(r"@\d+", "", export_path)
    return path.removeprefix("model.") if path != "model" else ""
