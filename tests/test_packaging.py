"""One import package: ``graphcost``. No module imports the folders as top-level packages
(``analyzer``, ``passes``, ``models_zoo``), which an installed graphcost does not have."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = re.compile(r"^\s*(from|import)\s+(analyzer|passes|models_zoo)\b", re.M)


def test_no_top_level_imports():
    offenders = [f"{p.relative_to(ROOT)}:{m.group(0).strip()}"
                 for folder in ("analyzer", "passes", "models_zoo", "benchmarks", "tests",
                                "graphcost")
                 for p in (ROOT / folder).rglob("*.py")
                 for m in TOP_LEVEL.finditer(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_import_graphcost_is_light_and_exports_analyze():
    code = ("import sys, graphcost; assert 'onnx' not in sys.modules and 'torch' not in "
            "sys.modules; from graphcost import analyze, GraphcostError, Report; "
            "print(analyze.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd="/", check=True).stdout
    assert out.strip() == "graphcost.analyzer.app.api"


def test_wheel_installs_only_graphcost(tmp_path):
    """The built wheel's top-level entries: the graphcost package and its metadata only."""
    import shutil
    import zipfile
    had_build = (ROOT / "build").exists()
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                        "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
                       check=True, capture_output=True)
    finally:
        if not had_build:  # setuptools builds in the checkout: leave no copy behind
            shutil.rmtree(ROOT / "build", ignore_errors=True)
    wheel = next(tmp_path.glob("graphcost-*.whl"))
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"graphcost"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "graphcost/passes/costs/registry.py" in names and "graphcost/analyzer/cli/main.py" in names
