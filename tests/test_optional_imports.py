"""A torchvision that does not import beside this torch (issue 48): timm imports it, and so does
transformers whenever it is installed, and its import fails deep inside ("operator
torchvision::nms does not exist"). ``timm:NAME`` says so in one line, exit 2, with the pip
command that pairs them. The broken torchvision is a stand-in put first on the path (and any
real one imported already set aside): a package whose import raises what the real one raised
beside the 2.13 CPU build, with the metadata the real wheels carry."""
from __future__ import annotations

import sys

import pytest
import torch
from graphcost.analyzer.frontends.torch.optional_imports import (
    _satisfies,
    check_torchvision,
    check_transformers_companions,
    torchao_problem,
)

from graphcost import GraphcostError
from tests.cli_runner import run_cli

# torchvision's wheels on PyPI pin their torch (Requires-Dist): 0.23.0 torch==2.8.0, 0.28.0
# torch==2.13.0; 0.29.1 torch>=2.14.0 (.ci/run pairs it with 2.14.1)
PAIRS = {"2.8.0": "0.23.0", "2.13.0": "0.28.0", "2.14.1": "0.29.1"}
PUBLIC = torch.__version__.partition("+")[0]


@pytest.fixture
def broken_torchvision(tmp_path, monkeypatch):
    """(version, requirement) -> a torchvision that raises on import, first on the path."""
    def make(version: str, requires: str):
        pkg = tmp_path / "torchvision"
        pkg.mkdir()
        (pkg / "__init__.py").write_text(
            'raise RuntimeError("operator torchvision::nms does not exist")\n')
        (pkg / "version.py").write_text(f"__version__ = '{version}'\n")
        release = version.partition("+")[0]
        info = tmp_path / f"torchvision-{release}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\n"
                                       f"Version: {release}\nRequires-Dist: torch ({requires})\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "torchvision", raising=False)
    return make


def test_a_torchvision_for_another_torch_is_one_line(broken_torchvision):
    broken_torchvision("0.0.1", "==1.0.0")
    done = run_cli("timm:resnet50")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert (f"timm:resnet50: torchvision 0.0.1 does not match torch {torch.__version__} "
            "(it requires torch==1.0.0): pip install") in done.stderr
    if PUBLIC in PAIRS:
        assert f"torchvision=={PAIRS[PUBLIC]}" in done.stderr


def test_a_cuda_build_beside_a_cpu_torch_is_one_line(broken_torchvision):
    # PyPI's torchvision 0.28.0 is 0.28.0+cu130 and pins torch==2.13.0, which the CPU build
    # 2.13.0+cpu meets: the pin cannot tell, the CUDA build's libraries do
    broken_torchvision(f"{PAIRS.get(PUBLIC, '0.0.1')}+cu130", f"=={PUBLIC}")
    done = run_cli("timm:resnet50")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    if torch.version.cuda is None:
        assert f"is a CUDA build, which does not load beside torch {torch.__version__}" \
            in done.stderr
        assert f'pip install "torch=={PUBLIC},!={PUBLIC}+cpu"' in done.stderr
    else:  # (a CUDA torch: the import's own error, named)
        assert "(RuntimeError: operator torchvision::nms does not exist)" in done.stderr


def test_what_runs_without_torchvision_is_offered_its_uninstall(broken_torchvision):
    # (transformers imports torchvision only where it is installed)
    broken_torchvision("0.0.1", "==1.0.0")
    with pytest.raises(GraphcostError, match=r"^config\.json: torchvision 0\.0\.1 does not match "
                       r".*; or pip uninstall torchvision: transformers runs without it$"):
        check_torchvision("config.json", without="transformers")


def test_the_torch_requirement_is_read_as_pip_reads_it():
    assert not _satisfies("2.13.0", ">=2.14.0")
    assert _satisfies("2.14.1", ">=2.14.0")
    assert _satisfies("2.13.0", "==2.13")            # 2.13 is 2.13.0
    assert not _satisfies("2.13.0", "==2.13.1")
    assert not _satisfies("2.15.0", ">=2.14,<2.15")
    assert _satisfies("2.13.0", "~=2.13.0")          # not read: the import's error is said


def test_a_torchao_built_for_another_torch_is_one_line(tmp_path, monkeypatch):
    # torchao 0.18 beside torch 2.8 raised this in its own import, which transformers runs
    # whenever torchao is installed (stop 62's CI: every transformers test failed); a stand-in
    # raising the same, with a wheel's metadata, first on the path
    pkg = tmp_path / "torchao"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError(\"cannot import name 'ScalingType' "
                                     "from 'torch.nn.functional'\")\n")
    info = tmp_path / "torchao-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchao\nVersion: 0.0.1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "torchao" or m.startswith("torchao.")]:
        monkeypatch.delitem(sys.modules, name)
    assert torchao_problem() == (
        f"torchao 0.0.1 does not import beside torch {torch.__version__} (ImportError: cannot "
        "import name 'ScalingType' from 'torch.nn.functional'): pip install the torchao "
        f"release built for torch {PUBLIC}")
    with pytest.raises(GraphcostError, match=r"^config\.json: torchao 0\.0\.1 does not import "
                       r".*; or pip uninstall torchao: transformers runs without it$"):
        check_transformers_companions("config.json")
