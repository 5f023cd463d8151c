"""Binding an exported graph's data-dependent sizes to their bounds (the FX frontend's part).

A traced tensor whose size the data decides has symbolic dims: ``u3`` (a fresh size: the
boxes NMS keeps), ``Min(100, u3)`` (the first 100 of them), ``4*u0``. Each dim is bound to
the upper end of its value range — torch's ShapeEnv holds the ranges: what the op's meta
kernel declared (``nonzero``: at most its input's elements), what the trace capped
(analyzer/frontends/torch/bounded_trace.py: a rule's bound, ``--dim u3=MAX``) and what follows
from them (``Min(100, u3)`` ≤ 100), with the expressions the trace's runtime assertions fix
(a length read as a number at its maximum) at their values — so every shape, cost and memory
figure downstream of a symbol is its upper bound. The lower ends are kept beside them
(``Graph.lower_values``), the nodes that touch a bounded size say so (``Node.bound``, with the
symbols), and every symbol is listed with its range and where its maximum comes from
(``Graph.size_bounds``). A symbol with no finite maximum stays symbolic: its nodes are not
costed and a warning names the flag that bounds it.
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any, Mapping

import torch
import torch.utils._pytree  # (torch.utils does not import it for the type checker)

from ....passes.errors import GraphcostError, opt
from ....passes.ir import SizeBound, TensorSpec
from .bounded_trace import finite as _finite
from .bounded_trace import is_unbacked, upper_of
from .dtype_names import dtype_name

_MAX_EXPRS = 3  # symbolic dims named in one node's bound sentence


def shape_env_of(graph: "torch.fx.Graph"):
    """The ShapeEnv behind the graph's symbolic sizes, None when every size is static."""
    for node in graph.nodes:
        for v in torch.utils._pytree.tree_leaves(node.meta.get("val")):
            dims = v.shape if isinstance(v, torch.Tensor) else (v,)
            for d in dims:
                if isinstance(d, torch.SymInt):
                    return d.node.shape_env
    return None


class SizeBinder:
    """Binds symbolic dims to the upper ends of their ranges while a graph is lowered."""

    def __init__(self, env, maxima: Mapping[str, int], capped: Mapping[str, str]):
        from torch.utils._sympy.value_ranges import ValueRanges

        self._env = env
        self._ranges = dict(env.var_to_range)
        for sym in list(self._ranges):
            if str(sym) in maxima:  # the user's maximum, where the trace could not apply it
                r = self._ranges[sym]
                self._ranges[sym] = ValueRanges(r.lower, min(maxima[str(sym)], r.upper)) \
                    if upper_of(env, sym) is not None else ValueRanges(r.lower, maxima[str(sym)])
        self._maxima = dict(maxima)
        self._capped = dict(capped)
        self._dims: dict[Any, tuple[int | str, int | str, str]] = {}  # expr -> (hi, lo, text)
        self._origin: dict[str, str] = {}         # symbol -> its first node
        self._caps: dict[str, list[str]] = {}     # symbol -> "Min(100, u7) ≤ 100" …
        self._uses: dict[str, int] = {}           # unbounded symbol -> values using it
        self.lower: dict[str, TensorSpec] = {}    # value -> its spec at the lower ends
        self._exprs: dict[str, tuple[str, ...]] = {}  # value -> its bounded dims' "e ≤ hi"
        self._fixed = _asserted_values(env)       # Min(1000, u13) -> 1000 …

    @classmethod
    def of(cls, graph: "torch.fx.Graph", maxima: Mapping[str, int] | None = None,
           capped: Mapping[str, str] | None = None) -> "SizeBinder | None":
        env = shape_env_of(graph)
        return None if env is None else cls(env, maxima or {}, capped or {})

    def _dim(self, d: torch.SymInt) -> tuple[int | str, int | str, str]:
        expr = self._env.replace(d.node.expr)
        got = self._dims.get(expr)
        if got is None:
            hi, lo = self._bound(expr)
            if self._fixed:  # 12000//Min(1000, u13): no maximum over a range holding 0
                at_hi, at_lo = self._bound(expr.xreplace(self._fixed))
                hi = at_hi if hi is None or (at_hi is not None and at_hi < hi) else hi
                lo = at_lo if lo is None else lo
            text = str(expr)
            got = self._dims[expr] = (text if hi is None else hi,
                                      text if lo is None else max(lo, 0), text)
            if hi is not None and not expr.is_Symbol:
                self._note_cap(expr, hi, f"{text} ≤ {hi}")
        return got

    def _bound(self, expr) -> tuple[int | None, int | None]:
        from torch.utils._sympy.value_ranges import bound_sympy
        try:
            r = bound_sympy(expr, self._ranges)
        except Exception:  # noqa: BLE001 - an expression sympy cannot bound
            return None, None
        return _finite(r.upper), _finite(r.lower)

    def _note_cap(self, expr, hi: int, text: str) -> None:
        """A size the model caps below its symbols' maxima (``keep[:100]``: Min(100, u7))."""
        syms = [s for s in expr.free_symbols if is_unbacked(s)]
        his = [_finite(self._ranges[s].upper) if s in self._ranges else None for s in syms]
        if syms and all(h is not None and hi < h for h in his):
            for s in syms:
                caps = self._caps.setdefault(str(s), [])
                if text not in caps:
                    caps.append(text)

    def spec(self, val: torch.Tensor, value: str, node: str) -> TensorSpec:
        """``val``'s spec at the upper bounds; ``value`` names it, ``node`` is "name (op) in
        scope" for the symbols it is the first to use."""
        upper, lower, exprs = [], [], []
        for d in val.shape:
            if not isinstance(d, torch.SymInt):
                upper.append(int(d))
                lower.append(int(d))
                continue
            hi, lo, text = self._dim(d)
            upper.append(hi)
            lower.append(lo)
            for s in d.node.expr.free_symbols:
                self._origin.setdefault(str(s), node)
                if isinstance(hi, str) and is_unbacked(s):
                    self._uses[str(s)] = self._uses.get(str(s), 0) + 1
            if isinstance(hi, int) and f"{text} ≤ {hi}" not in exprs and text != str(hi):
                exprs.append(f"{text} ≤ {hi}")
        dtype = dtype_name(val.dtype)
        if exprs:
            self.lower[value] = TensorSpec(tuple(lower), dtype)
            self._exprs[value] = tuple(exprs)
        return TensorSpec(tuple(upper), dtype)

    def sentence(self, names) -> str:
        """The bound of a node reading or writing ``names``: its symbolic dims and their
        maxima, or "" when none of them has one."""
        seen: list[str] = []
        for n in names:
            for e in self._exprs.get(n, ()):
                if e not in seen:
                    seen.append(e)
        if not seen:
            return ""
        more = f" (+{len(seen) - _MAX_EXPRS} more)" if len(seen) > _MAX_EXPRS else ""
        return "upper bound: data-dependent size " + ", ".join(seen[:_MAX_EXPRS]) + more

    def bounds(self) -> tuple[tuple[SizeBound, ...], tuple[str, ...]]:
        """Every unbacked symbol the shapes use, with its range and source; and one warning
        per symbol without a maximum, naming the flag that sets it."""
        out, warnings = [], []
        for sym in sorted(self._origin, key=_symbol_order):
            s = next((k for k in self._ranges if str(k) == sym), None)
            if s is None or not is_unbacked(s):
                continue
            r = self._ranges[s]
            hi, lo = _finite(r.upper), _finite(r.lower)
            source = self._capped.get(sym) or (f"--dim {sym}={self._maxima[sym]}"
                                                if sym in self._maxima else
                                                "torch.export's value range")
            out.append(SizeBound(sym, max(lo or 0, 0), hi, source if hi is not None else "",
                                 self._origin[sym], tuple(self._caps.get(sym, ()))))
            if hi is None:
                warnings.append(f"the data-dependent size {sym} (from {self._origin[sym]}) "
                                f"has no upper bound: {self._uses.get(sym, 0)} tensor(s) "
                                f"using it are not costed; pass --dim {sym}=MAX")
        return tuple(out), tuple(warnings)


def _asserted_values(env) -> dict:
    """The expressions the trace's runtime assertions fix to a number: a length read as a
    number at its maximum asserts it (``len(proposals)``: Eq(Min(1000, u13), 1000)), and the
    shapes built from that number divide by the expression (``reshape(box_sum, -1)``:
    12000//Min(1000, u13)), which has no maximum over a range that holds 0. The exported graph
    checks every assertion, so no run it describes has another value there."""
    import sympy
    fixed = {}
    for asserts in env.deferred_runtime_asserts.values():
        for a in asserts:
            if not isinstance(a.expr, sympy.Eq):
                continue
            lhs, rhs = a.expr.args
            if lhs.is_Integer:
                lhs, rhs = rhs, lhs
            if rhs.is_Integer and not lhs.is_number:
                fixed[env.replace(lhs)] = rhs
    return fixed


def _symbol_order(name: str) -> tuple[int, str]:
    digits = name.lstrip("abcdefghijklmnopqrstuvwxyz")
    return (int(digits) if digits.isdigit() else 1 << 30, name)


def check_maxima(graph, maxima: Mapping[str, int],
                 traced: Mapping[str, str] = MappingProxyType({})):
    """A --dim naming a data-dependent size the trace does not have is an error; one above
    the model's own maximum is said in a warning (the model's is used). ``traced``: the
    sizes the trace made (a loop unrolled over one leaves no symbol in the graph)."""
    known = {b.symbol: b for b in graph.size_bounds}
    for sym, value in maxima.items():
        if sym not in known and sym in traced:
            continue
        if sym not in known:
            have = ", ".join(sorted({*known, *traced}, key=lambda s: (len(s), s))) or "none"
            raise GraphcostError(f"{opt('dims', sym)}: {graph.name} has no data-dependent size named "
                                 f"{sym!r}; its data-dependent sizes: {have}")
        b = known[sym]
        if b.upper is not None and b.upper < value:
            graph = replace(graph, warnings=graph.warnings + (
                f"--dim {sym}={value} is above {sym}'s own maximum {b.upper} "
                f"({b.source}): {b.upper} is used",))
    return graph
