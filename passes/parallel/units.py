"""What the data-parallel strategies divide: FSDP units (which parameters each ``fully_shard``
call groups, when its forward and backward run on the joint graph), sharded sizes with PyTorch's
dim-0 padding, DDP's gradient buckets and ZeroRedundancyOptimizer's partition.

Units follow the usual FSDP2 recipe: ``fully_shard`` on each repeated block (the blocks
passes/training/checkpoint.py detects: a transformer's layers, ResNet's BasicBlocks) and on the root,
whose group holds every parameter no block owns (embeddings, final norm, head). A parameter
belongs to the unit whose module path is the longest prefix of its name.

A unit's forward is the span of forward nodes whose module path lies inside it. Its backward is
read off the joint graph, whose backward nodes carry no module path: the backward nodes that
read a tensor the unit made for its own use (not the output it hands on), read one of its
parameters, or produce one of its gradients. FSDP's pre-backward hook fires just before the
first of them, its post-backward (the reduce-scatter) just after the last — unless no input of
the unit's forward needs a gradient (the root's token ids, an MLP's data), in which case the
post-backward waits for the end of backward (FSDP's final callback). Under a master recipe
each gradient's half-precision storage lives to its unit's post-backward (``half_ends``).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from ..costs.collectives import FLOAT8_GATHERED
from ..costs.registry import lookup
from ..errors import GraphcostError, opt
from ..ir import FLOAT_DTYPES, INTERNAL, Graph, TensorSpec, ValueKind
from ..training.checkpoint import derived_per_forward, repeated_blocks
from ..training.optimizer import trainable_params

if TYPE_CHECKING:
    from ..training.memory import TrainingMemory

ROOT = "(root)"
DDP_FIRST_BUCKET_BYTES = 1 << 20   # DDP's first bucket is capped at 1 MiB


def expert_shards(data: int, tp: int = 1, ep: int = 1) -> int:
    """The ranks an expert-parallel rank's experts shard over: torchtitan's efsdp, the data
    ranks (dp_shard × cp) times the tensor-parallel ones the ep group is carved out of, over
    ep (1 without ep: the data ranks)."""
    return max(data * tp // ep, 1)


@dataclass(frozen=True)
class Unit:
    """One FSDP unit (a ``fully_shard`` call) as the report shows it."""
    name: str                     # module path, or (root)
    params: int                   # parameter tensors it groups
    param_bytes: int              # unsharded, as the model holds them
    padded_bytes: int             # dim 0 padded to a multiple of the world size
    shard_bytes: int              # one rank's shard: padded / world size
    grad_padded_bytes: int        # its trainable parameters, padded (the reduce-scatter input)
    forward: tuple[int, int] | None   # first and last forward node
    backward: tuple[int, int] | None  # first and last backward node touching its tensors
    post_backward_deferred: bool  # no forward input needs a gradient: reduce-scatter at the end
    members: tuple[str, ...] = field(default=(), metadata=INTERNAL)  # its parameter values
    # an expert-parallel rank's experts (1: not): one of ``ep`` slices, sharded over the
    # ranks that hold the same slice — torchtitan's efsdp, dp_shard · tp / ep
    ep: int = 1
    # the tensor-parallel ranks the ep group is carved out of beside the data ones (efsdp's
    # factor: torchtitan's dp_shard · cp · tp / ep)
    tp: int = field(default=1, metadata=INTERNAL)
    # what its all-gather moves and its unsharded parameters hold: ``padded_bytes`` but for
    # weights FSDP2 gathers in float8 (torchao's float8 all-gather), one byte an element
    gathered_bytes: int = 0

    def group(self, world: int) -> int:
        """The ranks the unit shards over when the data dimension has ``world``."""
        return expert_shards(world, self.tp, self.ep)

    def sized(self, graph: Graph, trainable: set[str], world: int,
              float8: frozenset[str] = frozenset()) -> "Unit":
        """The unit with its sizes at ``world`` ranks; ``float8``: the parameters gathered in
        float8 (``gathered_in_float8``)."""
        values = graph.values
        pad = sum(padded_bytes(values[p].spec, world) for p in self.members)
        return replace(self, padded_bytes=pad, shard_bytes=pad // world,
                       grad_padded_bytes=sum(padded_bytes(values[p].spec, world)
                                             for p in self.members if p in trainable),
                       gathered_bytes=sum(gathered_bytes(values[p].spec, world, p in float8)
                                          for p in self.members))


def shard_rows(dim0: int, world: int) -> int:
    """Rows of rank 0's shard: torch.chunk's ceil(dim0 / N) (FSDP2 pads every rank to it)."""
    return -(-dim0 // world)


def padded_bytes(spec: TensorSpec, world: int) -> int:
    """Bytes of a parameter with dim 0 padded to a multiple of ``world`` (a 0-d one is 1 row)."""
    shape = spec.shape or ()
    dim0 = int(shape[0]) if shape else 1
    row = (spec.nbytes or 0) // dim0 if dim0 else 0
    return shard_rows(dim0, world) * world * row


def gathered_bytes(spec: TensorSpec, world: int, float8: bool) -> int:
    """A parameter's padded bytes as its all-gather moves them: one a element in float8."""
    padded = padded_bytes(spec, world)
    if not float8 or not spec.numel:
        return padded
    return padded // max(1, (spec.nbytes or 0) // spec.numel)


def gathered_in_float8(graph: Graph) -> frozenset[str]:
    """The parameters FSDP2 gathers in float8 (torchao's enable_fsdp_float8_all_gather):
    those whose views reach the node that stands for the gathered float8 weight
    (frontends/torch/float8_linears.py; its rule a view: passes/costs/collectives.py)."""
    if not any(n.op == FLOAT8_GATHERED for n in graph.nodes):
        return frozenset()
    _, param_of = origins(graph)
    return frozenset(param_of[n.inputs[0]] for n in graph.nodes
                     if n.op == FLOAT8_GATHERED and n.inputs and n.inputs[0] in param_of)


def origins(graph: Graph) -> tuple[Mapping[str, str], Mapping[str, str]]:
    """Each value's allocating value (a view shares its input's storage, as in
    passes/memory/liveness.py) and, for views of parameters, the parameter they look at."""
    return graph.derived(("origins",), lambda: _origins(graph))


def _origins(graph: Graph) -> tuple[Mapping[str, str], Mapping[str, str]]:
    origin: dict[str, str] = {}
    param_of: dict[str, str] = {}
    for name, v in graph.values.items():
        if v.kind == ValueKind.PARAM:
            param_of[name] = name
    for node in graph.nodes:
        r = lookup(node.op)
        src = node.inputs[0] if node.inputs else ""
        alias = r is not None and r.alias and src
        for out in node.outputs:
            if not out:
                continue
            if alias and src in param_of:
                param_of[out] = param_of[src]
            elif alias and src in origin:
                origin[out] = origin[src]
            else:
                origin[out] = out
    return MappingProxyType(origin), MappingProxyType(param_of)


def _param_paths(graph: Graph, forward: set[int]) -> dict[str, str]:
    """Each parameter's module path + name: its name in the model, else the scope of the first
    forward node that reads it (through views)."""
    _, param_of = origins(graph)
    reader: dict[str, str] = {}
    for node in graph.nodes:
        if node.index not in forward:
            break
        for name in node.inputs:
            p = param_of.get(name) if name else None
            if p is not None and p not in reader:
                reader[p] = f"{node.scope}.{p}" if node.scope else p
    return {v.name: graph.param_paths.get(v.name) or reader.get(v.name, v.name)
            for v in graph.values.values() if v.kind == ValueKind.PARAM}


def fsdp_blocks(graph: Graph, forward: set[int]) -> list[str]:
    """The modules the usual recipe wraps: the repeated blocks (passes/training/checkpoint.py's: the
    largest group of same-kind modules with submodules at one depth), moved up to an enclosing
    group of same-kind modules when that one holds much more of the parameters (LoRA layers
    are repeated more often than the transformer layers around them, which are what gets
    wrapped); in execution order."""
    blocks = repeated_blocks(graph, forward)
    if not blocks:
        return []
    values = graph.values
    held: dict[str, int] = {}
    for p, path in _param_paths(graph, forward).items():
        parts = path.split(".")[:-1]
        for d in range(1, len(parts) + 1):
            prefix = ".".join(parts[:d])
            held[prefix] = held.get(prefix, 0) + (values[p].spec.nbytes or 0)
    first = {}
    for n in graph.nodes:
        if n.index in forward and n.scope:
            first.setdefault(n.scope, n.index)
    best, level = blocks, blocks
    while level[0].count("."):
        parents = {b.rsplit(".", 1)[0] for b in level}
        # the same-kind modules one level up that enclose the blocks
        kinds = {graph.module_types.get(p, "") for p in parents}
        if len(parents) < 2 or len(kinds) != 1 or "" in kinds:
            break
        order = {p: min(i for s, i in first.items() if s == p or s.startswith(p + "."))
                 for p in parents}
        level = sorted(parents, key=order.__getitem__)
        if sum(held.get(p, 0) for p in level) > 1.5 * sum(held.get(b, 0) for b in best):
            best = level
    return best


def unit_names(graph: Graph, forward: set[int], names: list[str] | None) -> list[str]:
    """The unit module paths: the names given (each must run in the forward; close matches are
    listed otherwise) or the blocks of the usual recipe (``fsdp_blocks``)."""
    if not names:
        return fsdp_blocks(graph, forward)
    scopes = {n.scope for n in graph.nodes if n.index in forward and n.scope}
    modules = sorted(scopes | {".".join(s.split(".")[:d]) for s in scopes
                               for d in range(1, s.count(".") + 1)})
    for name in names:
        if name not in modules:
            close = difflib.get_close_matches(name, modules, n=5, cutoff=0.5)
            raise GraphcostError(
                f"{opt('parallel.units', name)}: no module of that name runs in the forward"
                + (f"; close matches: {', '.join(close)}" if close
                   else "; modules: " + ", ".join(modules[:12])))
    return list(names)


def _owner(path: str, names: list[str]) -> str:
    best = ROOT
    for u in names:
        if (path == u or path.startswith(u + ".")) and (best == ROOT or len(u) > len(best)):
            best = u
    return best


def fsdp_units(graph: Graph, forward: set[int],
               names: list[str]) -> tuple[list[Unit], dict[str, str]]:
    """The units (blocks in forward order, then the root) and each parameter's unit."""
    units, unit_of = derived_per_forward(graph, f"fsdp_units {names}", forward,
                                         lambda: _fsdp_units(graph, forward, names))
    return list(units), dict(unit_of)   # (copies: the kept ones stay as made)


# long: matches names, orders blocks and assigns parameters in one pass over the forward
def _fsdp_units(graph: Graph, forward: set[int],
                names: list[str]) -> tuple[list[Unit], dict[str, str]]:
    values = graph.values
    origin, param_of = origins(graph)
    # every origin is a node's output, so each has a producer
    node_of = {v: p for v, o in origin.items() if (p := values[o].producer) is not None}
    paths = _param_paths(graph, forward)
    params = list(paths)
    unit_of = {p: _owner(path, names) for p, path in paths.items()}
    scope_unit: dict[str, str] = {}

    def node_unit(scope: str) -> str:
        u = scope_unit.get(scope)
        if u is None:
            u = scope_unit[scope] = _owner(scope, names) if scope else ROOT
        return u

    fwd_span: dict[str, list[int]] = {}
    for node in graph.nodes:
        if node.index in forward:
            u = node_unit(node.scope)
            if u != ROOT:
                span = fwd_span.setdefault(u, [node.index, node.index])
                span[1] = node.index
    # storages a unit made for its own use: no forward node outside it reads them (views
    # such as the detaches of saved tensors are followed to their readers)
    external: set[int] = set()
    for node in graph.nodes:
        if node.index not in forward:
            continue
        r = lookup(node.op)
        if r is not None and r.alias:
            continue
        u = node_unit(node.scope)
        for name in node.inputs:
            o = node_of.get(name) if name else None
            if o is not None and node_unit(graph.nodes[o].scope) != u:
                external.add(o)
    grad_unit = {g: unit_of[p] for p, g in graph.grads.items() if p in unit_of}
    bwd_span: dict[str, list[int]] = {}
    for node in graph.nodes:
        if node.index in forward:
            continue
        touched = set()
        for name in node.inputs:
            if not name:
                continue
            if name in param_of:
                touched.add(unit_of.get(param_of[name], ROOT))
                continue
            o = node_of.get(name)
            if o is not None and o in forward and o not in external:
                touched.add(node_unit(graph.nodes[o].scope))
        touched.update(grad_unit[o] for o in node.outputs if o in grad_unit)
        for u in touched:
            span = bwd_span.setdefault(u, [node.index, node.index])
            span[1] = node.index
    needs = _needs_grad(graph, forward)
    deferred = {u for u in fwd_span if not any(
        name in needs for node in graph.nodes[fwd_span[u][0]:fwd_span[u][1] + 1]
        for name in node.inputs
        if name and node_of.get(name, -1) < fwd_span[u][0] and name not in param_of)}
    order = sorted(fwd_span, key=lambda u: fwd_span[u][0])
    units = []
    for u in [*order, ROOT]:
        mine = tuple(p for p in params if unit_of[p] == u)
        if not mine and u != ROOT:
            continue
        units.append(Unit(
            u, len(mine), sum(values[p].spec.nbytes or 0 for p in mine), 0, 0, 0,
            (fwd_span[u][0], fwd_span[u][1]) if u in fwd_span else None,
            (bwd_span[u][0], bwd_span[u][1]) if u in bwd_span else None,
            u == ROOT or u in deferred, mine))
    return units, unit_of


def _needs_grad(graph: Graph, forward: set[int]) -> set[str]:
    """Forward values a gradient flows into: floating outputs of nodes that read a trainable
    parameter or such a value."""
    values = graph.values
    needs = set(graph.grads) if graph.grads else {v.name for v in values.values()
                                                  if v.kind == ValueKind.PARAM}
    for node in graph.nodes:
        if node.index not in forward:
            break
        if any(name in needs for name in node.inputs if name):
            needs.update(o for o in node.outputs
                         if o and values[o].spec.dtype in FLOAT_DTYPES)
    return needs


def ddp_buckets(grad_sizes: list[int], cap_bytes: int) -> list[int]:
    """The bytes of each gradient bucket DDP builds (``_compute_bucket_assignment_by_size``:
    the gradients in reverse order, a bucket closed once it reaches its cap; the first cap is
    1 MiB, the others ``bucket_cap_mb``). They add up to the gradients whatever the cap."""
    buckets, filled, cap = [], 0, DDP_FIRST_BUCKET_BYTES
    for size in reversed(grad_sizes):
        filled += size
        if filled >= cap:
            buckets.append(filled)
            filled, cap = 0, cap_bytes
    return buckets + ([filled] if filled else [])


def zero1_partition(numels: list[int], world: int) -> list[list[int]]:
    """ZeroRedundancyOptimizer's assignment: whole tensors, largest first (a stable sort),
    each to the rank with the fewest elements so far (the lowest such rank). Returns each
    rank's tensor indices in the order its local optimizer visits them."""
    import heapq

    order = sorted(range(len(numels)), key=lambda i: -numels[i])
    heap = [(0, r) for r in range(world)]
    ranks: list[list[int]] = [[] for _ in range(world)]
    for i in order:
        size, r = heapq.heappop(heap)
        ranks[r].append(i)
        heapq.heappush(heap, (size + numels[i], r))
    return ranks


def half_ends(graph: Graph, t: "TrainingMemory", units: list) -> dict[str, int]:
    """Each gradient storage's last node as a half gradient: its unit's post-backward (its
    last backward node) adds it into the fp32 accumulated gradient (passes/parallel/
    pipeline.py's ``_backwards``)."""
    end = {p: u.backward[1] for u in units if u.backward for p in u.members}
    owner: dict[str, int] = {}   # storage -> its unit's post-backward (the last, if shared)
    for p, g in grad_of(graph).items():
        if end.get(p) is not None:
            name = t.grad_storage_of.get(g, g)
            owner[name] = max(owner.get(name, 0), end[p])
    return {st.name: min(st.death, owner.get(st.name) or st.death)
            for st in t.storages if st.name in t.grad_storages}


def grad_of(graph: Graph) -> dict[str, str]:
    """Each parameter, as ``origins`` names it (a unit's members), -> its gradient value."""
    _, param_of = origins(graph)
    grads = dict(graph.grads) or dict(zip(trainable_params(graph), graph.outputs[1:]))
    return {param_of.get(p, p): g for p, g in grads.items()}
