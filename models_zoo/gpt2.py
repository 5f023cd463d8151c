"""A tiny GPT-2-style decoder: pre-LN blocks, causal SDPA attention, tanh-GELU MLP,
learned position embeddings and an lm_head tied to the token embedding. An optional KV cache
(models_zoo/kv_cache.py): ``forward(input_ids, past_key_values, use_cache=True)`` returns the
logits and each layer's (keys, values) of the new tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import attend_past, past_length


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 1000
    n_positions: int = 128
    d_model: int = 128
    n_head: int = 4
    n_layer: int = 2
    mlp_ratio: int = 4
    dropout: float = 0.1
    layer_norm_eps: float = 1e-5


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        assert cfg.d_model % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # fused q, k, v
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, past=None, use_cache: bool = False):  # x: (B, S, D)
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=-1)
        # (B, S, D) -> (B, H, S, head_dim)
        q, k, v = (t.unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2) for t in (q, k, v))
        if past is not None:
            y = attend_past(q, k, v, *past)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        y = y.transpose(1, 2).flatten(2)  # (B, S, D)
        out = self.resid_dropout(self.c_proj(y))
        return (out, (k, v)) if use_cache or past is not None else out


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.act = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, past=None, use_cache: bool = False):
        if not use_cache:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))
        a, present = self.attn(self.ln_1(x), past, True)
        x = x + a
        return x + self.mlp(self.ln_2(x)), present


class GPT2(nn.Module):
    def __init__(self, cfg: GPT2Config = GPT2Config()) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

        self.apply(self._init_weights)
        self.lm_head.weight = self.wte.weight  # weight tying

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, input_ids: torch.Tensor, past_key_values=None, use_cache: bool = False):
        """(B, S) int64 -> (B, S, vocab) logits; with ``use_cache`` (or a cache given),
        (logits, ((k, v) per layer)): the new tokens' keys and values, to be appended."""
        start = past_length(past_key_values)
        pos = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(pos))
        if not (use_cache or past_key_values):
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))
        presents = []
        for i, block in enumerate(self.h):
            x, kv = block(x, past_key_values[i] if past_key_values else None, True)
            presents.append(kv)
        return self.lm_head(self.ln_f(x)), tuple(presents)


def gpt2_tiny() -> GPT2:
    return GPT2(GPT2Config())
