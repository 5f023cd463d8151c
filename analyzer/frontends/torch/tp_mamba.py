"""A Mamba 2 mixer (Bamba's, Granite 4.0-H's, Nemotron-H's, Falcon-H1's) as a serving engine's
tensor-parallel rank holds it: vLLM's ``MambaMixer2`` (vllm/model_executor/layers/mamba/
mamba_mixer2.py) splits it by heads —

* ``in_proj`` column-parallel, each part split: the gate z and the inputs x (I/T each), the
  groups' B and C (G/T groups each — or, with fewer groups than ranks, one group a rank,
  replicated: vLLM's ``extra_groups_for_head_shards``), dt (H/T heads);
* the convolution over x, B and C split with them, ``A_log``, ``D`` and ``dt_bias`` per head;
* the gated RMS norm over each group: on the rank's groups where they split; over the whole
  intermediate width where one group spans the ranks — each rank's sum of squares all-reduced
  (vLLM's ``Mixer2RMSNormGated``: one all-reduce of a value a token and layer);
* ``out_proj`` row-parallel, its output all-reduced;
* the convolution and SSM states of the rank's channels and heads (the cache, made by the
  model's own code from the rank's tensors).

transformers' plans leave these mixers out (no split): they were refused. Derived from vLLM's
code, not measured (it runs no model on this CPU); checked by hand arithmetic
(tests/test_serving_tp.py). A mixer laid out otherwise is refused by name.
"""
from __future__ import annotations

import torch

from ....passes.errors import GraphcostError, opt
from .tp_collectives import tp_all_reduce
from .tp_heads import divides
from .tp_shards import ColwiseLinear, RowwiseLinear, cut_rows, rank_conv

SIZES = ("intermediate_size", "conv_dim", "num_heads", "n_groups", "ssm_state_size", "head_dim")


def mamba2_mixers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules of ``model`` that are transformers' Mamba 2 mixers (their sizes, input and
    output projections, convolution and per-head parameters as Bamba's)."""
    return [(n, m) for n, m in model.named_modules()
            if all(isinstance(getattr(m, a, None), int) for a in SIZES)
            and isinstance(getattr(m, "in_proj", None), torch.nn.Linear)
            and isinstance(getattr(m, "conv1d", None), torch.nn.Conv1d)
            and isinstance(getattr(m, "out_proj", None), torch.nn.Linear)
            and isinstance(getattr(m, "A_log", None), torch.Tensor)]


def shard_mamba(model: torch.nn.Module, group: int) -> set[str]:
    """``model``'s Mamba 2 and Mamba 1 mixers cut to one of ``group`` ranks' share, in place;
    their names (their sizes told the rank's here: not to be divided again)."""
    found = mamba2_mixers(model)
    for name, mixer in found:
        _shard_mamba2(name, mixer, group)
    older = mamba1_mixers(model)
    for name, mixer in older:
        _shard_mamba1(name, mixer, group)
    return {name for name, _ in found + older}


def _shard_mamba2(name: str, mixer: torch.nn.Module, group: int) -> None:
    """A Mamba 2 mixer as a rank of vLLM's ``MambaMixer2`` holds it (this module's doc)."""
    inner, heads, groups, state = (getattr(mixer, a) for a in (
        "intermediate_size", "num_heads", "n_groups", "ssm_state_size"))
    in_proj: torch.nn.Linear = getattr(mixer, "in_proj")
    if in_proj.out_features != 2 * inner + 2 * groups * state + heads:
        raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: {name}'s in_proj "
                             f"({in_proj.out_features:,} features) is not z, x, B, C and "
                             "dt as vLLM's MambaMixer2 splits them; not modelled")
    divides(f"{name}.num_heads", heads, group)
    if groups % group and group % groups:
        divides(f"{name}.n_groups", groups, group)
    local = max(groups // group, 1)   # (fewer groups than ranks: one a rank, replicated)
    rows = 2 * (inner // group) + 2 * local * state + heads // group
    mixer.in_proj = ColwiseLinear(in_proj, group, rows=rows)
    _scaled(mixer, in_proj.out_features, rows)
    mixer.conv1d = rank_conv(getattr(mixer, "conv1d"), inner // group + 2 * local * state)
    for attr in ("A_log", "D", "dt_bias"):
        cut_rows(mixer, attr, heads // group)
    norm = getattr(mixer, "norm", None)
    if isinstance(getattr(norm, "weight", None), torch.Tensor):   # (none: Falcon-H1's
        assert isinstance(norm, torch.nn.Module)                   # Identity, no norm)
        mixer.norm = SummedVarianceNorm(norm, group, inner) if groups < group else norm
        if groups >= group:
            cut_rows(norm, "weight", inner // group)
    mixer.out_proj = RowwiseLinear(getattr(mixer, "out_proj"), group)
    mixer.intermediate_size, mixer.num_heads, mixer.n_groups = \
        inner // group, heads // group, local
    mixer.conv_dim = inner // group + 2 * local * state


SIZES_1 = ("intermediate_size", "ssm_state_size", "time_step_rank")


def mamba1_mixers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules of ``model`` that are transformers' Mamba 1 mixers (Mamba's, Falcon
    Mamba's, Jamba's): their sizes, input, selective (``x_proj``), time-step (``dt_proj``)
    and output projections, convolution and per-channel ``A_log``."""
    return [(n, m) for n, m in model.named_modules()
            if all(isinstance(getattr(m, a, None), int) for a in SIZES_1)
            and all(isinstance(getattr(m, a, None), torch.nn.Linear)
                    for a in ("in_proj", "x_proj", "dt_proj", "out_proj"))
            and isinstance(getattr(m, "conv1d", None), torch.nn.Conv1d)
            and isinstance(getattr(m, "A_log", None), torch.Tensor)]


def _shard_mamba1(name: str, mixer: torch.nn.Module, group: int) -> None:
    """A Mamba 1 mixer as a rank of vLLM's ``MambaMixer`` (vllm/model_executor/layers/mamba/
    mamba_mixer.py) holds it, split by intermediate channel: ``in_proj`` column-parallel in
    its two parts (x and the gate, I/T rows each), the convolution's channels, ``x_proj``
    row-parallel (each rank's channels' partial sums of dt, B and C all-reduced, so the
    time-step, B and C norms — Jamba's — run whole on every rank), ``dt_proj``
    column-parallel (its bias too), ``A_log`` and ``D`` per channel, ``out_proj``
    row-parallel; the states of the rank's channels."""
    inner = getattr(mixer, "intermediate_size")
    in_proj: torch.nn.Linear = getattr(mixer, "in_proj")
    if in_proj.out_features != 2 * inner:
        raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: {name}'s in_proj "
                             f"({in_proj.out_features:,} features) is not x and the gate as "
                             "vLLM's MambaMixer splits them; not modelled")
    divides(f"{name}.intermediate_size", inner, group)
    mixer.in_proj = ColwiseLinear(in_proj, group, rows=2 * inner // group)
    mixer.conv1d = rank_conv(getattr(mixer, "conv1d"), inner // group)
    mixer.x_proj = RowwiseLinear(getattr(mixer, "x_proj"), group)
    mixer.dt_proj = ColwiseLinear(getattr(mixer, "dt_proj"), group)
    for attr in ("A_log", "D"):
        cut_rows(mixer, attr, inner // group)
    mixer.out_proj = RowwiseLinear(getattr(mixer, "out_proj"), group)
    mixer.intermediate_size = inner // group
    setattr(mixer, "tp_sharded", True)   # (its A_log, a matrix, is the rank's rows)


class SummedVarianceNorm(torch.nn.Module):
    """A gated RMS norm over the whole intermediate width (one group) on a rank's slice of it:
    the gate applied, each token's sum of squares all-reduced over the ranks, then normalized
    — vLLM's ``Mixer2RMSNormGated`` with one group over several ranks."""

    def __init__(self, norm: torch.nn.Module, group: int, width: int) -> None:
        super().__init__()
        self.weight: torch.nn.Parameter = getattr(norm, "weight")
        cut_rows(self, "weight", width // group)
        self.eps: float = getattr(norm, "variance_epsilon", 1e-6)
        self.group, self.width = group, width

    def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor | None = None):
        dtype = hidden_states.dtype
        h = hidden_states.float()
        if gate is not None:
            h = h * torch.nn.functional.silu(gate.float())
        squares = tp_all_reduce(h.pow(2).sum(-1, keepdim=True), self.group)
        h = h * torch.rsqrt(squares / self.width + self.eps)
        return self.weight * h.to(dtype)


def _scaled(mixer: torch.nn.Module, full: int, rows: int) -> None:
    """A per-feature scale of the projection (Falcon-H1's ``mup_vector``) cut to its rows."""
    scale = getattr(mixer, "mup_vector", None)
    if isinstance(scale, torch.Tensor) and scale.shape[-1] == full:
        mixer.register_buffer("mup_vector", scale[..., :rows].clone(), persistent=False)
