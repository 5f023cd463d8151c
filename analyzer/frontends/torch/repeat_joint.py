"""A training step's joint graph traced with three blocks of a stack, grown to all of them.

The forward is grown as repeat_layers.py grows an inference graph: layer 1 copied into layers
2 … N − 2, the third traced layer becoming layer N − 1. The backward runs the layers in
reverse, so it holds three spans — layer 2's, then layer 1's, then layer 0's — and layer 1's
is copied too, the copies in descending order between the last layer's backward and layer
1's. A backward node carries no module path: a span starts at the first backward node that
reads a value its layer's forward made (after the loss), and ends where the next one starts.

Each backward copy c reads copy c's forward values and weights, layer c − 1's forward values
where layer 1's backward reads layer 0's (a norm's saved input), and layer c + 1's backward
values where layer 1's reads layer 2's (the gradient flowing down the stack); layer 1's own
backward then reads copy 2's. Copy c's weights get their gradients as graph outputs, after
layer 1's. Refused (``None``: the caller traces every layer) unless the spans line up op for
op and every read has the same role in layers 1 and 2 (the gradient from above: in layers 0
and 1). What the model's Python held (``eager_refs``) and wrote in place (``eager_inplace``)
follow the copies: a layer-1 value held to a point of its layer is held so in each copy (and
layer 2 must hold its twin alike), one held into the next layer into the next copy.
tests/test_repeat_joint.py checks the grown graph node for node, and the training memory,
against the trace of every layer.
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from ....passes.costs.registry import lookup
from ....passes.ir import AttentionKernel, Graph, Node, Value
from .layer_stack import TRACED
from .repeat_layers import copied, grown_names, layer_of, moved, rescope


# long: one walk over both phases renumbers nodes and values together
def repeat_joint(graph: Graph, prefix: str, total: int) -> Graph | None:
    """``graph`` (a joint graph traced with the three layers ``prefix``.0–2) grown to
    ``total`` layers, or None when its layers do not line up."""
    if total <= TRACED:
        return graph if total == TRACED and _Layout.of(graph, prefix) is not None else None
    # as traced, else with the views AOTAutograd left at the end moved into their layers
    # (the grown graph is then the full trace's up to where those views stand)
    for g in (graph, _views_after_producers(graph)):
        lay = _Layout.of(g, prefix)
        if lay is not None and lay.check():
            return lay.grow(total)
    return None


def _views_after_producers(graph: Graph) -> Graph:
    """``graph`` with each view AOTAutograd writes at its end, unscoped, moved to just after
    the backward node it views, in that node's scope: a gradient an autograd function returns as a
    view (torchao's float8 linears return the weight's transposed) is made there, where the
    layer whose backward made it is long done; moved, each layer's backward holds its own. A
    view allocates nothing, and its storage is the viewed node's, so no lifetime changes."""
    nodes = graph.nodes
    loss = graph.values[graph.outputs[0]].producer if graph.outputs else None
    last = max((i for i, n in enumerate(nodes) if n.scope), default=len(nodes))
    after: dict[int, list[int]] = {}
    for i in range(last + 1, len(nodes)):
        node, rule = nodes[i], lookup(nodes[i].op)
        sources = [graph.values[x].producer for x in node.inputs if x]
        if node.scope or rule is None or not rule.alias or len(sources) != 1 or \
                sources[0] is None or loss is None or sources[0] <= loss:
            continue  # (a backward node's view alone)
        after.setdefault(sources[0], []).append(i)
    if not after:
        return graph
    moving = {i for views in after.values() for i in views}
    order: list[int] = []

    def emit(i: int) -> None:  # (a view of a view follows the view it reads)
        order.append(i)
        for view in after.get(i, ()):
            emit(view)
    for i in range(len(nodes)):
        if i not in moving:
            emit(i)
    return moved(graph, order, {i: nodes[p].scope for p, views in after.items() for i in views})


class _Layout:
    """Where each traced layer's forward and backward nodes are, and what each value is."""

    def __init__(self, graph: Graph, prefix: str, fwd: list[range], bwd: list[range]):
        self.g, self.prefix, self.fwd, self.bwd = graph, prefix, fwd, bwd
        self.where: dict[str, tuple[int, str, int, int]] = {}  # value -> (layer, phase, j, slot)
        for phase, spans in (("f", fwd), ("b", bwd)):
            for k, span in enumerate(spans):
                for j, i in enumerate(span):
                    for slot, out in enumerate(graph.nodes[i].outputs):
                        if out:
                            self.where[out] = (k, phase, j, slot)
        self.readers: dict[str, set[int]] = {}  # leaf value -> the layers reading it
        for phase_spans in (fwd, bwd):
            for k, span in enumerate(phase_spans):
                for i in span:
                    for x in graph.nodes[i].inputs:
                        if x:
                            self.readers.setdefault(x, set()).add(k)

    @classmethod
    def of(cls, graph: Graph, prefix: str) -> "_Layout | None":
        nodes = graph.nodes
        if not graph.outputs or graph.values[graph.outputs[0]].producer is None:
            return None
        loss = graph.values[graph.outputs[0]].producer
        assert loss is not None
        runs: dict[int, list[int]] = {}
        label: dict[str, int] = {}  # forward value -> its layer
        for i in range(loss + 1):
            k = layer_of(nodes[i].scope, prefix)
            if k is None and not nodes[i].scope:
                # the detach AOTAutograd writes after a tensor saved for backward has no
                # module path: it is its input's layer's
                ks = {label.get(x) for x in nodes[i].inputs if x}
                k = ks.pop() if len(ks) == 1 else None
            if k is not None:
                label.update((o, k) for o in nodes[i].outputs if o)
                run = runs.setdefault(k, [i, i])
                if run[1] not in (i, i - 1):
                    return None  # a layer's forward is not one run
                run[1] = i
        if sorted(runs) != [0, 1, 2]:
            return None
        fwd = [range(runs[k][0], runs[k][1] + 1) for k in range(3)]
        if not (fwd[0].stop == fwd[1].start and fwd[1].stop == fwd[2].start):
            return None
        # each layer's inner values: made in it and read by no forward node outside it (its
        # output, read by the next layer, is read by the next layer's backward too)
        inside = set().union(*fwd)
        outs = [{o for i in span for o in nodes[i].outputs if o} for span in fwd]
        read_out = {x for i in range(loss + 1) if i not in inside for x in nodes[i].inputs}
        read_out |= {x for a, b in ((0, 1), (1, 2)) for i in fwd[b] for x in nodes[i].inputs
                     if x in outs[a]}
        made = [o - read_out for o in outs]
        start = []
        for k in (2, 1, 0):  # the backward meets the layers in reverse
            first = next((i for i in range(loss + 1, len(nodes))
                          if any(x in made[k] for x in nodes[i].inputs)), None)
            if first is None or (start and first <= start[-1]):
                return None
            start.append(first)
        s2, s1, s0 = start
        n = s0 - s1
        if s1 - s2 != n:
            return None
        # (layer 0's span runs on past its backward, into the embeddings' backward, which may
        # be shorter than that: one kernel, kept whole)
        return cls(graph, prefix, fwd, [range(s0, min(s0 + n, len(nodes))), range(s1, s0),
                                        range(s2, s1)])

    def role(self, name: str, k: int, phase: str):
        """How a node of layer k's ``phase`` reads ``name``."""
        if name in self.where:
            lk, lphase, j, slot = self.where[name]
            if lk == k:
                return ("own", lphase, j, slot)
            if lphase == "f" and lk == k - 1:
                return ("prev", j, slot)
            if phase == "b" and lphase == "b" and lk == k + 1:
                return ("above", j, slot)
            return None
        v = self.g.values.get(name)
        if v is None:
            return None
        if v.producer is None and self.readers.get(name) == {k}:
            return ("leaf", v.spec, v.kind)
        if v.producer is None or v.producer < self.fwd[0].start:
            return ("shared", name)
        if phase == "b" and k == 2 and v.producer < self.bwd[2].start:
            return ("from head",)  # the gradient from what follows the stack
        return None

    def check(self) -> bool:
        """Layers 1 and 2 alike node for node in both phases (layer 0 in its ops); reads with
        the same roles (the gradient from above compared between layers 0 and 1); nothing
        outside the spans reads layer 1."""
        g = self.g
        spanned = set().union(*self.fwd, *self.bwd)
        for i, node in enumerate(g.nodes):
            if i not in spanned and any(self.where.get(x, (None,))[0] == 1
                                        for x in node.inputs if x):
                return False
        for spans, phase in ((self.fwd, "f"), (self.bwd, "b")):
            if not len(spans[0]) == len(spans[1]) == len(spans[2]) and \
                    not (phase == "b" and len(spans[0]) < len(spans[1]) == len(spans[2])):
                return False
            for j in range(len(spans[1])):
                a, b = g.nodes[spans[1][j]], g.nodes[spans[2][j]]
                z = g.nodes[spans[0][j]] if j < len(spans[0]) else a
                # (layer 0's backward span runs on into the embeddings' backward where layer
                # 1's runs into layer 0's: the two are compared where layer 1 reads from above)
                alike0 = j < len(spans[0]) and _alike(g, z, a, attrs=False)
                if (phase == "f" and not alike0) or not _alike(g, a, b, attrs=True):
                    return False
                for x0, x1, x2 in zip(z.inputs, a.inputs, b.inputs):
                    if not (x1 and x2):
                        if bool(x1) != bool(x2):
                            return False
                        continue
                    r1, r2 = self.role(x1, 1, phase), self.role(x2, 2, phase)
                    if r1 is None or r2 is None:
                        return False
                    if r1[0] == "above":
                        if r2 != ("from head",) or not alike0 or \
                                self.role(x0, 0, phase) != r1:
                            return False
                    elif r1 != r2:
                        return False
        return True

    # long: the copies' names and the reads that move to them are one mapping
    def grow(self, total: int) -> Graph | None:
        g, fwd, bwd = self.g, self.fwd, self.bwd
        nodes, values = g.nodes, g.values
        last = total - 2                          # the last copy of layer 1
        at1 = {(ph, j, slot): out for out, (k, ph, j, slot) in self.where.items() if k == 1}

        def name1(r, c: int) -> str:
            """Layer 1's value at role position ``r`` as copy c (1: the traced one) names it."""
            base = at1[r]
            return base if c == 1 else f"{base}~{c}"

        def read(x: str, c: int, phase: str) -> str:
            """Layer 1's read ``x`` as copy c makes it."""
            r = self.role(x, 1, phase)
            if r is None or r[0] == "shared":
                return x
            if r[0] == "leaf":
                return f"{x}~{c}"
            if r[0] == "own":
                return name1(r[1:], c)
            if r[0] == "prev":
                return name1(("f", *r[1:]), c - 1)
            # the gradient from above: layer c + 1's backward (the last layer's is traced)
            return x if c + 1 == total - 1 else name1(("b", *r[1:]), c + 1)

        order: list[tuple[int, int]] = []          # (traced node, copy; 0: the node itself)
        order += [(i, 0) for i in range(fwd[2].start)]
        order += [(i, c) for c in range(2, last + 1) for i in fwd[1]]
        order += [(i, 0) for i in range(fwd[2].start, bwd[1].start)]
        order += [(i, c) for c in range(last, 1, -1) for i in bwd[1]]
        order += [(i, 0) for i in range(bwd[1].start, len(nodes))]
        index = {i: new for new, (i, c) in enumerate(order) if c == 0}
        at = {(i, c): new for new, (i, c) in enumerate(order)}

        new_values: dict[str, Value] = {}
        for name, v in values.items():
            new_values[name] = v if v.producer is None else replace(v, producer=index[v.producer])
        out_nodes: list[Node] = []
        in_fwd1, in_bwd1 = set(fwd[1]), set(bwd[1])
        for new, (i, c) in enumerate(order):
            node = nodes[i]
            if c:
                phase = "f" if i in in_fwd1 else "b"
                ins = tuple(read(x, c, phase) if x else x for x in node.inputs)
                scope = rescope(node.scope, self.prefix, 1, c) if node.scope else node.scope
                out_nodes.append(copied(node, c, new, ins, values, new_values, scope))
                continue
            ins = node.inputs
            if i in fwd[2] or i in bwd[2]:  # the last layer reads the last copy, not layer 1
                phase = "f" if i in fwd[2] else "b"
                ins = tuple(name1(("f", *r[1:]), last) if x and (r := self.role(x, 2, phase))
                            and r[0] == "prev" else x for x in ins)
            elif i in in_bwd1:              # layer 1's backward reads copy 2's gradient
                ins = tuple(name1(("b", *r[1:]), 2) if x and (r := self.role(x, 1, "b"))
                            and r[0] == "above" else x for x in ins)
            scope = node.scope
            # the last layer's nodes, in its spans or outside them (AOTAutograd may place one
            # of its constants after the backward): scoped to the last layer of the stack
            if scope and layer_of(scope, self.prefix) == 2:
                scope = rescope(scope, self.prefix, 2, total - 1)
            out_nodes.append(replace(node, index=new, inputs=ins, scope=scope))
        refs = self._held(at, last)
        if refs is None:
            return None
        inplace = dict(g.eager_inplace)
        for out, into in g.eager_inplace.items():
            k = self.where.get(out, (None,))[0]
            if k == 1:
                inplace.update((f"{out}~{c}", read(into, c, "f")) for c in range(2, last + 1))
            elif k == 2 and (r := self.role(into, 2, "f")) is not None and r[0] == "prev":
                inplace[out] = name1(("f", *r[1:]), last)
        return replace(self._finish(out_nodes, new_values, total, last),
                       eager_refs=MappingProxyType(refs), eager_inplace=MappingProxyType(inplace))

    def _held(self, at: dict[tuple[int, int], int], last: int) -> dict[str, int] | None:
        """The model's Python references (``eager_refs``, forward nodes) in the grown graph:
        a value of layer 1 and its copies held to the same point of their own layer, or of
        the layer after (copy c into copy c + 1, the last copy into the last layer), or to a
        point after the stack. None where the layers do not hold alike (layer 2's value not
        held as layer 1's, a value of layer 0 held into layer 2)."""
        g, fwd = self.g, self.fwd
        refs = {}
        for name, p in g.eager_refs.items():
            k, phase, j, slot = self.where.get(name, (None, "", 0, 0))
            if phase == "f" and k == 0 and p in fwd[2]:
                return None  # held across two layers: no copy could say where to
            refs[name] = at[(p, 0)]
            if k != 1 or phase != "f":
                continue
            if p in fwd[1] or p in fwd[2]:
                into, rel = (1, p - fwd[1].start) if p in fwd[1] else (2, p - fwd[2].start)
                twin = g.nodes[fwd[2][j]].outputs[slot]  # layer 2's value in this role
                if into == 1 and g.eager_refs.get(twin) != fwd[2].start + rel:
                    return None
                if into == 1:
                    refs.update((f"{name}~{c}", at[(p, c)]) for c in range(2, last + 1))
                else:
                    src = fwd[1].start + rel
                    refs[name] = at[(src, 2)]  # (copies exist: total > TRACED)
                    refs.update((f"{name}~{c}", at[(src, c + 1)] if c < last else at[(p, 0)])
                                for c in range(2, last + 1))
            else:
                refs.update((f"{name}~{c}", at[(p, 0)]) for c in range(2, last + 1))
        return refs

    def _finish(self, out_nodes: list[Node], new_values: dict[str, Value], total: int,
                last: int) -> Graph:
        g, prefix = self.g, self.prefix
        leaves = {x for x, ks in self.readers.items()
                  if ks == {1} and x in g.values and g.values[x].producer is None}
        grads = dict(g.grads)
        paths = dict(g.param_paths)
        for p in leaves:
            for c in range(2, last + 1):
                if p in g.grads:
                    grads[f"{p}~{c}"] = f"{g.grads[p]}~{c}"
                if p in g.param_paths:
                    paths[f"{p}~{c}"] = rescope(g.param_paths[p], prefix, 1, c)
        for p in [p for p in g.param_paths if layer_of(g.param_paths[p], prefix) == 2]:
            paths[p] = rescope(g.param_paths[p], prefix, 2, total - 1)
        types = dict(g.module_types)
        for path, kind in g.module_types.items():
            if layer_of(path, prefix) == 1:
                for c in range(3, total):
                    types[rescope(path, prefix, 1, c)] = kind
        mine = {x for x, (k, *_rest) in self.where.items() if k == 1}
        return replace(g, nodes=tuple(out_nodes), values=MappingProxyType(new_values),
                       inputs=grown_names(g.inputs, lambda x: x in leaves, total),
                       outputs=grown_names(g.outputs, lambda x: x in mine, total),
                       grads=MappingProxyType(grads), param_paths=MappingProxyType(paths),
                       module_types=MappingProxyType(types),
                       attention=_grown_calls(g.attention, prefix, total))


def _alike(g: Graph, a: Node, b: Node, attrs: bool) -> bool:
    if a.op != b.op or len(a.inputs) != len(b.inputs) or len(a.outputs) != len(b.outputs):
        return False
    if attrs and dict(a.attrs) != dict(b.attrs):
        return False
    return [g.spec(o) for o in a.outputs] == [g.spec(o) for o in b.outputs]


def _grown_calls(calls: tuple[AttentionKernel, ...], prefix: str,
                 total: int) -> tuple[AttentionKernel, ...]:
    """The attention calls of the grown stack, in order: layer 1's repeated for each copy."""
    layer1 = [c for c in calls if layer_of(c.scope, prefix) == 1]
    out: list[AttentionKernel] = []
    for call in calls:
        if layer_of(call.scope, prefix) == 2:
            if layer1:  # the copies, once, before the last layer's calls
                out += [replace(c, scope=rescope(c.scope, prefix, 1, n))
                        for n in range(2, total - 1) for c in layer1]
                layer1 = []
            call = replace(call, scope=rescope(call.scope, prefix, 2, total - 1))
        out.append(call)
    return tuple(out)
