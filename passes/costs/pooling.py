"""Pooling and reductions: FLOPs from the elements each output visits. No MACs."""
from __future__ import annotations

import math

from passes.costs.registry import OpView, rule


@rule("MaxPool", "AveragePool", "LpPool")
def pool(op: OpView) -> tuple[int, int]:
    # Design notes: B·H_out·W_out·C·K² — each output visits its window once (K²−1 compares or
    # adds, plus the divide of an average, counted as K² in all).
    return 0, op.out_numel(0) * math.prod(op.attr("kernel_shape") or (1,))


@rule("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(op: OpView) -> tuple[int, int]:
    return 0, op.in_numel(0)  # every input element added/compared once


@rule("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ArgMax", "ArgMin",
      "CumSum")
def reduce_once(op: OpView) -> tuple[int, int]:
    return 0, op.in_numel(0)  # one add/compare per input element (a mean's divide is per output)


@rule("ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")
def reduce_twice(op: OpView) -> tuple[int, int]:
    return 0, 2 * op.in_numel(0)  # transform (square/abs/exp) + accumulate per element


@rule("TopK")
def topk(op: OpView) -> tuple[int, int]:
    # a heap selection: ≈ log2(k) compares per input element (at least one).
    k = op.out_shape(0)[int(op.attr("axis", -1))]
    return 0, op.in_numel(0) * max(1, math.ceil(math.log2(max(k, 1))))
