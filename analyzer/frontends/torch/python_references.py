"""How long the model's own Python holds each tensor, observed while ``torch.export`` traces
its forward (capture.export_module for an inference, capture.export_joint for a training
step): what a graph's dataflow cannot show, measured instead of guessed."""
from __future__ import annotations

import weakref
from contextlib import nullcontext

import torch
import torch.utils._pytree  # (torch.utils does not import it for the type checker)

from ....passes.errors import GraphcostError


class PythonReferences(torch.overrides.TorchFunctionMode):
    """How long the model's own Python code holds each tensor, observed during the trace.

    Non-strict ``torch.export`` runs the model's forward itself, on fake tensors: every local
    variable, list or returned tuple holds a fake tensor exactly as it would hold the real one
    in an eager forward. A finalizer on each tensor an op returns records, when Python frees
    it, the last node the trace had recorded: ``references[node that made it] = that node``.
    What a graph cannot show — GPT-2's token embeddings kept by a variable of
    ``GPT2Model.forward`` until it returns, the attention probabilities returned beside the
    attention output and held by the block, a UNet's list of skip tensors — is measured
    instead of guessed. Tensors still alive when the trace ends record nothing."""

    def __init__(self, references: dict[str, str]):
        super().__init__()
        self._refs = references
        self._finalizers: list = []
        self._open = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

        mode = get_proxy_mode()
        if mode is None:
            return out
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                slot = get_proxy_slot(t, mode.tracer, None)
                node = getattr(getattr(slot, "proxy", None), "node", None)
                if node is None or node.op != "call_function":
                    continue
                # An op may return an object already seen (``.to()`` of the dtype it has, an
                # in-place op): the object then stands for both nodes' tensors.
                fin = weakref.finalize(t, self._released, node.name, mode.tracer.graph)
                fin.atexit = False
                self._finalizers.append(fin)
        return out

    def _released(self, name: str, graph) -> None:
        if self._open:
            last = next(iter(reversed(graph.nodes)), None)
            if last is not None and last.op != "output":
                self._refs[name] = last.name

    def __exit__(self, *exc):
        self._open = False  # what is freed after the trace (the outputs) says nothing
        for fin in self._finalizers:
            fin.detach()
        self._finalizers.clear()
        return super().__exit__(*exc)


def saved_as_run(autocast):
    """While the forward is exported for its references, autograd saves what the step will
    save: the tensors of the exported ops as eager saves them (a tensor autograd keeps is
    held, at least to the end of the forward, where the joint graph's decomposed backward may
    read another: ProphetNet's step peak was 8% low without). Under autocast the
    export (in fp32: ExportedRun casts) saves the fp32 tensors where the step saves their half
    copies (a LayerNorm's output before a Linear), so autograd then keeps nothing and the
    references are Python's alone."""
    if autocast is None:
        return nullcontext()
    return torch.autograd.graph.saved_tensors_hooks(lambda _t: None, _never_unpacked)


def _never_unpacked(_packed) -> torch.Tensor:
    raise GraphcostError("the forward ran a backward while it was exported")
