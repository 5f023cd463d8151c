"""``graphcost verify``: run the model for real on this CPU and compare with the prediction.

The model is resolved as everywhere else (analyzer/app/resolve.py), with real weights:

* ONNX (a file, a ModelProto, or ``zoo:NAME``'s cached export) → analyzer/measure/verify_onnx.py:
  onnxruntime's shapes of every node output and its latency beside the roofline bound;
* PyTorch (``zoo:NAME --fx``, ``file.py:Class``, an nn.Module) → analyzer/measure/verify_torch.py:
  MemTracker's peak of one forward, or of one steady-state training step.

The input model file is only read. Nothing here prints; results are frozen dataclasses.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...passes.errors import GraphcostError
from ..app.api_wording import api_wording
from ..app.resolve import Bindings, resolve
from .verify_onnx import OnnxVerification, verify_onnx
from .verify_torch import TorchVerification, verify_torch


def verify(model, example_inputs: Sequence[Any] | None = None, *, fx: bool = False,
           batch: int | None = None, dims: Mapping[str, int] | None = None,
           input_shapes: Mapping[str, Sequence[int]] | None = None,
           input_dtypes: Mapping[str, Any] | None = None, train: bool = False,
           optimizer: str = "adam", repeat: int = 10, depth: int = 1,
           lifetimes: str | None = None, include_inputs: bool = True, inplace: bool = False,
           progress: Callable[[str], None] | None = None, all_layers: bool = False,
           _cli: bool = False) -> OnnxVerification | TorchVerification:
    """``model``: anything analyze() takes (a .pt2 program excepted: its weights are never
    unpickled). PyTorch models are built with seeded random weights."""
    try:
        bindings = Bindings(batch, dict(dims or {}),
                            {k: tuple(v) for k, v in (input_shapes or {}).items()},
                            dict(input_dtypes or {}))
        r = resolve(model, example_inputs, bindings, fx=fx, train=train, materialize=True,
                    note=progress)
        if r.kind == "program":
            raise GraphcostError("verify does not run .pt2 programs: graphcost never "
                                 "unpickles their weights; verify the module (file.py:Class) "
                                 "instead")
        if r.kind == "onnx":
            if train:
                raise GraphcostError("--train verifies a PyTorch training step: use zoo:NAME "
                                     "--fx or path/to/file.py:Class")
            return verify_onnx(r, batch, repeat=repeat, progress=progress,
                               lifetimes=lifetimes, include_inputs=include_inputs,
                               inplace=inplace)
        inputs = dict(r.kwargs) if r.kwargs else r.inputs
        return verify_torch(r.module, inputs, name=r.name, train=train, optimizer=optimizer,
                            depth=depth, lifetimes=lifetimes, progress=progress,
                            all_layers=all_layers)
    except GraphcostError as exc:
        if _cli:
            raise
        raise GraphcostError(api_wording(str(exc))) from None
