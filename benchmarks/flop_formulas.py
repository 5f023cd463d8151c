"""FLOP formulas the sweeps give FlopCounterMode (its ``custom_mapping``) where it has none
or counts wrong: a triangular solve (none: the gated delta rule's), a grouped convolution's
weight gradient (counted ``groups`` times over). Shapes in, FLOPs out, as FlopCounterMode's
own formulas take them."""
from __future__ import annotations


def solve_triangular_flops(a_shape, b_shape, *args, out_shape=None, unitriangular=False,
                            **kwargs) -> int:
    """FlopCounterMode has no formula for a triangular solve (the gated delta rule's, Qwen3.5's
    linear attention): LAPACK's xTRSM count, n(n − 1)/2 multiplies and as many adds per
    solved column of n, plus n divisions unless the diagonal is unit."""
    import math
    n, solved = a_shape[-1], math.prod(out_shape or b_shape)
    return solved * (n - 1) + (0 if unitriangular else solved)


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation,
                        transposed, _output_padding, groups, output_mask, out_shape=None,
                        **kwargs) -> int:
    """FlopCounterMode's own formula with the weight gradient of a grouped convolution
    divided by its groups: torch's counts every input channel against every output channel
    there (a depthwise 3×3 conv over 8 channels: 8× its 4,608 MACs), where each group's
    weight meets only its own channels, as the forward's count (weights C_in/groups deep)
    has it."""
    from torch.utils.flop_counter import conv_flop_count

    def t(shape):
        return [shape[1], shape[0], *shape[2:]]
    flops = 0
    if output_mask[0]:  # the input's gradient: a transposed conv of grad_out by the weight
        flops += conv_flop_count(list(grad_out_shape), list(w_shape), list(out_shape[0]),
                                 not transposed)
    if output_mask[1]:  # the weight's: input against grad_out, batch and channels swapped
        a, b = (grad_out_shape, x_shape) if transposed else (x_shape, grad_out_shape)
        flops += conv_flop_count(t(a), t(b), t(out_shape[1])) // groups
    return flops
