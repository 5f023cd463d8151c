"""The zoo decoders' optional KV cache: attention of new tokens over cached keys and values.

A serving engine appends each token's keys and values to its cache in place (vLLM's paged
blocks, TensorRT-LLM's KV pool) and its attention kernel reads the cache once. The zoo's own
GPT-2 and Llama do the same when given ``past_key_values``: a decode step returns only the
keys and values it computed (``present``: what the step appends) and attends over the cached
tokens and its own without concatenating them, so the step reads every cached byte once and
copies none (transformers' ``DynamicCache`` concatenates instead: it copies the whole cache at
every step). Grouped-query heads read their shared KV head directly (no ``repeat_interleave``
copy of the cache).
"""
from __future__ import annotations

import torch


def attend_past(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor,
                past_v: torch.Tensor) -> torch.Tensor:
    """Causal attention of ``q`` (b, heads, s, d) over ``past_k``/``past_v`` (b, kv_heads,
    T, d), the cached tokens before it, and ``k``/``v`` (b, kv_heads, s, d), its own tokens.
    Heads are grouped as ``repeat_interleave`` groups them (query head j reads KV head
    j // (heads / kv_heads)). Returns (b, heads, s, d)."""
    b, h, s, d = q.shape
    kvh = k.shape[1]
    past = past_k.shape[-2]
    qg = q.reshape(b, kvh, (h // kvh) * s, d)  # each KV head's query rows, no cache copy
    scale = d ** -0.5
    scores_past = torch.matmul(qg, past_k.transpose(-1, -2)) * scale
    scores_new = torch.matmul(qg, k.transpose(-1, -2)) * scale
    if s > 1:  # new tokens see the cache and the new tokens up to themselves
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores_new = scores_new.masked_fill(mask.repeat(h // kvh, 1), float("-inf"))
    weights = torch.softmax(torch.cat((scores_past, scores_new), dim=-1), dim=-1)
    y = torch.matmul(weights[..., :past], past_v) + torch.matmul(weights[..., past:], v)
    return y.reshape(b, h, s, d)


def past_length(past_key_values) -> int:
    """Tokens already cached (0 without a cache)."""
    return int(past_key_values[0][0].shape[-2]) if past_key_values else 0
