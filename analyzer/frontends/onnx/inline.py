"""Model-local functions inlined under a budget counted before anything is expanded.

onnx.inliner copies a function's body into every call, recursively, so a file whose function
k calls function k − 1 twice grows as 2^k: 30 levels are a 2 KB file and a billion nodes
(11.9 GB, then SIGSEGV). What inlining WOULD produce is counted first, as onnx.inliner makes
it (onnx/inliner/inliner.cc), in time linear in the file; past the budget nothing is expanded
and the call that carries the growth is named. Two measures:

* nodes: a call is its callee's nodes, a node's subgraphs are their nodes, and an attribute
  that refers to the caller's (``ref_attr_name``) is a copy of the graph the call passed, at
  every place it is referred to: an If whose two branches refer to a graph passed down K levels
  of two calls each holds 2^K copies of it (K = 10, a 1,000-node graph: 6.2 GB, over 60 s);
* bytes: every copy of a node's names (inputs, outputs, its own: their characters plus
  NAME_BYTES, what a string costs in memory) and attributes (a tensor, a list): one Sum of
  10,000 inputs in a doubling function is few nodes but 10,000 names per copy (14 levels: 8 GB).
  A formal input or output is as long as the name the call binds to it, and each inlining
  suffixes the names it copies (RENAME_BYTES), so a graph passed down K levels is renamed K times.

Counting is symbolic, memoized per function: a function's size is a fixed part plus, per free
variable (an attribute it refers to, a formal input or output), the number of copies of the
variable's value it holds and the suffix bytes added to their names; a call substitutes what it
binds, so a graph passed down is counted once and multiplied.

The budget grows with the file: INLINE_FACTOR nodes (bytes) per node (byte) the file writes
(real exports call one block's function once per layer: ~10–30 nodes out per node in), and never
below INLINE_FLOOR nodes (~1.4 s and ~85 MB of analysis at ~45 µs and ~3 KB per node) nor
INLINE_BYTES_FLOOR bytes (~500k one-letter names: ~1.5 s and ~90 MB of analysis).
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import onnx
import onnx.inliner
from onnx import AttributeProto

from ....passes.errors import GraphcostError, first_line

INLINE_FACTOR = 32
INLINE_FLOOR = 30_000
INLINE_BYTES_FLOOR = 16 << 20
NAME_BYTES = 32  # a name's cost beyond its characters: a std::string in onnx, a str in Python
RENAME_BYTES = 8  # what one inlining appends to a name it copies: "__" + its count (1 to 10^6)
# graphs in graphs, counted by recursion: a parsed file stops near 33 (protobuf's 100 messages
# deep), a proto built in memory does not
MAX_NESTING = 100
_CAP = 1 << 64  # counts saturate here: exact figures beyond it say nothing more


def _sat(n: int) -> int:
    return min(n, _CAP)


class _Size:
    """What some nodes inline to: nodes, names and bytes, plus per free variable — ("attr",
    the name an attribute refers to) or ("io", a formal input/output) — how many copies of its
    value they hold and the rename bytes added to each name of those copies."""
    __slots__ = ("nodes", "names", "bytes", "free")

    def __init__(self, nodes: int = 0, names: int = 0, nbytes: int = 0) -> None:
        self.nodes, self.names, self.bytes = nodes, names, nbytes
        self.free: dict[tuple[str, str], tuple[int, int]] = {}

    @classmethod
    def var(cls, var: tuple[str, str], renamed: int, nbytes: int = 0) -> _Size:
        s = cls(nbytes=nbytes)
        s.use(var, renamed)
        return s

    def use(self, var: tuple[str, str], renamed: int = 0) -> None:
        """Adds one copy of ``var``'s value."""
        m, r = self.free.get(var, (0, 0))
        self.free[var] = (_sat(m + 1), _sat(r + renamed))

    def add(self, other: _Size, copies: int = 1, renamed: int = 0) -> None:
        """Adds ``copies`` of ``other``, each of whose names ends up ``renamed`` bytes longer."""
        self.nodes = _sat(self.nodes + copies * other.nodes)
        self.names = _sat(self.names + copies * other.names)
        self.bytes = _sat(self.bytes + copies * other.bytes + renamed * other.names)
        for var, (m, r) in other.free.items():
            m0, r0 = self.free.get(var, (0, 0))
            self.free[var] = (_sat(m0 + copies * m), _sat(r0 + copies * r + renamed * m))


@dataclass
class _Form:
    """A function's size, its formals, and the bytes of its formal outputs' own names (what a
    call that binds none of them gets: onnx.inliner keeps an unbound output's name)."""
    size: _Size
    inputs: list[str]
    outputs: list[str]
    unbound: int


def _subgraphs(node: onnx.NodeProto):
    # by presence, not by the declared type: onnx.inliner goes into any graph an attribute has
    for a in node.attribute:
        if a.HasField("g"):
            yield a.g
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
        subs = list(_subgraphs(node)) if node.attribute else None
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


def _holds_graph(n: onnx.NodeProto) -> bool:
    return bool(n.attribute) and any(a.HasField("g") or a.graphs for a in n.attribute)


def _text(n: onnx.NodeProto) -> int:
    """A node's bytes apart from its names and attributes."""
    return len(n.op_type) + len(n.domain) + len(n.overload) + len(n.doc_string) + \
        sum(p.ByteSize() for p in chain(n.metadata_props, n.device_configurations))


def _payload(a: AttributeProto) -> int:
    """An attribute's bytes apart from its graphs (those are counted node by node)."""
    if not a.HasField("g") and not a.graphs:
        return a.ByteSize()
    messages = chain([a.t, a.sparse_tensor, a.tp], a.tensors, a.sparse_tensors, a.type_protos)
    return len(a.name) + len(a.doc_string) + len(a.s) + sum(map(len, a.strings)) + \
        8 * (len(a.floats) + len(a.ints)) + sum(m.ByteSize() for m in messages)


def _shell(g: onnx.GraphProto, rename: int) -> _Size:
    """A subgraph's own inputs, outputs, initializers and annotations: onnx.inliner renames
    the first three in every copy."""
    names = len(g.input) + len(g.output) + len(g.initializer)
    parts = chain(g.input, g.output, g.initializer, g.sparse_initializer, g.value_info,
                  g.quantization_annotation, g.metadata_props)
    return _Size(0, names, len(g.name) + len(g.doc_string) + sum(p.ByteSize() for p in parts)
                 + names * (NAME_BYTES + rename))


class _Counter:
    """Counts what onnx.inliner makes of nodes: inside a function symbolically (``formals``,
    its inputs and outputs, are free variables; its names are renamed when it is inlined), in
    the model's graph (``formals`` None) as written."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.forms: dict[tuple[str, str, str], _Form] = {}
        self.domains: set[str] = set()  # the forms' (a cheap test before the key's)
        self.depth = 0
        self.worst: dict[str, tuple[int, tuple[str, str, str]]] = {}  # the graph's calls

    def function(self, f: onnx.FunctionProto) -> None:
        """Memoizes ``f``'s form (its callees' are known: they come first)."""
        formals = frozenset([*f.input, *f.output])
        size = self.nodes(f.node, formals)
        # its value_info is appended to the graph at every call
        size.add(_Size(0, len(f.value_info), sum(v.ByteSize() + NAME_BYTES + RENAME_BYTES
                                                  for v in f.value_info)))
        unbound = sum(size.free.get(("io", o), (0, 0))[0] * len(o) for o in f.output)
        self.domains.add(f.domain)
        self.forms[_key(f)] = _Form(size, list(f.input), list(f.output), _sat(unbound))

    def nodes(self, nodes, formals: frozenset | None) -> _Size:
        total = _Size()
        for n in nodes:
            form = self.forms.get(_key(n)) if n.domain in self.domains else None
            if form is None:
                self.node(total, n, formals)
            else:
                total.add(self.call(n, form, formals))
        total.bytes = _sat(total.bytes)
        return total

    def node(self, total: _Size, n: onnx.NodeProto, formals: frozenset | None) -> None:
        """Adds node ``n`` (not a call) to ``total``."""
        slots = 1 + len(n.input) + len(n.output)  # its name, inputs and outputs
        total.nodes += 1
        total.names += slots
        if formals is None and not _holds_graph(n):  # as written: one C call
            total.bytes += n.ByteSize() + NAME_BYTES * slots
            return
        total.bytes += _text(n) + len(n.name) + NAME_BYTES * slots
        if formals is None:
            total.bytes += sum(map(len, n.input)) + sum(map(len, n.output))
        else:
            total.bytes += RENAME_BYTES  # its own name's suffix
            for x in chain(n.input, n.output):
                if x in formals:  # the name the call binds to it, as it is
                    total.use(("io", x))
                else:
                    total.bytes += len(x) + RENAME_BYTES
        for a in n.attribute:
            if (a.ref_attr_name and formals is not None) or a.HasField("g") or a.graphs:
                total.add(self.attribute(a, formals))
            else:
                total.bytes += a.ByteSize()

    def attribute(self, a: AttributeProto, formals: frozenset | None) -> _Size:
        """An attribute as inlined: inside a function, a reference is a copy of what the
        caller passes, renamed with the function's names; graphs are counted node by node."""
        if a.ref_attr_name and formals is not None:
            return _Size.var(("attr", a.ref_attr_name), RENAME_BYTES, len(a.name))
        s = _Size(nbytes=_payload(a))
        for g in chain([a.g] if a.HasField("g") else [], a.graphs):
            s.add(self.graph(g, formals))
        return s

    def graph(self, g: onnx.GraphProto, formals: frozenset | None) -> _Size:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise GraphcostError(f"{self.name}: graphs nested over {MAX_NESTING} deep in a "
                                 "model with local functions: cannot inline them")
        s = self.nodes(g.node, formals)
        s.add(_shell(g, 0 if formals is None else RENAME_BYTES))
        self.depth -= 1
        return s

    def call(self, n: onnx.NodeProto, form: _Form, formals: frozenset | None) -> _Size:
        """A call: its callee's form with what the call binds substituted (onnx.inliner binds
        attributes by name, the last of a name winning, inputs and outputs by position)."""
        free = form.size.free
        s = _Size(form.size.nodes, form.size.names, form.size.bytes + form.unbound)
        for name, a in {a.name: a for a in n.attribute}.items():
            if ("attr", name) in free:
                s.add(self.attribute(a, formals), *free["attr", name])
        for formal, actual in zip(form.inputs, n.input):
            if actual and ("io", formal) in free:
                s.add(self.name_of(actual, formals), *free["io", formal])
        for formal, actual in zip(form.outputs, n.output):
            if actual and ("io", formal) in free:
                s.add(self.name_of(actual, formals), *free["io", formal])
                if form.unbound < _CAP and s.bytes < _CAP:  # not the formal's own name
                    s.bytes -= free["io", formal][0] * len(formal)
        if formals is None:
            self.note(_key(n), s)
        return s

    @staticmethod
    def name_of(actual: str, formals: frozenset | None) -> _Size:
        return _Size.var(("io", actual), 0) if formals and actual in formals else \
            _Size(nbytes=len(actual))

    def note(self, key: tuple[str, str, str], s: _Size) -> None:
        """Keeps the graph's largest call, by nodes and by bytes, for the refusal."""
        for measure, value in (("nodes", s.nodes), ("bytes", s.bytes)):
            if value > self.worst.get(measure, (-1, key))[0]:
                self.worst[measure] = (value, key)


def _written(model: onnx.ModelProto) -> tuple[int, int]:
    """The nodes and bytes the file writes (graph and functions, subgraphs included), counted
    as _Counter counts them: the budget's base."""
    nodes = nbytes = 0
    for n in chain(_walk(model.graph.node), *(_walk(f.node) for f in model.functions)):
        slots = 1 + len(n.input) + len(n.output)
        nodes += 1
        nbytes += NAME_BYTES * slots
        if not _holds_graph(n):
            nbytes += n.ByteSize()
            continue
        nbytes += _text(n) + len(n.name) + sum(map(len, n.input)) + sum(map(len, n.output)) + \
            sum(_payload(a) for a in n.attribute) + sum(_shell(g, 0).bytes for g in _subgraphs(n))
    return nodes, nbytes + sum(v.ByteSize() for f in model.functions for v in f.value_info)


def _count(model: onnx.ModelProto, name: str) -> tuple[_Size, _Counter]:
    functions = {_key(f): f for f in model.functions}
    roots = list(dict.fromkeys(_key(n) for n in _walk(model.graph.node) if _key(n) in functions))
    counter = _Counter(name)
    for k in _order(functions, roots, name):
        counter.function(functions[k])
    return counter.nodes(model.graph.node, None), counter


def inlined_size(model: onnx.ModelProto, name: str = "model") -> tuple[int, int, int]:
    """The nodes, names and bytes inlining ``model``'s local functions makes, as the budget
    counts them (nothing is expanded)."""
    total, _ = _count(model, name)
    return total.nodes, total.names, total.bytes


def check_inline_budget(model: onnx.ModelProto, name: str) -> None:
    """Raises unless inlining ``model``'s local functions stays within the budget."""
    total, counter = _count(model, name)
    written, written_bytes = _written(model)
    budget = max(INLINE_FLOOR, INLINE_FACTOR * written)
    if total.nodes > budget:
        size, worst = counter.worst.get("nodes", (0, ("", "?", "")))
        raise GraphcostError(
            f"{name}: refused: inlining its local functions would make {_figure(total.nodes)} "
            f"nodes out of the {written:,} in the file (a call to {_label(worst)} alone expands "
            f"to {_figure(size)}); the budget is {budget:,}: max({INLINE_FLOOR:,}, "
            f"{INLINE_FACTOR} per node in the file)")
    budget = max(INLINE_BYTES_FLOOR, INLINE_FACTOR * written_bytes)
    if total.bytes > budget:
        size, worst = counter.worst.get("bytes", (0, ("", "?", "")))
        raise GraphcostError(
            f"{name}: refused: inlining its local functions would make {_figure(total.nodes)} "
            f"nodes holding {_figure(total.names)} names, {_figure(total.bytes)} bytes of names "
            f"and attributes out of the {written_bytes:,} in the file (a call to "
            f"{_label(worst)} alone expands to {_figure(size)}); the budget is {budget:,}: "
            f"max({INLINE_BYTES_FLOOR:,}, {INLINE_FACTOR} per byte in the file)")


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
                             f"{first_line(exc) or type(exc).__name__}"
                             ) from None
