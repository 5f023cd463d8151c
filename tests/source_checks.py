"""Helpers for the tests that read the product's source (tests/test_layers.py,
tests/test_rule_ownership.py)."""
from __future__ import annotations

import ast


def docstring_ids(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants in ``tree`` (module, class and function ones): the
    checks of string constants skip them, since a docstring may name what code may not."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids
