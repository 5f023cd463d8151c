"""transformers' own serving steps on this CPU: what the serving review (passes/serving/analysis.py) is
checked against (tests/test_serving.py, benchmarks/accuracy_serving.py). Nothing is predicted
here: the cache bytes are the tensors transformers returns, the FLOPs FlopCounterMode's."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass(frozen=True)
class RealSteps:
    prefill_cache_bytes: int     # past_key_values after the prompt
    prefill_flops: int           # FlopCounterMode over the prefill
    before_bytes: int            # the cache after P + G − 1 tokens
    after_bytes: int             # ... and after the last decode step (P + G)
    decode_flops: int            # FlopCounterMode over that decode step
    # the steps' working memory: their live tensors' peak (``LiveBytes``) less the weights and
    # the cache each leaves
    prefill_work: int = 0
    decode_work: int = 0


def cache_bytes(past) -> int:
    """Bytes of every tensor a transformers Cache's layers hold: keys and values, a linear-
    attention layer's convolution and recurrent states (kept in dicts by state index), none
    for a layer that keeps nothing; their scalar counters aside."""
    return sum(t.numel() * t.element_size() for t in _cache_tensors(past))


def _cache_tensors(past) -> list:
    def held(layer):
        for v in vars(layer).values():
            for t in (v.values() if isinstance(v, dict) else (v,)):
                if isinstance(t, torch.Tensor) and t.dim() > 0:
                    yield t
    return [t for layer in past.layers for t in held(layer)]


class LiveBytes(TorchDispatchMode):
    """The bytes of the live tensor storages — ``existing`` tensors' until freed, and each one
    an op makes inside the mode — and their peak: MemTracker's count (torch.distributed.
    _tools.mem_tracker: storages by weak reference), which cannot run under no_grad (its
    module hooks register gradient hooks)."""

    def __init__(self, existing=()):
        super().__init__()
        self.live = self.peak = 0
        self.held: set[int] = set()
        for t in existing:
            self._add(t)
        self.base = self.live   # (the existing tensors' bytes)

    def _add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if key in self.held or size == 0:
            return
        self.held.add(key)
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        if key in self.held:
            self.held.discard(key)
            self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._add(t)
        return out


def measure_steps(model, ids, prompt: int, keep: bool = True, flops: bool = True) -> RealSteps:
    """The prefill of ``ids[:, :prompt]`` and the last decode step of ``ids`` (its cache
    grown as generate grows it, ``generated_cache``), under no_grad; with ``keep`` the
    prefill's logits those of the last position where the model takes ``logits_to_keep``,
    as ``generate`` asks; without ``flops`` not counted (0: FlopCounterMode's module hooks
    fail inside a `kernels` hub layer, as Qwen3.5's convolution runs on CPU)."""
    import inspect
    from contextlib import nullcontext

    from torch.utils.flop_counter import FlopCounterMode

    def counted():
        return FlopCounterMode(display=False) if flops else nullcontext()

    from ..frontends.torch.serve import hf_cache_out

    last = {"logits_to_keep": 1} if keep and "logits_to_keep" in \
        inspect.signature(model.forward).parameters else {}
    # (each step run twice: its FLOPs counted, then its memory alone, neither mode's
    # bookkeeping in the other's figures)
    weights = [*model.parameters(), *model.buffers()]
    with torch.no_grad():
        with counted() as counter:
            model(input_ids=ids[:, :prompt], use_cache=True, **last)
        prefill_flops = counter.get_total_flops() if counter else 0
        with LiveBytes(weights) as pre_live:
            pre = hf_cache_out(model(input_ids=ids[:, :prompt], use_cache=True, **last))
        past = generated_cache(model, ids[:, :-1], prompt)
        kwargs = decode_inputs(model, ids, past)
        with counted() as counter:
            model(**kwargs)
        decode_flops = counter.get_total_flops() if counter else 0
        past = generated_cache(model, ids[:, :-1], prompt)
        before = cache_bytes(past)
        kwargs = decode_inputs(model, ids, past)
        with LiveBytes(weights + _cache_tensors(past)) as live:
            model(**kwargs)
    after, fixed = cache_bytes(past), pre_live.base
    return RealSteps(cache_bytes(pre), prefill_flops, before, after, decode_flops,
                     pre_live.peak - fixed - cache_bytes(pre), live.peak - fixed - after)


def generated_cache(model, ids, prompt: int):
    """The cache ``generate`` holds after ``ids``: the prompt's prefill, then a decode step a
    token (a sliding window's tensors the window's own then, not a view of the prompt's)."""
    from ..frontends.torch.serve import hf_cache_out

    past = hf_cache_out(model(input_ids=ids[:, :prompt], use_cache=True))
    for t in range(prompt + 1, ids.shape[1] + 1):
        model(**decode_inputs(model, ids[:, :t], past))
    return past


def decode_inputs(model, ids, past) -> dict:
    """A decode step's arguments for the last token of ``ids`` as ``generate`` makes them:
    the model's own ``prepare_inputs_for_generation`` (Mamba's drops the attention mask after
    the first step — given, its mixer broadcast the token's states over every position of
    it), the token alone as input."""
    from ..frontends.torch.serve import hf_cache_kwarg

    mask = torch.ones(ids.shape, dtype=torch.long)
    kw = model.prepare_inputs_for_generation(ids, **{hf_cache_kwarg(model): past},
                                             attention_mask=mask, use_cache=True,
                                             is_first_iteration=False)
    return {**kw, "input_ids": ids[:, -1:]}
