"""transformers' own serving steps on this CPU: what the serving review (passes/serving/analysis.py) is
checked against (tests/test_serving.py, benchmarks/accuracy_serving.py). Nothing is predicted
here: the cache bytes are the tensors transformers returns, the FLOPs FlopCounterMode's."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RealSteps:
    prefill_cache_bytes: int     # past_key_values after the prompt
    prefill_flops: int           # FlopCounterMode over the prefill
    before_bytes: int            # the cache after P + G − 1 tokens
    after_bytes: int             # ... and after the last decode step (P + G)
    decode_flops: int            # FlopCounterMode over that decode step


def cache_bytes(past) -> int:
    """Bytes of every tensor a transformers Cache's layers hold: keys and values, a linear-
    attention layer's convolution and recurrent states (kept in dicts by state index), none
    for a layer that keeps nothing; their scalar counters aside."""
    import torch

    def held(layer):
        for v in vars(layer).values():
            for t in (v.values() if isinstance(v, dict) else (v,)):
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    yield t
    return sum(t.numel() * t.element_size() for layer in past.layers for t in held(layer))


def measure_steps(model, ids, prompt: int, keep: bool = True, flops: bool = True) -> RealSteps:
    """The prefill of ``ids[:, :prompt]`` and the last decode step of ``ids`` (its cache built
    from every token but the last), under no_grad; with ``keep`` the prefill's logits those of
    the last position where the model takes ``logits_to_keep``, as ``generate`` asks; without
    ``flops`` not counted (0: FlopCounterMode's module hooks fail inside a `kernels` hub
    layer, as Qwen3.5's convolution runs on CPU)."""
    import inspect
    from contextlib import nullcontext

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    def counted():
        return FlopCounterMode(display=False) if flops else nullcontext()

    from ..frontends.torch.serve import hf_cache_kwarg, hf_cache_out

    batch, total = ids.shape
    last = {"logits_to_keep": 1} if keep and "logits_to_keep" in \
        inspect.signature(model.forward).parameters else {}
    with torch.no_grad():
        with counted() as counter:
            pre = hf_cache_out(model(input_ids=ids[:, :prompt], use_cache=True, **last))
        prefill_flops = counter.get_total_flops() if counter else 0
        past = hf_cache_out(model(input_ids=ids[:, :-1], use_cache=True))
        before = cache_bytes(past)
        with counted() as counter:
            model(input_ids=ids[:, -1:], use_cache=True, **{hf_cache_kwarg(model): past},
                  attention_mask=torch.ones(batch, total, dtype=torch.long))
    return RealSteps(cache_bytes(pre), prefill_flops, before, cache_bytes(past),
                     counter.get_total_flops() if counter else 0)
