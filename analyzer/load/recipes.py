"""The dtype and the training recipe a resolved PyTorch model is traced in: ``--dtype`` (or the
published weights') for inference and serving, a casting precision recipe (bf16-true,
bf16-master) and torchao's float8 linears for a training step. Each returns a new
``Resolved``; a module the caller passed is copied before it is changed."""
from __future__ import annotations

import copy
from dataclasses import replace

from ...passes.errors import GraphcostError, opt
from .resolve import Resolved

DTYPES = {"fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16",
          "half": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16"}


def in_dtype(r: Resolved, dtype: str | None, train: bool) -> Resolved:
    """``r`` in the dtype asked (``dtype``: --dtype's) or, for inference and serving, the
    published weights' (a zoo model's ``own_dtype``): the module and its floating inputs cast,
    the report's name saying where the dtype came from. A training step's dtypes are the
    precision recipe's (the module as built, fp32; see ``in_recipe_dtype``)."""
    if r.kind != "torch" or (dtype is None and (train or r.own_dtype is None)):
        return r
    name = DTYPES[dtype.lower()] if dtype else r.own_dtype
    assert name is not None  # (one of the two, by the test above)
    source = "the dtype asked" if dtype else "its published config"
    # Module.to casts in place: a module the caller passed is copied first (the analysis
    # leaves it as it was); a zoo model built here is cast as it is
    return replace(_cast(r, name, copy_module=bool(dtype)),
                   name=f"{r.name} ({name} from {source})")


def in_recipe_dtype(r: Resolved, dtype: str | None) -> Resolved:
    """A training recipe that casts the module (bf16-true, bf16-master; ``dtype`` its, None
    for the others): a PyTorch ``r`` traced in it, as ``model.to(dtype)`` runs, so the
    model's own float32 upcasts (an RMSNorm's) stay float32 — re-typing an fp32 trace would
    make them half. The caller's module is copied first."""
    return r if r.kind != "torch" or dtype is None else _cast(r, dtype, copy_module=True)


def in_float8(r: Resolved, recipe: str | None, all_gather: bool = False) -> Resolved:
    """A training step whose linears run torchao's float8 ``recipe`` (None: ``r`` itself):
    the module's linears swapped as torchtitan's float8 converter swaps them
    (frontends/torch/float8_linears.py; the caller's module is copied), the report's name
    saying how many; ``all_gather``: their weights gathered in float8 by FSDP2."""
    if recipe is None:
        return r
    if r.kind != "torch":
        raise GraphcostError(f"{opt('float8', value=recipe)}: float8 linears are swapped into "
                             "a PyTorch module; trace the PyTorch model")
    from ..frontends.torch.float8_linears import convert

    module = copy.deepcopy(r.module)
    swapped, linears = convert(module, recipe, all_gather)
    gathered = ", gathered in float8" if all_gather else ""
    return replace(r, module=module, name=f"{r.name} (torchao float8 {recipe}: {swapped} of "
                                         f"{linears} linears{gathered})")


def _cast(r: Resolved, name: str, copy_module: bool) -> Resolved:
    import torch
    to = getattr(torch, name)

    def cast(x):
        return x.to(to) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
    module = copy.deepcopy(r.module) if copy_module else r.module
    return replace(r, module=module.to(to), inputs=tuple(cast(x) for x in r.inputs),
                   kwargs={k: cast(v) for k, v in r.kwargs.items()})
