"""A stack of identical blocks traced as three, the middle one repeated in the IR.

Tracing costs PyTorch about a millisecond per op (twice: export, then decomposition), so a
7B decoder's 32 layers take most of a serving analysis. Its layers are the same code on
weights of the same shapes, so their traced subgraphs are the same but for names. The model is
traced with its layer list cut to three — layer 0 (after the embeddings), layer 1 (between two
layers: the one every middle layer is) and layer 2 (before the head) — and layer 1 is copied
into layers 2 … N − 2, each copy with its own weights, cache tensors, activations and
references (the model's Python holding a tensor into the next layer is held into the next
copy); the third traced layer becomes layer N − 1. The graph is then the full trace's up to
names: tests/test_serving.py checks node for node, and the memory timeline, against a trace
of all N layers.

It is refused (``None``: the caller traces every layer) unless the three layers are
contiguous runs of nodes with the same ops, attributes and shapes, each reading only its own
values, its own weights and cache, the layer before it and values made before the stack.

A stack whose layers' kinds repeat with a period (Gemma-2's and gpt-oss's sliding and full
attention alternate: period 2) is grown the same way with each run of ``period`` layers as
one block: 3 · period layers traced, their scopes renamed ``layers.5`` → ``layers.2.1`` while
the blocks are grown and back after (:func:`regrouped`). Layers before the blocks unlike them
(DeepSeek's dense first layer) and a tail of less than a period after them (Gemma-3's) are
traced as they are and renamed out of the stack meanwhile, so that the walk sees them as
what comes before and after it (layer_stack.py). A node before
the stack that one layer alone reads (a sliding-window cache's token counter) is grown with
that layer and put back before the stack after (:func:`_preludes`).
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import torch

from ....passes.ir import Graph, Node, Value, ValueKind
from .capture import TraceFailure
from .layer_stack import (
    REPEAT_AT,
    TRACED,
    Stack,
    find_stack,
    layers_note,
    truncated,
)


def trace_repeated(model: torch.nn.Module, trace, prefix: str = "",
                   at_least: int = REPEAT_AT, grown: list | None = None,
                   repeat=None) -> Graph:
    """``trace()``'s graph of ``model`` (a function tracing it afresh), taken with the
    model's stack of ``at_least`` or more identical blocks cut to three and grown back to
    its length in the IR; the whole stack traced when it cannot be (the graph then has no
    ``traced_layers``). ``prefix``: the module path the trace's scopes put before the
    model's own (a wrapper's attribute). When the stack is grown, the function growing a
    graph of three layers is appended to ``grown`` (for the same trace at another batch).
    ``repeat``: the growing function (``repeat_layers``; a joint graph's is repeat_joint.py's)."""
    stack = find_stack(model, at_least) if at_least else None
    if stack is None:
        return trace()
    try:
        with truncated(model, stack):
            graph = trace()
    except TraceFailure:
        # the model needs the whole list, however its code counts on it (RF-DETR indexes its
        # 13 query groups' heads by a count of its own; Gemma 4 views a tensor by the
        # config's layer count; DPT's neck checks that it has a hidden state of each layer
        # it reads, ZoeDepth's that they are a list): traced whole, where a failure is the
        # whole model's own
        return trace()

    def grow(g: Graph) -> Graph | None:
        out = None if g.size_bounds else grow_stack(g, prefix + stack.path, stack, repeat)
        return None if out is None else replace(out, traced_layers=layers_note(stack))
    out = grow(graph)
    if out is None:
        return trace()
    if grown is not None:
        grown.append(grow)
    return out


def grow_stack(graph: Graph, prefix: str, stack: Stack, repeat=None) -> Graph | None:
    """``graph``, traced with ``stack`` truncated, grown to the stack's length by ``repeat``
    (``repeat_layers``, or repeat_joint.py's for a joint graph); None when it cannot be."""
    repeat = repeat or repeat_layers
    blocks = regrouped(graph, prefix, stack)
    preludes = _preludes(blocks, prefix)
    out = repeat(_into_layers(blocks, prefix, preludes), prefix, stack.blocks)
    if out is None:
        return None
    return regrouped(_out_of_layers(out, preludes, graph.nodes), prefix, stack, back=True)


def _preludes(graph: Graph, prefix: str) -> dict[int, int]:
    """The nodes before the stack that one layer alone reads, from the graph's leaves (node
    index -> that layer): transformers' sliding-window cache makes each sliding layer's token
    counter before the stack (a clone of a constant), which its layer only checks."""
    layer = [layer_of(n.scope, prefix) for n in graph.nodes]
    first = next((i for i, k in enumerate(layer) if k is not None), 0)
    readers: dict[str, set] = {}
    for i, node in enumerate(graph.nodes):
        for x in node.inputs:
            if x:
                readers.setdefault(x, set()).add(i)
    out = {}
    for i in range(first):
        node = graph.nodes[i]
        read = {layer[r] for o in node.outputs if o for r in readers.get(o, ())}
        if len(read) == 1 and None not in read and all(
                graph.values[x].producer is None and readers[x] == {i}
                and graph.values[x].kind == ValueKind.CONST   # (a constant's clone: not the
                for x in node.inputs if x):                     # embedding of the ids)
            out[i] = read.pop()
    counts = {k: list(out.values()).count(k) for k in range(TRACED)}
    # each layer its own (else it is no prelude: the embedding only the first layer reads)
    return out if len(set(counts.values())) == 1 else {}


def _into_layers(graph: Graph, prefix: str, preludes: dict[int, int]) -> Graph:
    """``graph`` with each prelude node moved to the head of the layer that reads it, in its
    scope, so that a layer grown is grown with its own."""
    if not preludes:
        return graph
    heads: dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        k = layer_of(node.scope, prefix)
        if k is not None and i not in preludes:
            heads.setdefault(k, i)
    scope = {i: f"{prefix}.{k}" for i, k in preludes.items()}
    order = [i for i in range(len(graph.nodes)) if i not in preludes]
    for k, head in sorted(heads.items(), key=lambda kv: -kv[1]):
        at = order.index(head)
        order[at:at] = [i for i, pk in preludes.items() if pk == k]
    return moved(graph, order, scope)


def _out_of_layers(graph: Graph, preludes: dict[int, int], traced: tuple[Node, ...]) -> Graph:
    """The grown ``graph`` with every layer's prelude node (its copies are named
    ``name~c``) back before the stack, where the first was traced, in layer order and its
    traced scope."""
    if not preludes:
        return graph
    scope_of = {traced[i].name: traced[i].scope for i in preludes}
    back = [i for i, n in enumerate(graph.nodes) if n.name.split("~")[0] in scope_of]
    rest = [i for i in range(len(graph.nodes)) if i not in set(back)]
    at = min(preludes)
    order = rest[:at] + back + rest[at:]
    return moved(graph, order, {i: scope_of[graph.nodes[i].name.split("~")[0]]
                                for i in back})


def moved(graph: Graph, order: list[int], scopes: dict[int, str]) -> Graph:
    """``graph``'s nodes in ``order`` (old indices), renumbered, ``scopes`` (old index ->
    scope) changed; producers and eager references follow their nodes."""
    new = {old: k for k, old in enumerate(order)}
    nodes = tuple(replace(graph.nodes[old], index=k,
                          scope=scopes.get(old, graph.nodes[old].scope))
                  for k, old in enumerate(order))
    values = {n: v if v.producer is None else replace(v, producer=new[v.producer])
              for n, v in graph.values.items()}
    return replace(graph, nodes=nodes, values=MappingProxyType(values),
                   eager_refs=MappingProxyType({n: new[p] for n, p in graph.eager_refs.items()}))


def regrouped(graph: Graph, prefix: str, stack: Stack, back: bool = False) -> Graph:
    """``graph`` with the stack ``prefix``'s layers scoped as blocks, so that it grows as
    identical blocks: each run of ``period`` layers one block, its layers numbered inside it
    ("layers.5.mlp" → "layers.2.1.mlp" at period 2), the head's and the tail's layers out of
    the stack ("layers~head.0.mlp", "layers~tail.1.mlp"); ``back``: the scopes of the grown
    graph as the model names them again."""
    if (stack.period, stack.head, stack.tail) == (1, 0, 0):
        return graph
    scoped = _back_scope if back else _block_scope

    def rename(scope: str) -> str:
        return scoped(scope, prefix, stack)
    return replace(
        graph, nodes=tuple(replace(n, scope=rename(n.scope)) if n.scope.startswith(prefix)
                           else n for n in graph.nodes),
        module_types=MappingProxyType({rename(k): v for k, v in graph.module_types.items()}),
        param_paths=MappingProxyType({k: rename(v) for k, v in graph.param_paths.items()}),
        attention=tuple(replace(c, scope=rename(c.scope)) for c in graph.attention))


def _block_scope(scope: str, prefix: str, stack: Stack) -> str:
    """A traced layer's module path as the grown walk reads it (:func:`regrouped`)."""
    first, dot, rest = scope.removeprefix(prefix + ".").partition(".")
    if not scope.startswith(prefix + ".") or not first.isdigit():
        return scope
    i, h, p = int(first), stack.head, stack.period
    if i < h:
        return f"{prefix}~head.{i}{dot}{rest}"
    if i >= h + TRACED * p:
        return f"{prefix}~tail.{i - h - TRACED * p}{dot}{rest}"
    block, layer = divmod(i - h, p)
    return f"{prefix}.{block}{dot}{rest}" if p == 1 else f"{prefix}.{block}.{layer}{dot}{rest}"


def _back_scope(scope: str, prefix: str, stack: Stack) -> str:
    """A grown graph's module path as the model names it: :func:`_block_scope` undone, the
    tail after the last block."""
    h, p = stack.head, stack.period
    for part, base in (("~head.", 0), ("~tail.", h + stack.blocks * p)):
        if scope.startswith(prefix + part):
            first, dot, rest = scope.removeprefix(prefix + part).partition(".")
            return f"{prefix}.{base + int(first)}{dot}{rest}"
    if not scope.startswith(prefix + "."):
        return scope
    n = 1 if p == 1 else 2  # the numbers naming a layer in the walk: its block (its place)
    parts = scope.removeprefix(prefix + ".").split(".", n)
    if len(parts) < n or not all(x.isdigit() for x in parts[:n]):
        return scope
    layer = h + int(parts[0]) * p + (int(parts[1]) if n == 2 else 0)
    return ".".join([f"{prefix}.{layer}", *parts[n:]])


def layer_of(scope: str, prefix: str) -> int | None:
    """The block index of a module path inside the stack ``prefix`` ("layers.3.mlp" → 3)."""
    if not scope.startswith(prefix + "."):
        return None
    head = scope[len(prefix) + 1:].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def rescope(scope: str, prefix: str, old: int, new: int) -> str:
    """``scope`` of block ``old`` as block ``new``'s."""
    return f"{prefix}.{new}" + scope[len(f"{prefix}.{old}"):]


def repeat_layers(graph: Graph, prefix: str, total: int) -> Graph | None:
    """``graph`` traced with the three layers ``prefix``.0–2, grown to ``total`` layers."""
    layer = [layer_of(n.scope, prefix) for n in graph.nodes]
    spans = _spans(layer)
    if spans is None:
        return None
    n = len(spans[1])
    if len(spans[0]) != n or len(spans[2]) != n or total <= TRACED:
        return graph if total == TRACED else None
    lay = _Layers(graph, prefix, layer, spans, total)
    if not lay.alike():
        return None
    refs = lay.eager_refs()
    if refs is None:
        return None  # a value held across two layers: no copy could say where to
    nodes, values = lay.nodes()
    return replace(graph, nodes=nodes, values=MappingProxyType(values),
                   inputs=grown_names(graph.inputs, lambda x: (r := lay.role(x, 1)) is not None
                                      and r[0] == "leaf", total),
                   outputs=grown_names(graph.outputs,
                                       lambda x: lay.where.get(x, (None,))[0] == 1, total),
                   module_types=MappingProxyType(lay.module_types()),
                   eager_refs=MappingProxyType(refs),
                   eager_inplace=MappingProxyType(lay.eager_inplace()))


def _spans(layer: list[int | None]) -> list[range] | None:
    """The node spans of the three traced layers (``layer``: each node's), None unless each
    is one run and they follow each other."""
    runs: dict[int, list[int]] = {}
    for i, k in enumerate(layer):
        if k is not None:
            run = runs.setdefault(k, [i, i])
            if run[1] not in (i, i - 1):
                return None  # a layer's nodes are not one run
            run[1] = i
    if sorted(runs) != [0, 1, 2] or runs[0][1] + 1 != runs[1][0] or \
            runs[1][1] + 1 != runs[2][0]:
        return None
    return [range(runs[k][0], runs[k][1] + 1) for k in range(3)]


class _Layers:
    """The three traced layers of ``graph`` (``spans``: their nodes), what each value is to
    them, and where the grown graph of ``total`` layers puts each node."""

    def __init__(self, graph: Graph, prefix: str, layer: list[int | None],
                 spans: list[range], total: int):
        self.g, self.prefix, self.spans, self.total = graph, prefix, spans, total
        self.n = n = len(spans[1])
        self.last = total - 2                       # the last copy of layer 1
        self.base2 = base2 = spans[1][-1] + 1       # copy 2's first node
        shift = (total - TRACED) * n                # how far layer 2 and what follows move
        self.new_index = {i: (i if i < base2 else i + shift) for i in range(len(graph.nodes))}
        self.where: dict[str, tuple[int, int, int]] = {}  # value -> (layer, position, slot)
        for k, span in enumerate(spans):
            for j, i in enumerate(span):
                for slot, out in enumerate(graph.nodes[i].outputs):
                    if out:
                        self.where[out] = (k, j, slot)
        self.readers: dict[str, set] = {}  # value -> the layers reading it (None: outside)
        for i, node in enumerate(graph.nodes):
            for name in node.inputs:
                if name:
                    self.readers.setdefault(name, set()).add(layer[i])
        # layer 1's value at (position, slot)
        self.at1 = {(j, slot): out for out, (k, j, slot) in self.where.items() if k == 1}

    def role(self, name: str, k: int):
        """How layer k's node reads ``name``: its own value, the layer before's, its own
        leaf (a weight or cache input no one else reads) or a value shared by the stack."""
        if name in self.where:
            lk, j, slot = self.where[name]
            if lk == k:
                return ("own", j, slot)
            return ("prev", j, slot) if lk == k - 1 else None
        v = self.g.values.get(name)
        if v is not None and v.producer is None and self.readers.get(name) == {k}:
            return ("leaf", v.spec, v.kind)
        if v is not None and (v.producer is None or v.producer < self.spans[0][0]):
            return ("shared", name)
        return None

    def alike(self) -> bool:
        """Layers 1 and 2 alike node for node (layer 0 in ops and output shapes), each read
        with the same role; after the stack, only the last layer read."""
        g, nodes, spans = self.g, self.g.nodes, self.spans
        for j in range(self.n):
            z, a, b = nodes[spans[0][j]], nodes[spans[1][j]], nodes[spans[2][j]]
            if z.op != a.op or [g.spec(o) for o in z.outputs] != \
                    [g.spec(o) for o in a.outputs]:
                return False
            if (a.op, dict(a.attrs), len(a.inputs), len(a.outputs)) != \
                    (b.op, dict(b.attrs), len(b.inputs), len(b.outputs)):
                return False
            if [g.spec(o) for o in a.outputs if o] != [g.spec(o) for o in b.outputs if o]:
                return False
            for x, y in zip(a.inputs, b.inputs):
                rx, ry = (self.role(x, 1), self.role(y, 2)) if x and y else (x, y)
                if rx is None or rx != ry:
                    return False
        for i in range(spans[2][-1] + 1, len(nodes)):  # after the stack: only the last layer's
            if any(self.where.get(x, (2,))[0] != 2 for x in nodes[i].inputs if x):
                return False
        return True

    def copy(self, name: str, c: int) -> str:
        """Layer 1's ``name`` as read by copy c (layer c)."""
        r = self.role(name, 1)
        if r is None or r[0] == "shared":
            return name
        if r[0] == "leaf":
            return f"{name}~{c}"
        base = self.at1[(r[1], r[2])]
        if r[0] == "own":
            return f"{base}~{c}"
        return base if c - 1 == 1 else f"{base}~{c - 1}"  # the layer before it

    def from_last(self, name: str) -> str:
        """Layer 2's ``name`` as the last layer reads it: the last copy's, not layer 1's."""
        r = self.role(name, 2) if name else None
        return f"{self.at1[(r[1], r[2])]}~{self.last}" if r and r[0] == "prev" else name

    def nodes(self) -> tuple[tuple[Node, ...], dict[str, Value]]:
        """The grown graph's nodes (layer 1's copies after it, layer 2 the last layer) and
        values."""
        nodes, values, spans, prefix = self.g.nodes, self.g.values, self.spans, self.prefix
        out_nodes: list[Node] = []
        new_values: dict[str, Value] = {}
        for name, v in values.items():
            new_values[name] = v if v.producer is None else \
                replace(v, producer=self.new_index[v.producer])
        for i in range(self.base2):
            out_nodes.append(replace(nodes[i], index=i) if nodes[i].index != i else nodes[i])
        for c in range(2, self.total - 1):
            for j, i in enumerate(spans[1]):
                node = nodes[i]
                ins = tuple(self.copy(x, c) if x else x for x in node.inputs)
                out_nodes.append(copied(node, c, self.base2 + (c - 2) * self.n + j, ins, values,
                                        new_values, rescope(node.scope, prefix, 1, c)))
        for i in range(spans[2][0], len(nodes)):
            node = nodes[i]
            ins = tuple(self.from_last(x) for x in node.inputs) if i in spans[2] else \
                node.inputs
            scope = rescope(node.scope, prefix, 2, self.total - 1) if i in spans[2] else \
                node.scope
            out_nodes.append(replace(node, index=self.new_index[i], inputs=ins, scope=scope))
        return tuple(out_nodes), new_values

    def eager_refs(self) -> dict[str, int] | None:
        """Where the model's Python releases each value it held, each layer-1 value's copies
        included; None when a layer-0 value is held into layer 2."""
        refs = {}
        for name, p in self.g.eager_refs.items():
            k = self.where.get(name, (None,))[0]
            if k == 0 and p in self.spans[2]:
                return None
            if k == 1:
                refs[name] = self._held(p, 1)
                for c in range(2, self.total - 1):
                    refs[f"{name}~{c}"] = self._held(p, c)
            else:
                refs[name] = self.new_index[p]
        return refs

    def _held(self, p: int, c: int) -> int:
        """Where copy c of a layer-1 value is released: the same point of its own layer, of
        the layer after it, or a point after the stack."""
        spans, new_index = self.spans, self.new_index
        if p in spans[1]:
            return new_index[p] if c == 1 else self.base2 + (c - 2) * self.n + (p - spans[1][0])
        if p in spans[2]:
            if c == self.last:
                return new_index[p]
            return self.base2 + (c - 1) * self.n + (p - spans[2][0])
        return new_index[p]

    def eager_inplace(self) -> dict[str, str]:
        """What the model's Python wrote in place, each layer-1 write's copies included."""
        inplace = dict(self.g.eager_inplace)
        for out, into in self.g.eager_inplace.items():
            if self.where.get(out, (None,))[0] == 1:
                for c in range(2, self.total - 1):
                    inplace[f"{out}~{c}"] = self.copy(into, c)
            elif self.where.get(out, (None,))[0] == 2:
                inplace[out] = self.from_last(into)
        return inplace

    def module_types(self) -> dict[str, str]:
        """Module path -> type, with layer 1's modules under every copy's path."""
        types = dict(self.g.module_types)
        for path, kind in self.g.module_types.items():
            if layer_of(path, self.prefix) == 1:
                for c in range(3, self.total):
                    types[rescope(path, self.prefix, 1, c)] = kind
        return types


def copied(node: Node, c: int, index: int, inputs: tuple[str, ...], values, new_values: dict,
           scope: str) -> Node:
    """``node`` as copy c's, at ``index``, reading ``inputs``: its outputs renamed ``name~c``
    and, with every input name new to the graph, entered in ``new_values``."""
    outs = tuple(f"{o}~{c}" if o else o for o in node.outputs)
    for x, nx in zip(node.inputs, inputs):
        if nx != x and nx not in new_values:
            new_values[nx] = replace(values[x], name=nx)
    for o, no in zip(node.outputs, outs):
        if o:
            new_values[no] = replace(values[o], name=no, producer=index)
    return replace(node, index=index, name=f"{node.name}~{c}", inputs=inputs, outputs=outs,
                   scope=scope)


def grown_names(names: tuple[str, ...], of_layer1, total: int) -> tuple[str, ...]:
    """Graph inputs or outputs with layer 1's copies after layer 1's own."""
    mine = [x for x in names if of_layer1(x)]
    if not mine:
        return names
    out = []
    for x in names:
        out.append(x)
        if x == mine[-1]:
            out += [f"{y}~{c}" for c in range(2, total - 1) for y in mine]
    return tuple(out)
