"""Tensors a training forward makes that ``torch.export`` lifts as constants it could not
trace: kept, as tensors of their shape, so that the joint trace goes on.

Gemma-3n's AltUp clamps its coefficients in place through ``.data`` in train mode
(``self.prediction_coefs.weight.data.clamp_(-c, c)``): non-strict export, training or meta
build alike, lifts ``weight.data`` as a constant that is still a fake tensor, and from torch
2.9 refuses the program ("We found a fake tensor in the exported program constant's list";
torch 2.8 keeps it), then AOTAutograd refuses the fake attribute ("Unexpected fake buffer").
Eager clamps the weight's own storage: nothing is allocated, the step's bytes are the same
but for the constant's (a few coefficients). So the export is asked to warn, not refuse
(``torch._export.config.error_on_lifted_constant_tensors``), and each fake constant of the
program's module becomes a tensor of zeros of its shape, dtype and device (meta stays meta):
its values were never traced, and nothing graphcost reads depends on them. An op the graph
runs in place on such a constant (the clamp_, whose storage is the weight's in eager) runs
out of place: AOTAutograd traces functional graphs only; the op's arithmetic is counted, its
result (a few coefficients) freed at once."""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

import torch

from .fx_references import writes_in_place


@contextmanager
def lifted_fakes_kept() -> Iterator[None]:
    """Meanwhile, ``torch.export`` keeps a fake lifted constant (its warning silenced)."""
    config = getattr(getattr(torch, "_export", None), "config", None)
    if config is None or not hasattr(config, "error_on_lifted_constant_tensors"):
        yield   # (torch 2.8: no such check)
        return
    before = config.error_on_lifted_constant_tensors
    config.error_on_lifted_constant_tensors = False
    try:
        with warnings.catch_warnings():   # (its words ask to file an issue: not the user's)
            warnings.filterwarnings("ignore", message="We found a fake tensor")
            yield
    finally:
        config.error_on_lifted_constant_tensors = before


def real_constants(gm: torch.fx.GraphModule) -> None:
    """Each fake tensor ``gm``'s graph reads as an attribute, replaced by zeros of its
    shape, dtype and device."""
    from torch._subclasses.fake_tensor import FakeTensor

    replaced = set()
    for target in {n.target for n in gm.graph.nodes if n.op == "get_attr"}:
        value = attribute(gm, str(target))
        if isinstance(value, FakeTensor):
            replace_attribute(gm, str(target),
                              torch.zeros(value.shape, dtype=value.dtype, device=value.device))
            replaced.add(target)
    for node in gm.graph.nodes:
        if writes_in_place(node) and node.args[0].op == "get_attr" \
                and node.args[0].target in replaced:
            node.target = _functional(node.target)
    gm.recompile()


def attribute(gm: torch.fx.GraphModule, target: str):
    """What a ``get_attr`` node of ``gm`` reads (None where nothing is there)."""
    owner, _, name = target.rpartition(".")
    return getattr(gm.get_submodule(owner) if owner else gm, name, None)


def replace_attribute(gm: torch.fx.GraphModule, target: str, value: torch.Tensor) -> None:
    """The tensor a ``get_attr`` node of ``gm`` reads replaced by ``value`` (a buffer stays
    a buffer)."""
    owner, _, name = target.rpartition(".")
    module = gm.get_submodule(owner) if owner else gm
    if name in module._buffers:
        module._buffers[name] = value
    else:
        setattr(module, name, value)


def _functional(op):
    """An in-place aten overload's functional twin (``clamp_.default`` → ``clamp.default``);
    the op itself where aten has none."""
    twin = getattr(torch.ops.aten, op.overloadpacket.__name__.removesuffix("_"), None)
    return getattr(twin, op._overloadname, op) if twin is not None else op
