"""``timm:NAME``: a timm architecture by the name ``timm.create_model`` takes, built on the
meta device without weights (``pretrained=False``: nothing is downloaded) and analyzed at
its default input size (its ``pretrained_cfg``'s ``input_size``). timm is an optional extra;
it imports torchvision, which must be the build for the installed torch: a torchvision that
does not import beside it, or none, is one line naming the pip command that pairs them
(optional_imports.py).
"""
from __future__ import annotations

from typing import Any

from ....passes.errors import GraphcostError, did_you_mean
from .optional_imports import check_torchvision, torchvision_install

PREFIX = "timm:"


def build(name: str) -> tuple[Any, tuple[int, ...]]:
    """(the model on the meta device in eval mode, its default input shape (C, H, W))."""
    timm = _timm(name)
    import torch

    if not timm.is_model(name):
        raise GraphcostError(f"no timm model {name!r}"
                             f"{did_you_mean(name, timm.list_models(), 'timm:{}')}")
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False).eval()
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224)
    return model, tuple(int(d) for d in size)


def _timm(name: str):
    import importlib

    check_torchvision(f"{PREFIX}{name}")  # (timm imports it, and a broken one fails deep inside)
    try:  # (by name: the optional extra is absent where the type checker runs)
        timm = importlib.import_module("timm")
    except ImportError as exc:
        what = "timm" if exc.name in (None, "timm") else f"timm and {exc.name}"
        raise GraphcostError(f"{PREFIX}{name} needs {what} ({exc}): "
                             f"{torchvision_install('timm')}") from None
    return timm
