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

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from ..costs.registry import lookup
from ..ir import INTERNAL, Graph, Node, ValueKind
from .peak import Peak

if TYPE_CHECKING:
    from .allocator_events import PhaseReserve


@dataclass(frozen=True, slots=True)
class Storage:
    name: str     # the value that allocated it
    nbytes: int
    birth: int    # first node index at which it is live
    death: int    # last node index at which it is live


@dataclass(frozen=True, slots=True)
class LiveTensor:
    name: str
    bytes: int


@dataclass(frozen=True)
class Liveness:
    """Activation memory by liveness: the report's ``memory`` section (fields marked INTERNAL
    are the pass's working state, not part of the report)."""
    include_inputs: bool
    lifetimes: str                  # "dataflow" or "eager"
    naive_sum_bytes: int            # every storage added up, as if nothing were ever freed
    peak_bytes: int                 # activations (and inputs, if included) at the peak
    peak_node: str | None           # the first node where the peak is reached
    peak_node_index: int            # its index (-1: an empty graph)
    live_at_peak: tuple[LiveTensor, ...]   # largest first
    arena_bytes: int | None         # a static arena's size (passes.memory.arena; None: not planned)
    timeline: tuple[int, ...]       # bytes live while node i runs (its inputs and outputs)
    storages: tuple[Storage, ...] = field(metadata=INTERNAL)
    value_storage: dict[str, int] = field(metadata=INTERNAL)  # value -> index into storages
    unknown: tuple[str, ...] = field(metadata=INTERNAL)  # activations of unknown size (0 B)
    # what PyTorch's CUDA caching allocator would reserve for this run, parameters and buffers
    # included (passes.memory.caching_allocator; None: not modelled, as for a training graph)
    reserved_peak_bytes: int | None = None
    # what it had reserved by the end of each phase: the weights, the first batch, the second
    reserved_by_phase: "tuple[PhaseReserve, ...]" = ()
    # held through the whole run beside the activations, by category (the parameters and
    # buffers: analyze_liveness's ``resident``)
    resident: Mapping[str, int] = field(default_factory=dict, metadata=INTERNAL)
    JSON_PROPERTIES = ("fragmentation", "peak")

    @property
    def fragmentation(self) -> float:
        """arena / peak − 1 (0 when no arena was planned)."""
        if self.arena_bytes is None or not self.peak_bytes:
            return 0.0
        return round(self.arena_bytes / self.peak_bytes - 1.0, 6)

    @property
    def peak(self) -> Peak:
        """The inference run's peak (passes/memory/peak.py): what is resident + the
        activation peak, against the reserved replay where one was made."""
        return Peak(allocated_bytes=sum(self.resident.values()) + self.peak_bytes,
                    reserved_bytes=self.reserved_peak_bytes, phase="inference",
                    node=self.peak_node,
                    by_category={**self.resident, "activations": self.peak_bytes})


def module_call_ends(graph: Graph) -> list[list[int]]:
    """ends[d][i]: index of the last node of the module call at depth d that contains node i.

    A call is a maximal run of consecutive nodes whose scope shares the same first d path
    components (a module's nodes are contiguous in execution order). O(nodes × depth): the
    common prefix of each pair of neighbours is measured once.
    """
    paths = [node.scope.split(".") if node.scope else [] for node in graph.nodes]
    depth = max((len(p) for p in paths), default=0)
    n = len(paths)
    shared = []  # shared[i]: length of the common prefix of paths i and i + 1
    for a, b in zip(paths, paths[1:]):
        k, m = 0, min(len(a), len(b))
        while k < m and a[k] == b[k]:
            k += 1
        shared.append(k)
    ends = []
    for d in range(depth + 1):
        end = [0] * n
        j = n - 1
        for i in range(n - 1, -1, -1):
            if i < n - 1 and shared[i] < d:
                j = i
            end[i] = j
        ends.append(end)
    return ends


def analyze_liveness(graph: Graph, *, include_inputs: bool = True,
                     inplace: bool = False, eager: bool = False,
                     python_refs: bool | None = None,
                     resident: Mapping[str, int] | None = None) -> Liveness:
    """``eager=True`` models PyTorch eager execution instead of a graph runtime: a tensor passed
    into a module call stays referenced (by the caller's variable and the callee's parameter)
    until that call returns, so it lives at least to the call's last node (the model's own
    inputs to the last node: the caller holds them through the whole call); and a tensor the
    model's Python code was seen holding while it was traced (``graph.eager_refs``: a local
    variable, a list of skip tensors) lives as long as that reference did, and an op the model
    ran in place (``graph.eager_inplace``) writes into its input's storage. ``python_refs``
    (None: as ``eager``) applies those two alone: a training step's forward, whose module
    arguments the autograd engine's saved tensors or Python's references hold as long as
    they are held, and whose backward Python runs none of. ``resident``: the bytes held
    through the whole run beside the activations, by category (the parameters and buffers the
    parameter pass counts), which the run's ``peak`` adds."""
    nodes = graph.nodes
    refs = eager if python_refs is None else python_refs
    last_use = _last_uses(graph, eager, refs)
    t = _Tables(graph, last_use)
    if include_inputs:
        for name in graph.inputs:
            t.allocate(name, 0)
    for node in nodes:
        _place_outputs(graph, node, t, inplace, refs)
    timeline, peak, peak_node = _curve(t, len(nodes))
    storages = tuple(Storage(a, s, b, d) for a, s, b, d in zip(t.names, t.sizes, t.births,
                                                               t.deaths))
    at_peak = sorted((s for s in storages if s.birth <= peak_node <= s.death),
                     key=lambda s: (-s.nbytes, s.name)) if peak_node >= 0 else []
    return Liveness(include_inputs=include_inputs, lifetimes="eager" if eager else "dataflow",
                    naive_sum_bytes=sum(t.sizes), peak_bytes=peak,
                    peak_node=nodes[peak_node].name if peak_node >= 0 else None,
                    peak_node_index=peak_node,
                    live_at_peak=tuple(LiveTensor(s.name, s.nbytes) for s in at_peak),
                    arena_bytes=None, timeline=tuple(timeline), storages=storages,
                    value_storage=t.of, unknown=tuple(t.unknown),
                    resident=dict(resident or {}))


def _last_uses(graph: Graph, eager: bool, refs: bool) -> dict[str, int]:
    """The index of the last node that uses each value, with the references that hold a value
    longer: an autograd call's, eager module calls', Python's own (``refs``), the outputs'."""
    last = len(graph.nodes) - 1
    last_use: dict[str, int] = {}
    for node in reversed(graph.nodes):  # one reverse walk
        for name in node.inputs:
            if name and name not in last_use:
                last_use[name] = node.index
    _hold_through_autograd_calls(graph, last_use)
    if eager:
        _extend_to_module_returns(graph, last_use)
        for name in graph.inputs:  # the caller's arguments: referenced until the call returns
            last_use[name] = last
    if refs:
        for name, end in graph.eager_refs.items():  # Python's own references (traced)
            if end > last_use.get(name, -1):
                last_use[name] = end
    for name in graph.outputs:
        last_use[name] = last
    return last_use


class _Tables:
    """The storages found so far, column by column (a storage: the value that allocated it, its
    bytes, birth and death), and the storage each value lives in."""

    def __init__(self, graph: Graph, last_use: dict[str, int]):
        self.values, self.last_use = graph.values, last_use
        self.outputs = set(graph.outputs)
        self.names: list[str] = []
        self.sizes: list[int] = []
        self.births: list[int] = []
        self.deaths: list[int] = []
        self.of: dict[str, int] = {}
        self.unknown: list[str] = []   # activations of unknown size (counted as 0 B)

    def allocate(self, name: str, birth: int) -> None:
        v = self.values.get(name)
        size = v.spec.nbytes if v is not None else None
        if size is None:
            self.unknown.append(name)
            size = 0
        self.of[name] = len(self.names)
        self.names.append(name)
        self.sizes.append(size)
        self.births.append(birth)
        self.deaths.append(max(birth, self.last_use.get(name, birth)))


def _place_outputs(graph: Graph, node: Node, t: _Tables, inplace: bool, refs: bool) -> None:
    """Give each activation ``node`` makes a storage: its input's (a view, an op the model ran
    in place, an in-place what-if) or a new one."""
    values, of, deaths = graph.values, t.of, t.deaths
    r = lookup(node.op)
    src = node.inputs[0] if node.inputs else ""
    shared = of.get(src) if src else None
    if r is not None and r.alias and src and shared is None:
        if getattr(values.get(src), "kind", None) != ValueKind.INPUT:
            return  # a view of a weight or constant allocates nothing
        # an input left out (include_inputs=False) is held while a view of it is: its
        # whole storage, once for all its views (MemTracker sees it through them alone)
        t.allocate(src, node.index)
        shared = of[src]
        deaths[shared] = node.index  # (then as long as its views)
    is_view = shared is not None and r is not None and r.alias
    written = graph.eager_inplace.get(node.outputs[0]) if refs and node.outputs else None
    if is_view:
        pass  # every output (split/unbind give several) is a view of input 0
    elif written is not None and written in of:
        shared = of[written]  # the model itself ran this op in place
    elif (inplace and shared is not None and r is not None and r.inplace
          and deaths[shared] == node.index and src not in t.outputs):
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
            d = t.last_use.get(name, node.index)
            if d > deaths[shared]:
                deaths[shared] = d
        else:
            t.allocate(name, node.index)


def _curve(t: _Tables, n: int) -> tuple[list[int], int, int]:
    """(bytes live while each node runs, the peak, the first node reaching it: -1 for an empty
    graph): a difference array and a running sum."""
    diff = [0] * (n + 1)
    for s, b, d in zip(t.sizes, t.births, t.deaths):
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
    return timeline, peak, peak_node


def _hold_through_autograd_calls(graph: Graph, last_use: dict[str, int]) -> None:
    """A joint graph's backward as eager autograd runs it: an autograd node's formula is one
    call (consecutive nodes marked with one ``Node.autograd``) that holds its incoming
    gradient and the tensors its forward saved until it returns. That matters where it makes
    several gradients one after another: MulBackward0 of a·b keeps a while it computes b's
    gradient after a's (GPT-2's gelu_new, a SwiGLU's gate·up). A call making one gradient
    makes it last; holding its inputs to then would only add to the temporaries of a kernel
    the trace decomposed (ReLU's backward: a mask, then a where), which eager never makes."""
    outputs = set(graph.outputs)
    for call in _autograd_calls(graph.nodes):
        nodes = [graph.nodes[i] for i in call]
        made = {o for n in nodes for o in n.outputs if o}
        returns = [n.index for n in nodes if any(
            o in outputs or last_use.get(o, -1) > call[-1] for o in n.outputs if o)]
        if len(returns) < 2:
            continue
        for n in nodes:
            for name in n.inputs:
                v = graph.values.get(name)
                if v is not None and v.producer is not None and name not in made and \
                        last_use.get(name, -1) < returns[-1]:
                    last_use[name] = returns[-1]


def _autograd_calls(nodes: tuple[Node, ...]) -> list[range]:
    """The runs of nodes marked with one autograd node, two or more, with no other autograd
    node's between them (an unmarked node, an alias the frontend could not match, joins)."""
    calls: list[range] = []
    start, last, key = 0, -1, None
    for i, node in enumerate((*nodes, None)):
        mark = node.autograd if node is not None else -1
        if mark is None:
            continue
        if mark != key:
            if key is not None and last > start:
                calls.append(range(start, last + 1))
            start, key = i, mark
        last = i
    return calls


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
