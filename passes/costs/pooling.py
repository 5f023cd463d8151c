"""Pooling and reductions: FLOPs from the elements each output visits. No MACs."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..costs.cuda_reduce import THREADS_PER_SM, reduce_buffers
from ..costs.registry import AXIS_ATTRS, WINDOW_ATTRS, OpView, rule

if TYPE_CHECKING:
    from ..device_rates import DeviceRates


def pool(op: OpView) -> tuple[int, int]:
    # Design notes: B·H_out·W_out·C·K² — each output visits its window once (K²−1 compares or
    # adds, plus the divide of an average, counted as K² in all). ONNX names the window
    # kernel_shape; aten kernel_size, where one size stands for every spatial axis.
    out = op.out_shape(0)
    k = tuple(op.attr("kernel") or (1,))
    if len(k) == 1:
        k = k * max(1, len(out) - 2)
    return 0, math.prod(out) * math.prod(k)


# One rule, registered per backward behaviour: max pooling's backward scatters into the argmax
# (input + int64 indices kept), average pooling's spreads evenly (nothing kept).
# (kernel="pool": a window op runs at its own pace, far from the memory rate of its bytes:
# PyTorch's CPU max pooling with indices visits each window element by element)
rule("MaxPool", "aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default",
     saves="indices", rf="pool", attr_names=WINDOW_ATTRS, kernel="pool")(pool)
rule("AveragePool", "aten.avg_pool2d.default", "aten.avg_pool3d.default", saves="nothing",
     rf="pool", attr_names=WINDOW_ATTRS, kernel="pool")(pool)
rule("LpPool", saves="inputs", rf="pool", attr_names=WINDOW_ATTRS, kernel="pool")(pool)


def reduce_once(op: OpView) -> tuple[int, int]:
    return 0, op.in_numel(0)  # one add/compare per input element (a mean's divide is per output)


def cuda_sum_buffers(op: OpView, device: "DeviceRates") -> tuple[int, ...]:
    """The staging buffer and semaphores a CUDA sum or mean allocates around its kernel when
    it splits its inputs across thread blocks (passes/costs/cuda_reduce.py: exact, from
    Reduce.cuh's launch configuration); none on ROCm (its configuration differs: not
    modelled) or where the multiprocessor count is not known."""
    arch = device.capability and THREADS_PER_SM.get(device.capability)
    if device.rocm or not device.sms or not arch:
        return ()
    spec = op.in_spec(0)
    wide = spec.dtype in ("float64", "int64", "int32", "int16", "int8", "uint8", "bool")
    dims = op.attr("dim") or ()
    return reduce_buffers(op.in_shape(0), [int(d) for d in dims], 8 if wide else 4,
                          device.sms, arch, broadcast=op.broadcast(0))


def _reduce_bound(v):
    # axes from a tensor that is not a constant: with keepdims the output has the input's
    # rank and no larger a dim (nothing reduced is the largest)
    x, axes = v.shape(0), v.shape(1) if v.has_input(1) else None
    if v.attr("keepdims", 1) or x is None:
        return [(None, x)]
    if axes is None or not isinstance(axes[0], int) or not all(isinstance(d, int) for d in x):
        return [None]
    # k axes dropped: the largest output keeps the largest r − k dims (in their order)
    drop = sorted(range(len(x)), key=lambda i: (x[i], i))[:axes[0]]
    return [(None, tuple(d for i, d in enumerate(x) if i not in drop))]


# Reductions whose axes input is not a constant: the output size depends on the data.
REDUCE_BOUND = dict(bound="axes (a tensor, not a constant) leave the largest output they can",
                    bound_shapes=_reduce_bound)
# Sums and means spread the gradient back (nothing kept); max/min/prod need their input.
rule("ReduceSum", "ReduceMean", saves="nothing", **REDUCE_BOUND)(reduce_once)
rule("GlobalAveragePool", "CumSum", "aten.cumsum.default",
     "ArgMax", "ArgMin", "aten.argmax.default", "aten.argmin.default", "aten.any.dim",
     "aten.any.dims", "aten.any.default", saves="nothing")(reduce_once)
rule("aten.mean.dim", "aten.mean.default", "aten.sum.dim_IntList", saves="nothing",
     workspace=cuda_sum_buffers)(reduce_once)
rule("ReduceMax", "ReduceMin", "ReduceProd", saves="inputs", **REDUCE_BOUND)(reduce_once)
rule("GlobalMaxPool", "GlobalLpPool", "CumProd",
     "aten.amax.default", "aten.amin.default", "aten.max.dim", "aten.min.dim",
     "aten.max.default", "aten.min.default",
     "aten.prod.dim_int", saves="inputs")(reduce_once)
# A histogram (an MoE's tokens per expert) visits each input element once; no gradient.
rule("aten.histc.default", saves="nothing")(reduce_once)
# torch's adaptive pools: windows of in/out when the sizes divide (receptive fields), else
# a global pool; each input element is visited once either way.
rule("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default",
     saves="nothing", rf="adaptive_pool")(reduce_once)
rule("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default", saves="indices",
     rf="adaptive_pool")(reduce_once)
global_pool = reduce_once  # every input element added/compared once


def reduce_twice(op: OpView) -> tuple[int, int]:
    return 0, 2 * op.in_numel(0)  # transform (square/abs/exp) + accumulate per element


rule("ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
     saves="inputs", **REDUCE_BOUND)(reduce_twice)
rule("aten.var.correction", "aten.var_mean.correction", "aten.linalg_vector_norm.default",
     saves="inputs")(reduce_twice)


def _topk_bound(v):
    x = v.shape(0)  # k ≤ the axis length: the outputs at most have the input's shape
    return [(None, x), ("int64", x)]


@rule("TopK", "aten.topk.default", saves="outputs",  # the indices it selected
      attr_names=AXIS_ATTRS, bound="k (a tensor, not a constant) as large as the axis",
      bound_shapes=_topk_bound, routing="top_k")
def topk(op: OpView) -> tuple[int, int]:
    # a heap selection: ≈ log2(k) compares per input element (at least one).
    k = op.out_shape(0)[int(op.attr("axis", -1))]
    return 0, op.in_numel(0) * max(1, math.ceil(math.log2(max(k, 1))))


@rule("aten.sort.default", "aten.sort.stable", saves="outputs",  # the permutation
      attr_names=AXIS_ATTRS)
def sort(op: OpView) -> tuple[int, int]:
    # a comparison sort: ≈ log2(n) compares per element along the sorted axis (an MoE's
    # tokens by expert id).
    n = op.in_shape(0)[int(op.attr("axis", -1))] if op.in_shape(0) else 1
    return 0, op.in_numel(0) * max(1, math.ceil(math.log2(max(n, 1))))


@rule("aten._unique2.default", saves="nothing")
def unique(op: OpView) -> tuple[int, int]:
    # torch.unique sorts (≈ log2(n) compares per element) then compares neighbours (n); its
    # output size is the data's (torch's range: at most n)
    n = op.in_numel(0)
    return 0, n * max(1, math.ceil(math.log2(max(n, 1)))) + n
