"""torch.export / FX frontend: an ExportedProgram (or AOTAutograd's joint graph) ->
passes.ir.Graph.

* Capture: ``torch.export.export(..., strict=False)`` on fake (or meta) tensors, then
  ``run_decompositions`` to core ATen — except ``scaled_dot_product_attention``, kept whole so
  attention is costed as attention. Weights are never materialized: a model built on the meta
  device exports and analyzes without allocating its parameters.
* Parameters and buffers (from the graph signature) become PARAM / BUFFER values, a tied
  weight one value; the FX graph itself is lowered node by node in fx_lowering.py.
"""
from __future__ import annotations

import functools
import warnings
from contextlib import contextmanager
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

import torch

from ....passes.errors import GraphcostError, first_line
from ....passes.ir import Graph, ValueKind
from .fx_lowering import lower_fx_graph, module_types

if TYPE_CHECKING:
    from .capture import JointTrace

# Ops kept whole instead of decomposed: their cost rule is the better model.
# SDPA and its kernels (flash, efficient, cuDNN, _for_cpu); GELU's and BatchNorm's backward,
# which PyTorch runs as one kernel each (GELU's decomposition holds three activation-sized
# temporaries at once; BatchNorm's, on a half input, fp32 copies of the input and gradient);
# SiLU and its backward, one kernel each (the decomposition computes a half input in fp32:
# two fp32 copies of a Llama MLP's widest activation at its peak, and the forward's sigmoid
# kept for the backward where PyTorch keeps only the input); the backward of an embedding and
# of a LayerNorm, one kernel each (decomposed: an embedding's weight-sized zeros, then a second
# weight-sized tensor index_put writes, BERT's 4096-position table's gradient twice; a
# LayerNorm's activation-sized temporaries, which eager never makes, held beside the inputs
# its autograd call keeps until all three gradients exist: passes/memory/liveness.py); a GroupNorm's
# backward, one kernel (decomposed: activation-sized temporaries, wav2vec2's first
# convolution's 6.5 MB output four times at the step's peak, +5%); resizing (F.interpolate's
# modes) and its backward, one kernel each (decomposed: gathers of index tensors and per-tap
# products, a bicubic upsample's inference peak 7.6 times its output; in training its
# backward, input-sized zeros and an index_put per tap, +204% on a bilinear decoder's step,
# +307% on a bicubic one); a slice's, row's or diagonal's gradient, one kernel (decomposed:
# zeros and a scatter copy of them, two input-sized tensors at once: Longformer +14%); ReLU's
# backward, one kernel reading the saved output while it writes the gradient (decomposed: a
# boolean mask of the output first, the output freed before the gradient exists — a conv +
# BatchNorm + ReLU CNN's step −12% against MemTracker, now exact); the math attention
# kernel's ``_safe_softmax``, one kernel keeping its output (decomposed: scores-sized zeros
# and a ``where`` beside the softmax: a learned-mask attention's step +9%, now +0.3%)
_KEEP = ("scaled_dot_product", "gelu_backward", "threshold_backward",
         "native_batch_norm_backward", "silu",
         "embedding_dense_backward", "native_layer_norm_backward", "native_group_norm_backward",
         "upsample", "slice_backward", "select_backward", "diagonal_backward",
         "_safe_softmax")


def unreachable_rules() -> list[str]:
    """Registered aten rules that this torch's decompositions remove before any graph reaches
    the registry (reported per torch version by the tests; at run time such an op is costed
    through what it decomposes into)."""
    from ....passes.costs import registered  # noqa: F401  (every family registered)
    from ....passes.costs.registry import unreachable
    removed = {str(op) for op in training_decompositions()}
    # AOTAutograd writes a detach for every tensor saved for backward after the
    # decompositions ran: that one reaches the joint graph all the same.
    return unreachable(removed - {"aten.detach.default"})


@contextmanager
def kept_whole():
    """Meanwhile, the ops of ``_KEEP`` that torch decomposes in Python while it traces reach
    the graph whole, with their own autograd formula, as eager runs them. Table or no
    table, torch's Python dispatcher runs the decomposition an op registers for the Autograd
    and CompositeImplicitAutograd keys (``py_impl`` in torch/_decomp/decompositions.py: from
    torch 2.8 to 2.14 every upsampling op, and only those of ``_KEEP``); those kernels are
    taken out of the op's ``py_kernels`` (and its dispatch cache) and put back after."""
    from torch._C import DispatchKey

    from .compat import forget_cia_ops, functional_kernels_kept
    from .eager_backward import EAGER_KERNELS

    keys = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)
    taken = [(op, key, op.py_kernels.pop(key)) for op in _kept_overloads() for key in keys
             if key in op.py_kernels]
    for op, _, _ in taken:
        op._dispatch_cache.clear()
    try:
        with functional_kernels_kept(EAGER_KERNELS):  # (their C++ CIA kernels: compat.py)
            yield
    finally:
        for op, key, kernel in taken:
            op.py_kernels[key] = kernel
            op._dispatch_cache.clear()
        forget_cia_ops()  # built meanwhile, torch's cache would lack them for good


@functools.cache
def _kept_overloads() -> tuple:
    """Every overload of an aten op ``_KEEP`` names, as torch registers them."""
    import torch._decomp  # noqa: F401  (registers the Python decompositions first)

    found = []
    for name in torch._C._dispatch_get_all_op_names():
        base, _, overload = name.removeprefix("aten::").partition(".")
        if name.startswith("aten::") and any(k in base for k in _KEEP):
            found.append(getattr(getattr(torch.ops.aten, base), overload or "default"))
    return tuple(found)


def decompose(ep: "torch.export.ExportedProgram") -> "torch.export.ExportedProgram":
    """``ep`` in core ATen, the calls whose result no output reads kept (dead_ends.py: the
    decomposed program's last user outputs; ``lower_exported`` drops them again)."""
    from .compat import eager_view_strides, no_stack_traces
    from .dead_ends import dead_ends_as_outputs

    table = training_decompositions()
    with warnings.catch_warnings(), no_stack_traces(), eager_view_strides(), kept_whole():
        warnings.simplefilter("ignore", FutureWarning)  # torch-internal deprecations
        try:
            with dead_ends_as_outputs(ep):
                return ep.run_decompositions(table)
        except Exception:  # a program the extra outputs trip: decomposed as torch leaves it
            return ep.run_decompositions(table)


def decompose_program(ep: "torch.export.ExportedProgram",
                      name: str) -> "torch.export.ExportedProgram":
    """``decompose``, its failure one line naming the model."""
    try:
        return decompose(ep)
    except Exception as exc:
        raise GraphcostError(f"{name}: decomposing the exported program failed: "
                             f"{type(exc).__name__}: {first_line(exc)}") from None


def training_decompositions() -> dict:
    """Core-ATen decompositions for the joint graph (attention kept whole, as at inference):
    a fresh copy (torch's passes delete from the table they are given) of one table built per
    set of registered operators — torch builds its default table anew on every call (0.1 s,
    a tenth of a small model's trace, which a repeated stack's short traces each paid)."""
    return dict(_decompositions(len(torch._C._dispatch_get_all_op_names())))


@functools.cache
def _decompositions(registered: int) -> dict:
    """(``registered``: how many operators torch has, so that a library's ops registered
    later, torchao's, are in the table they would be in.)"""
    table = torch.export.default_decompositions()
    return {op: table[op] for op in list(table) if not any(k in str(op) for k in _KEEP)}


def lower_joint(trace: "JointTrace", model: "torch.nn.Module", *, name: str, batch: int,
                maxima: Mapping[str, int] | None = None,
                capped: Mapping[str, str] | None = None) -> Graph:
    """Lower AOTAutograd's joint forward+backward graph (capture.export_joint's). Outputs: the
    loss, then one gradient per parameter (which live to the optimizer step). Tied parameters
    become one value. What the model's Python held and wrote in place become the graph's
    ``eager_refs`` and ``eager_inplace``."""
    gm, sig, prefix = trace.gm, trace.sig, trace.prefix
    kind_of: dict[str, ValueKind] = {}
    alias: dict[str, str] = {}
    first_of: dict[int, str] = {}
    rank = {id(p): i for i, p in enumerate(model.parameters())}
    order: dict[str, int] = {}  # placeholder -> where model.parameters() yields its tensor
    for ph, fqn in sig.inputs_to_parameters.items():
        tensor = model.get_parameter(fqn.removeprefix(prefix))
        order[ph] = rank.get(id(tensor), len(rank))
        # a frozen weight (requires_grad=False: Whisper's sinusoidal positions, a LoRA base)
        # stays a parameter (FSDP shards it, parameters() counts it) with no gradient below,
        # hence no optimizer state (Graph.grads)
        kind_of[ph] = ValueKind.PARAM
        first = first_of.setdefault(id(tensor), ph)
        if first != ph:
            alias[ph] = first
    for ph in sig.inputs_to_buffers:
        kind_of[ph] = ValueKind.BUFFER
    # Outputs: the loss, then the gradients. Running-stat updates (BatchNorm) are left out:
    # eager copies them into the buffers in place.
    # A tied weight gets one gradient (eager accumulates both uses into one .grad).
    tied = {sig.inputs_to_parameters[ph] for ph in alias}
    # The user outputs after the loss are the dead ends ExportedRun returns: not kept.
    keep = set(sig.user_outputs[:1]) | {out for out, fqn in
                                    sig.backward_signature.gradients_to_parameters.items()
                                    if fqn not in tied}
    # Which parameter each gradient is for: a parameter with requires_grad=False has none
    # (AOTAutograd traces no backward for it, nor saves what only its gradient would need).
    placeholder = {fqn: ph for ph, fqn in sig.inputs_to_parameters.items() if ph not in alias}
    grads = {placeholder[fqn]: out for out, fqn in
             sig.backward_signature.gradients_to_parameters.items() if fqn in placeholder}
    paths = {ph: fqn.removeprefix(prefix) for fqn, ph in placeholder.items()}
    graph = lower_fx_graph(gm.graph, kind_of, alias, keep, name=name, batch=batch,
                           module_types={path: type(m).__name__
                                         for path, m in model.named_modules()},
                           scopes=trace.scopes, grads=grads, param_paths=paths,
                           maxima=maxima, capped=capped, held=trace.held,
                           written=trace.written)
    return _in_parameter_order(graph, order)


def _in_parameter_order(graph: Graph, order: Mapping[str, int]) -> Graph:
    """``graph`` with its parameters in ``model.parameters()``'s order, the order an optimizer
    steps them in: torch.export lists a tied weight once, under one of its names (GPT-2's
    token embedding as lm_head.weight, last), where the optimizer steps it first; its
    for-loop step's temporaries depend on which parameter comes before which."""
    params = sorted((n for n, v in graph.values.items() if v.kind == ValueKind.PARAM),
                    key=lambda n: order.get(n, len(order)))
    values = {n: graph.values[n] for n in params}
    values.update(graph.values)  # everything else in its place (params keep their new one)
    return replace(graph, values=MappingProxyType(values))


def lower_exported(ep: "torch.export.ExportedProgram", *, name: str = "model",
                   batch: int = 1, dims: Mapping[str, int] | None = None,
                   decomposed: bool = False,
                   references: Mapping[str, str] | None = None,
                   maxima: Mapping[str, int] | None = None,
                   capped: Mapping[str, str] | None = None,
                   exported: "torch.export.ExportedProgram | None" = None) -> Graph:
    """Lower ``ep`` (decomposed here unless ``decomposed``) into the IR. ``references``
    (torch_capture.export_module's: node -> node reached when Python released its tensor,
    in the names of ``exported``, the program ``ep`` was decomposed from, or of ``ep``)
    become the graph's ``eager_refs``. ``maxima`` bound data-dependent sizes by name
    (``--dim u3=MAX``), ``capped`` says how the trace bounded them
    (bounded_trace.BoundedSizes.capped)."""
    original = exported or ep
    if not decomposed:
        ep = decompose_program(ep, name)
    from .dead_ends import own_outputs
    from .fx_references import decomposed_references

    held, written = decomposed_references(original.graph, ep.graph, references) \
        if references is not None else ({}, {})
    from torch.export.graph_signature import InputKind

    sig = ep.graph_signature
    kind_of: dict[str, ValueKind] = {}
    for spec in sig.input_specs:
        arg = getattr(spec.arg, "name", "")  # ("": none, no node is named so)
        if spec.kind == InputKind.PARAMETER:
            kind_of[arg] = ValueKind.PARAM
        elif spec.kind == InputKind.BUFFER:
            kind_of[arg] = ValueKind.BUFFER
        elif spec.kind in (InputKind.CONSTANT_TENSOR,):
            kind_of[arg] = ValueKind.CONST
        else:
            kind_of[arg] = ValueKind.INPUT
    user_outputs = own_outputs(ep, original)  # (not the dead ends decompose kept)

    alias: dict[str, str] = {}  # tied weight placeholder -> the placeholder it stands for
    # Tied weights (GPT-2's lm_head and token embedding) are one tensor behind two
    # placeholders: the second stands for the first, so the weight is counted once.
    first_of: dict[int, str] = {}
    state = {**ep.state_dict, **getattr(ep, "constants", {})}
    for spec in sig.input_specs:
        arg = getattr(spec.arg, "name", None)
        tensor = state.get(spec.target) if spec.target else None
        if arg and tensor is not None:
            first = first_of.setdefault(id(tensor), arg)
            if first != arg:
                alias[arg] = first
    return lower_fx_graph(ep.graph, kind_of, alias, user_outputs, name=name, batch=batch,
                          dims=dims, module_types=module_types(ep.graph), held=held,
                          written=written, maxima=maxima, capped=capped)
