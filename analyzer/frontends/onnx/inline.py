"""Model-local functions inlined under a budget counted before anything is expanded.

onnx.inliner copies a function's body into every call, recursively, so a file whose function
k calls function k − 1 twice grows as 2^k: 30 levels are a 2 KB file and a billion nodes
(11.9 GB, then SIGSEGV). The nodes inlining WOULD produce are counted first, memoized per
function — count(f) = Σ over f's nodes of count(callee) for a call, else 1 + the nodes of its
subgraphs — in time linear in the file; past the budget nothing is expanded and the function
that carries the growth is named.

The budget grows with the file: INLINE_FACTOR nodes per node the file writes (real exports
call one block's function once per layer: ~10–30 nodes out per node in), and never below
INLINE_FLOOR (~1.4 s and ~85 MB of analysis at ~45 µs and ~3 KB per node, whatever the
file's size).
"""
from __future__ import annotations

import onnx
import onnx.inliner
from onnx import AttributeProto

from ....passes.errors import GraphcostError

INLINE_FACTOR = 32
INLINE_FLOOR = 30_000
_CAP = 1 << 64  # counts saturate here: exact figures beyond it say nothing more


def _subgraphs(node: onnx.NodeProto):
    for a in node.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


def _walk(nodes):
    """Every node of ``nodes`` and of their subgraphs (iteratively: nesting cannot exhaust
    the stack)."""
    stack = [iter(nodes)]
    while stack:
        node = next(stack[-1], None)
        if node is None:
            stack.pop()
            continue
        yield node
        subs = list(_subgraphs(node))
        if subs:
            stack.append(n for g in subs for n in g.node)


def _key(node_or_fn) -> tuple[str, str, str]:
    name = node_or_fn.op_type if isinstance(node_or_fn, onnx.NodeProto) else node_or_fn.name
    return node_or_fn.domain, name, node_or_fn.overload


def _order(functions: dict, roots: list, name: str) -> list:
    """The functions reachable from ``roots``, callees before callers (iterative DFS); a
    call cycle is refused (inlining it would never end)."""
    done, active, order = set(), set(), []
    calls = {k: [_key(n) for n in _walk(f.node) if _key(n) in functions]
             for k, f in functions.items()}
    for root in roots:
        if root in done:
            continue
        stack = [(root, iter(calls[root]))]
        active.add(root)
        while stack:
            k, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                active.discard(k)
                done.add(k)
                order.append(k)
            elif nxt in active:
                path = [key for key, _ in stack]
                cycle = " -> ".join(map(_label, [*path[path.index(nxt):], nxt]))
                raise GraphcostError(f"{name}: local functions call themselves ({cycle}): "
                                     "recursive functions cannot be inlined")
            elif nxt not in done:
                active.add(nxt)
                stack.append((nxt, iter(calls[nxt])))
    return order


def _label(key: tuple[str, str, str]) -> str:
    domain, name, overload = key
    return repr(f"{domain}::{name}" + (f":{overload}" if overload else ""))


def _count(nodes, sizes: dict) -> int:
    total = 0
    for n in _walk(nodes):
        total += sizes.get(_key(n), 1)  # a call is its callee's nodes; subgraphs are walked
    return min(total, _CAP)


def check_inline_budget(model: onnx.ModelProto, name: str) -> None:
    """Raises unless inlining ``model``'s local functions stays within the budget."""
    functions = {_key(f): f for f in model.functions}
    roots = list(dict.fromkeys(_key(n) for n in _walk(model.graph.node) if _key(n) in functions))
    sizes: dict = {}
    for k in _order(functions, roots, name):
        sizes[k] = _count(functions[k].node, sizes)
    total = _count(model.graph.node, sizes)
    written = sum(1 for _ in _walk(model.graph.node)) + \
        sum(1 for f in model.functions for _ in _walk(f.node))
    budget = max(INLINE_FLOOR, INLINE_FACTOR * written)
    if total > budget:
        worst = max(roots, key=lambda k: sizes[k])
        raise GraphcostError(
            f"{name}: refused: inlining its local functions would make {_figure(total)} nodes "
            f"out of the {written:,} in the file (a call to {_label(worst)} alone expands to "
            f"{_figure(sizes[worst])}); the budget is {budget:,}: max({INLINE_FLOOR:,}, "
            f"{INLINE_FACTOR} per node in the file)")


def _figure(n: int) -> str:
    return f"{n:,}" if n < _CAP else "over 2^64"


def inline_functions(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``model`` with its local functions inlined (a new proto), within the budget."""
    if not model.functions:
        return model
    check_inline_budget(model, name)
    try:
        return onnx.inliner.inline_local_functions(model)
    except Exception as exc:
        raise GraphcostError(f"{name}: cannot inline the model's local functions: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                             ) from None
