"""The rule owns the op: no code outside the registry names an op.

Every string constant (docstrings excepted; comments are not in the AST) in passes/ outside
passes/costs/, and in analyzer/ outside analyzer/frontends/ (which read op types from the file),
is checked against the registered op names.
"""
from __future__ import annotations

import ast
from pathlib import Path

import graphcost.passes.costs  # noqa: F401  (registers every rule family)
from graphcost.passes.costs import registry

from tests.source_checks import docstring_ids

ROOT = Path(__file__).resolve().parent.parent
CHECKED = [(ROOT / "passes", ROOT / "passes" / "costs"),
           (ROOT / "analyzer", ROOT / "analyzer" / "frontends")]


def _op_literals(path: Path, names: set[str]) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docs = docstring_ids(tree)
    return [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docs and node.value in names]


def test_no_op_name_outside_the_registry():
    names = set(registry.registered())
    found = []
    for top, exempt in CHECKED:
        for path in sorted(top.rglob("*.py")):
            if exempt not in path.parents:
                found += _op_literals(path, names)
    assert not found, "op names outside passes/costs/:\n" + "\n".join(found)


def test_the_check_sees_a_literal(tmp_path):
    # the check itself: a file naming an op in a string constant is found, a docstring is not
    f = tmp_path / "x.py"
    f.write_text('"""Conv in a docstring."""\nOPS = ("Conv",)\n')
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert _op_literals(f, {"Conv"}) == ["x.py:2: 'Conv'"]
    finally:
        ROOT = saved


def test_ops_with_graph_attributes_declare_their_bodies():
    # onnx's own schemas say which ops carry subgraphs (GRAPH / GRAPHS attributes): each one's
    # rule must say bodies=True, which is all the ONNX frontend reads to lower the bodies as
    # nodes of their own (analyzer/frontends/onnx/lowering.py keeps no list of its own)
    from onnx import defs

    graph_types = (defs.OpSchema.AttrType.GRAPH, defs.OpSchema.AttrType.GRAPHS)
    carriers = {s.name if s.domain in ("", "ai.onnx") else f"{s.domain}::{s.name}"
                for s in defs.get_all_schemas_with_history()
                if any(a.type in graph_types for a in s.attributes.values())}
    assert {"If", "Loop", "Scan"} <= carriers  # the schemas are read, not an empty set
    missing = sorted(op for op in carriers
                     if registry.lookup(op) is None or not registry.lookup(op).bodies)
    assert not missing, f"ops with subgraphs whose rule does not declare bodies: {missing}"
