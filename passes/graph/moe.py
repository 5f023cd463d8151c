"""Mixture-of-experts layers: the parameters one token uses against the total, and the FLOPs
per token.

A layer is found in the traced graph, not in a config: a grouped matmul over expert weights
(a rule with ``routing="experts"``: rows sorted by expert, each meeting one expert's matrix;
transformers' ``grouped_mm`` experts) gives the number of experts n (the weights' leading
dim), and the router's top-k over n scores in the same module (``routing="top_k"``) gives k
and the tokens routed (its rows). A token runs through k of the n experts, so

    active params = total − Σ over layers of expert params · (n − k) / n

(the convention of Mixtral's "12.9 B active of 46.7 B": embeddings, attention and routers
count whole). A grouped matmul computes exactly the rows routed to an expert — tokens · k in
all, whatever the routing — so the graph's expert FLOPs are the active ones; FLOPs per token
divide the graph's FLOPs by the tokens. How those rows split among the experts depends on the
data: each expert gets tokens · k / n at the balanced expectation (an estimate) and at most
every token (a bound).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..costs import CostReport
from ..costs.registry import lookup
from ..ir import Graph, ValueKind


@dataclass(frozen=True)
class MoELayer:
    module: str              # the block holding router and experts ("model.layers.0.mlp")
    experts: int             # n: the expert weights' leading dim
    top_k: int               # k: the router's top-k width
    tokens: int              # rows the router scores
    expert_params: int       # all n experts' weights
    expert_flops: int        # the grouped matmuls' FLOPs: tokens · k rows in all
    rows_per_expert_estimate: float  # ESTIMATE: tokens · k / n at balanced routing
    rows_per_expert_bound: int       # BOUND: every token routed to one expert


@dataclass(frozen=True)
class MoE:
    layers: tuple[MoELayer, ...]
    total_params: int
    active_params: int       # per token: k of n experts' weights, everything else whole
    tokens: int              # tokens the first layer routes
    flops_per_token: float   # the graph's FLOPs / tokens (the experts' are the active ones)
    dense_flops_per_token: float  # … had every token run all n experts


def _weight_of(graph: Graph, name: str) -> str | None:
    """The parameter behind ``name``, through views (a transposed expert weight)."""
    seen = 0
    while name and seen < 16:
        v = graph.values.get(name)
        if v is None:
            return None
        if v.kind == ValueKind.PARAM:
            return name
        if v.producer is None:
            return None
        node = graph.nodes[v.producer]
        r = lookup(node.op)
        if r is None or not r.alias or not node.inputs:
            return None
        name, seen = node.inputs[0], seen + 1
    return None


def _parent(scope: str) -> str:
    return scope.rsplit(".", 1)[0] if "." in scope else ""


def find_moe(graph: Graph, costs: CostReport, total_params: int) -> MoE | None:
    """The graph's mixture-of-experts layers (None if it has none)."""
    experts: dict[str, list] = {}   # block -> expert nodes
    routers: dict[str, list] = {}   # block -> top-k nodes
    for node in graph.nodes:
        r = lookup(node.op)
        if r is None or r.routing is None or not node.scope:
            continue  # (a joint graph's backward nodes carry no module)
        key = _parent(node.scope)
        (experts if r.routing == "experts" else routers).setdefault(key, []).append(node)
    layers = []
    for block, nodes in experts.items():
        weights = {w for n in nodes if len(n.inputs) > 1
                   for w in [_weight_of(graph, n.inputs[1])] if w}
        if not weights:
            continue
        w_shape = graph.values[next(iter(weights))].spec.shape
        n_exp = w_shape[0] if w_shape else None
        if not isinstance(n_exp, int):
            continue
        router = None
        for cand in routers.get(block, []):  # a top-k over the n experts' scores
            scores = graph.spec(cand.inputs[0]) if cand.inputs else None
            out = graph.spec(cand.outputs[0]) if cand.outputs else None
            if scores and scores.shape and out and out.shape and scores.shape[-1] == n_exp:
                k = out.shape[-1]
                # (symbolic: skipped; a top-0 routes no token: no MoE layer to describe)
                if isinstance(k, int) and k > 0 and scores.numel is not None:
                    router = (k, scores.numel // n_exp)
                break
        if router is None:
            continue
        k, tokens = router
        layers.append(MoELayer(
            module=block, experts=n_exp, top_k=k, tokens=tokens,
            expert_params=sum(graph.values[w].spec.numel or 0 for w in weights),
            expert_flops=sum(costs.nodes[n.index].cost.flops for n in nodes),
            rows_per_expert_estimate=tokens * k / n_exp, rows_per_expert_bound=tokens))
    if not layers:
        return None
    inactive = sum(m.expert_params * (m.experts - m.top_k) // m.experts for m in layers)
    tokens = layers[0].tokens
    flops = costs.totals.flops
    dense_extra = sum(m.expert_flops * (m.experts - m.top_k) / m.top_k for m in layers)
    return MoE(tuple(layers), total_params, total_params - inactive, tokens, flops / tokens,
               (flops + dense_extra) / tokens)
