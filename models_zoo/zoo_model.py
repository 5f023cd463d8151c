"""One zoo model's entry: how to build it, its inputs and their dims. Below the registry, so
that the families it lists lazily (detection.py, hf.py) can describe their models without
importing it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

BATCH = "batch"
SEQ = "seq"


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[], nn.Module]
    # batch (plus optional model-specific keyword dims, e.g. seq=...) -> {input_name: shape}
    input_shapes: Callable[..., dict[str, tuple[int, ...]]]
    input_dtypes: dict[str, torch.dtype]
    description: str
    # input_name -> {axis: dim_name}; axis 0 is always "batch", transformers also have axis 1 "seq"
    dynamic_dims: dict[str, dict[int, str]]
    # names of the model outputs, in forward() order (used as ONNX output names)
    output_names: tuple[str, ...] = ("output",)
    # output_name -> {axis: dim_name}; default: {0: "batch"} for every output
    output_dynamic_dims: dict[str, dict[int, str]] = field(default_factory=dict)
    # integer inputs: input_name -> (low, high) for torch.randint (high exclusive)
    int_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    # too large to materialize: analyze it traced on the meta device (--fx), never export it
    meta_only: bool = False
    # a transformers model (models_zoo/hf.py): inputs passed by name, traced with torch.export
    # only (never exported to ONNX); needs the optional extra ``hf``
    hf: bool = False
    # traced with torch.export only (a custom op no ONNX exporter writes: the detection
    # models' NMS); built and run for real as any other
    torch_only: bool = False
    # the dtype the published model's config gives its weights (None: float32); inference
    # and serving analyze it in that dtype unless --dtype says otherwise (training: the
    # --precision recipe's)
    dtype: str | None = None
    # a miniature of a published model, named after it: what it stands in for (the model
    # line says so: zoo:gpt2 is not GPT-2 small)
    stand_in: str | None = None

    def output_dims(self) -> dict[str, dict[int, str]]:
        return {o: dict(self.output_dynamic_dims.get(o, {0: BATCH})) for o in self.output_names}
