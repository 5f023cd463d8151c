"""graphcost reference model zoo: plain-torch models with example inputs and ONNX export.

>>> from models_zoo import MODELS, example_inputs, export_onnx, cached_export
>>> m = build_model("small_cnn"); y = m(*example_inputs("small_cnn", batch=2))

The names below are imported on first use (PEP 562), so that ``models_zoo.cache`` — all that
analyzing a cached export needs — loads without torch.
"""
# pyright: reportUnsupportedDunderAll=false
from __future__ import annotations

from typing import TYPE_CHECKING

from .cache import cache_dir

if TYPE_CHECKING:
    from .export import ZooExportError, cached_export, export_onnx
    from .registry import (
        MODELS,
        ZooModel,
        build_model,
        default_dims,
        example_inputs,
        get,
        input_shapes,
        names,
    )

_EXPORT = ("ZooExportError", "cached_export", "export_onnx")
_REGISTRY = ("MODELS", "ZooModel", "build_model", "default_dims", "example_inputs", "get",
             "input_shapes", "names")
__all__ = ["MODELS", "ZooExportError", "ZooModel", "build_model", "cache_dir", "cached_export",
           "default_dims", "example_inputs", "export_onnx", "get", "input_shapes", "names"]


def __getattr__(name: str):
    if name in _EXPORT:
        from . import export
        return getattr(export, name)
    if name in _REGISTRY:
        from . import registry
        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
