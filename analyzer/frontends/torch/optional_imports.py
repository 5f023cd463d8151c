"""torchvision (and torchao) beside torch. timm imports torchvision, and so does transformers
(its image utilities, on the way to any model class) whenever it is installed, as it imports
torchao (its quantizers). A torchvision built for another torch,
or PyPI's CUDA build beside a CPU-only torch, fails inside its own import ("operator
torchvision::nms does not exist"), which would reach the user as an internal error: here it is
one line naming both versions and the pip command that pairs them.

torch 2.N pairs with torchvision 0.(N+15) of the same patch release (2.8.0 and 0.23.0, 2.13.0
and 0.28.0, 2.14.1 and 0.29.1); each torchvision wheel pins its torch (``Requires-Dist: torch
(==2.13.0)``). PyPI's Linux torchvision is built against PyPI's CUDA torch; the CPU build of
both is on PyTorch's own index only.
"""
from __future__ import annotations

import re
import sys

from ....passes.errors import GraphcostError, first_line

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torchvision_problem() -> str | None:
    """None where torchvision is absent or imports beside this torch; else one line: what does
    not match and how to install the torchvision that does."""
    import importlib
    import importlib.util

    if "torchvision" in sys.modules:  # (imported already, so it works: a failed import is gone)
        return None
    if importlib.util.find_spec("torchvision") is None:
        return None
    try:  # (by name: it is absent where the type checker runs)
        importlib.import_module("torchvision")
    except Exception as exc:  # noqa: BLE001 - whatever its import raises, said in one line
        return _mismatch(exc)
    return None


def check_torchvision(about: str, *, without: str = "") -> None:
    """GraphcostError, one line about ``about``, where torchvision is installed but does not
    import beside this torch; ``without``: what runs without torchvision (transformers), which
    makes uninstalling it the other fix."""
    problem = torchvision_problem()
    if problem:
        other = f"; or pip uninstall torchvision: {without} runs without it" if without else ""
        raise GraphcostError(f"{about}: {problem}{other}")


def torchao_problem() -> str | None:
    """None where torchao is absent or imports beside this torch; else one line. Each torchao
    release is built for one torch, and transformers imports it whenever it is installed: a
    newer one beside torch 2.8 fails inside its own import ("cannot import name
    'ScalingType' from 'torch.nn.functional'"), and every transformers model with it."""
    import importlib
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    import torch

    if "torchao" in sys.modules or importlib.util.find_spec("torchao") is None:
        return None
    try:
        importlib.import_module("torchao")
    except Exception as exc:  # noqa: BLE001 - whatever its import raises, said in one line
        try:
            have = version("torchao")
        except PackageNotFoundError:
            have = "(version unknown)"
        first = first_line(exc, 200)
        public = torch.__version__.partition("+")[0]
        return (f"torchao {have} does not import beside torch {torch.__version__} "
                f"({type(exc).__name__}: {first}): pip install the torchao release built for "
                f"torch {public}")
    return None


def check_transformers_companions(about: str) -> None:
    """GraphcostError, one line about ``about``, where a package transformers imports
    whenever it is installed (torchvision, torchao) is installed but does not import beside
    this torch; uninstalling it is the other fix."""
    check_torchvision(about, without="transformers")
    problem = torchao_problem()
    if problem:
        raise GraphcostError(f"{about}: {problem}; or pip uninstall torchao: transformers "
                             "runs without it")


def torchvision_install(more: str = "") -> str:
    """The pip command that installs the torchvision built for the installed torch (with
    ``more`` beside it)."""
    import torch

    public, _, local = torch.__version__.partition("+")
    m = re.fullmatch(r"2\.(\d+)\.(\d+)", public)
    pair = " ".join(filter(None, [f"torchvision==0.{int(m[1]) + 15}.{m[2]}" if m
                                  else "torchvision", more]))
    if local == "cpu":  # (PyPI's torchvision needs PyPI's CUDA torch, which runs on a CPU too)
        return (f'pip install "torch=={public},!={public}+cpu" {pair} (PyPI\'s CUDA builds, '
                f"which run on a CPU too; torchvision's CPU build is on {CPU_INDEX})")
    return f"pip install {pair}"


def _mismatch(exc: Exception) -> str:
    import torch

    have, wants = _tagged_version(), _torch_requirement()
    public = torch.__version__.partition("+")[0]
    if wants and not _satisfies(public, wants):
        why = f"does not match torch {torch.__version__} (it requires torch{wants})"
    elif "+cu" in have and torch.version.cuda is None:
        why = (f"is a CUDA build, which does not load beside torch {torch.__version__} "
               "(built without CUDA)")
    else:
        first = first_line(exc)
        why = f"does not import beside torch {torch.__version__} ({type(exc).__name__}: {first})"
    return f"torchvision {have} {why}: {torchvision_install()}"


def _tagged_version() -> str:
    """torchvision's version with its build tag (0.28.0+cu130), from its version.py read as
    text (its own import is what fails), else from its metadata (0.28.0)."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    spec = importlib.util.find_spec("torchvision")
    try:
        text = Path(spec.origin).with_name("version.py").read_text() if spec and spec.origin \
            else ""
        tagged = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", text, re.M)
        return tagged[1] if tagged else version("torchvision")
    except (OSError, PackageNotFoundError):
        return "(version unknown)"


def _torch_requirement() -> str | None:
    """The torch versions torchvision's metadata requires (``==2.13.0``, ``>=2.14.0``)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("torchvision") or []
    except PackageNotFoundError:  # (a source tree on the path, not an installed wheel)
        return None
    for req in reqs:
        m = re.fullmatch(r"torch\s*\(?([^();]*)\)?", req.split(";")[0].strip())
        if m and m[1].strip():
            return m[1].replace(" ", "")
    return None


def _satisfies(version: str, spec: str) -> bool:
    """Whether a release (2.13.0) meets a specifier of plain releases (``>=2.14.0,<2.15``);
    what this cannot read counts as met (the import's own error is said instead)."""
    ops = {"==": tuple.__eq__, "!=": tuple.__ne__, ">=": tuple.__ge__, "<=": tuple.__le__,
           ">": tuple.__gt__, "<": tuple.__lt__}
    for clause in spec.split(","):
        m = re.fullmatch(r"(==|!=|>=|<=|>|<)(\d+(?:\.\d+)*)", clause)
        if m and re.fullmatch(r"\d+(?:\.\d+)*", version):
            have, want = (tuple(int(p) for p in v.split(".")) for v in (version, m[2]))
            n = max(len(have), len(want))  # (2.14 is 2.14.0)
            if not ops[m[1]](have + (0,) * (n - len(have)), want + (0,) * (n - len(want))):
                return False
    return True


def transformers_model(model) -> bool:
    """Whether ``model`` is a transformers model (transformers imported already: a model of
    it cannot exist otherwise)."""
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)
