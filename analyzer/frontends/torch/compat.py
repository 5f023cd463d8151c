"""The torch APIs that moved between the supported releases, in one place.

graphcost supports every torch release from 2.8 to 2.14 (pyproject.toml); each helper here
names the release that changed what it papers over, so the branch can go when the range's
floor passes it. Everything else in the frontends uses torch's public or long-stable names.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

# torch 2.8: a first import of torch._dynamo inside a ``with torch.device("meta")`` block
# fails (a circular import through torch._compile's disable decorator, which the device mode
# intercepts), and transformers imports it while a model is built on meta. Imported here,
# before any frontend enters that block; fixed in torch 2.9.
import torch._dynamo  # noqa: F401

# (major, minor) of the installed torch: '2.14.1+cu128' -> (2, 14)
TORCH_VERSION = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


@contextmanager
def no_stack_traces():
    """The tracer records a Python stack trace on every node (``meta["stack_trace"]``): 4 s of
    the 21 s the 7B joint trace took, and about half of the 7B inference export and
    decomposition. Nothing here reads it; the graph is otherwise the same.
    ``torch.fx.config.do_not_emit_stack_traces`` came in torch 2.9; on 2.8 the traces are
    recorded (slower, same graph)."""
    import torch.fx.config as fx_config

    if not hasattr(fx_config, "do_not_emit_stack_traces"):  # torch < 2.9
        yield
        return
    before = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = before


def unbacked_vals_attr(shape_env) -> str:
    """The ShapeEnv's attribute holding the values that real-tensor propagation (draft_export)
    gives data-dependent sizes: ``unbacked_var_to_val`` up to torch 2.8, renamed
    ``real_tensor_prop_unbacked_vals`` in 2.9."""
    if hasattr(shape_env, "real_tensor_prop_unbacked_vals"):
        return "real_tensor_prop_unbacked_vals"
    return "unbacked_var_to_val"  # torch 2.8


def fake_safe(func, args: tuple, kwargs: dict):
    """``func`` as fake tensors can run it. torch 2.8: the one-argument ``torch.where(cond)``
    reaches the reference decomposition of the three-argument form, which raises
    NotImplementedError, so any export of it fails; it is ``torch.nonzero(cond,
    as_tuple=True)`` (both are ATen's nonzero_numpy), which 2.8 traces. Fixed in 2.9."""
    if TORCH_VERSION < (2, 9) and func is torch.where and len(args) + len(kwargs) == 1:
        return torch.nonzero, (*args, *kwargs.values()), {"as_tuple": True}
    return func, args, kwargs


@contextmanager
def eager_view_strides():
    """Meanwhile a fake tensor's ``view`` gets the strides an eager view gets. torch 2.8 views
    fake tensors through the meta kernel, ATen's ``computeStride`` as eager; torch 2.13 and
    2.14 through ``torch._refs._reshape_view_helper``, which strides a size-one dimension
    otherwise ((1, 64, 16) strided (1664, 1, 64) viewed as (1, 64, 4, 4): eager (64, 1, 256,
    64), the helper (1664, 1, 256, 64)). Kernels read those strides: a channels-last guess
    (``suggest_memory_format``) holds in the trace and not eagerly, so an upsample's or a
    convolution's backward lays its gradient out otherwise than eager, and AccumulateGrad's
    copy (accumulate_grad.py) is traced where eager makes none, or missed where it makes one.
    A view of static sizes is strided by the meta kernel here; any other as torch does."""
    from torch._subclasses import fake_impls

    table = fake_impls.op_implementations_dict
    ops = [op for op in (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)
           if op in table]
    saved = {op: table[op] for op in ops}

    def strided(impl):
        def view(fake_mode, func, a, *shape, **kwargs):
            size = shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) \
                else shape
            if kwargs or not all(isinstance(s, int) for s in (*a.shape, *a.stride(), *size)):
                return impl(fake_mode, func, a, *shape, **kwargs)
            try:
                meta = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype,
                                           device="meta").view(size)
            except RuntimeError:  # not a view: torch's own words
                return impl(fake_mode, func, a, *shape, **kwargs)
            return a.as_strided(meta.shape, meta.stride())
        return view

    for op in ops:
        table[op] = strided(saved[op])
    try:
        yield
    finally:
        table.update(saved)


def forget_cia_ops() -> None:
    """torch.export caches the set of aten ops it may keep whole (those with a
    CompositeImplicitAutograd kernel, C++ or Python) the first time a program is decomposed
    (``torch._export.utils._collect_all_valid_cia_ops_for_aten_namespace``, an lru_cache in
    2.8 to 2.14). If that first time falls inside ``frontend.kept_whole``, the upsampling ops,
    whose only such kernel is the Python one taken out meanwhile, are missing from it for the
    life of the process; a later export that decomposes them (the dynamo ONNX exporter on
    torch 2.8) then fails on torch's assertion "This should be a custom op". Forgotten once
    the kernels are back, the set is built again as torch would build it."""
    from torch._export import utils

    cached = getattr(utils, "_collect_all_valid_cia_ops_for_aten_namespace", None)
    if cached is not None and hasattr(cached, "cache_clear"):
        cached.cache_clear()


def non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """ATen's ``is_non_overlapping_and_dense`` (some order of the dimensions is contiguous),
    as torch._prims_common computes it: named so up to torch 2.8, ``..._or_false`` since."""
    import torch._prims_common as common

    check = getattr(common, "is_non_overlapping_and_dense_or_false", None) \
        or getattr(common, "is_non_overlapping_and_dense")
    return bool(check(t))


@contextmanager
def functional_kernels_kept(ops: frozenset) -> Iterator[None]:
    """Meanwhile, ``ops`` are not decomposed by functionalization. aot_export_module
    functionalizes in export mode, where FunctionalTensorMode calls ``func.decompose()`` on
    every op with a CompositeImplicitAutograd kernel (torch 2.8 to 2.14), even one with a CPU
    or CUDA kernel of its own, which eager runs: silu_backward has both (its CIA kernel is
    math_silu_backward, sigmoid and four activation-sized products). Each op's ``decompose``
    answers NotImplemented meanwhile (an attribute of that OpOverload alone, which the mode
    reads as "nothing to decompose"), and is deleted after."""
    added = [op for op in ops if "decompose" not in vars(op)]  # (nested: the outer one's)
    for op in added:
        op.decompose = _not_decomposed
    try:
        yield
    finally:
        for op in added:
            del op.decompose


def _not_decomposed(*_args, **_kwargs):
    return NotImplemented


def ring_attention_parts() -> Any:
    """PyTorch's context-parallel ring attention pieces that need no process group: the
    merger of the ring's partial outputs (``_SDPAMerger``), each step's causal behaviour
    (``_is_causal_behavior``), the load-balanced partial update (``_partial_update``) and the
    options (``_cp_options``) — in ``torch.distributed.tensor.experimental._attention`` up to
    torch 2.8, in its ``_context_parallel._attention`` from 2.9."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import (
            _attention as parts,
        )
    except ImportError:   # torch 2.8
        from torch.distributed.tensor.experimental import _attention as parts
    return parts
