"""The Python entry point: ``analyze(model, ...) -> Report``. Never prints.

Accepted models: an ONNX path, ``zoo:NAME``, ``path/to/file.py:Class`` (imports and runs that
file, builds the class on the meta device), an ``onnx.ModelProto``, a
``torch.export.ExportedProgram``, an ``fx.GraphModule`` or any ``nn.Module`` (with
``example_inputs`` or ``input_shapes``). The ONNX paths never import torch.
"""
from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from graphcost.analyzer.errors import GraphcostError
from graphcost.analyzer.report import Report

ZOO_PREFIX = "zoo:"
Progress = Callable[[str], None]


def _is_torch(model: Any) -> bool:
    torch = sys.modules.get("torch")  # a torch object implies torch is already imported
    return torch is not None and isinstance(model, (torch.nn.Module,
                                                    torch.export.ExportedProgram))


def load_graph(model, example_inputs: Sequence[Any] | None = None, *, batch: int | None = None,
               dims: Mapping[str, int] | None = None,
               input_shapes: Mapping[str, Sequence[int]] | None = None,
               input_dtypes: Mapping[str, Any] | None = None, zoo_exporter: str = "onnx",
               progress: Progress | None = None, train: bool = False):
    """Lower any accepted model into the IR (with ``train``: its joint forward+backward)."""
    note = progress or (lambda _msg: None)
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if text.startswith(ZOO_PREFIX):
            return _zoo_graph(text[len(ZOO_PREFIX):], batch, dims, input_shapes,
                              "fx" if train else zoo_exporter, note, train)
        if ".py:" in text:
            return _file_class_graph(text, batch, input_shapes, input_dtypes, note, train)
        if text.endswith(".pt2"):
            from graphcost.analyzer.frontends.pt2 import load_pt2
            note(f"reading {Path(text).name}")
            program = load_pt2(Path(text))
            graph = _torch_graph(program, None, batch, input_shapes, input_dtypes, note, train)
            return _renamed(graph, Path(text).name, {})
        graph = _onnx_path_graph(Path(text), batch, dims, input_shapes, note)
        return _onnx_estimate(graph, note) if train else graph
    if _is_torch(model):
        return _torch_graph(model, example_inputs, batch, input_shapes, input_dtypes, note,
                            train)
    import onnx

    if isinstance(model, onnx.ModelProto):
        from graphcost.analyzer.frontends.onnx_frontend import lower_onnx
        graph = lower_onnx(model, name=model.graph.name or "model", batch=batch, dims=dims,
                           input_shapes=input_shapes)
        return _onnx_estimate(graph, note) if train else graph
    raise GraphcostError(f"cannot analyze a {type(model).__name__}: pass an ONNX path, "
                         "'zoo:NAME', 'file.py:Class', an onnx.ModelProto, an ExportedProgram, "
                         "an fx.GraphModule or an nn.Module")


def _onnx_estimate(graph, note: Progress):
    """An ONNX graph has no backward: the training step is ESTIMATED from per-op save rules
    (passes/backward_estimate.py; labelled in the report's warnings). The PyTorch model gives
    the exact joint graph instead (AOTAutograd)."""
    from graphcost.passes.backward_estimate import estimate_joint
    note("estimating the backward from per-op save rules")
    return estimate_joint(graph)


def _onnx_path_graph(path: Path, batch, dims, input_shapes, note: Progress):
    from graphcost.analyzer.frontends.onnx_frontend import load_model, lower_onnx

    note(f"reading {path.name}")
    proto = load_model(path)
    note("inferring shapes")
    return lower_onnx(proto, name=path.name, batch=batch, dims=dims, input_shapes=input_shapes)


def _zoo_graph(name: str, batch, dims, input_shapes, exporter: str, note: Progress,
               train: bool = False):
    try:
        from graphcost import models_zoo
    except ImportError as exc:  # pragma: no cover - an install without torch
        raise GraphcostError(f"the model zoo needs torch: {exc}") from None
    if name not in models_zoo.names():
        raise GraphcostError(f"no zoo model {name!r}; known: " + ", ".join(sorted(models_zoo.names())))
    # the zoo's own sizes (seq=64 …) unless the caller binds them
    dims = {**models_zoo.default_dims(name), **(dims or {})}
    spec = models_zoo.get(name)
    if exporter == "fx" or spec.meta_only or spec.hf:
        shapes = dict(input_shapes or models_zoo.input_shapes(name, batch or 1, **dims))
        note(f"building zoo:{name} on the meta device")
        import torch

        from graphcost.analyzer.frontends.torch_capture import make_fakes
        try:
            with torch.device("meta"):
                module = spec.build().eval()
        except ImportError as exc:  # a transformers model without transformers
            raise GraphcostError(f"zoo:{name} needs transformers (pip install "
                                 f"'graphcost[hf]'): {exc}") from None
        fakes = make_fakes(module, shapes, spec.input_dtypes)
        # transformers models take their inputs by name; the other zoo models' input names
        # need not be forward's argument names: passed in order
        graph = _torch_graph(module, fakes if spec.hf else tuple(fakes.values()), None, None,
                             None, note, train)
        return _renamed(graph, f"zoo:{name}", dims)
    note(f"exporting zoo:{name} to ONNX (cached)")
    try:
        path = Path(models_zoo.cached_export(name))
    except models_zoo.ZooExportError as exc:
        raise GraphcostError(str(exc)) from None
    if input_shapes:
        dims = {}
    from graphcost.analyzer.frontends.onnx_frontend import load_model, lower_onnx
    return lower_onnx(load_model(path), name=f"zoo:{name}", batch=batch, dims=dims,
                      input_shapes=input_shapes)


def _renamed(graph, name: str, dims: Mapping[str, int]):
    from dataclasses import replace
    from types import MappingProxyType
    return replace(graph, name=name, dims=MappingProxyType(dict(graph.dims, **dims)))


def _file_class_graph(spec: str, batch, input_shapes, input_dtypes, note: Progress,
                      train: bool = False):
    from graphcost.analyzer.frontends.torch_capture import build_on_meta, load_class

    if not input_shapes:
        raise GraphcostError(f"{spec}: pass the input sizes, e.g. --input-shape x=1x3x224x224")
    note(f"importing {spec}")
    cls, cls_name = load_class(spec)
    module = build_on_meta(cls, cls_name)
    graph = _torch_graph(module, None, batch, input_shapes, input_dtypes, note, train)
    return _renamed(graph, cls_name, {})


def _torch_graph(model, example_inputs, batch, input_shapes, input_dtypes, note: Progress,
                 train: bool = False):
    import torch

    from graphcost.analyzer.frontends.fx_frontend import lower_exported
    from graphcost.analyzer.frontends.torch_capture import (call_defaults, export_module,
                                                            fake_inputs, traceable_experts)

    name = type(model).__name__
    if isinstance(model, torch.export.ExportedProgram) and train:
        example_inputs = model.example_inputs[0] if model.example_inputs else ()
        model = model.module()
    if isinstance(model, torch.export.ExportedProgram):
        if batch is not None or input_shapes:
            raise GraphcostError("an exported program has fixed shapes: --batch and "
                                 "--input-shape do not apply (re-export at the size you want)")
        note("lowering the exported program")
        user = [s.arg.name for s in model.graph_signature.input_specs
                if s.kind.name == "USER_INPUT"]
        vals = [n.meta.get("val") for n in model.graph.nodes
                if n.op == "placeholder" and n.name in user]
        return lower_exported(model, name="ExportedProgram", batch=_batch_of(vals))
    if not isinstance(model, torch.nn.Module):
        raise GraphcostError(f"cannot analyze a {name}")
    if example_inputs is not None:
        kwargs: dict = {}
        if isinstance(example_inputs, Mapping):  # keyword inputs by forward argument name
            args, kwargs = (), dict(example_inputs)
        else:
            args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) \
                else (example_inputs,)
        if batch is not None:
            raise GraphcostError("batch= applies to input_shapes; with example_inputs the "
                                 "batch is the inputs' own")
    elif input_shapes:
        shapes = {k: tuple(v) for k, v in input_shapes.items()}
        if batch is not None:
            if batch <= 0:
                raise GraphcostError(f"--batch must be a positive integer, got {batch}")
            shapes = {k: (batch, *v[1:]) if v else v for k, v in shapes.items()}
        args, kwargs = (), fake_inputs(model, shapes, input_dtypes)
    else:
        raise GraphcostError(f"{name}: pass example_inputs or input_shapes")
    batch_size = _batch_of((*args, *kwargs.values()))
    kwargs = call_defaults(model, kwargs)
    with traceable_experts(model) as notes:
        if train:
            from graphcost.analyzer.frontends.fx_frontend import lower_joint
            from graphcost.analyzer.frontends.torch_capture import export_joint
            note(f"tracing {name}'s forward and backward (torch.export, then AOTAutograd)")
            gm, sig, prefix, scopes = export_joint(model, args, kwargs, name=name)
            graph = lower_joint(gm, sig, model, prefix, scopes, name=name, batch=batch_size)
        else:
            note(f"tracing {name} with torch.export")
            references: dict[str, str] = {}  # how long the model's Python holds each tensor
            ep = export_module(model, args, kwargs, name=name, references=references)
            note("decomposing and lowering")
            graph = lower_exported(ep, name=name, batch=batch_size, references=references)
    if notes:
        from dataclasses import replace
        graph = replace(graph, warnings=graph.warnings + tuple(notes))
    return graph


def _device(device):
    if device is None or not isinstance(device, str):
        return device
    from graphcost.analyzer.devices import get_device
    return get_device(device)


def _batch_of(tensors) -> int:
    for t in tensors:
        shape = getattr(t, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return 1


def analyze(model, example_inputs: Sequence[Any] | None = None, *, batch: int | None = None,
            dims: Mapping[str, int] | None = None,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            input_dtypes: Mapping[str, Any] | None = None,
            include_inputs: bool = True, inplace: bool = False, lifetimes: str | None = None,
            zoo_exporter: str = "onnx", progress: Progress | None = None,
            train: bool = False, optimizer: str = "adam",
            checkpoint: Mapping[str, Any] | None = None, precision: str = "fp32",
            device: Any = None, tf32: bool = False, overhead: Any = None,
            what_ifs: bool = True) -> Report:
    """Analyze ``model`` at the given bindings; see the module docstring for what it accepts.

    ONNX: ``batch`` binds axis 0 of the graph inputs (default 1), ``dims`` any other symbolic
    dim by name, ``input_shapes`` whole input shapes. PyTorch: ``example_inputs`` (real, fake
    or meta tensors) or ``input_shapes`` (+ ``input_dtypes``, default float32) by forward
    argument name; ``batch`` replaces axis 0 of ``input_shapes``. ``progress`` receives short
    stage messages (the CLI shows them; nothing is printed otherwise). ``train`` analyzes one
    training step of a PyTorch model (its joint forward+backward graph) with ``optimizer``
    (none, sgd, momentum, adam, adamw); ``checkpoint`` adds a checkpoint plan:
    ``{"names": [...]}``, ``{"every": N}``, ``{"sqrt": True}`` or ``{"budget": BYTES}`` (the
    plan with the least recompute that fits); ``precision`` fp16-mixed / bf16-mixed (training)
    analyzes half-precision weights, activations and gradients with fp32 master weights and
    optimizer state. ``device`` (a name such as "a100-40gb" or an analyzer.devices.Device)
    adds the roofline time per node and whether the memory fits with ``overhead``
    (analyzer.devices.Overhead); ``tf32`` uses the TF32 rate for fp32 matmuls.
    ``what_ifs=False`` skips the training what-ifs (each re-runs the training passes). Raises
    GraphcostError.
    """
    from graphcost.analyzer.pipeline import run_passes

    # The IR is hundreds of thousands of small acyclic objects: the cyclic collector would
    # rescan them again and again (≈15% of the time on a 100k-node graph) and free nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        graph = load_graph(model, example_inputs, batch=batch, dims=dims,
                           input_shapes=input_shapes, input_dtypes=input_dtypes,
                           zoo_exporter=zoo_exporter, progress=progress, train=train)
        if progress:
            progress("running the passes")
        if checkpoint and not train:
            raise GraphcostError("checkpoint plans need a training analysis (--train)")
        if precision != "fp32" and not train:
            raise GraphcostError("--precision is a training recipe: add --train")
        return run_passes(graph, include_inputs=include_inputs, inplace=inplace,
                          lifetimes=lifetimes, optimizer=optimizer if train else None,
                          checkpoint=dict(checkpoint) if checkpoint else None,
                          precision=precision, device=_device(device), tf32=tf32,
                          overhead=overhead, savers=what_ifs)
    finally:
        if was_enabled:
            gc.enable()
