"""The global-memory buffers of PyTorch's CUDA reductions (``sum``, ``mean``): what
``gpu_reduce_kernel`` (aten/src/ATen/native/cuda/Reduce.cuh) allocates through the caching
allocator when it splits each output's inputs across thread blocks: a staging buffer of the
blocks' partial results and a semaphore per output block, freed when the kernel returns.

The split is ``setReduceConfig``'s, followed step by step below for a contiguous input; it
depends on the GPU through its multiprocessor count and resident threads per multiprocessor.
A bias's or a norm weight's gradient is such a reduction — the sum of a (tokens × features)
gradient over its tokens — and its buffer is 8 B per feature per token while the split goes
by rows (a 4-wide column of outputs per thread, one block per 64 rows, 32 × 4 floats staged
per block): read off PyTorch 2.11's allocator trace on an H200
(benchmarks/results/cuda_traces_h200.json.gz),
a 1,024-feature bias's gradient over 8,192 tokens allocated 67,108,864 B and 32 B around the
kernel, a 1,024-wide RMSNorm weight's over 4,096 tokens 33,554,432 B and 32 B, the step's
scalar loss (a sum over 131 M logits) 4,000 B and 4 B — each as computed here.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

MAX_THREADS = 512          # mnt_wrapper<T>::MAX_NUM_THREADS (256 for complex double only)
WARP = 32                  # at::cuda::warp_size() on NVIDIA parts
INPUT_VEC = 4              # ReduceConfig::input_vec_size
VT0 = 4                    # gpu_reduce_kernel's default vt0 (sum and mean use it)
MIN_VALUES, MAX_VALUES = 16, 256   # min_/max_values_per_thread

# Resident threads per multiprocessor by compute capability (CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability").
THREADS_PER_SM = {(6, 0): 2048, (6, 1): 2048, (7, 0): 2048, (7, 5): 1024, (8, 0): 2048,
                  (8, 6): 1536, (8, 7): 2048, (8, 9): 1536, (9, 0): 2048, (10, 0): 2048,
                  (12, 0): 1536}


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _iterator(shape: Sequence[int], dims: Sequence[int], broadcast: bool
              ) -> tuple[list, list]:
    """TensorIterator's view of an input reduced over ``dims``: (reduced, kept), each a list
    of (size, stride in elements), innermost first, adjacent dims coalesced (size-1 dims
    dropped). The input is contiguous, or ``broadcast``: every stride 0."""
    strides = [0 if broadcast else math.prod(shape[i + 1:]) for i in range(len(shape))]
    groups: tuple[list, list] = ([], [])
    for i in reversed(range(len(shape))):
        if shape[i] == 1:
            continue
        group = groups[0] if i in dims else groups[1]
        if group and group[-1][1] * group[-1][0] == strides[i]:
            group[-1] = (group[-1][0] * shape[i], group[-1][1])
        else:
            group.append((shape[i], strides[i]))
    return groups


# long: setReduceConfig's steps in its own order, so each can be checked against the source
def reduce_buffers(shape: Sequence[int], dims: Sequence[int], acc_bytes: int, sms: int,
                   threads_per_sm: int, broadcast: bool = False) -> tuple[int, ...]:
    """(staging buffer, semaphores) bytes a CUDA sum/mean of a contiguous ``shape`` over
    ``dims`` allocates (``acc_bytes``: its accumulator's, 4 for float, half and bfloat16),
    or () where it reduces within blocks. ``broadcast``: the input is one value expanded
    (every stride 0: the loss's gradient reaching a bias). Inputs of 2^31 elements and more
    (split into 32-bit-indexed pieces) are not modelled: ()."""
    numel = math.prod(shape)
    dims = [d % len(shape) for d in dims] if dims else list(range(len(shape)))
    if numel == 0 or numel >= 1 << 31:
        return ()
    reduced, kept = _iterator(shape, dims, broadcast)
    outputs, per_output = math.prod(s for s, _ in kept), math.prod(s for s, _ in reduced)
    on_fastest = not kept or (bool(reduced) and reduced[0][1] < kept[0][1])
    dim0, dim1 = (per_output, outputs) if on_fastest else (outputs, per_output)
    vec_out = 1
    fastest_stride = (reduced[0][1] if reduced else 1) if on_fastest else kept[0][1]
    if fastest_stride == 1:
        if on_fastest and dim0 > 128 and len(reduced) == 1 and VT0 >= INPUT_VEC:
            dim0 //= INPUT_VEC                        # "vectorize along input"
        elif not on_fastest:                          # "vectorize along output"
            vec_out = 4
            for n in [kept[0][0]] + [st for _, st in reduced + kept[1:]]:
                while n % vec_out:
                    vec_out //= 2
            dim0 //= vec_out
    width, height = _block(dim0, dim1, MAX_THREADS // vec_out)
    step_in = step_out = 1
    if on_fastest:
        step_in *= width                              # input_mult[BLOCK_X]
    else:
        step_out *= width                             # output_mult[BLOCK_X]
    across_warps = _div_up(per_output, step_in) >= min(height * 16, MAX_VALUES)
    if across_warps:
        step_in *= height                             # input_mult[BLOCK_Y]
    else:
        step_out *= height
    grid = _div_up(outputs // vec_out, step_out)
    values = _div_up(per_output, step_in)
    target = sms * (threads_per_sm // (width * height))
    if not (across_warps and values >= MAX_VALUES and grid <= target):
        return ()
    ctas = max(min(_div_up(target, grid), _div_up(values, MIN_VALUES)),
               _div_up(values, MAX_VALUES))
    if ctas <= 1:
        return ()
    buffer = acc_bytes * outputs * ctas * (1 if on_fastest else width * vec_out)
    return buffer, 4 * grid


def _block(dim0: int, dim1: int, max_threads: int) -> tuple[int, int]:
    """ReduceConfig::set_block_dimension: (block width, block height)."""
    pow0 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    pow1 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    width = min(pow0, WARP)
    height = min(pow1, max_threads // width)
    return min(pow0, max_threads // height), height
