"""Collectives inside a traced rank's program: the tensor-parallel ops a rank's rewritten
module calls (analyzer/frontends/torch/tensor_parallel.py). They do no arithmetic graphcost
counts (an all-reduce's adds happen across the link), move their bytes through memory, and
``COLLECTIVES`` says which collective each is, for the parallel pass to add up the ``tp``
dimension's communication (passes/parallel/tensor.py) and the serving pass a tensor-parallel
replica's (passes/serving/timing.py): ``tp_collectives`` counts a graph's, and
``ring_seconds`` prices them on a link by the α–β model of a ring collective

    seconds = wire / (BUS_SHARE × link bandwidth) + ALPHA_S × its collective calls

(NCCL's tests report "bus bandwidth", which for ring all-gather, reduce-scatter and
all-reduce is exactly wire bytes over time)."""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from ..ir import Graph
from .registry import OpView, rule, zero_cost

ALPHA_S = 20e-6          # a collective call's latency (launch, the ring's hops), assumed
BUS_SHARE = 0.80         # NCCL's bus bandwidth against the link's rate, assumed

FAMILY = "collectives"
COPY = "graphcost.tp_copy.default"
ALL_REDUCE = "graphcost.tp_all_reduce.default"
GATHER_LAST = "graphcost.tp_gather_last.default"
SPLIT_LAST = "graphcost.tp_split_last.default"
GATHER_SEQ = "graphcost.tp_gather_seq.default"
SCATTER_SEQ = "graphcost.tp_scatter_seq.default"
PARTIAL_ROWS = "graphcost.tp_partial_rows.default"
ROWS_OF = "graphcost.tp_rows_of.default"
CROSS_ENTROPY = "graphcost.tp_cross_entropy.default"
ALL_TO_ALL = "graphcost.ep_all_to_all.default"
CP_GATHER = "graphcost.cp_all_gather.default"
CP_PASS = "graphcost.cp_ring_pass.default"
HELD = "graphcost.held.default"
FLOAT8_GATHERED = "graphcost.fsdp_float8_weight.default"

# op -> the collective it runs: the bytes of the collective's buffer are the output's (an
# all-reduce, an all-gather) or the input's (a reduce-scatter)
COLLECTIVES: Mapping[str, str] = MappingProxyType({
    ALL_REDUCE: "all_reduce", GATHER_LAST: "all_gather", GATHER_SEQ: "all_gather",
    SCATTER_SEQ: "reduce_scatter"})
# ops that all-reduce values of each row inside them, fp32: op -> values per row (loss
# parallelism's cross-entropy: each row's max, its sum of exponentials and its target's
# log-probability)
ROW_ALL_REDUCES: Mapping[str, int] = MappingProxyType({CROSS_ENTROPY: 3})

zero_cost(COPY, reason="a replicated input handed to tensor-parallel work: the same tensor "
          "(no copy); its gradient is all-reduced in backward", alias=True,
          same_shape=True, family=FAMILY)
zero_cost(FLOAT8_GATHERED, reason="a weight as FSDP2's float8 all-gather hands it over "
          "(torchao's enable_fsdp_float8_all_gather): the parameter itself, gathered and cast "
          "outside the step's graph; the FSDP pass sizes it at one byte an element",
          alias=True, same_shape=True, family=FAMILY)
zero_cost(HELD, reason="its first input itself; the others held by the program to here (loss "
          "parallelism's log-probabilities until the log-softmax's node runs; a ring "
          "attention's buffers until PyTorch's loop lets them go)",
          alias=True, same_shape=True, family=FAMILY)
zero_cost(ALL_REDUCE, reason="a collective: the tensor-parallel ranks' partial sums added "
          "across the link into a new tensor (the adds are not counted)", same_shape=True,
          family=FAMILY)
zero_cost(GATHER_LAST, GATHER_SEQ, reason="a collective: the tensor-parallel ranks' slices "
          "gathered across the link", family=FAMILY)
zero_cost(SPLIT_LAST, reason="the tensor-parallel rank's slice of a replicated input's last "
          "dim, a copy (nothing crosses the link); its gradient is all-gathered in backward",
          family=FAMILY)
zero_cost(SCATTER_SEQ, reason="a collective: the tensor-parallel ranks' partial sums added "
          "across the link, each rank keeping its sequence shard", family=FAMILY)
zero_cost(ROWS_OF, reason="the rank's rows of a vocabulary-parallel embedding's gradient, "
          "which DTensor makes whole and alike on every rank (the replicated output "
          "gradient's embedding backward: nothing crosses the link) and keeps whole as the "
          "parameter's gradient: a view of it", alias=True, family=FAMILY)
zero_cost(ALL_TO_ALL, reason="a collective: an expert-parallel rank's routed rows sent to the "
          "ranks holding their experts, as many received into a new tensor (balanced "
          "routing: analyzer/frontends/torch/expert_parallel.py)", same_shape=True,
          family=FAMILY)
zero_cost(CP_GATHER, reason="a collective: a context-parallel rank's keys and values, "
          "flattened, gathered from every rank of the ring into a new buffer (PyTorch's "
          "all-gather rotater: analyzer/frontends/torch/context_parallel.py)", family=FAMILY)
zero_cost(CP_PASS, reason="a collective: a ring step's key and value gradients (or, under "
          "the alltoall rotate method, its keys and values) passed to the next "
          "context-parallel rank, as many received into a new tensor (PyTorch's all-to-all "
          "rotater)", same_shape=True, family=FAMILY)
zero_cost(PARTIAL_ROWS, reason="the rank's rows of a vocabulary-parallel embedding read as "
          "the whole table (the same tensor); its gradient is the whole table's, which the "
          "rank keeps whole (DTensor's embedding backward)", alias=True,
          family=FAMILY)


@rule(CROSS_ENTROPY, family=FAMILY)
def tp_cross_entropy(op: OpView) -> tuple[int, int]:
    # as a whole vocabulary's (normalization.py, training_ops.py): a log-softmax of 5 per
    # score of the rank's slice, then per target pick and negate (1) and the mean's sum (1)
    return 0, 5 * op.in_numel(0) + 2 * op.in_numel(1)


def tp_collectives(graph: Graph, recomputed: frozenset[int] = frozenset()) -> dict[str, int]:
    """Bytes of each collective the graph's nodes run (all_reduce, all_gather,
    reduce_scatter: the buffer NCCL's tests size them by), and ``calls``; a node among
    ``recomputed`` (a checkpoint's forward, run again in backward) twice."""
    out = dict(all_reduce=0, all_gather=0, reduce_scatter=0, calls=0)
    for node in (*graph.nodes, *(graph.nodes[i] for i in sorted(recomputed))):
        per_row = ROW_ALL_REDUCES.get(node.op, 0)
        if per_row:   # one value of each row of its first input, fp32, per all-reduce
            spec = graph.values[node.inputs[0]].spec
            last = spec.shape[-1] if spec.shape else None
            rows = (spec.numel or 0) // last if isinstance(last, int) and last else 0
            out["all_reduce"] += per_row * 4 * rows
            out["calls"] += per_row
        kind = COLLECTIVES.get(node.op)
        if kind is None:
            continue
        ends = node.inputs[:1] if kind == "reduce_scatter" else node.outputs
        out[kind] += sum(graph.values[v].spec.nbytes or 0 for v in ends)
        out["calls"] += 1
    return out


def output_bytes(graph: Graph, ops: tuple[str, ...],
                 recomputed: frozenset[int] = frozenset()) -> dict[str, tuple[int, int]]:
    """Per op of ``ops``: (the bytes of its nodes' outputs, its calls), a ``recomputed`` node
    twice."""
    out: dict[str, tuple[int, int]] = dict.fromkeys(ops, (0, 0))
    for node in (*graph.nodes, *(graph.nodes[i] for i in sorted(recomputed))):
        if node.op in out:
            size, calls = out[node.op]
            out[node.op] = (size + (graph.values[node.outputs[0]].spec.nbytes or 0), calls + 1)
    return out


def all_to_all_bytes(graph: Graph, recomputed: frozenset[int] = frozenset()) -> tuple[int, int]:
    """(the bytes of the graph's expert-parallel all-to-alls — each one's buffer, what a rank
    sends — and their calls), a ``recomputed`` node twice."""
    return output_bytes(graph, (ALL_TO_ALL,), recomputed)[ALL_TO_ALL]


def ring_bytes(graph: Graph,
               recomputed: frozenset[int] = frozenset()) -> tuple[int, int, int]:
    """(the bytes of the graph's context-parallel all-gathers — each one's output — and of
    its ring passes, and their calls), a ``recomputed`` node twice."""
    found = output_bytes(graph, (CP_GATHER, CP_PASS), recomputed)
    (gathered, gathers), (passed, passes) = found[CP_GATHER], found[CP_PASS]
    return gathered, passed, gathers + passes


def ring_wire(counts: Mapping[str, int], ranks: int) -> int:
    """The bytes each rank sends (and receives) for ``tp_collectives``' ``counts`` over a
    ring of ``ranks``: an all-reduce of S bytes 2·(T−1)/T·S, an all-gather whose output and a
    reduce-scatter whose input are S bytes (T−1)/T·S each."""
    return round((ranks - 1) / ranks * (2 * counts["all_reduce"] + counts["all_gather"]
                                        + counts["reduce_scatter"]))


def ring_seconds(wire: float, calls: int, bandwidth: float) -> float:
    """A ring's collectives on a link of ``bandwidth`` bytes/s each way (the α–β model)."""
    return wire / (BUS_SHARE * bandwidth) + ALPHA_S * calls
