"""``graphcost verify``: run the model for real on this CPU and compare with the prediction.

The model is resolved as everywhere else (analyzer/load/resolve.py), with real weights:

* ONNX (a file, a ModelProto, or ``zoo:NAME``'s cached export) → analyzer/measure/verify_onnx.py:
  onnxruntime's shapes of every node output and its latency beside the roofline bound;
* PyTorch (``zoo:NAME --fx``, ``file.py:Class``, an nn.Module) → analyzer/measure/verify_torch.py:
  MemTracker's peak of one forward, or of one steady-state training step.

The input model file is only read. Nothing here prints; results are frozen dataclasses.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...passes.choices import Optimizer
from ...passes.errors import GraphcostError, opt
from ..app.request import PassOptions, Request, build_request
from ..load.loading import resolve_model
from .verify_onnx import OnnxVerification, verify_onnx
from .verify_torch import TorchVerification, verify_torch


def verify(model, example_inputs: Sequence[Any] | None = None, *, fx: bool = False,
           batch: int | None = None, dims: Mapping[str, int] | None = None,
           input_shapes: Mapping[str, Sequence[int]] | None = None,
           input_dtypes: Mapping[str, Any] | None = None, train: bool = False,
           optimizer: str = "adam", repeat: int = 10, depth: int = 1,
           lifetimes: str | None = None, include_inputs: bool = True, inplace: bool = False,
           progress: Callable[[str], None] | None = None,
           all_layers: bool = False) -> OnnxVerification | TorchVerification:
    """``model``: anything analyze() takes (a .pt2 program excepted: its weights are never
    unpickled). PyTorch models are built with seeded random weights. Errors name these
    arguments."""
    request = build_request(
        batch=batch, dims=dims, input_shapes=input_shapes, input_dtypes=input_dtypes,
        zoo_exporter="fx" if fx else "onnx", train=train, optimizer=optimizer,
        lifetimes=lifetimes, include_inputs=include_inputs, inplace=inplace,
        all_layers=all_layers)
    return verify_request(model, request, example_inputs, repeat=repeat, depth=depth,
                          progress=progress)


def verify_request(model, request: Request, example_inputs: Sequence[Any] | None = None, *,
                   repeat: int = 10, depth: int = 1,
                   progress: Callable[[str], None] | None = None,
                   ) -> OnnxVerification | TorchVerification:
    """Measure what ``request`` asks on this CPU (both faces come here). Only plain fp32
    steps are measured."""
    load, passes = request.load, request.passes
    if passes.checkpoint or passes.precision != "fp32":
        raise GraphcostError(f"verify measures plain fp32 steps: {opt('checkpoint')} and {opt('precision')} "
                             "are not measured")
    r = resolve_model(model, load, example_inputs, progress, materialize=True)
    if r.kind == "program":
        raise GraphcostError("verify does not run .pt2 programs: graphcost never "
                             "unpickles their weights; verify the module (file.py:Class) "
                             "instead")
    if r.kind == "onnx":
        if load.train:
            raise GraphcostError(f"{opt('train')} verifies a PyTorch training step: use zoo:NAME "
                                 f"{opt('zoo_exporter', value='fx')} or path/to/file.py:Class")
        return verify_onnx(r, load.batch, repeat=repeat, progress=progress,
                           passes=PassOptions(include_inputs=passes.include_inputs,
                                              inplace=passes.inplace,
                                              lifetimes=passes.lifetimes))
    inputs = dict(r.kwargs) if r.kwargs else r.inputs
    return verify_torch(r.module, inputs, name=r.name, train=load.train,
                        optimizer=passes.optimizer or Optimizer.ADAM, depth=depth,
                        lifetimes=passes.lifetimes, progress=progress,
                        all_layers=load.all_layers)
