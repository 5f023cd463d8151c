"""What a tensor-parallel rank's attention holds of its heads (tensor_parallel.py rewrites
the module, then this): the head counts its attributes and its config say, divided by the
ranks; a per-head parameter cut to the rank's heads; key/value projections of fewer heads
than ranks, replicated as vLLM replicates them; and multi-head latent attention's rope key,
whose gradient transformers' plan all-reduces."""
from __future__ import annotations

import copy
from typing import Collection

import torch

from ....passes.errors import GraphcostError, opt
from .tp_collectives import tp_copy
from .tp_shards import ColwiseLinear, cut_rows
from .transformers_tp_plan import planned_style

HEAD_COUNTS = ("n_head", "n_kv", "n_heads", "n_kv_heads", "num_heads", "num_key_value_heads")


def local_head_counts(model: torch.nn.Module, group: int,
                      whole: Collection[str] = ()) -> None:
    """Attention modules that say their head counts (``n_head``, ``num_key_value_heads``, …)
    told the rank's share, as torchtitan once did (``attn.n_heads //= tp``): their q/k/v
    views then shape the local heads; but those ``whole`` names (their q/k/v outputs
    gathered: every rank runs every head)."""
    for name, child in model.named_modules():
        if name in whole:
            continue
        for attr in HEAD_COUNTS:
            count = getattr(child, attr, None)
            if isinstance(count, int) and not isinstance(count, bool) and count > 1:
                divides(f"{name}.{attr}", count, group)
                setattr(child, attr, count // group)


def local_head_parameters(parents: list, group: int) -> None:
    """An attention module's parameter of one value per query head (gpt-oss's ``sinks``) cut
    to the rank's heads, as vLLM holds it: the heads its sharded ``q_proj`` computes."""
    for parent in parents:
        q, head_dim = getattr(parent, "q_proj", None), getattr(parent, "head_dim", None)
        if not isinstance(q, ColwiseLinear) or not isinstance(head_dim, int) or q.gather_out:
            continue
        heads = q.full_out // head_dim
        for name, p in list(parent.named_parameters(recurse=False)):
            if p.dim() == 1 and p.numel() == heads:
                cut_rows(parent, name, heads // group)


def divides(what: str, size: int, group: int) -> None:
    if size % group:
        raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: {what} ({size:,}) does "
                             f"not divide into {group} ranks")


def local_configs(parents: list, group: int) -> None:
    """An attention module whose fused ``qkv_proj`` is sharded, and which splits its output by
    its config's head counts (Phi-3's ``query_pos``), given a config of its own that says the
    rank's heads: the rank's rows of the projection are its query heads', then its key and
    value heads' (vLLM's ``QKVParallelLinear``)."""
    for parent in parents:
        qkv, config = getattr(parent, "qkv_proj", None), getattr(parent, "config", None)
        if not isinstance(qkv, ColwiseLinear) or qkv.gather_out or config is None:
            continue
        local = copy.copy(config)
        for attr in ("num_attention_heads", "num_key_value_heads"):
            count = getattr(config, attr, None)
            if not isinstance(count, int):
                continue
            if attr == "num_key_value_heads" and count < group and group % count == 0:
                setattr(local, attr, 1)   # (replicated: _fused_kv_rows)
                continue
            divides(f"{attr} of {type(config).__name__}", count, group)
            setattr(local, attr, count // group)
        parent.config = local


def mla_rope_reduced(model: torch.nn.Module, group: int) -> None:
    """transformers' ``"mla_kv_a_proj"`` style (``MlaKvAProjParallel``): the latent key/value
    projection whole on every rank, its output's rope key — which reaches the attention
    without passing a column-wise linear — through an identity whose backward all-reduces
    its gradient (the latent part's is reduced by kv_b_proj's input), then concatenated back
    as transformers does."""
    style = planned_style(model)
    for name, module in model.named_modules():
        if style(name) != "mla_kv_a_proj":
            continue
        rope = getattr(model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model,
                       "qk_rope_head_dim", None)   # (the attention's)
        if not isinstance(rope, int):
            continue

        def hook(_m, _args, out: torch.Tensor, rope: int = rope) -> torch.Tensor:
            latent, key = out.split([out.shape[-1] - rope, rope], dim=-1)
            return torch.cat([latent, tp_copy(key, group)], dim=-1)
        module.register_forward_hook(hook)


def kv_rows(attention: torch.nn.Module, path: str, linear: torch.nn.Linear, group: int,
             replicate: bool) -> int:
    """The rank's rows of a key or value projection: 0 for an even split of its heads (the
    rows' own check), its heads checked to divide into the ranks (a split inside a head is
    refused) — but, with ``replicate`` (a serving engine's plan), fewer heads than ranks
    where the ranks divide into them (Qwen3-235B's 4 on 8): vLLM's ``QKVParallelLinear``
    gives each rank one head, each head on group / heads ranks, and the attention pairs the
    rank's query heads with it (``num_key_value_groups``): one head's rows."""
    head_dim = getattr(attention, "head_dim", None)
    leaf = path.rsplit(".", 1)[-1]
    if leaf == "qkv_proj" and replicate:
        return _fused_kv_rows(attention, linear, group)
    if leaf not in ("k_proj", "v_proj") or not isinstance(head_dim, int) or \
            linear.out_features % head_dim:
        return 0
    heads = linear.out_features // head_dim
    if heads % group == 0:
        return 0
    if not replicate or group % heads:
        divides(f"{path}'s key/value head count", heads, group)
    query = getattr(attention, "q_proj", None)
    if isinstance(query, torch.nn.Linear):   # (sharded already or not: its whole width)
        full = query.full_out if isinstance(query, ColwiseLinear) else query.out_features
        # (the config's query heads where it says them: Qwen3-Next's q_proj holds a gate
        # beside each head's queries, twice the heads' width)
        queries = getattr(getattr(attention, "config", None), "num_attention_heads", None)
        queries = queries if isinstance(queries, int) else full // head_dim
        _one_head_each(attention, heads, queries // group)
    return head_dim


def _fused_kv_rows(attention: torch.nn.Module, linear: torch.nn.Linear, group: int) -> int:
    """A fused ``qkv_proj`` (Phi-3's) of fewer key/value heads than ranks, where the ranks
    divide into them: the rank's query heads, then one key and one value head
    (``QKVParallelLinear``'s replicas); 0 where its heads split evenly (or do not split at
    all: local_configs refuses that)."""
    config, head_dim = getattr(attention, "config", None), getattr(attention, "head_dim", None)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None)
    if not all(isinstance(n, int) for n in (heads, kv, head_dim)):
        return 0
    assert isinstance(heads, int) and isinstance(kv, int) and isinstance(head_dim, int)
    if kv % group == 0 or group % kv or heads % group or \
            linear.out_features != (heads + 2 * kv) * head_dim:
        return 0
    _one_head_each(attention, kv, heads // group)
    return (heads // group + 2) * head_dim


def _one_head_each(attention: torch.nn.Module, heads: int, queries: int) -> None:
    """The attention told it holds one key/value head (of ``heads``), shared by its
    ``queries`` query heads; its counts not divided again."""
    setattr(attention, "num_key_value_groups", queries)
    for attr in ("n_kv", "n_kv_heads", "num_key_value_heads"):
        if getattr(attention, attr, None) == heads:
            setattr(attention, attr, 1)
