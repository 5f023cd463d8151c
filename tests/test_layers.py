"""The layers, bottom to top. A module imports from its own layer or from below, never above;
siblings (one row) do not import each other.

    analyzer/cli/            the command line
    analyzer/render/         text, tables, HTML, charts
    analyzer/measure/        verify and the reference measurements
    analyzer/app/            the application: api, pipeline, report, diff, devices, …
                             (orchestrates passes and reports; nothing from frontends/)
    analyzer/load/           the front door: a model argument and its options -> the IR
    analyzer/frontends/onnx/ | analyzer/frontends/torch/ | models_zoo/      (siblings)
    analyzer/frontends/      binding.py, serving_steps.py: what onnx/ and torch/ share
    passes/                  the IR, errors, the op catalogue (costs/), the passes:
                             the standard library only, in sub-layers of its own:
        serving/ | parallel/     (siblings)
        training/                the step, its checkpoint plans, precision recipes
        memory/                  liveness, the arena, the caching allocator and its events
        graph/ | device/         facts of the graph (params, modules, …) | of a device (siblings)
        costs/                   the op catalogue: one rule per op
        passes/*.py              ir, errors, choices, device_rates, magnitude

``graphcost/`` (the package root: analyze, GraphcostError, Report, __version__) sits on top;
the product (analyzer/, passes/, models_zoo/) reads only its ``__version__``. Inside the
product every import of graphcost's own code is relative, and no module imports another's
private (``_name``) names: what a module shares is public. Tests and benchmarks import
``graphcost.X`` absolutely and may reach private names.

Every check reads the source (the AST, in-function imports included), except two that import:
each product file is the module its path names, and the tests are not part of the package.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

from tests.source_checks import docstring_ids

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("analyzer", "passes", "models_zoo")

# (module prefix, rank): a module may import ranks up to its own; equal ranks only within
# one prefix (onnx/, torch/ and models_zoo/ are siblings). Longest prefix wins.
LAYERS = {
    "graphcost.passes": 0,
    "graphcost.analyzer.frontends": 1,
    "graphcost.analyzer.frontends.onnx": 2,
    "graphcost.analyzer.frontends.torch": 2,
    "graphcost.models_zoo": 2,
    "graphcost.analyzer.load": 3,
    "graphcost.analyzer.app": 4,
    "graphcost.analyzer.measure": 5,
    "graphcost.analyzer.render": 6,
    "graphcost.analyzer.cli": 7,
}
# what a layer may not import though it is below: analyzer/app/ reaches the frontends (and
# the zoo) only through analyzer/load/, its front door
NOT_FROM = {"graphcost.analyzer.app": ("graphcost.analyzer.frontends", "graphcost.models_zoo")}


def _layer(module: str) -> str | None:
    best = None
    for prefix in LAYERS:
        if (module == prefix or module.startswith(prefix + ".")) and \
                (best is None or len(prefix) > len(best)):
            best = prefix
    return best


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["graphcost", *parts])


def _product_files(root: Path) -> list[Path]:
    return [p for top in PRODUCT for p in sorted((root / top).rglob("*.py"))]


class Import:
    """One imported name of graphcost's own code, resolved to the module it comes from."""

    def __init__(self, node: ast.stmt, module: str, name: str | None, relative: bool):
        self.line, self.module, self.name, self.relative = node.lineno, module, name, relative
        self.node_id = id(node)


def _own_imports(path: Path, root: Path, tree: ast.AST | None = None) -> list[Import]:
    """Every import of graphcost's code in ``path`` (parsed as ``tree``), module-level and
    in-function alike."""
    me = _module_name(path, root)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    modules = {_module_name(p, root) for p in _product_files(root)}
    out = []
    tree = tree or ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Import(node, a.name, None, False) for a in node.names
                    if a.name == "graphcost" or a.name.startswith("graphcost.")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == "graphcost" or target.startswith("graphcost.")):
                continue
            for a in node.names:  # `from . import shapes` imports the module shapes
                sub = f"{target}.{a.name}"
                out.append(Import(node, sub if sub in modules else target, a.name,
                                  node.level > 0))
    return out


def _where(path: Path, root: Path, imp: Import) -> str:
    return f"{path.relative_to(root)}:{imp.line}"


# passes/' own sub-layers (the same rules, inside passes/): package under passes -> rank
PASSES_LAYERS = {"": 0, "costs": 1, "graph": 2, "device": 2, "memory": 3, "training": 4,
                 "parallel": 5, "serving": 5}


def _passes_layer(module: str) -> str | None:
    """The sub-package of passes/ a module of it is in ("" for passes/*.py)."""
    parts = module.split(".")
    if parts[:2] != ["graphcost", "passes"]:
        return None
    return parts[2] if len(parts) > 3 or parts[2:3] and parts[2] in PASSES_LAYERS else ""


def passes_offences(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / "passes").rglob("*.py")):
        me = _module_name(path, root)
        mine = _passes_layer(me)
        for imp in _own_imports(path, root):
            theirs = _passes_layer(imp.module)
            if theirs is None or mine is None:
                continue  # outside passes/: layer_offences' job
            if theirs not in PASSES_LAYERS or mine not in PASSES_LAYERS:
                why = f"{theirs if theirs not in PASSES_LAYERS else mine}/ is in no sub-layer " \
                    "(add it to PASSES_LAYERS and the picture)"
            elif PASSES_LAYERS[theirs] > PASSES_LAYERS[mine]:
                why = f"imports {imp.module} from a sub-layer above (passes/{theirs}/ over " \
                    f"passes/{mine}/)"
            elif PASSES_LAYERS[theirs] == PASSES_LAYERS[mine] and theirs != mine:
                why = f"imports {imp.module}: passes/{theirs}/ and passes/{mine}/ are siblings"
            else:
                continue
            found.append(f"{_where(path, root, imp)}: {why}")
    return found


def _runtime_imports(tree: ast.AST):
    """The import statements that run: all but those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and \
                node.test.id == "TYPE_CHECKING":
            yield from (n for s in node.orelse for n in [s, *_runtime_imports(s)]
                        if isinstance(n, (ast.Import, ast.ImportFrom)))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _runtime_imports(node)


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """The product's runtime import cycles: each strongly connected set of modules (over the
    imports that run, module-level and in-function alike) of more than one module."""
    import networkx as nx
    graph = nx.DiGraph()
    for path in _product_files(root):
        me = _module_name(path, root)
        graph.add_node(me)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        keep = {id(n) for n in _runtime_imports(tree)}
        for imp in _own_imports(path, root, tree):
            if imp.node_id in keep and imp.module != me:
                graph.add_edge(me, imp.module)
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def layer_offences(root: Path = ROOT) -> list[str]:
    found = []
    for path in _product_files(root):
        me = _module_name(path, root)
        mine = _layer(me)
        for imp in _own_imports(path, root):
            if imp.module == "graphcost" and imp.name and imp.name.startswith("__"):
                continue  # the package root's __version__: metadata, not code from above
            theirs = _layer(imp.module)
            if mine is None:
                why = f"{me} is in no layer (add its folder to LAYERS and the picture)"
            elif theirs is None:
                why = f"imports {imp.module}, which is above every layer"
            elif LAYERS[theirs] > LAYERS[mine]:
                why = f"imports {imp.module} from a layer above ({theirs} over {mine})"
            elif LAYERS[theirs] == LAYERS[mine] and theirs != mine:
                why = f"imports {imp.module}: {theirs} and {mine} are siblings"
            elif any(imp.module == f or imp.module.startswith(f + ".")
                     for f in NOT_FROM.get(mine, ())):
                why = f"imports {imp.module}: {mine} loads models through " \
                    "graphcost.analyzer.load only"
            else:
                continue
            found.append(f"{_where(path, root, imp)}: {why}")
    return found


def absolute_offences(root: Path = ROOT) -> list[str]:
    return [f"{_where(path, root, imp)}: absolute import of {imp.module}"
            for path in _product_files(root) for imp in _own_imports(path, root)
            if not imp.relative]


def private_offences(root: Path = ROOT) -> list[str]:
    return [f"{_where(path, root, imp)}: {imp.name} from {imp.module}"
            for path in _product_files(root) for imp in _own_imports(path, root)
            if imp.name and imp.name.startswith("_")
            and not (imp.name.startswith("__") and imp.name.endswith("__"))]


def stdlib_offences(root: Path = ROOT) -> list[str]:
    """Imports in passes/ of anything but the standard library and passes/ itself."""
    found = []
    for path in sorted((root / "passes").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue  # relative: inside graphcost (layer_offences keeps it in passes/)
            found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names
                      if n.split(".")[0] not in sys.stdlib_module_names]
    return found


def test_imports_go_down_the_layers():
    found = layer_offences()
    assert not found, "imports against the layers (tests/test_layers.py's docstring):\n" + \
        "\n".join(found)


def test_passes_sub_layers_go_down():
    found = passes_offences()
    assert not found, "imports against passes/' sub-layers (tests/test_layers.py's " \
        "docstring):\n" + "\n".join(found)


def test_no_import_cycle_at_runtime():
    cycles = import_cycles()
    assert not cycles, "modules that import each other at runtime (move what both need to " \
        "a module below them):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_passes_checks_see_an_offence(tmp_path):
    # a memory/ module importing training/ (above it) and one importing serving/ from
    # parallel/ (siblings), and a cycle between two root modules (one in a function)
    for sub in ("memory", "training", "parallel", "serving"):
        (tmp_path / "passes" / sub).mkdir(parents=True)
    (tmp_path / "passes" / "memory" / "liveness.py").write_text(
        "from ..training.step import x\n")
    (tmp_path / "passes" / "training" / "step.py").write_text("x = 1\n")
    (tmp_path / "passes" / "serving" / "kv.py").write_text("y = 1\n")
    (tmp_path / "passes" / "parallel" / "step.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..serving.kv import y\n")
    (tmp_path / "passes" / "ir.py").write_text("from .errors import E\n")
    (tmp_path / "passes" / "errors.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .ir import G\n"
        "def f():\n    from .ir import G\n")
    assert passes_offences(tmp_path) == [
        "passes/memory/liveness.py:1: imports graphcost.passes.training.step from a sub-layer "
        "above (passes/training/ over passes/memory/)",
        "passes/parallel/step.py:3: imports graphcost.passes.serving.kv: passes/serving/ and "
        "passes/parallel/ are siblings"]
    # the TYPE_CHECKING import alone would not be a cycle; the one in f() is
    assert import_cycles(tmp_path) == [["graphcost.passes.errors", "graphcost.passes.ir"]]


def test_passes_import_only_the_standard_library():
    found = stdlib_offences()
    assert not found, "passes/ is the ground floor: the standard library only:\n" + \
        "\n".join(found)


def test_product_imports_of_graphcost_are_relative():
    found = absolute_offences()
    assert not found, "inside analyzer/, passes/, models_zoo/ graphcost's own code is " \
        "imported relatively (from ..passes.ir import Graph):\n" + "\n".join(found)


def test_no_module_imports_private_names():
    found = private_offences()
    assert not found, "private names imported from another module: make the name public " \
        "(or move it to the module that uses it):\n" + "\n".join(found)


def test_the_checks_see_an_offence(tmp_path):
    # the checks themselves, on a product tree of four files with one offence of each kind
    (tmp_path / "passes").mkdir()
    (tmp_path / "passes" / "ir.py").write_text("import numpy\n_SECRET = 1\n")
    (tmp_path / "analyzer" / "app").mkdir(parents=True)
    (tmp_path / "analyzer" / "app" / "report.py").write_text(
        "from ...passes.ir import _SECRET\nfrom ..cli import main\n"
        "from ..frontends.torch import capture\n")
    (tmp_path / "analyzer" / "cli").mkdir()
    (tmp_path / "analyzer" / "cli" / "main.py").write_text(
        "from graphcost.analyzer.app import report\nfrom ... import __version__\n")
    (tmp_path / "analyzer" / "frontends" / "onnx").mkdir(parents=True)
    (tmp_path / "analyzer" / "frontends" / "onnx" / "types.py").write_text(
        "def f():\n    from ..torch import capture\n")
    (tmp_path / "models_zoo").mkdir()
    assert layer_offences(tmp_path) == [
        "analyzer/app/report.py:2: imports graphcost.analyzer.cli.main from a layer above "
        "(graphcost.analyzer.cli over graphcost.analyzer.app)",
        "analyzer/app/report.py:3: imports graphcost.analyzer.frontends.torch: "
        "graphcost.analyzer.app loads models through graphcost.analyzer.load only",
        "analyzer/frontends/onnx/types.py:2: imports graphcost.analyzer.frontends.torch: "
        "graphcost.analyzer.frontends.torch and graphcost.analyzer.frontends.onnx are siblings"]
    assert absolute_offences(tmp_path) == [
        "analyzer/cli/main.py:1: absolute import of graphcost.analyzer.app.report"]
    assert private_offences(tmp_path) == [
        "analyzer/app/report.py:1: _SECRET from graphcost.passes.ir"]
    assert stdlib_offences(tmp_path) == ["passes/ir.py:1: numpy"]


def _run_outside(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    # From a folder outside the checkout: only the installed mapping (pyproject's
    # package-dir, through the editable install) can resolve graphcost there.
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=tmp_path)


def test_every_module_is_the_file_its_path_names(tmp_path):
    files = {_module_name(p, ROOT): p.relative_to(ROOT).as_posix() for p in _product_files(ROOT)}
    code = ("import importlib, json, sys\n"
            "names = json.loads(sys.argv[1])\n"
            "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))\n")
    out = _run_outside(tmp_path, code, json.dumps(sorted(files)))
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    wrong = [f"{name}: {Path(got[name]).as_posix()} (expected …/{rel})"
             for name, rel in files.items() if not Path(got[name]).as_posix().endswith("/" + rel)]
    assert not wrong, "modules that are not the file their path names:\n" + "\n".join(wrong)


def test_tests_are_not_part_of_the_package(tmp_path):
    out = _run_outside(tmp_path, "import graphcost\n"
                       "try:\n"
                       "    import graphcost.tests\n"
                       "except ModuleNotFoundError as e:\n"
                       "    print(e.name)\n")
    assert out.returncode == 0, out.stderr[-2000:]  # graphcost itself imports
    assert out.stdout.strip() == "graphcost.tests", out.stdout


# ---- CLI option names belong to analyzer/cli/ ----------------------------------------------
# Errors name an option with passes.errors.opt and each face words it (the API dims={'seq': N},
# the CLI --dim seq=N: analyzer/cli/wording.py). What is left below is not an error but text a
# report carries or a renderer prints — the JSON report's warnings and size-bound sources, the
# terminal and HTML views' hints — which say the command line's option, the one spelling every
# reader of a report can run (a report holds no face). The test fails when a file not listed
# names one, or a listed file names more; when a file names fewer, shrink its count (or drop
# it) so the list only ever gets shorter.
FLAG = re.compile(r"--[a-z][a-z0-9-]+")
KNOWN = {
    "analyzer/frontends/onnx/lowering.py": 2,       # a Loop's bound and warning in the report
    "analyzer/frontends/torch/bounded_trace.py": 1,  # a size bound's source in the report
    "analyzer/frontends/torch/size_bounds.py": 3,   # the same, and the report's warnings
    "analyzer/render/html.py": 1,                    # renderers' hints
    "analyzer/render/plot.py": 1,
    "analyzer/render/summary.py": 2,
    "analyzer/render/terminal.py": 1,
    "analyzer/render/verify.py": 1,
    "models_zoo/export.py": 1,                       # a command to run instead (graphcost … --fx)
    "passes/costs/training_ops.py": 1,               # an op's note in the report
}


def flag_texts(path: Path) -> list[tuple[int, str]]:
    """(line, --option) for each option name in a string constant (f-strings' text parts
    included; docstrings and comments are not checked)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docs = docstring_ids(tree)
    return [(node.lineno, flag) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docs for flag in FLAG.findall(node.value)]


def test_cli_option_names_stay_in_the_cli():
    counts, lines = {}, {}
    for path in _product_files(ROOT):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("analyzer/cli/"):
            continue
        found = flag_texts(path)
        if found:
            counts[rel] = len(found)
            lines[rel] = [f"{rel}:{line}: {flag}" for line, flag in sorted(found)]
    more = [f"{rel}: {n} (KNOWN: {KNOWN.get(rel, 0)})\n  " + "\n  ".join(lines[rel])
            for rel, n in sorted(counts.items()) if n > KNOWN.get(rel, 0)]
    assert not more, (
        "CLI option names in product code outside analyzer/cli/ (the API's messages name its "
        "arguments; the CLI words them as options):\n" + "\n".join(more))
    fewer = {rel: counts.get(rel, 0) for rel, n in KNOWN.items() if counts.get(rel, 0) < n}
    if fewer:
        warnings.warn(f"fewer CLI option names than tests/test_layers.py's KNOWN says: "
                      f"shrink it to {fewer} (0: drop the entry)", stacklevel=1)


def test_the_option_check_skips_docstrings(tmp_path):
    f = tmp_path / "x.py"
    f.write_text('"""pass --batch N."""\n# --dim in a comment\nMSG = f"bind it with --dim {1}"\n')
    assert flag_texts(f) == [(3, "--dim")]


# ---- Long functions say why ----------------------------------------------------------------
LONG = 60


def test_a_function_over_60_lines_says_why():
    # a function is split by job; one that is not says why on the line above it ("# long: …")
    silent = []
    for path in _product_files(ROOT):
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > LONG:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if not lines[first - 2].strip().startswith("# long:"):
                    silent.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                                  f"({node.end_lineno - node.lineno + 1} lines)")
    assert not silent, "split these by job, or say why above them (# long: …):\n" + \
        "\n".join(silent)
