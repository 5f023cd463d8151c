"""A stage's backward split as a zero-bubble schedule runs it (``torch.distributed.pipelining``'s
``ScheduleInterleavedZeroBubble``): the input-gradient half (I) at one slot, the weight-gradient
half (W) later, to fill the bubble.

PyTorch runs I as ``stage_backward_input`` (torch/distributed/pipelining/_backward.py):
``autograd.grad`` of the stage's outputs for its inputs alone, with ``retain_graph=True``,
capturing at each node where a weight's path meets the input's (a linear's ``MmBackward0``, a
norm's ``MulBackward0``) the gradient it receives (``param_groups[…]["grads"]``); W, later, as
``stage_backward_weight``: ``autograd.grad`` from those nodes to the weights with the captured
gradients, the graph then freed. So between a micro-batch's I and its W the stage holds what
its forward saved (the graph retained) and each captured gradient; the nodes on the outputs'
side of every capture (the last stage's loss: its fp32 log-probabilities) are let go at I,
when the outputs are detached. The first stage runs no I (its input needs no gradient): its
W is the whole backward (``backward_weight_one_chunk``'s stage-0 branch).

In the traced joint graph (forward, then backward node by node) a backward node belongs to W
when it reads no weight (nor a view or cast of one: a weight is read to pass a gradient on to
the input) and what it makes goes only to weight gradients through W's nodes; the others are
I. ``split_backward`` returns the graph with its backward in the order I then W, and what the
forward saved held through W (``eager_refs``), for the training step's liveness to lay out;
the index where W starts.
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from ..ir import Graph, Node, ValueKind
from ..training.memory import forward_set


def split_backward(graph: Graph, first: bool) -> tuple[Graph, int]:
    """(``graph`` with its backward nodes in the order zero-bubble runs them — I's, then
    W's — and the forward's saved tensors held to W's end; the index of W's first node).
    ``first``: the pipeline's first stage, whose whole backward is W."""
    n, fe = len(graph.nodes), len(forward_set(graph))
    if first:   # (its backward deferred whole, run as a plain backward: nothing retained)
        return graph, fe
    weight = weight_nodes(graph, fe)
    order = [*graph.nodes[:fe], *(nd for nd in graph.nodes[fe:] if nd.index not in weight),
             *(nd for nd in graph.nodes[fe:] if nd.index in weight)]
    wi = n - len(weight)
    moved = _renumbered(graph, order)
    read = {name for nd in moved.nodes[wi:] for name in nd.inputs}
    captured = next((k for k, nd in enumerate(moved.nodes[fe:wi], fe)
                     if any(o in read for o in nd.outputs if o)), wi)
    return _retained(moved, fe, n, captured), wi


def weight_nodes(graph: Graph, fe: int) -> set[int]:
    """The backward nodes of the weight-gradient half (see the module docstring)."""
    grads = set(graph.grads.values())
    weights = _weight_values(graph)
    users: dict[str, list[int]] = {}
    for nd in graph.nodes[fe:]:
        for name in nd.inputs:
            users.setdefault(name, []).append(nd.index)
    weight: set[int] = set()
    for nd in reversed(graph.nodes[fe:]):   # (a node's users come after it)
        outs = [o for o in nd.outputs if o]
        if not outs or any(i in weights for i in nd.inputs):
            continue
        if all(o in grads or (users.get(o) and all(u in weight for u in users[o]))
               for o in outs):
            weight.add(nd.index)
    return weight


def _weight_values(graph: Graph) -> set[str]:
    """The weights and what the graph makes of them alone (views, casts, transposes)."""
    values = graph.values
    out = {name for name, v in values.items() if v.kind == ValueKind.PARAM}
    for nd in graph.nodes:
        tensors = [i for i in nd.inputs if i and i in values and
                   values[i].kind not in (ValueKind.CONST, ValueKind.BUFFER)]
        if tensors and all(i in out for i in tensors):
            out.update(o for o in nd.outputs if o)
    return out


def _renumbered(graph: Graph, order: list[Node]) -> Graph:
    """``graph`` with its nodes in ``order``, their indices and the values' producers too."""
    at = {nd.index: k for k, nd in enumerate(order)}
    nodes = tuple(replace(nd, index=k) for k, nd in enumerate(order))
    def moved(table):
        return MappingProxyType({name: replace(v, producer=at[v.producer])
                                 if v.producer is not None else v
                                 for name, v in table.items()})
    refs = {name: at.get(end, end) for name, end in graph.eager_refs.items()}
    return replace(graph, nodes=nodes, values=moved(graph.values),
                   lower_values=moved(graph.lower_values), eager_refs=MappingProxyType(refs))


def _retained(graph: Graph, fe: int, n: int, captured: int) -> Graph:
    """The forward's values a backward node at or after ``captured`` (the first node whose
    output is captured for W) reads, held to the last node: the graph ``retain_graph`` keeps
    until W has run. Those only the output side reads (the loss's) go at I, as traced."""
    refs = dict(graph.eager_refs)
    made = {o for nd in graph.nodes[:fe] for o in nd.outputs if o}
    for nd in graph.nodes[captured:]:
        for name in nd.inputs:
            if name in made:
                refs[name] = n - 1
    return replace(graph, eager_refs=MappingProxyType(refs))


def split_figures(wi: int, fe: int, nongrad: list[int], grad: list[int], made: list[int],
                  between: int) -> dict[str, int]:
    """A stage step's I and W figures (passes/parallel/pipeline.py ``StageStep``) from its
    curves node by node (``nongrad``: all but the gradients; ``grad``: those a first backward
    makes and keeps; ``made``: a later one's, each until added in): I runs nodes [fe, wi), W
    the rest; ``between``: the bytes alive from one to the other. A weight's gradient is made
    in I only where one node makes it beside the input's (a fused grouped matmul's experts'):
    ``input_grads``, held from the first I on, so the first W's curve leaves them out."""
    n = len(nongrad)
    born = grad[wi - 1] if fe < wi <= n else 0
    return {"split": wi, "between": between, "input_grads": born,
            "first_input_peak": max([between, *(nongrad[k] + grad[k] for k in range(fe, wi))]),
            "input_peak": max([between, *(nongrad[k] + made[k] for k in range(fe, wi))]),
            "first_weight_peak": max((nongrad[k] + grad[k] - born for k in range(wi, n)),
                                     default=between),
            "weight_peak": max((nongrad[k] + made[k] for k in range(wi, n)), default=between)}
