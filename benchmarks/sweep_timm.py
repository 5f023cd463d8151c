"""The breadth sweep's timm models (sweep_breadth.py's docstring says how): one architecture
per family, the smallest-looking name, built and run once under FlopCounterMode."""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Callable

from .sweep_reference import Failed, reference

SIZE_WORDS = ("pico", "femto", "atto", "zepto", "nano", "micro", "xxxs", "xxs", "xs", "tiny",
              "mini", "small", "s", "t", "lite", "medium", "m", "base", "b", "l", "large",
              "huge", "h", "giant", "g")


def _size_key(name: str) -> tuple:
    """Smaller-looking timm names first: a size word (s18 counts as s), a size in the name
    (5m, 1b), the first number, the default input's pixels."""
    from timm.models import get_pretrained_cfg
    tokens = re.split(r"[_.]", name)
    rank = min((SIZE_WORDS.index(w) for t in tokens for w in (t, t.rstrip("0123456789"))
                if w in SIZE_WORDS), default=len(SIZE_WORDS))
    sizes = [int(m.group(1)) * (1000 if m.group(2) == "b" else 1)
             for t in tokens if (m := re.fullmatch(r"(\d+)([mb])", t))]
    number = re.search(r"\d+", tokens[0]) or re.search(r"\d+", name)
    try:
        size = get_pretrained_cfg(name).input_size
        pixels = size[-1] * size[-2]
    except Exception:
        pixels = 224 * 224
    return (rank, min(sizes, default=10**6), int(number.group()) if number else 0, pixels,
            len(name), name)


def timm_families() -> dict[str, str]:
    """{family: its representative model}: one per (timm module, leading letters)."""
    import timm

    families: dict[str, list[str]] = defaultdict(list)
    for module in timm.list_modules():
        for name in timm.list_models(module=module):
            if not name.startswith("test_"):
                lead = re.match(r"[a-z]*", name)
                families[f"{module}/{lead.group() if lead else name}"].append(name)
    return {fam: min(names, key=_size_key) for fam, names in sorted(families.items())}


def prepare_timm(name: str, stage: Callable[[str], None], rec: dict) -> tuple:
    import timm
    import torch

    stage("build")
    try:
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False).eval()
    except Exception as exc:
        raise Failed("build", exc) from None
    rec["model"] = type(model).__name__
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224)
    rec["input"] = "x".join(str(d) for d in (1, *size))
    x = torch.randn((1, *size), generator=torch.Generator().manual_seed(0))
    stage("forward")
    try:
        flops = reference(model, (x,), {})
    except Exception as exc:
        raise Failed("forward", exc) from None
    return model, (x,), flops
