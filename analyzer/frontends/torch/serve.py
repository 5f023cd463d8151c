"""A PyTorch decoder's two serving steps traced with its KV cache as graph inputs and outputs.

* **prefill** — the P prompt tokens with an empty cache; outputs: the logits, then every cache
  tensor the model keeps for the prompt;
* **decode** — one token over the cache the model keeps after P + G − 1 tokens (the last token
  generated attends over P + G tokens); inputs: the token, then those cache tensors.

Two kinds of model have a cache graphcost can trace:

* a ``transformers`` causal LM: the step builds the model's own ``DynamicCache`` *inside* the
  traced function from plain tensors (a cache object passed across the ``torch.export``
  boundary fails to decompose: its pytree unflatten makes new constants), handing each layer
  the given tensors as they are, no copy. A decode step concatenates (``DynamicCache``
  copies the whole cache every step) and returns the whole cache; sliding-window layers keep
  their last W − 1 tokens. What the cache keeps after P + G − 1 tokens is found by running that
  cache's own ``update`` on meta tensors — the layer classes' code, not a formula;
* a module whose ``forward(input_ids, past_key_values=None, use_cache=False)`` returns
  ``(logits, ((k, v) per layer))`` — the zoo's GPT-2 and Llama (models_zoo/kv_cache.py): a
  decode step returns only the token's keys and values (an engine appends them in place) and
  reads the cache once. The cache after P + G − 1 tokens is what the model returns for that
  many tokens, run eagerly on meta (or fake) tensors.

Anything else is refused in one line: no cache, or no causal LM head.
"""
from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any

import torch

from ....passes.errors import GraphcostError, opt
from ....passes.ir import Graph, TensorSpec
from ..serving_steps import Steps
from .hf_cache_slots import Slot, SlotRecord, fill, slots_of, tensor_in
from .layer_stack import REPEAT_AT
from .optional_imports import transformers_model
from .transformers_tracing import traceable_experts


def check_servable(model: torch.nn.Module, name: str) -> str:
    """How the model keeps its cache — "hf" (transformers) or "kv" (past_key_values in,
    the new keys and values out; see the module docstring) — or a one-line GraphcostError."""
    params = inspect.signature(model.forward).parameters
    if transformers_model(model):
        cfg = model.config
        if getattr(cfg, "is_encoder_decoder", False):
            what = "an encoder-decoder" if "decoder_input_ids" in params else \
                "the encoder of an encoder-decoder"   # (WhisperEncoder: no decoder at all)
            raise GraphcostError(f"{opt('serve')}: {name} is {what} "
                                 f"({type(model).__name__}); {opt('serve')} analyzes decoder-only "
                                 "language models (prefill, then decode over a KV cache)")
        # (a transformers method: to the checker, nn.Module's __getattr__ gives Tensor | Module)
        if model.get_output_embeddings() is None or not hf_cache_kwarg(model):  # pyright: ignore[reportCallIssue]
            raise GraphcostError(f"{opt('serve')}: {name} ({type(model).__name__}) has no causal LM "
                                 f"head and no KV cache to decode with; {opt('serve')} analyzes "
                                 "decoder language models (…ForCausalLM)")
        return "hf"
    if "past_key_values" in params and "use_cache" in params:
        return "kv"
    raise GraphcostError(f"{opt('serve')}: {name} ({type(model).__name__}) has no KV cache: its "
                         f"forward takes no past_key_values; {opt('serve')} analyzes decoder language "
                         "models that keep one")


def hf_cache_kwarg(model) -> str:
    """The name a transformers model's forward takes its cache by, "" for none: transformers
    5.24 renamed ``past_key_values`` to ``cache`` (in and out; the old name is deprecated until
    5.40), and both are in use."""
    params = inspect.signature(model.forward).parameters
    return next((k for k in ("cache", "past_key_values") if k in params), "")


def hf_cache_out(out):
    """The cache a transformers model returned, under either name (``hf_cache_kwarg``)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _hf_cache(config, flat, past: int, slots: list[list[Slot]]):
    """The model's own DynamicCache whose layers hold the given tensors themselves in their
    ``slots`` (hf_cache_slots.py; none: an empty cache, a prefill's), after ``past`` tokens
    (a sliding-window layer counts them to size its mask)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    layers: list[Any] = cache.layers  # (duck-typed: attention and linear-attention layers)
    at = 0
    for layer, own in zip(layers, slots):
        fill(layer, own, list(flat[at:at + len(own)]), past)
        at += len(own)
    return cache


class HFStep(torch.nn.Module):
    """(input_ids, attention_mask, *cache) -> (logits, *cache after the step); the prefill's
    run records which tensors each cache layer holds (``slots``), the decode step's reads
    them."""

    def __init__(self, model, unpadded: bool = False):
        super().__init__()
        self.model = model
        # the requests unpadded (the serving review's: one shape): the model gets no mask, as
        # generate's all-ones one ends up — transformers skips it where it can tell (not on
        # traced values), so attention runs causal and grouped-query heads in the kernel
        # (sdpa's enable_gqa) instead of repeat_kv's copies of each layer's keys and values
        self.unpadded = unpadded
        # (an object of its own: torch.export puts a module's containers back after a trace)
        self.record = SlotRecord()
        self.recurrent = _recurrent_count(model)   # (its linear-attention cache layers)

    def _positions(self, input_ids: torch.Tensor, past: int) -> dict:
        """The step's token positions, given as generate gives them, where the cache holds
        recurrent states: the model would read them off its first layer's token counter, a
        value no other layer reads, and its repeated layers could not be grown
        (repeat_layers.py)."""
        if not self.recurrent or \
                "position_ids" not in inspect.signature(self.model.forward).parameters:
            return {}
        return {"position_ids": torch.arange(past, past + input_ids.shape[1],
                                             device=input_ids.device).unsqueeze(0)}

    def forward(self, input_ids, attention_mask, *flat):
        past = attention_mask.shape[1] - input_ids.shape[1]
        # (no prefill recorded: keys and values a layer, a decoder-with-past's export)
        slots = self.record.layers or [[("keys", 0), ("values", 0)]] * (len(flat) // 2)
        cache = _hf_cache(self.model.config, flat, past, slots if flat else [])
        # a decode step of a model with no attention layer (Mamba's) takes no mask: its
        # generate passes none (prepare_inputs_for_generation), and a mask of the context
        # would broadcast each recurrent state's input over every position
        mask = None if self.unpadded or flat and not any(("keys", 0) in own for own in slots) \
            else attention_mask
        out = self.model(input_ids=input_ids, attention_mask=mask, use_cache=True,
                         **{hf_cache_kwarg(self.model): cache}, **self._positions(input_ids, past))
        returned = hf_cache_out(out)
        if returned is None:   # (BERT's LM head unless its config says is_decoder; XLM's)
            raise GraphcostError(
                f"{opt('serve')}: {type(self.model).__name__} returns no cache with "
                "use_cache=True (not a decoder as configured: a BERT-like model needs "
                "is_decoder=True); serve analyzes decoder language models")
        layers = returned.layers
        self.record.layers = slots = [slots_of(layer) for layer in layers]
        self.record.shared = any(isinstance(getattr(layer, "keys", None), torch.Tensor)
                                 and layer.keys is layer.values for layer in layers)
        return (out.logits, *[tensor_in(layer, slot) for layer, own in zip(layers, slots)
                              for slot in own])


def _recurrent_count(model) -> int:
    """How many of the model's cache layers hold recurrent states (hf_cache_slots.py: its
    linear-attention layers)."""
    from transformers import DynamicCache
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # noqa: BLE001 - a config its cache cannot read: the trace says so
        return 0
    return sum(hasattr(layer, "conv_states") for layer in layers)


def _recurrent_note(count: int, prefill: Graph) -> list[str]:
    """The report's line where ``count`` of the model's cache layers hold recurrent states:
    Mamba's scans run as the fused kernels (fused_scan.py), the gated delta nets' prefill as
    transformers' PyTorch code runs it."""
    from ....passes.costs.recurrent import SELECTIVE_SCAN, SSD_SCAN
    if not count:
        return []
    how = "scans as mamba-ssm's fused kernels" if any(
        n.op in (SELECTIVE_SCAN, SSD_SCAN) for n in prefill.nodes) else \
        "prefill as transformers' PyTorch scan, not a fused kernel"
    return [f"{count} recurrent layers: states of a fixed size in the cache; {how}"]


class KVStep(torch.nn.Module):
    """(input_ids, *cache) -> (logits, *the new tokens' keys and values)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, *kv):
        pairs = tuple(zip(kv[0::2], kv[1::2])) or None
        logits, presents = self.model(input_ids, past_key_values=pairs, use_cache=True)
        return (logits, *[t for pair in presents for t in pair])


def _positions(model) -> int | None:
    """Learned positions cap the context (GPT-2's 1,024); rotary ones do not."""
    cfg = getattr(model, "config", None) or getattr(model, "cfg", None)
    return getattr(cfg, "n_positions", None)


def capture(model: torch.nn.Module, *, batch: int, prompt: int, generate: int, name: str,
            note=None, repeat_at: int = REPEAT_AT, last_logits: bool = False) -> Steps:
    """Trace the prefill and one decode step of ``model`` (meta or fake tensors: nothing is
    allocated). A stack of ``repeat_at`` or more identical blocks is traced as three and the
    middle one repeated in the IR (analyzer/frontends/torch/repeat_layers.py): each copy gets its
    own weights, cache tensors and activations, as a full trace would. ``last_logits``: the
    LM head runs on each sequence's last position alone (``LastPosition``), as transformers'
    ``generate`` (``logits_to_keep=1``) and vLLM compute them."""
    from .fused_scan import fused_scans
    from .layer_stack import find_stack, layers_note, truncated
    from .repeat_layers import grow_stack

    note = note or (lambda _m: None)
    kind = check_servable(model, name)
    cap = _positions(model)
    if cap is not None and prompt + generate > cap:
        raise GraphcostError(f"{opt('serve')}: {name} has {cap} learned positions; {opt('serve.prompt')} + "
                             f"{opt('serve.generate')} = {prompt + generate} exceeds them")
    stack = find_stack(model, repeat_at) if repeat_at else None
    step = HFStep(model, unpadded=True) if kind == "hf" else KVStep(model)
    # a mixture of experts in transformers' eager loop is costed as plain analysis costs it
    with truncated(model, stack) if stack else nullcontext(), traceable_experts(model) as notes, \
            last_position(model) if last_logits else nullcontext(), fused_scans():
        prefill, decode = _trace_both(step, model, kind, batch, prompt, generate, name, note)
    notes += _recurrent_note(step.recurrent, prefill) if isinstance(step, HFStep) else []
    if notes:
        prefill = replace(prefill, warnings=prefill.warnings + tuple(notes))
    if stack is not None:
        note(f"repeating the layers traced into {stack.layers}")
        prefill = grow_stack(prefill, f"model.{stack.path}", stack)
        decode = grow_stack(decode, f"model.{stack.path}", stack)
        if prefill is None or decode is None:  # not three identical blocks after all
            return capture(model, batch=batch, prompt=prompt, generate=generate, name=name,
                           note=note, repeat_at=0, last_logits=last_logits)
    fixed = 2 if kind == "hf" else 1  # input_ids (and attention_mask) before the cache
    note_ = None if stack is None else layers_note(stack)
    return Steps(prefill, decode, prefill.outputs[1:], decode.inputs[fixed:],
                 decode.outputs[1:], kind == "kv", note_, cap)


class LastPosition(torch.nn.Module):
    """The LM head on each sequence's last position alone, as a generation loop computes a
    step's logits: for the token it samples (vLLM's ``LogitsProcessor`` over the last hidden
    state of each sequence; transformers' ``generate`` passes ``logits_to_keep=1``, whose
    (batch, 1, hidden) slice eager ``linear`` folds into this same product under no_grad —
    traced, it would be a batched product over the weight expanded per sequence, a copy of
    the head's weight for each: 4.2 GB for Llama 3.2 1B at batch 8), not for every prompt
    position."""

    def __init__(self, head: torch.nn.Module):
        super().__init__()
        self.head = head

    @property
    def weight(self) -> torch.Tensor:   # (Mamba's forward reads its head's dtype off it)
        weight = self.head.weight
        assert isinstance(weight, torch.Tensor)
        return weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # (batch, hidden): one row a sequence, as vLLM gathers them (a (batch, 1, hidden)
        # slice would run as a batched product over the weight expanded per sequence)
        return self.head(hidden[:, -1, :]).unsqueeze(1)


@contextmanager
def last_position(model: torch.nn.Module):
    """``model`` with its LM head (vocab_layers.py finds it) on the last position
    alone, put back as it was afterwards; as it is when it has none."""
    from .vocab_layers import vocab_layers

    head = vocab_layers(model)[1]
    path = next((n for n, m in model.named_modules() if m is head), None)
    if head is None or not path:
        yield
        return
    model.set_submodule(path, LastPosition(head))
    try:
        yield
    finally:
        model.set_submodule(path, head)


def _trace_both(step, model, kind, batch, prompt, generate, name, note):
    from .capture import make_fakes

    def inputs(tokens: int, context: int, cache=()) -> tuple:
        # one call: the fakes of one trace must share one fake mode
        shapes = {"input_ids": (batch, tokens), "attention_mask": (batch, context)}
        dtypes = {"input_ids": torch.int64, "attention_mask": torch.int64}
        if kind != "hf":
            del shapes["attention_mask"]
        for i, (shape, dtype) in enumerate(cache):
            shapes[f"kv{i}"], dtypes[f"kv{i}"] = shape, dtype
        return tuple(make_fakes(model, shapes, dtypes).values())

    note(f"tracing {name}'s prefill of {prompt} tokens")
    prefill = _trace(step, inputs(prompt, prompt), f"{name} prefill", batch)
    if kind == "hf" and step.record.shared:
        raise GraphcostError(f"{opt('serve')}: {name} keeps each layer's keys and values as "
                             "one tensor (shared key-value attention, DeepSeek V4's); its cache "
                             "is not modelled yet")
    context = prompt + generate - 1
    cache = _cache_after(step, model, kind, prefill, batch, context)
    note(f"tracing one decode step over a cache of {context} tokens")
    return prefill, _trace(step, inputs(1, context + 1, cache), f"{name} decode", batch)


def _trace(step, args: tuple, name: str, batch: int) -> Graph:
    from .capture import export_module
    from .frontend import lower_exported

    refs: dict[str, str] = {}  # export and decomposition record no stack traces (their own)
    ep = export_module(step, args, name=name, references=refs)
    return lower_exported(ep, name=name, batch=batch, references=refs)


def _cache_after(step, model, kind: str, prefill: Graph, batch: int, tokens: int):
    """(shape, dtype) of each cache tensor the model keeps after ``tokens`` tokens."""
    if kind == "hf":  # the model's cache classes' own update, on meta tensors
        return _hf_cache_after(step, model, prefill, tokens)
    # the model's own answer for that many tokens, run eagerly without allocating
    with torch.no_grad(), _fake_for(model) as device:
        out = step(torch.zeros((batch, tokens), dtype=torch.int64, device=device))
    return [(tuple(t.shape), t.dtype) for t in out[1:]]


def _hf_cache_after(step, model, prefill: Graph, tokens: int) -> list:
    """(shape, dtype) of each tensor a transformers cache holds after ``tokens`` tokens: an
    attention layer's keys and values as its own ``update`` keeps them (a sliding window its
    last W − 1), a linear-attention layer's states as the prefill left them (their size does
    not change with the context)."""
    from transformers import DynamicCache

    layers: list[Any] = DynamicCache(config=model.config).layers
    specs = iter(prefill.values[n].spec for n in prefill.outputs[1:])
    out = []
    for layer, own in zip(layers, step.record.layers):
        given = [next(specs) for _ in own]
        if ("keys", 0) not in own:
            out += [(_sizes(s), _dtype(s.dtype)) for s in given]
            continue
        states, (k, v) = given[:-2], given[-2:]
        out += [(_sizes(s), _dtype(s.dtype)) for s in states]
        new = [torch.empty((*d[:-2], tokens, d[-1]), dtype=_dtype(s.dtype), device="meta")
               for s in (k, v) for d in [_sizes(s)]]
        layer.update(*new)
        out += [(tuple(layer.keys.shape), layer.keys.dtype),
                (tuple(layer.values.shape), layer.values.dtype)]
    return out


def _sizes(spec: TensorSpec) -> tuple[int, ...]:
    """A bound tensor's sizes (the prefill's cache outputs are all concrete)."""
    assert spec.shape is not None
    return tuple(int(d) for d in spec.shape)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


@contextmanager
def _fake_for(model):
    """Meta models run on meta tensors as they are; real ones under a fake mode. Yields the
    device to make inputs on."""
    device = next(model.parameters()).device
    if device.type == "meta":
        yield device
        return
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield device
