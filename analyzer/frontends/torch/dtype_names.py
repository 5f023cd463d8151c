"""A torch dtype as the IR names it (passes/ir.py DTYPE_BITS): torch's own name, but for the
narrow floats, which the IR spells as ONNX does (``float8_e4m3fn`` is ``float8e4m3fn``) so
that a float8 tensor of torchao's linears counts its byte an element, not none."""
from __future__ import annotations

import torch

_NARROW = {"float8_e4m3fn": "float8e4m3fn", "float8_e4m3fnuz": "float8e4m3fnuz",
           "float8_e5m2": "float8e5m2", "float8_e5m2fnuz": "float8e5m2fnuz",
           "float8_e8m0fnu": "float8e8m0",
           # two fp4 values packed in one byte: an element of this dtype is a byte
           "float4_e2m1fn_x2": "uint8"}


def dtype_name(dt: torch.dtype) -> str:
    name = str(dt).removeprefix("torch.")
    return _NARROW.get(name, name)
