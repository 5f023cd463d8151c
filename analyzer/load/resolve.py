"""The one model resolver: what a model argument names, and the model and inputs it stands for.

``analyze``/``load_graph`` (analyzer/load/loading.py), ``verify`` (analyzer/measure/verify.py) and the command
line all start here, so a model spec and its bindings mean the same everywhere:

* an ``.onnx`` path or an ``onnx.ModelProto`` → an ONNX model (its inputs are bound by the ONNX
  frontend from ``batch``, ``dims``, ``input_shapes``);
* ``zoo:NAME`` → the zoo's cached ONNX export, or with ``fx`` (and always for training and for
  meta-only models) the zoo's torch module and inputs of the zoo's sizes;
* ``path/to/file.py:Class`` → that class built with no arguments (this RUNS the file) and inputs
  of ``input_shapes`` (+ ``input_dtypes``);
* a ``.pt2`` archive or an ``ExportedProgram`` → the program (fixed shapes);
* an ``nn.Module`` → the module with ``example_inputs`` or ``input_shapes``.

A torch model is built on the meta device with fake inputs for analysis, or (``materialize``)
with seeded random weights and real inputs for measuring. Nothing here lowers or analyzes.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ...passes.errors import GraphcostError, did_you_mean, opt
from .model_names import file_class, model_text, not_a_class
from .progress import Progress

ZOO_PREFIX = "zoo:"
TIMM_PREFIX = "timm:"
# torch.export names the sizes the data decides u0, u1… (unbacked symbols): a --dim of that
# name sets such a size's maximum on the torch route (analyzer/frontends/torch/bounded_trace.py)
UNBACKED = re.compile(r"u\d+")
# Files of tensors without a graph, told apart by name alone: graphcost never opens them
# (unpickling a .pt runs code) and there is nothing in them to cost. Read as ONNX, they used
# to fail with a protobuf DecodeError that said nothing of what to pass instead.
WEIGHTS_FILES = {
    ".pt": "a PyTorch weights file (a state dict or checkpoint)",
    ".pth": "a PyTorch weights file (a state dict or checkpoint)",
    ".ckpt": "a checkpoint (weights and training state)",
    ".bin": "a weights file (as pytorch_model.bin)",
    ".safetensors": "a safetensors weights file",
}


@dataclass(frozen=True)
class Bindings:
    """The sizes a model is analyzed at (the API's and the command line's options)."""
    batch: int | None = None
    dims: Mapping[str, int] = field(default_factory=dict)
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    input_dtypes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolved:
    kind: str                           # "onnx" | "torch" | "program"
    name: str                           # the report's model name
    onnx: Any = None                    # kind onnx: a ModelProto (weights not loaded)
    path: Path | None = None            # kind onnx: the file it was read from, if any
    dims: Mapping[str, int] = field(default_factory=dict)   # kind onnx: dims to bind
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    module: Any = None                  # kind torch: the module (meta / real weights)
    inputs: tuple = ()                  # kind torch: positional forward inputs
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # kind torch: keyword inputs
    program: Any = None                 # kind program: a torch.export.ExportedProgram
    int_ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # random ids
    maxima: Mapping[str, int] = field(default_factory=dict)  # kind torch: data-dependent sizes
    own_dtype: str | None = None        # kind torch: the published weights' dtype (zoo)
    notes: tuple[str, ...] = ()         # what the rank program's rewriting says (the report's)


def batch_of(tensors) -> int:
    """Axis 0 of the first tensor with one (1 when there is none)."""
    for t in tensors:
        shape = getattr(t, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return 1


def is_torch(model: Any) -> bool:
    torch = sys.modules.get("torch")  # a torch object implies torch is already imported
    return torch is not None and isinstance(model, (torch.nn.Module,
                                                    torch.export.ExportedProgram))


def resolve(model, example_inputs: Sequence[Any] | None = None,
            bindings: Bindings = Bindings(), *, fx: bool = False, train: bool = False,
            materialize: bool = False, note: Progress | None = None) -> Resolved:
    """What ``model`` names (see the module docstring). ``train`` and ``fx`` ask for the torch
    module of a zoo model; ``materialize`` builds torch models with real (seeded) weights."""
    note = note or (lambda _m: None)
    if isinstance(model, (str, os.PathLike)):
        text = model_text(model)
        if text.startswith(ZOO_PREFIX):
            return _zoo(text[len(ZOO_PREFIX):], bindings, fx or train, materialize, note)
        if text.startswith(TIMM_PREFIX):
            return _timm(text[len(TIMM_PREFIX):], bindings, materialize, note)
        if file_class(text) is not None:
            return _file_class(text, bindings, materialize, note)
        from ..frontends.torch import hub
        if hub.is_hub_name(text):
            return _hub(text, bindings, materialize, note)
        path = Path(text)
        if path.is_dir():
            raise GraphcostError(f"{path}: is a directory, not a model file")
        if not path.is_file():
            raise GraphcostError(f"{path}: no such file{not_a_class(text)}")
        refuse_weights_file(path)
        if text.endswith(".pt2"):
            from ..frontends.torch.pt2 import load_pt2
            note(f"reading {path.name}")
            return Resolved("program", path.name, program=load_pt2(path))
        from ..frontends.onnx.frontend import load_model
        note(f"reading {path.name}")
        return _onnx(load_model(path), path.name, bindings, path)
    if is_torch(model):
        import torch
        if isinstance(model, torch.export.ExportedProgram):
            return Resolved("program", "ExportedProgram", program=model)
        return _module(model, example_inputs, bindings, type(model).__name__)
    import onnx
    if isinstance(model, onnx.ModelProto):
        return _onnx(model, model.graph.name or "model", bindings, None)
    raise GraphcostError(f"cannot analyze a {type(model).__name__}: pass an ONNX path, "
                         "'zoo:NAME', 'file.py:Class', an onnx.ModelProto, an ExportedProgram, "
                         "an fx.GraphModule or an nn.Module")


def refuse_weights_file(path: Path) -> None:
    """A weights file named as the model: one line on what it is and what to pass instead."""
    kind = WEIGHTS_FILES.get(path.suffix.lower())
    if kind is not None:
        raise GraphcostError(
            f"{path}: {kind}: tensors, no graph to cost; graphcost takes an .onnx file, a .pt2 "
            "from torch.export.save, path/to/file.py:Class (the model's code) or zoo:NAME "
            "(weights files are never opened)")


def _onnx(proto, name: str, b: Bindings, path: Path | None) -> Resolved:
    if b.input_dtypes:
        from ..frontends.onnx.frontend import DTYPE
        _same_dtypes(b.input_dtypes, {vi.name: DTYPE.get(vi.type.tensor_type.elem_type, "?")
                                      for vi in proto.graph.input}, name)
    return Resolved("onnx", name, onnx=proto, path=path, dims=dict(b.dims),
                    input_shapes=dict(b.input_shapes))


def _cached_zoo(name: str, b: Bindings) -> Resolved | None:
    """zoo:NAME analyzed as its ONNX export when the cache holds it, without importing torch
    (about 2 s of a 3 s command): the file records the registry's facts the analysis needs.
    None: not cached (or written before it recorded them), the registry's route decides."""
    from ...models_zoo.cache import cache_path, read_props
    name = name.lower()   # the zoo's names are all lower-case (below)
    if not re.fullmatch(r"[a-z0-9_]+", name):
        return None       # no zoo name: the registry's route says so
    path = cache_path(name)
    if not path.is_file():
        return None
    from ..frontends.onnx.frontend import load_model
    proto = load_model(path)
    props = read_props(proto)
    if props is None:
        return None
    defaults, ranges = props
    return _zoo_onnx(proto, path, f"zoo:{name}", b, defaults, ranges)


def _zoo_onnx(proto, path: Path, name: str, b: Bindings, defaults: Mapping[str, int],
              ranges: dict[str, tuple[int, int]]) -> Resolved:
    if b.input_dtypes:
        from ..frontends.onnx.frontend import DTYPE
        _same_dtypes(b.input_dtypes, {vi.name: DTYPE.get(vi.type.tensor_type.elem_type, "?")
                                      for vi in proto.graph.input}, name)
    return Resolved("onnx", name, onnx=proto, path=path,
                    dims={} if b.input_shapes else {**defaults, **b.dims},
                    input_shapes=dict(b.input_shapes), int_ranges=ranges)


# long: the zoo's routes (ONNX cache, torch, transformers, meta-only) each a few lines
def _zoo(name: str, b: Bindings, torch_module: bool, materialize: bool,
         note: Progress) -> Resolved:
    if not (torch_module or materialize):
        cached = _cached_zoo(name, b)
        if cached is not None:
            return cached
    try:
        from ... import models_zoo
    except ImportError as exc:  # pragma: no cover - an install without torch
        raise GraphcostError(f"the model zoo needs torch: {exc}") from None
    names = models_zoo.names()
    # Any case names a zoo model, as any case names a device: the zoo's names are ours, all
    # lower-case, so `zoo:ResNet50` can mean nothing but resnet50 (the report says resnet50).
    name = {n.lower(): n for n in names}.get(name.lower(), name)
    if name not in names:
        raise GraphcostError(f"no zoo model {name!r}{did_you_mean(name, names, 'zoo:{}')}; "
                             f"known (in any case): {', '.join(sorted(names))}")
    spec = models_zoo.get(name)
    if b.input_dtypes:
        _same_dtypes(b.input_dtypes, {k: str(v).removeprefix("torch.")
                                      for k, v in spec.input_dtypes.items()}, f"zoo:{name}")
    ranges = {k: (int(v[0]), int(v[1])) for k, v in spec.int_ranges.items()}
    maxima = _maxima(b)
    dims = {**models_zoo.default_dims(name), **{k: v for k, v in b.dims.items()
                                                 if k not in maxima}}
    if spec.meta_only and materialize:
        raise GraphcostError(f"zoo:{name} is never materialized (meta device only): verify "
                             "runs the model for real; pick a model that fits in memory")
    if not (torch_module or spec.meta_only or spec.hf or spec.torch_only):
        note(f"exporting zoo:{name} to ONNX (cached)")
        try:
            path = Path(models_zoo.cached_export(name))
        except models_zoo.ZooExportError as exc:
            raise GraphcostError(str(exc)) from None
        from ..frontends.onnx.frontend import load_model
        return _zoo_onnx(load_model(path), path, f"zoo:{name}", b, dims, ranges)
    try:
        shapes = dict(b.input_shapes or models_zoo.input_shapes(name, b.batch or 1, **{
            k: v for k, v in dims.items() if k != "batch"}))
    except TypeError as exc:
        from ...models_zoo.registry import dim_names
        takes = dim_names(name)
        typo = next((k for k in dims if k != "batch" and k not in takes), None)
        if typo is None:
            raise GraphcostError(f"zoo:{name}: {exc}") from None
        raise _no_such_dim(f"zoo:{name}", typo, takes) from None
    if b.input_shapes and b.batch is not None:
        shapes = {k: (b.batch, *v[1:]) for k, v in shapes.items()}
    from ..frontends.torch.capture import make_fakes, real_inputs
    try:
        if materialize:
            module = models_zoo.build_model(name)
            inputs = real_inputs(shapes, spec.input_dtypes, ranges)
        else:
            import torch
            note(f"building zoo:{name} on the meta device")
            with torch.device("meta"):
                module = spec.build().eval()
            inputs = make_fakes(module, shapes, spec.input_dtypes)
    except ImportError as exc:  # a transformers model without transformers
        if spec.hf:  # (or one whose torchvision import failed: optional_imports)
            from ..frontends.torch.optional_imports import check_transformers_companions
            check_transformers_companions(f"zoo:{name}")
        raise GraphcostError(f"zoo:{name} needs transformers (pip install 'graphcost[hf]'): "
                             f"{exc}") from None
    if spec.hf:  # transformers models take their inputs by name
        return Resolved("torch", f"zoo:{name}", module=module, kwargs=inputs, dims=dims,
                        int_ranges=ranges, maxima=maxima, own_dtype=spec.dtype)
    # the other zoo models' input names need not be forward's argument names: in order
    return Resolved("torch", f"zoo:{name}", module=module, inputs=tuple(inputs.values()),
                    dims=dims, int_ranges=ranges, maxima=maxima, own_dtype=spec.dtype)


def _timm(name: str, b: Bindings, materialize: bool, note: Progress) -> Resolved:
    """A timm architecture (analyzer/frontends/torch/timm_models.py) on meta, at its default
    input size unless ``input_shapes`` says otherwise."""
    from ..frontends.torch import timm_models
    from ..frontends.torch.capture import fake_inputs

    if materialize:
        raise GraphcostError(f"timm:{name} is built on the meta device, without weights: "
                             "verify needs a model it can run")
    note(f"building timm:{name} on the meta device")
    module, size = timm_models.build(name)
    shapes = _batched(b) if b.input_shapes else {"x": (b.batch or 1, *size)}
    return Resolved("torch", f"timm:{name}", module=module,
                    kwargs=fake_inputs(module, shapes, b.input_dtypes))


def _no_such_dim(model: str, typo: str, takes) -> GraphcostError:
    """The error for a ``--dim`` the model does not take, naming those it takes."""
    return GraphcostError(f"{opt('dims', typo)}: {model} has no dim {typo!r}"
                          f"{did_you_mean(typo, takes)}; its dims: "
                          f"{', '.join(takes) or 'batch only'}")


def _hub(text: str, b: Bindings, materialize: bool, note: Progress) -> Resolved:
    """A hub id or a local config (analyzer/frontends/torch/hub.py), built on meta in the config's dtype."""
    from ..frontends.torch import hub

    if materialize:
        raise GraphcostError(f"{text} is built from its config on the meta device, without "
                             "weights: verify needs a model it can run")
    note(f"reading {text}'s config.json and building it on the meta device")
    module, config, dtype, source = hub.build(text)
    # (imported after the config's checks: it imports torch, seconds that a refusal skips)
    from ..frontends.torch import config_inputs
    from ..frontends.torch.capture import make_fakes

    shapes = dict(b.input_shapes) or config_inputs.input_shapes(config, b.batch or 1,
                                                                dict(b.dims), module)
    # (token ids: input_ids, an encoder-decoder's decoder_input_ids)
    dtypes = {n: "int64" if n.endswith("input_ids") else dtype for n in shapes}
    dims = {} if b.input_shapes else \
        {dim: shapes[name][i] for dim, name, i in (("seq", "input_ids", 1),
                                                   ("decoder_seq", "decoder_input_ids", 1),
                                                   ("image", "pixel_values", -1),
                                                   ("samples", "input_values", 1),
                                                   ("frames", "input_features", 1))
         if name in shapes and (dim != "frames" or config_inputs.frames_first(config, module))}
    typo = next((k for k in b.dims if k not in dims and k != "batch"
                 and not re.fullmatch(r"u\d+", k)), None)   # (u3: a data-dependent bound)
    if typo is not None and not b.input_shapes:
        raise _no_such_dim(text, typo, list(dims))
    kwargs = make_fakes(module, shapes, {**dtypes, **b.input_dtypes})
    pad = config_inputs.ordinary_tokens(config, kwargs, module)
    images = config_inputs.image_tokens(config, kwargs, module)
    return Resolved("torch", f"{text} ({str(dtype).removeprefix('torch.')} from {source})",
                    module=module, kwargs=kwargs, dims=dims,
                    notes=tuple(n for n in (pad, images) if n))


def _file_class(spec: str, b: Bindings, materialize: bool, note: Progress) -> Resolved:
    from ..frontends.torch.capture import (
        build_on_meta,
        build_seeded,
        fake_inputs,
        load_class,
        real_inputs,
    )
    if not b.input_shapes:
        raise GraphcostError(f"{spec}: pass the input sizes, e.g. {opt('input_shapes', 'x', '1x3x224x224')}")
    note(f"importing {spec}")
    cls, cls_name = load_class(spec)
    module = build_seeded(cls, cls_name) if materialize else build_on_meta(cls, cls_name)
    shapes = _batched(b)
    fakes = fake_inputs(module, shapes, b.input_dtypes)  # checks the names against forward
    if materialize:
        fakes = real_inputs(shapes, {k: v.dtype for k, v in fakes.items()}, {})
    return Resolved("torch", cls_name, module=module, kwargs=fakes, maxima=_maxima(b))


def _module(model, example_inputs, b: Bindings, name: str) -> Resolved:
    from ..frontends.torch.capture import fake_inputs
    if example_inputs is not None:
        if b.batch is not None:
            raise GraphcostError("batch= applies to input_shapes; with example_inputs the "
                                 "batch is the inputs' own")
        if isinstance(example_inputs, Mapping):  # keyword inputs by forward argument name
            return Resolved("torch", name, module=model, kwargs=dict(example_inputs),
                            maxima=_maxima(b))
        args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) \
            else (example_inputs,)
        return Resolved("torch", name, module=model, inputs=args, maxima=_maxima(b))
    if not b.input_shapes:
        raise GraphcostError(f"{name}: pass example_inputs or input_shapes")
    return Resolved("torch", name, module=model,
                    kwargs=fake_inputs(model, _batched(b), b.input_dtypes), maxima=_maxima(b))


def _maxima(b: Bindings) -> dict[str, int]:
    """The --dim values that name data-dependent sizes (u0, u1…): their maxima."""
    return {k: v for k, v in b.dims.items() if UNBACKED.fullmatch(k)}


def _batched(b: Bindings) -> dict[str, tuple[int, ...]]:
    shapes = {k: tuple(v) for k, v in b.input_shapes.items()}
    if b.batch is not None:
        shapes = {k: (b.batch, *v[1:]) if v else v for k, v in shapes.items()}
    return shapes


def _same_dtypes(asked: Mapping[str, Any], declared: Mapping[str, str], model: str) -> None:
    """A dtype the model would reject is refused: a zoo model's or an ONNX graph's input
    types are the model's own."""
    for name, dtype in asked.items():
        want = str(dtype).removeprefix("torch.")
        have = declared.get(name)
        if have is None:
            raise GraphcostError(f"{opt('input_dtypes', name)}: {model} has no input {name!r}; its "
                                 f"inputs: {', '.join(declared)}")
        if want != have:
            raise GraphcostError(f"{opt('input_dtypes', name, want)}: {model} declares {name} as "
                                 f"{have}; it would reject a {want} input")
