"""Activation checkpointing on the joint forward+backward graph.

A checkpoint segment keeps only its inputs during forward (torch.utils.checkpoint): a tensor
produced inside the segment and consumed only inside it is freed after its last forward use,
and the segment's forward is recomputed when backward reaches the segment (the first backward
node that needs one of its tensors); from then on the recomputed tensors live to their last
backward use. The segment's output, read by later forward nodes, is an input of what follows
and is kept as before. Recompute costs the segment's forward FLOPs once more.

Segments are module paths (their forward nodes); plans come from a list of names, every N of
the model's repeated blocks, √N segments (Chen et al. 2016, "Training Deep Nets with Sublinear
Memory Cost"), or the cheapest set of blocks that fits a budget.

Selective activation checkpointing (SAC: ``torch.utils.checkpoint`` with
``create_selective_checkpoint_contexts(policy)``) checkpoints each repeated block, but the
ops its policy marks MUST_SAVE keep their outputs: cached in the forward, handed to the
recompute, never run again. ``sac_saved`` applies a policy to a block: torchtitan's op
policy (passes/costs/sac_policy.py: matmuls, the fused attention kernels, FSDP's
reduce-scatter and float8's amax, every second ``mm`` of a block recomputed), or a user's
list of op names, all saved. A saved tensor lives at least until its block is recomputed;
the rest of the block is recomputed as a whole checkpoint's is, its FLOPs counted again.
"""
from __future__ import annotations

import difflib
import math
from collections import Counter
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from ..costs.registry import lookup
from ..costs.sac_policy import MM, TORCHTITAN_SAC
from ..errors import GraphcostError, opt
from ..ir import Graph
from ..memory.liveness import Liveness, Storage


@dataclass(frozen=True)
class CheckpointSpec:
    """The plan asked for, one of six forms: module ``names``, ``every`` N repeated blocks,
    ``sqrt`` (√N groups, Chen et al. 2016), the least recompute that fits ``budget`` bytes,
    ``sac``: each repeated block under a selective policy (("torchtitan",): its op policy;
    else the op names to save, ``mm`` or ``sdpa`` short for their aten ops), or ``nth``: every
    N-th repeated block checkpointed whole (torchtitan's ``selective_ac_option = "N"``)."""
    names: tuple[str, ...] | None = None
    every: int | None = None
    sqrt: bool = False
    budget: int | None = None
    sac: tuple[str, ...] | None = None
    nth: int | None = None      # every N-th repeated block, whole (torchtitan's per-layer AC)


@dataclass(frozen=True)
class Segment:
    name: str
    nodes: frozenset[int]   # forward node indices
    saved: frozenset[int] = frozenset()   # SAC: the nodes whose outputs its policy saves


MEGATRON_CORE_ATTN = ("megatron-core-attn",)


def sac_saved(graph: Graph, seg: Segment, policy: tuple[str, ...]) -> Segment:
    """``seg`` with the nodes ``policy`` saves (see the module docstring). Megatron-LM's
    selective recompute (``--recompute-granularity selective``, its default module
    ``core_attn``) saves every output but the fused attention kernel's, recomputed in
    backward from the saved q, k and v."""
    if policy == MEGATRON_CORE_ATTN:
        return Segment(seg.name, seg.nodes, frozenset(
            i for i in seg.nodes if not _names_op("sdpa", graph.nodes[i].op)))
    titan = policy == ("torchtitan",)
    names = TORCHTITAN_SAC if titan else policy
    saved, mms = set(), 0
    for i in sorted(seg.nodes):
        op = graph.nodes[i].op
        if op == MM:
            mms += 1
        if any(_names_op(name, op) for name in names) and not (titan and op == MM and mms % 2 == 0):
            saved.add(i)
    return Segment(seg.name, seg.nodes, frozenset(saved))


def _names_op(name: str, op: str) -> bool:
    """A user's op name for a node's: the full name, the aten short one (``mm``, ``addmm``), or
    ``sdpa``: every scaled_dot_product_attention kernel."""
    if name == "sdpa":
        return "_scaled_dot_product" in op
    return op == name or op == f"aten.{name}.default"


def segments_by_name(graph: Graph, forward: set[int], names: list[str]) -> list[Segment]:
    out = []
    by_scope = _forward_scopes(graph, forward)   # (a joint graph's nodes are many, scopes few)
    paths = sorted(by_scope)
    modules = sorted(set(paths) | {p.rsplit(".", 1)[0] for p in paths if "." in p})
    for name in names:
        nodes = frozenset(i for scope, nodes in by_scope.items()
                          if scope == name or scope.startswith(name + ".") for i in nodes)
        if not nodes:
            close = difflib.get_close_matches(name, modules, n=5, cutoff=0.5)
            raise GraphcostError(f"{opt('checkpoint')} {name}: no module of that name runs in the "
                                 f"forward" + (f"; close matches: {', '.join(close)}"
                                               if close else "; modules: "
                                               + ", ".join(modules[:12])))
        out.append(Segment(name, nodes))
    return out


def _forward_scopes(graph: Graph, forward: set[int]) -> Mapping[str, tuple[int, ...]]:
    """Each module scope of the forward with its nodes."""
    def make() -> Mapping[str, tuple[int, ...]]:
        by_scope: dict[str, list[int]] = {}
        for n in graph.nodes:
            if n.index in forward and n.scope:
                by_scope.setdefault(n.scope, []).append(n.index)
        return MappingProxyType({k: tuple(v) for k, v in by_scope.items()})

    return derived_per_forward(graph, "forward_scopes", forward, make)


def derived_per_forward(graph: Graph, key: str, forward: set[int], make):
    """``make()`` (a function of ``graph`` and ``forward``), kept on the graph
    (``Graph.derived``) when ``forward`` is its forward set (forward_set: its nodes 0 … n − 1,
    which its size names), else computed."""
    if forward and len(forward) == max(forward) + 1:
        return graph.derived((key, len(forward)), make)
    return make()


def repeated_blocks(graph: Graph, forward: set[int]) -> list[str]:
    """The model's repeated blocks (what users checkpoint): among the modules with submodules
    that run in the forward, the largest group of one kind at one depth (ResNet's
    BasicBlocks, a transformer's layers), in execution order. A module's kind is its class
    where the frontend knows it (FX); an ONNX graph records only module paths, so there the
    kind is the set of op types the module runs (a ResNet block with a downsample branch and
    one without both run Conv, BatchNormalization, Relu and Add)."""
    return list(derived_per_forward(graph, "repeated_blocks", forward,
                                    lambda: tuple(_repeated_blocks(graph, forward))))


def _repeated_blocks(graph: Graph, forward: set[int]) -> list[str]:
    first: dict[str, int] = {}
    ops: dict[str, set[str]] = {}
    for n in graph.nodes:
        if n.index in forward and n.scope:
            parts = n.scope.split(".")
            for d in range(1, len(parts) + 1):
                path = ".".join(parts[:d])
                first.setdefault(path, n.index)
                ops.setdefault(path, set()).add(n.op)
    containers = {p.rsplit(".", 1)[0] for p in first if "." in p}

    def kind(path: str) -> str:
        return graph.module_types.get(path, "") or "ops:" + ",".join(sorted(ops[path]))

    groups = Counter((p.count("."), kind(p)) for p in first if p in containers)
    best = max(((cnt, -depth, typ) for (depth, typ), cnt in groups.items() if typ and cnt >= 2),
               default=None)
    if best is None:   # one block alone: a ModuleList's (a pipeline stage's one layer)
        listed = [p for p in first if p in containers and "." in p
                  and p.rsplit(".", 1)[1].isdigit()
                  and graph.module_types.get(p.rsplit(".", 1)[0]) == "ModuleList"]
        return sorted(listed, key=first.__getitem__)
    _, neg_depth, typ = best
    blocks = [p for p in first if p in containers and p.count(".") == -neg_depth and
              kind(p) == typ]
    return sorted(blocks, key=first.__getitem__)


def group_every(blocks: list[str], every: int) -> list[list[str]]:
    if every <= 0:
        raise GraphcostError(f"{opt('checkpoint.every')} must be a positive integer")
    return [blocks[i:i + every] for i in range(0, len(blocks), every)]


def sqrt_groups(blocks: list[str]) -> list[list[str]]:
    """√N segments of about √N blocks each (Chen et al. 2016)."""
    if not blocks:
        return []
    return group_every(blocks, max(1, math.ceil(len(blocks) / round(math.sqrt(len(blocks))))))


def merge(name: str, segments: list[Segment]) -> Segment:
    return Segment(name, frozenset().union(*(s.nodes for s in segments)))


def view_nodes(graph: Graph) -> frozenset[int]:
    """The nodes whose output views their input's storage (their rules say ``alias``): not
    readers of a tensor for checkpointing, their readers are (torch 2.13 traces the detach of
    a saved tensor outside every module, 2.14 an alias inside its module)."""
    return graph.derived(("views",), lambda: frozenset(
        n.index for n in graph.nodes if (r := lookup(n.op)) is not None and r.alias))


def checkpointed_storages(graph: Graph, live: Liveness, forward: set[int],
                          segments: list[Segment]) -> list[Storage]:
    """The storages' lifetimes under checkpointing: a tensor internal to a segment and saved
    for backward becomes two lifetimes, forward and recomputed."""
    uses: list[list[int]] = [[] for _ in live.storages]
    of = live.value_storage
    for node in graph.nodes:
        for name in node.inputs:
            s = of.get(name) if name else None
            if s is not None:
                uses[s].append(node.index)
    outputs = {of[o] for o in graph.outputs if o in of}
    views = view_nodes(graph)
    seg_of: dict[int, int] = {}
    for k, seg in enumerate(segments):
        for i in seg.nodes:
            seg_of[i] = k
    internal: dict[int, int] = {}  # storage -> segment, for tensors that stay inside one
    saved: dict[int, int] = {}     # storage -> segment, for those its SAC policy saves
    for s, st in enumerate(live.storages):
        k = seg_of.get(st.birth)
        if k is None or s in outputs:
            continue
        if st.birth in segments[k].saved:
            saved[s] = k
            continue
        # (a view's readers read the same storage and are its uses too: view_nodes)
        fwd_uses = [u for u in uses[s] if u in forward and u not in views]
        if all(seg_of.get(u) == k for u in fwd_uses) and any(u not in forward for u in uses[s]):
            internal[s] = k
    recompute_at: dict[int, int] = {}
    for s, k in internal.items():
        first_bwd = min(u for u in uses[s] if u not in forward)
        recompute_at[k] = min(recompute_at.get(k, first_bwd), first_bwd)
    out = []
    for s, st in enumerate(live.storages):
        k = internal.get(s)
        if s in saved:  # (cached to the block's recompute, then autograd's as before)
            out.append(Storage(st.name, st.nbytes, st.birth,
                               max(st.death, recompute_at.get(saved[s], st.death))))
            continue
        if k is None:
            out.append(st)
            continue
        fwd_end = max([u for u in uses[s] if u in forward], default=st.birth)
        out.append(Storage(st.name, st.nbytes, st.birth, fwd_end))
        out.append(Storage(st.name + "@recompute", st.nbytes, recompute_at[k], st.death))
    return out


def timeline_of(storages: list[Storage], n: int) -> list[int]:
    diff = [0] * (n + 1)
    for st in storages:
        diff[st.birth] += st.nbytes
        diff[st.death + 1] -= st.nbytes
    out, running = [], 0
    for i in range(n):
        running += diff[i]
        out.append(running)
    return out
