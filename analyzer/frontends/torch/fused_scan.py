"""A Mamba 1 selective scan as a serving engine runs it: one fused kernel (mamba-ssm's
``selective_scan_fn``, which vLLM's ``MambaMixer`` and transformers with mamba-ssm or its hub
kernel call), not transformers' PyTorch fallback.

That fallback (``mamba_selective_scan`` in transformers' Mamba, Falcon Mamba, Jamba and Zamba
modules, where no kernel is installed — as on this CPU) materializes the discretized A and
B·u of every token, channel and state (batch × channels × tokens × states in fp32: 2 GiB a
layer for 16 sequences of 2,048 tokens on a rank of Jamba's 8), then loops over the tokens —
a trace of thousands of nodes a layer, and a prefill's memory the kernel never holds. The
kernel keeps the state in registers and writes the output and the last state alone.

``fused_scans`` puts ``graphcost::selective_scan`` in that function's place while a serving
step is traced: its output (batch, channels, tokens) and last state (batch, channels,
states), both in the input's dtype (the kernel's output; the state as transformers' cache and
vLLM's default cache dtype keep it). Its rule (passes/costs/recurrent.py) counts the kernel's
arithmetic. A transformers release without that function keeps its own path.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Iterator

import torch

# transformers' modules that define the fallback, by its name there
MODULES = ("mamba", "falcon_mamba", "jamba", "zamba")
FALLBACK = "mamba_selective_scan"


@torch.library.custom_op("graphcost::selective_scan", mutates_args=())
def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
                   delta_bias: torch.Tensor | None,
                   delta_softplus: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, last state) of the selective scan of ``u`` (batch, channels, tokens) with
    ``B``, ``C`` (batch, states, tokens), ``A`` (channels, states): token by token,
    h = exp(δ·A)·h + δ·B·u, y = C·h (+ D·u, × silu(z))."""
    dt = delta.float() + (delta_bias.float()[:, None] if delta_bias is not None else 0.0)
    dt = torch.nn.functional.softplus(dt) if delta_softplus else dt
    h = u.new_zeros((u.shape[0], u.shape[1], A.shape[-1]), dtype=torch.float32)
    ys = []
    for t in range(u.shape[-1]):
        step = dt[..., t, None]
        h = torch.exp(step * A.float()) * h + step * B[:, None, :, t].float() * \
            u[..., t, None].float()
        ys.append((h * C[:, None, :, t].float()).sum(-1))
    y = torch.stack(ys, -1)
    y = y + u.float() * D.float()[:, None] if D is not None else y
    y = y * torch.nn.functional.silu(z.float()) if z is not None else y
    return y.to(u.dtype), h.to(u.dtype)


@selective_scan.register_fake
def _(u, delta, A, B, C, D, z, delta_bias, delta_softplus):
    return torch.empty_like(u), u.new_empty((u.shape[0], u.shape[1], A.shape[-1]))


def _fused(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
           return_last_state=False, **_options):
    """transformers' ``mamba_selective_scan`` signature, run as the fused kernel."""
    out, state = selective_scan(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus)
    return (out, state) if return_last_state else out


@contextlib.contextmanager
def fused_scans() -> Iterator[None]:
    """While in it, transformers' Mamba 1 scans are the fused kernel's (this module's doc)."""
    swapped = []
    for name in MODULES:
        try:
            module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            continue
        if callable(getattr(module, FALLBACK, None)):
            swapped.append((module, getattr(module, FALLBACK)))
            setattr(module, FALLBACK, _fused)
    try:
        yield
    finally:
        for module, original in swapped:
            setattr(module, FALLBACK, original)
