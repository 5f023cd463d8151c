"""A Llama-style decoder: RMSNorm, rotary position embeddings, grouped-query causal SDPA
attention, SwiGLU MLP, no biases, untied lm_head. An optional KV cache (models_zoo/kv_cache.py):
``forward(input_ids, past_key_values, use_cache=True)`` returns the logits and each layer's
(keys, values) of the new tokens, rotated, before any head repetition.

``llama7b`` is the Llama-2-7B shape (vocab 32,000, d 4,096, 32 layers, 32 heads, MLP 11,008:
6,738,415,616 parameters). Build it under ``torch.device("meta")``: its fp32 weights would take
27 GB. ``llama_tiny`` is the same code at a size that runs and exports in a test.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kv_cache import attend_past, past_length


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 32000
    d_model: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int = 32
    ffn: int = 11008
    max_seq: int = 4096
    eps: float = 1e-5
    rope_base: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv = cfg.n_head, cfg.n_kv_head
        self.head_dim = cfg.d_model // cfg.n_head
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_head * self.head_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, past=None,
                use_cache: bool = False):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if past is not None:
            y = attend_past(q, k, v, *past)
            return self.o_proj(y.transpose(1, 2).reshape(b, s, -1)), (k, v)
        present = (k, v) if use_cache else None  # (no reference kept otherwise: eager liveness)
        if self.n_kv != self.n_head:
            rep = self.n_head // self.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = self.o_proj(y.transpose(1, 2).reshape(b, s, -1))
        return (out, present) if use_cache else out


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn, bias=False)
        self.down_proj = nn.Linear(cfg.ffn, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, past=None, use_cache: bool = False):
        if not use_cache:
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))
        a, present = self.self_attn(self.input_layernorm(x), cos, sin, past, True)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), present


class Llama(nn.Module):
    inv_freq: torch.Tensor  # a buffer (register_buffer below)

    def __init__(self, cfg: LlamaConfig = LlamaConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm: RMSNorm | None = RMSNorm(cfg.d_model, cfg.eps)
        self.lm_head: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        head_dim = cfg.d_model // cfg.n_head
        inv_freq = 1.0 / (cfg.rope_base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # the positions the rotary embedding covers where the input is not the whole sequence:
        # a later pipeline stage under sequence parallelism receives its sequence shard, and
        # its attention sees the whole (torchtitan slices its rotary table to that length)
        self.positions: int | None = None

    def forward(self, input_ids: torch.Tensor, past_key_values=None, use_cache: bool = False):
        """Logits; with ``use_cache`` (or a cache given), (logits, ((k, v) per layer)) where
        k, v are the new tokens' keys and values, to be appended to ``past_key_values``."""
        s = self.positions or input_ids.shape[1]
        start = past_length(past_key_values)
        pos = torch.arange(start, start + s, device=input_ids.device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.float())  # the angles in fp32 at any dtype
        emb = torch.cat((freqs, freqs), dim=-1)
        # a pipeline stage (torchtitan's split) lacks the parts other stages run: without the
        # embedding its input is the previous stage's hidden states, without the head it
        # returns its own
        x = self.embed_tokens(input_ids) if self.embed_tokens is not None else input_ids
        # in the model's dtype (as transformers' rotary embedding returns them): fp16 weights
        # keep q, k and v fp16
        cos, sin = emb.cos()[None, None].to(x.dtype), emb.sin()[None, None].to(x.dtype)
        if not (use_cache or past_key_values):
            for layer in self.layers:
                x = layer(x, cos, sin)
            x = self.norm(x) if self.norm is not None else x
            return self.lm_head(x) if self.lm_head is not None else x
        assert self.norm is not None and self.lm_head is not None  # (serving: the whole model)
        presents = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, past_key_values[i] if past_key_values else None, True)
            presents.append(kv)
        return self.lm_head(self.norm(x)), tuple(presents)


def llama7b() -> Llama:
    return Llama(LlamaConfig())


TINY = LlamaConfig(vocab_size=1000, d_model=128, n_layer=2, n_head=4, n_kv_head=2, ffn=344,
                   max_seq=256)


def llama_tiny() -> Llama:
    return Llama(TINY)


# Llama 3.1's shapes (meta-llama's config.json: vocab 128,256, GQA with 8 KV heads, rope
# base 500,000) in this torchtitan-style decoder, as torchtitan's llama3 "8B", "70B" and
# "405B" flavors build them: 8,030,261,248, 70,553,706,496 and 405,853,388,800 parameters
LLAMA3 = {
    "8b": LlamaConfig(vocab_size=128256, d_model=4096, n_layer=32, n_head=32, n_kv_head=8,
                      ffn=14336, max_seq=131072, rope_base=500000.0),
    "70b": LlamaConfig(vocab_size=128256, d_model=8192, n_layer=80, n_head=64, n_kv_head=8,
                       ffn=28672, max_seq=131072, rope_base=500000.0),
    "405b": LlamaConfig(vocab_size=128256, d_model=16384, n_layer=126, n_head=128,
                        n_kv_head=8, ffn=53248, max_seq=131072, rope_base=500000.0),
}


def llama3_8b() -> Llama:
    return Llama(LLAMA3["8b"])


def llama3_70b() -> Llama:
    return Llama(LLAMA3["70b"])


def llama3_405b() -> Llama:
    return Llama(LLAMA3["405b"])


def param_count(cfg: LlamaConfig) -> int:
    """Exact parameter count from the config (the arithmetic the tests check against)."""
    hd = cfg.d_model // cfg.n_head
    attn = cfg.d_model * (cfg.n_head * hd) * 2 + cfg.d_model * (cfg.n_kv_head * hd) * 2
    mlp = 3 * cfg.d_model * cfg.ffn
    per_layer = attn + mlp + 2 * cfg.d_model
    return 2 * cfg.vocab_size * cfg.d_model + cfg.n_layer * per_layer + cfg.d_model
