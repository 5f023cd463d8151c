"""The breadth sweep's reference (sweep_breadth.py): FlopCounterMode's count of one real CPU
forward (or, with ``--train``, the training step's: sweep_training.py) on the kernels it has
formulas for, and the exceptions by which building and running a model says how it ended."""
from __future__ import annotations

import contextlib
from typing import Callable

STAGES = ("config", "build", "inputs", "forward", "step", "graphcost", "compare")


class Skip(Exception):
    pass


class Failed(Exception):
    def __init__(self, stage: str, exc: BaseException):
        super().__init__(stage)
        self.stage, self.exc = stage, exc


def first_line(exc: BaseException) -> str:
    """The exception's type and first line (with the next one where it ends in a colon)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()] or [""]
    first = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]
    return f"{type(exc).__name__}: {first}".strip()


@contextlib.contextmanager
def _batched_experts(model):
    """transformers' MoE experts as batched_mm while FlopCounterMode counts: it has no formula
    for the default grouped_mm and would count the experts' matmuls as 0."""
    try:
        switch = getattr(model, "_can_set_experts_implementation", lambda: False)()
        saved = model.get_experts_implementation() if switch else None
        if switch:
            model.set_experts_implementation("batched_mm")
    except Exception:
        switch = False
    try:
        yield
    finally:
        if switch:
            model.set_experts_implementation(saved)


def reference(model, args: tuple, kwargs: dict, train: bool = False) -> int:
    """FlopCounterMode's total over one forward under no_grad, on the swapped kernels (module
    docstring). Parameters stop requiring grad meanwhile: FlopCounterMode's module tracker
    asserts "Expected gradient function to be set" on a module that returns one as is.
    ``train``: over the training step's forward (train mode) and backward instead."""
    if train:
        from .sweep_training import reference_step
        return reference_step(model, args, kwargs, counted_kernels)
    # (a model with an RNN runs without oneDNN: its fused mkldnn_rnn has no formula either)
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    grad = [p for p in model.parameters() if p.requires_grad]
    from .flop_formulas import solve_triangular_flops

    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten.linalg_solve_triangular: solve_triangular_flops})
    try:
        for p in grad:
            p.requires_grad_(False)
        with counter, torch.no_grad(), counted_kernels(model):
            model(*args, **kwargs)
    finally:
        for p in grad:
            p.requires_grad_(True)
    return int(counter.get_total_flops())


@contextlib.contextmanager
def counted_kernels(model):
    """The kernels FlopCounterMode has formulas for (module docstring): SDPA's math kernel,
    batched_mm experts, an RNN without oneDNN."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rnn = any(isinstance(m, torch.nn.RNNBase) for m in model.modules())
    with sdpa_kernel(SDPBackend.MATH), _batched_experts(model), \
            torch.backends.mkldnn.flags(enabled=not rnn):
        yield


def step_reference(model, args, stage: Callable[[str], None]) -> int:
    """The training step's FLOPs (sweep_training.py); its failure is the step's."""
    stage("step")
    try:
        if isinstance(args, dict):
            return reference(model, (), args, train=True)
        return reference(model, tuple(args), {}, train=True)
    except Exception as exc:
        raise Failed("step", exc) from None
