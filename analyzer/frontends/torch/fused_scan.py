"""Mamba's scans as a serving engine runs them: fused kernels (mamba-ssm's
``selective_scan_fn`` for Mamba 1, its chunked-scan kernels ``mamba_chunk_scan_combined`` for
Mamba 2 — vLLM's ``MambaMixer`` and ``MambaMixer2`` call their ports, transformers with
mamba-ssm or its hub kernels the originals), not transformers' PyTorch fallbacks.

That fallback (``mamba_selective_scan`` in transformers' Mamba, Falcon Mamba, Jamba and Zamba
modules, where no kernel is installed — as on this CPU) materializes the discretized A and
B·u of every token, channel and state (batch × channels × tokens × states in fp32: 2 GiB a
layer for 16 sequences of 2,048 tokens on a rank of Jamba's 8), then loops over the tokens —
a trace of thousands of nodes a layer, and a prefill's memory the kernel never holds. The
kernel keeps the state in registers and writes the output and the last state alone.

Mamba 2's fallback (``mamba2_chunk_scan``: Bamba, Falcon-H1, Granite 4.0-H, Mamba 2,
Nemotron-H, Zamba 2) is vectorized, but materializes each chunk's position-by-position scores
per head — (batch, chunks, chunk, chunk, heads) in fp32, 2 GiB for 16 × 2,048 tokens on a rank
of Bamba-9B's 2 — where the kernels keep C·Bᵀ per group and the chunks' states.

``fused_scans`` puts ``graphcost::selective_scan`` and ``graphcost::ssd_scan`` in those
functions' places while a serving step is traced: the output in the input's dtype and the
last state (Mamba 1's in the input's dtype, as transformers' cache and vLLM's default cache
dtype keep it; Mamba 2's in fp32, the kernels' final states); the chunked scan also a
workspace standing for the kernels' intermediates, read off mamba-ssm's
``_mamba_chunk_scan_combined_fwd`` (derived from its code, not run here: it needs a GPU).
Their rules (passes/costs/recurrent.py) count the kernels' arithmetic. A transformers release
without those functions keeps its own paths.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch

from ....passes.errors import GraphcostError


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


@torch.library.custom_op("graphcost::ssd_scan", mutates_args=())
def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, chunk_size: int, D: torch.Tensor | None,
             dt_bias: torch.Tensor | None, initial_states: torch.Tensor | None,
             dt_softplus: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, final state, the kernels' workspace) of Mamba 2's scan of ``x`` (batch,
    tokens, heads, head dim) with ``B``, ``C`` (batch, tokens, groups, states), ``A`` (heads):
    token by token, h = exp(δ·A)·h + δ·B ⊗ x, y = C·h + D·x — what the chunked kernels
    compute. The workspace (fp32) stands for their intermediates (``_ssd_workspace``)."""
    b, length, heads, p = x.shape
    rep = heads // B.shape[2]
    step = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    step = torch.nn.functional.softplus(step) if dt_softplus else step
    h = initial_states.float() if initial_states is not None else \
        x.new_zeros((b, heads, p, B.shape[-1]), dtype=torch.float32)
    Bh, Ch = (t.float().repeat_interleave(rep, dim=2) for t in (B, C))
    ys = []
    for t in range(length):
        d = step[:, t, :, None, None]
        h = torch.exp(d * A.float()[:, None, None]) * h + \
            d * x[:, t, :, :, None].float() * Bh[:, t, :, None, :]
        ys.append((h * Ch[:, t, :, None, :]).sum(-1))
    y = torch.stack(ys, 1)
    if D is not None:
        y = y + x.float() * (D.float()[:, None] if D.dim() == 1 else D.float())
    return y.to(x.dtype), h, x.new_zeros(_ssd_workspace(x, B, chunk_size), dtype=torch.float32)


@ssd_scan.register_fake
def _(x, dt, A, B, C, chunk_size, D, dt_bias, initial_states, dt_softplus):
    b, _, heads, p = x.shape
    return (torch.empty_like(x), x.new_empty((b, heads, p, B.shape[-1]), dtype=torch.float32),
            x.new_empty(_ssd_workspace(x, B, chunk_size), dtype=torch.float32))


def _ssd_workspace(x: torch.Tensor, B: torch.Tensor, chunk: int) -> int:
    """fp32 elements of the most of mamba-ssm's chunked-scan intermediates alive at once
    (``_mamba_chunk_scan_combined_fwd``): the cumulative decay and the time steps (batch,
    heads, chunks, chunk) fp32 each, throughout; the chunks' states (batch, chunks, heads,
    head dim, states) in fp32, then passed on in the input's dtype (both during the passing);
    C·Bᵀ per group (batch, chunks, groups, chunk, chunk) fp32 while the output is made."""
    b, length, heads, p = x.shape
    groups, n = B.shape[2], B.shape[3]
    c = -(-length // chunk)
    decay = 2 * b * heads * c * chunk
    states = b * c * heads * p * n
    passed = states * x.element_size() // 4
    return decay + max(states + passed, passed + b * c * groups * chunk * chunk)


def _fused_ssd(hidden_states, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
               initial_states=None, dt_softplus=False, return_final_states=False,
               **_options):
    """transformers' ``mamba2_chunk_scan`` signature, run as the fused kernels (its gate z
    is applied by the caller in the models this serves: z None)."""
    if z is not None:
        raise GraphcostError("a Mamba 2 scan gated inside the kernel (z): not modelled")
    out, state, _ = ssd_scan(hidden_states, dt, A, B, C, chunk_size, D, dt_bias,
                             initial_states, dt_softplus)
    return (out, state) if return_final_states else out


# each fallback by its name in transformers' modules, its replacement and the models whose
# modules define it: Mamba 1's selective scan, Mamba 2's chunked scan (the SSD)
FALLBACKS = {
    "mamba_selective_scan": (_fused, ("mamba", "falcon_mamba", "jamba", "zamba")),
    "mamba2_chunk_scan": (_fused_ssd, ("bamba", "falcon_h1", "granitemoehybrid", "mamba2",
                                       "nemotron_h", "zamba2"))}


@contextlib.contextmanager
def fused_scans() -> Iterator[None]:
    """While in it, transformers' Mamba 1 and Mamba 2 scans are the fused kernels' (this
    module's doc). Only modules already imported are touched: a model built from one has
    imported it, and no other model's module is loaded for nothing."""
    swapped = []
    for fallback, (replacement, names) in FALLBACKS.items():
        for name in names:
            module = sys.modules.get(f"transformers.models.{name}.modeling_{name}")
            if callable(getattr(module, fallback, None)):
                swapped.append((module, fallback, getattr(module, fallback)))
                setattr(module, fallback, replacement)
    try:
        yield
    finally:
        for module, fallback, original in swapped:
            setattr(module, fallback, original)
