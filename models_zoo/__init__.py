"""graphcost reference model zoo: plain-torch models with example inputs and ONNX export.

>>> from models_zoo import MODELS, example_inputs, export_onnx, cached_export
>>> m = build_model("small_cnn"); y = m(*example_inputs("small_cnn", batch=2))
"""

from .export import ZooExportError, cache_dir, cached_export, export_onnx
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

__all__ = [
    "MODELS",
    "ZooModel",
    "ZooExportError",
    "build_model",
    "cache_dir",
    "cached_export",
    "default_dims",
    "example_inputs",
    "export_onnx",
    "get",
    "input_shapes",
    "names",
]
