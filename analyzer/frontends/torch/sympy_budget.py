"""How many terms a .pt2 size expression can expand to, read from its tokens before sympy sees it.

torch's ShapeEnv expands the sizes it guards on (``size >= 0`` for every tensor it rebuilds):
``(s0 + s1)*(s1 + s2)*…`` with 14 factors is 2^14 terms and 6 s, 25 factors never finish. A
product of sums expands to the product of their term counts, so the estimate is computed
bottom-up over the expression (a Pratt parser over analyzer/frontends/torch/pt2_checks.py's tokens):
``a + b`` and comparisons add, ``a * b`` and ``a / b`` multiply, ``Add(…)`` / ``Mul(…)`` add /
multiply their arguments, any other call (FloorDiv, Mod, Max …) and any atom is one term — a
function's arguments expand on their own, so the largest count anywhere is the one bounded.
Counts saturate just past the bound (a 20,000-character product stays a small integer).
"""
from __future__ import annotations

MAX_TERMS = 512  # (2^9 terms: ~0.2 s of ShapeEnv; real programs' sizes expand to a handful)

_BINARY = {"==": 1, "!=": 1, "<": 1, "<=": 1, ">": 1, ">=": 1, "&": 1, "|": 1,
           "+": 2, "-": 2, "*": 3, "/": 3, "//": 3, "%": 3}
_UNARY = ("-", "+", "~")


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens = tokens
        self.i = 0
        self.worst = 1

    def _peek(self, k: int = 0) -> str | None:
        j = self.i + k
        return self.tokens[j][1] if j < len(self.tokens) else None

    def _take(self) -> tuple[str, str]:
        if self.i >= len(self.tokens):
            raise ValueError("an expression that ends too early")
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def _note(self, n: int) -> int:
        n = min(n, MAX_TERMS + 1)
        self.worst = max(self.worst, n)
        return n

    def expr(self, min_prec: int = 0) -> int:
        left = self._operand()
        while (prec := _BINARY.get(self._peek() or "")) is not None and prec >= min_prec:
            op = self._take()[1]
            right = self.expr(prec + 1)
            left = self._note(left + right if prec < 3 else
                              1 if op in ("//", "%") else left * right)
        return left

    def _operand(self) -> int:
        kind, tok = self._take()
        while tok in _UNARY:  # iteratively: 20,000 minus signs are no recursion
            kind, tok = self._take()
        if tok == "(":
            values = self._items()
            return values[0] if len(values) == 1 else 1  # a group, or a tuple (Piecewise)
        if kind == "name" and self._peek() == "(":
            self._take()
            args = self._items()
            total = 1
            if tok == "Add":
                total = sum(args)
            elif tok == "Mul":
                for a in args:
                    total = min(total * a, MAX_TERMS + 1)
            return self._note(total)
        if kind == "op":
            raise ValueError(f"an operator {tok!r} where a value belongs")
        return 1

    def _items(self) -> list[int]:
        """Comma-separated values up to the closing parenthesis (keyword arguments such as
        ``integer=True`` count for nothing)."""
        values = []
        while self._peek() != ")":
            if self.tokens[self.i][0] == "name" and self._peek(1) == "=":
                self.i += 3
            else:
                values.append(self.expr())
            if self._peek() == ",":
                self._take()
            elif self._peek() != ")":
                raise ValueError(f"{self._peek()!r} where ',' or ')' belongs")
        self._take()
        return values or [1]


def check_terms(tokens: list[tuple[str, str]]) -> None:
    """Raises ValueError when the expression could expand past MAX_TERMS terms."""
    parser = _Parser(tokens)
    parser.expr()
    if parser.i != len(tokens):
        raise ValueError(f"{tokens[parser.i][1]!r} after the end of the expression")
    if parser.worst > MAX_TERMS:
        raise ValueError(f"an expression that expands to over {MAX_TERMS} terms (a product "
                         "of sums: torch's ShapeEnv multiplies it out)")
