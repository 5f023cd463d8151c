"""Collectives inside a traced rank's program: the tensor-parallel ops a rank's rewritten
module calls (analyzer/frontends/torch/tensor_parallel.py). They do no arithmetic graphcost
counts (an all-reduce's adds happen across the link), move their bytes through memory, and
``COLLECTIVES`` says which collective each is, for the parallel pass to add up the ``tp``
dimension's communication (passes/parallel/tensor.py)."""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from .registry import OpView, rule, zero_cost

FAMILY = "collectives"
COPY = "graphcost.tp_copy.default"
ALL_REDUCE = "graphcost.tp_all_reduce.default"
GATHER_LAST = "graphcost.tp_gather_last.default"
GATHER_SEQ = "graphcost.tp_gather_seq.default"
SCATTER_SEQ = "graphcost.tp_scatter_seq.default"
CROSS_ENTROPY = "graphcost.tp_cross_entropy.default"
HELD = "graphcost.tp_held.default"

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
zero_cost(HELD, reason="its first input itself; its second held by the autograd engine to "
          "here (loss parallelism's log-probabilities until the log-softmax's node runs)",
          alias=True, same_shape=True, family=FAMILY)
zero_cost(ALL_REDUCE, reason="a collective: the tensor-parallel ranks' partial sums added "
          "across the link into a new tensor (the adds are not counted)", same_shape=True,
          family=FAMILY)
zero_cost(GATHER_LAST, GATHER_SEQ, reason="a collective: the tensor-parallel ranks' slices "
          "gathered across the link", family=FAMILY)
zero_cost(SCATTER_SEQ, reason="a collective: the tensor-parallel ranks' partial sums added "
          "across the link, each rank keeping its sequence shard", family=FAMILY)


@rule(CROSS_ENTROPY, family=FAMILY)
def tp_cross_entropy(op: OpView) -> tuple[int, int]:
    # as a whole vocabulary's (normalization.py, training_ops.py): a log-softmax of 5 per
    # score of the rank's slice, then per target pick and negate (1) and the mean's sum (1)
    return 0, 5 * op.in_numel(0) + 2 * op.in_numel(1)
