"""ONNX export of zoo models (legacy TorchScript exporter or the dynamo exporter) and an
on-disk export cache."""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from pathlib import Path

import onnx
import torch

from .cache import LEGACY_DEFAULT_OPSET, cache_dir, cache_path, zoo_props
from .registry import build_model, default_dims, example_inputs, get, input_shapes

EXPORT_BATCH = 2  # torch.export specialises sizes 0/1, so trace with batch 2


class ZooExportError(RuntimeError):
    """Raised when a zoo model cannot be exported to ONNX."""


def _export_legacy(model, args, path: Path, spec, opset: int) -> None:
    dynamic_axes = {**spec.dynamic_dims, **spec.output_dims()}
    with warnings.catch_warnings():
        # TracerWarning is public but torch.jit's __all__ omits it
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # pyright: ignore[reportPrivateImportUsage]
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*constant folding be turned off.*")
        torch.onnx.export(
            model,
            args,
            str(path),
            dynamo=False,
            input_names=list(input_shapes(spec.name, EXPORT_BATCH)),
            output_names=list(spec.output_names),
            opset_version=opset,
            dynamic_axes=dynamic_axes,
            # Keep BatchNormalization nodes: the default eval export folds BN into Conv, which
            # changes the parameter count (and the FLOPs) away from the PyTorch model's.
            training=torch.onnx.TrainingMode.PRESERVE,
        )


def _export_dynamo(model, args, path: Path, spec, opset: int | None) -> None:
    try:
        import onnxscript  # noqa: F401  (required by the dynamo exporter)
    except ImportError as e:  # pragma: no cover
        raise ZooExportError("the dynamo ONNX exporter needs the 'onnxscript' package") from e
    from torch.export import Dim

    names = list(input_shapes(spec.name, EXPORT_BATCH))
    dims: dict[str, Dim] = {}  # one Dim object per dim name, shared by all inputs
    dynamic_shapes = tuple(
        {axis: dims.setdefault(dn, Dim(dn)) for axis, dn in spec.dynamic_dims.get(n, {}).items()} for n in names
    )
    reg_logger = logging.getLogger("torch.onnx._internal.exporter._registration")
    old_level = reg_logger.level
    try:
        # expected noise: "torchvision is not installed" logs, pytree FutureWarnings and
        # "axis name ... will not be used" when inputs share a Dim (bert's batch/seq)
        reg_logger.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", message=r".*axis name.*will not be used.*", category=UserWarning)
            prog = torch.onnx.export(
                model,
                args,
                dynamo=True,
                input_names=names,
                output_names=list(spec.output_names),
                opset_version=opset,
                dynamic_shapes=dynamic_shapes,
                external_data=False,
                report=False,
                verbose=False,
            )
    except Exception as e:
        raise ZooExportError(f"the dynamo ONNX exporter failed on zoo model {spec.name!r}: {type(e).__name__}: {e}") from e
    finally:
        reg_logger.setLevel(old_level)
    assert prog is not None  # dynamo=True always returns the ONNXProgram
    prog.save(str(path), external_data=False)


def _rename_dim_params(model: onnx.ModelProto, spec) -> None:
    """Make graph input/output dim_params use the zoo's dim names ("batch", "seq")."""
    mapping: dict[str, str] = {}
    for vi in model.graph.input:
        for axis, dn in spec.dynamic_dims.get(vi.name, {}).items():
            d = vi.type.tensor_type.shape.dim[axis]
            if d.dim_param and d.dim_param != dn:
                mapping[d.dim_param] = dn
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param in mapping:
                d.dim_param = mapping[d.dim_param]


def export_onnx(name: str, path: str | os.PathLike, *, dynamo: bool = False, opset: int | None = None) -> Path:
    """Export zoo model ``name`` (seed 0, eval mode) to ``path`` with all weights inside the
    .onnx file. Inputs are named as in ``input_shapes``, outputs as ``output_names``, and
    the ``dynamic_dims`` are symbolic ("batch", "seq"). ``dynamo=False`` uses the legacy
    TorchScript exporter (default opset 17); ``dynamo=True`` uses ``torch.export`` +
    onnxscript (default opset: the exporter's own). Raises :class:`ZooExportError` if the
    model cannot be exported."""
    spec = get(name)
    if spec.torch_only:
        raise ZooExportError(f"zoo model {name!r} is traced with torch.export only (a custom "
                             "op no ONNX exporter writes): analyze zoo:" + name)
    if spec.meta_only:
        raise ZooExportError(f"zoo model {name!r} is too large to export (its weights would be "
                             "materialized): analyze it traced on the meta device instead "
                             "(graphcost zoo:" + name + " --fx)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = build_model(name)
    args = example_inputs(name, EXPORT_BATCH)
    with torch.no_grad():
        if dynamo:
            _export_dynamo(model, args, path, spec, opset)
        else:
            _export_legacy(model, args, path, spec, opset or LEGACY_DEFAULT_OPSET)
    # weights must be embedded and dims named consistently
    proto = onnx.load(str(path), load_external_data=False)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        raise ZooExportError(f"export of {name!r} produced external data; expected embedded weights")
    _rename_dim_params(proto, spec)
    # what the registry says that the analysis of the file needs: a cached export is then
    # analyzed without importing torch (cache.py)
    onnx.helper.set_model_props(proto, {**{p.key: p.value for p in proto.metadata_props},
                                        **zoo_props(default_dims(name), spec.int_ranges)})
    onnx.save(proto, str(path))
    return path


def cached_export(name: str, *, dynamo: bool = False, opset: int | None = None) -> Path:
    """Export ``name`` once into :func:`cache_dir` (keyed by model, exporter, opset, torch
    version and zoo version) and return the path. Writes go to a temp file in the same
    directory and are published with ``os.replace``, so concurrent callers never see a
    partial file (at worst both export and the last rename wins)."""
    if get(name).meta_only:  # validate the name early
        export_onnx(name, "")
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    final = cache_path(name, dynamo, opset)
    if final.exists():
        return final
    fd, tmp = tempfile.mkstemp(prefix=f".{final.stem}.", suffix=".tmp.onnx", dir=d)
    os.close(fd)
    try:
        export_onnx(name, tmp, dynamo=dynamo, opset=opset)
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return final
