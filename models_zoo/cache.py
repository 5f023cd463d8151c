"""The zoo's on-disk ONNX export cache: where an export lives and what it records beside its
graph, without importing torch.

``graphcost zoo:resnet50`` analyzes the zoo model's ONNX export. Once that export is in the
cache, the analysis needs nothing from torch: the file names the torch release that wrote it
(read from the installed package's metadata, not by importing torch, which takes about 2 s of
the command's 3 s) and carries in its ``metadata_props`` what the registry would otherwise
say — the default sizes of its symbolic dims and its integer inputs' ranges.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from pathlib import Path
from typing import Any

LEGACY_DEFAULT_OPSET = 17
# Bump when a model definition or the export recipe changes, to invalidate caches.
ZOO_VERSION = 5
# metadata_props keys of a cached export
DIMS_KEY = "graphcost.zoo.default_dims"       # {"seq": 64}
RANGES_KEY = "graphcost.zoo.int_ranges"       # {"input_ids": [0, 1000]}


def cache_dir() -> Path:
    """``$GRAPHCOST_CACHE`` if set (used as-is), else ``~/.cache/graphcost/zoo``."""
    env = os.environ.get("GRAPHCOST_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "graphcost" / "zoo"


def torch_release() -> str:
    """The installed torch's version as its package metadata says (a CUDA wheel's is
    "2.14.1", its ``torch.__version__`` "2.14.1+cu130"): one export per release."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a torch built in place: ask it
        import torch
        return torch.__version__


def cache_path(name: str, dynamo: bool = False, opset: int | None = None) -> Path:
    """Where ``name``'s export (by that exporter and opset) lives in :func:`cache_dir`."""
    exporter = "dynamo" if dynamo else "legacy"
    op = opset or (LEGACY_DEFAULT_OPSET if not dynamo else "default")
    release = re.sub(r"[^0-9A-Za-z._-]", "_", torch_release())
    return cache_dir() / f"{name}-{exporter}-opset{op}-torch{release}-zoo{ZOO_VERSION}.onnx"


def zoo_props(default_dims: dict[str, int], int_ranges: dict[str, tuple[int, int]]
              ) -> dict[str, str]:
    """The ``metadata_props`` an export records (the registry's facts the analysis needs)."""
    return {DIMS_KEY: json.dumps(default_dims, sort_keys=True),
            RANGES_KEY: json.dumps({k: list(v) for k, v in int_ranges.items()}, sort_keys=True)}


def read_props(proto: Any) -> tuple[dict[str, int], dict[str, tuple[int, int]]] | None:
    """(default dims, integer ranges) from an export's ``metadata_props``; None when it has
    none, or they do not read as :func:`zoo_props` writes them (then the registry is asked)."""
    props = {p.key: p.value for p in proto.metadata_props}
    try:
        dims = {str(k): int(v) for k, v in json.loads(props[DIMS_KEY]).items()}
        ranges = {str(k): (int(v[0]), int(v[1]))
                  for k, v in json.loads(props[RANGES_KEY]).items()}
    except (KeyError, ValueError, TypeError, AttributeError, IndexError):
        return None   # none recorded, or not as written here
    return dims, ranges
