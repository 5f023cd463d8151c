"""The optimizer's share of a training step: its state per parameter, the temporaries of its
update, and which parameters it steps (the memory model is in passes/training/memory.py's
docstring).
"""
from __future__ import annotations

from ..choices import Optimizer, OptimizerImpl
from ..ir import Graph, ValueKind

# state tensors per parameter (momentum: one buffer; Adam's family: exp_avg and exp_avg_sq)
ADAPTIVE = tuple(o for o in Optimizer if o.adaptive)
STATE_MULTIPLIER: dict[str, int] = {Optimizer.NONE: 0, Optimizer.SGD: 0, Optimizer.MOMENTUM: 1,
                    Optimizer.ADAM: 2, Optimizer.ADAMW: 2}


def step_temporaries(sizes: list[int], optimizer: str, impl: str = "forloop") -> int:
    """Bytes the optimizer step allocates beyond its state, for parameters of ``sizes`` bytes
    in the order the optimizer visits them (see the module docstring)."""
    if optimizer not in ADAPTIVE or not sizes:
        return 0
    if impl == OptimizerImpl.FOREACH:
        return sum(sizes)
    return max(prev + 2 * cur for prev, cur in zip([0, *sizes], sizes))


def state_tensors(sizes: list[int], optimizer: str) -> list[int]:
    """The optimizer's state for parameters of ``sizes`` bytes (as it steps them), one tensor
    each: STATE_MULTIPLIER per parameter, plus Adam's 4-byte ``step`` counter per parameter."""
    return [b for b in sizes for _ in range(STATE_MULTIPLIER[optimizer])] + \
        ([4] * len(sizes) if optimizer in ADAPTIVE else [])


def optimizer_tensors(params, optimizer: str, master_weights: bool
                      ) -> tuple[list[int], list[int]]:
    """The bytes the optimizer steps per parameter (fp32 with a master copy, else the
    parameter's own), and its state (``state_tensors``)."""
    sizes = [4 * (v.spec.numel or 0) if master_weights else v.spec.nbytes or 0 for v in params]
    return sizes, state_tensors(sizes, optimizer)


def trainable_params(graph: Graph) -> list[str]:
    """The parameters that get a gradient, in the graph's (``named_parameters()``) order. A
    graph made without the gradient map (hand-built) treats every parameter as trainable."""
    params = [v.name for v in graph.values.values() if v.kind == ValueKind.PARAM]
    if graph.grads or len(graph.outputs) <= 1:
        return [p for p in params if p in graph.grads]
    return params
