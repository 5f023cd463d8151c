"""Inference activation liveness: when each tensor's storage is born and dies.

Each activation lives from its producer to its last consumer, in execution order (the reverse
walk of torch/fx/interpreter.py that finds last uses); graph outputs live to the end; graph
inputs are live from the first node (``include_inputs=False`` leaves them out). A view op
(a rule declared ``alias``: Reshape, Squeeze, Unsqueeze, Flatten, Identity, inference Dropout)
allocates nothing: its output joins its input's storage, which then lives until the last use of
either. With ``inplace=True``, an op whose rule allows it (``Rule.inplace``: the unary
activations, Clip) writes into its input's storage when the input dies at that node (the
what-if of in-place activations), on either frontend.

The memory curve is a difference array and a running sum (torch/_inductor/memory.py, tinygrad's
schedule/memory.py): O(nodes + tensors).
"""
from __future__ import annotations

from dataclasses import dataclass

from graphcost.analyzer.ir import Graph, ValueKind
from graphcost.passes.costs.registry import lookup


@dataclass(frozen=True, slots=True)
class Storage:
    name: str     # the value that allocated it
    nbytes: int
    birth: int    # first node index at which it is live
    death: int    # last node index at which it is live


@dataclass(frozen=True)
class Liveness:
    storages: tuple[Storage, ...]
    value_storage: dict[str, int]   # value name -> index into storages
    timeline: tuple[int, ...]       # bytes live while node i runs (its inputs and outputs)
    naive_sum_bytes: int            # every storage added up, as if nothing were ever freed
    peak_bytes: int
    peak_node: int                  # index of the first node where the peak is reached (-1: none)
    unknown: tuple[str, ...]        # activations whose size is unknown (counted as 0)

    def live_at(self, i: int) -> list[Storage]:
        """Storages live while node i runs, largest first."""
        live = [s for s in self.storages if s.birth <= i <= s.death]
        live.sort(key=lambda s: (-s.nbytes, s.name))
        return live


def module_call_ends(graph: Graph) -> list[list[int]]:
    """ends[d][i]: index of the last node of the module call at depth d that contains node i.

    A call is a maximal run of consecutive nodes whose scope shares the same first d path
    components (a module's nodes are contiguous in execution order).
    """
    paths = [node.scope.split(".") if node.scope else [] for node in graph.nodes]
    depth = max((len(p) for p in paths), default=0)
    n = len(paths)
    ends = []
    for d in range(depth + 1):
        end = [0] * n
        j = n - 1
        for i in range(n - 1, -1, -1):
            if i < n - 1 and (len(paths[i]) < d or len(paths[i + 1]) < d
                              or paths[i][:d] != paths[i + 1][:d]):
                j = i
            end[i] = j
        ends.append(end)
    return ends


def analyze_liveness(graph: Graph, *, include_inputs: bool = True,
                     inplace: bool = False, eager: bool = False) -> Liveness:
    """``eager=True`` models PyTorch eager execution instead of a graph runtime: a tensor passed
    into a module call stays referenced (by the caller's variable and the callee's parameter)
    until that call returns, so it lives at least to the call's last node; and a tensor the
    model's Python code was seen holding while it was traced (``graph.eager_refs``: a local
    variable, a list of skip tensors) lives as long as that reference did, and an op the model
    ran in place (``graph.eager_inplace``) writes into its input's storage."""
    nodes = graph.nodes
    n = len(nodes)
    values = graph.values
    last = n - 1

    # Last use of every value: one reverse walk.
    last_use: dict[str, int] = {}
    for node in reversed(nodes):
        for name in node.inputs:
            if name and name not in last_use:
                last_use[name] = node.index
    if eager:
        _extend_to_module_returns(graph, last_use)
        for name, end in graph.eager_refs.items():  # Python's own references (traced)
            if end > last_use.get(name, -1):
                last_use[name] = end
    for name in graph.outputs:
        last_use[name] = last

    names: list[str] = []
    sizes: list[int] = []
    births: list[int] = []
    deaths: list[int] = []
    of: dict[str, int] = {}
    unknown: list[str] = []

    def allocate(name: str, birth: int) -> None:
        v = values.get(name)
        size = v.spec.nbytes if v is not None else None
        if size is None:
            unknown.append(name)
            size = 0
        of[name] = len(names)
        names.append(name)
        sizes.append(size)
        births.append(birth)
        deaths.append(max(birth, last_use.get(name, birth)))

    if include_inputs:
        for name in graph.inputs:
            allocate(name, 0)
    for node in nodes:
        r = lookup(node.op)
        src = node.inputs[0] if node.inputs else ""
        shared = of.get(src) if src else None
        if r is not None and r.alias and src and shared is None and \
                values[src].kind != ValueKind.INPUT:
            continue  # a view of a weight or constant allocates nothing
        is_view = shared is not None and r is not None and r.alias
        written = graph.eager_inplace.get(node.outputs[0]) if eager and node.outputs else None
        if is_view:
            pass  # every output (split/unbind give several) is a view of input 0
        elif written is not None and written in of:
            shared = of[written]  # the model itself ran this op in place
        elif (inplace and shared is not None and r is not None and r.inplace
              and deaths[shared] == node.index and src not in graph.outputs):
            pass  # in place: the input's storage dies here, the output reuses it
        else:
            shared = None
        for k, name in enumerate(node.outputs):
            if not name:
                continue
            v = values.get(name)
            if v is None or v.kind != ValueKind.ACTIVATION:
                continue
            if shared is not None and (k == 0 or is_view):
                of[name] = shared
                d = last_use.get(name, node.index)
                if d > deaths[shared]:
                    deaths[shared] = d
            else:
                allocate(name, node.index)

    diff = [0] * (n + 1)
    for s, b, d in zip(sizes, births, deaths):
        diff[b] += s
        diff[d + 1] -= s
    timeline = []
    running = 0
    peak, peak_node = 0, -1 if n == 0 else 0
    for i in range(n):
        running += diff[i]
        timeline.append(running)
        if running > peak:
            peak, peak_node = running, i
    storages = tuple(Storage(a, s, b, d) for a, s, b, d in zip(names, sizes, births, deaths))
    return Liveness(storages, of, tuple(timeline), sum(sizes), peak, peak_node, tuple(unknown))


def _extend_to_module_returns(graph: Graph, last_use: dict[str, int]) -> None:
    """For every use of a value inside a module call that the value was produced outside of,
    keep the value to the end of that (outermost such) call."""
    ends = module_call_ends(graph)
    called = graph.module_types  # the frontend's known modules; empty: every path prefix
    scope_of = {}
    for node in graph.nodes:
        for out in node.outputs:
            if out:
                scope_of[out] = node.scope
    for node in graph.nodes:
        consumer = node.scope.split(".") if node.scope else []
        for name in node.inputs:
            if not name:
                continue
            producer = scope_of.get(name)
            prod = producer.split(".") if producer else []
            common = 0
            while common < len(prod) and common < len(consumer) and \
                    prod[common] == consumer[common]:
                common += 1
            # the outermost module *called* around this use that the value came into
            # (containers such as ModuleList are never called: they hold no reference)
            for d in range(common + 1, len(consumer) + 1):
                if not called or ".".join(consumer[:d]) in called:
                    end = ends[d][node.index]
                    if end > last_use.get(name, -1):
                        last_use[name] = end
                    break
