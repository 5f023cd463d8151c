"""``timm:NAME``: a timm architecture by the name ``timm.create_model`` takes, built on the
meta device without weights (``pretrained=False``: nothing is downloaded) and analyzed at
its default input size (its ``pretrained_cfg``'s ``input_size``). timm is an optional extra:
``pip install 'graphcost[timm]'`` (it needs torchvision, which must match the installed torch).
"""
from __future__ import annotations

from typing import Any

from ....passes.errors import GraphcostError, did_you_mean

PREFIX = "timm:"


def build(name: str) -> tuple[Any, tuple[int, ...]]:
    """(the model on the meta device in eval mode, its default input shape (C, H, W))."""
    timm = _timm()
    import torch

    if not timm.is_model(name):
        raise GraphcostError(f"no timm model {name!r}"
                             f"{did_you_mean(name, timm.list_models(), 'timm:{}')}")
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False).eval()
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224)
    return model, tuple(int(d) for d in size)


def _timm():
    import importlib

    try:  # (by name: the optional extra is absent where the type checker runs)
        timm = importlib.import_module("timm")
    except ImportError as exc:
        raise GraphcostError(f"timm:NAME needs timm (pip install 'graphcost[timm]', with the "
                             f"torchvision that matches your torch): {exc}") from None
    return timm
