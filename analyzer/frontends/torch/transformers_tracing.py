"""What a transformers model needs to be traced as it runs: no KV cache unless asked
(``call_defaults``), the attention mask eager makes where the export path makes none
(``eager_default_mask``), experts a trace can follow (``traceable_experts``), every layer of a
LayerDrop stack (``every_layer_runs``), and the branches its eager forward takes
(``eager_paths``). Used by capture.py's exports and by the
fake-tensor re-runs (fake_rerun.py); nothing here imports transformers: a model that is not
one passes through untouched."""
from __future__ import annotations

import inspect
import sys
from contextlib import contextmanager, nullcontext
from typing import Any, Mapping

import torch


def call_defaults(model: torch.nn.Module, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for one analyzed forward: a transformers model runs without a KV
    cache (``use_cache=False``) unless the caller passes ``use_cache`` — the cache object it
    would return is no tensor output (some fail the trace: GraniteMoe's). With the cache on,
    transformers' default, a training step keeps more: GPT-2's attention saves the cache's
    concatenated key and value copies for the backward (4 · S · d · 4 B per layer pair at
    fp32), left out here. A head whose forward passes ``**kwargs`` on to its model
    (GraniteMoe's) takes it there, where its config has the cache on: one whose config has it
    off already (a config.json's model: hub.py) is left to it, as a head may pass
    ``use_cache=False`` itself beside ``**kwargs`` (T5Gemma's sequence classifier: "got
    multiple values for keyword argument 'use_cache'")."""
    kwargs = dict(kwargs)
    transformers = sys.modules.get("transformers")
    pretrained = getattr(transformers, "PreTrainedModel", None) if transformers else None
    if pretrained is None or not isinstance(model, pretrained) or "use_cache" in kwargs:
        return kwargs
    params = inspect.signature(model.forward).parameters
    passes_on = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()) \
        and bool(getattr(getattr(model, "config", None), "use_cache", None))
    if "use_cache" in params or passes_on:
        kwargs["use_cache"] = False
    return kwargs


def eager_default_mask(model: torch.nn.Module, args: tuple,
                       kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """``kwargs`` with the all-ones ``attention_mask`` a transformers model's eager forward
    makes when the caller gives none, or None where that does not apply (not a transformers
    model, a mask given, no ``input_ids`` tensor of (batch, sequence)). Under torch.export
    some models make none (SwitchTransformers' and LongT5's stacks:
    ``if attention_mask is None and not is_torchdynamo_compiling()``) and then index it, so
    their export fails where eager runs; with the mask eager makes they trace its way."""
    transformers = sys.modules.get("transformers")
    pretrained = getattr(transformers, "PreTrainedModel", None) if transformers else None
    if pretrained is None or not isinstance(model, pretrained) or "attention_mask" in kwargs:
        return None
    params = list(inspect.signature(model.forward).parameters)
    if "attention_mask" not in params or params.index("attention_mask") < len(args):
        return None
    ids = kwargs.get("input_ids", args[0] if args and params[0] == "input_ids" else None)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    # (eager's default: torch.ones(batch, seq) in the default float dtype)
    return {**kwargs, "attention_mask": torch.ones(tuple(ids.shape), device=ids.device)}


@contextmanager
def traceable_experts(model: torch.nn.Module):
    """A transformers mixture of experts whose experts run the "eager" loop (a Python loop
    over the experts the router hit, tokens picked with ``torch.where``) dispatches by the
    data and cannot be traced. For the trace the model uses transformers' "grouped_mm"
    experts instead — the same arithmetic, every token through k of the n experts — and
    is put back after. Yields the warnings to report (one line, or none)."""
    notes: list[str] = []
    saved = None
    # (transformers' methods: to the checker, nn.Module's __getattr__ gives Tensor | Module)
    if getattr(getattr(model, "config", None), "_experts_implementation", None) == "eager" \
            and getattr(model, "_can_set_experts_implementation", lambda: False)():
        saved = model.get_experts_implementation()  # pyright: ignore[reportCallIssue]
        model.set_experts_implementation("grouped_mm")  # pyright: ignore[reportCallIssue]
        notes.append(f"{type(model).__name__}'s eager experts route tokens by their data (a "
                     "loop over the experts hit), which no trace can follow: costed with "
                     "transformers' grouped_mm experts at the expected load, k of n experts "
                     "per token and k/n of the tokens per expert (ESTIMATE)")
    try:
        yield notes
    finally:
        if saved is not None:
            model.set_experts_implementation(saved)  # pyright: ignore[reportCallIssue]


@contextmanager
def every_layer_runs(model: torch.nn.Module):
    """LayerDrop (M2M-100, NLLB, Seamless, the speech encoders: transformers' ``layerdrop``,
    ``encoder_layerdrop``, ...) skips each layer of a training step when a random draw falls
    under p: a branch on a tensor's value, which no trace can follow. For the trace p is 0,
    every layer runs — the most a step costs — and put back after. Yields the warnings to
    report (one line, or none)."""
    owners = {id(o): o for m in model.modules() for o in (m, getattr(m, "config", None))
              if o is not None}  # the modules and the configs they read p from
    # (a "config" may be any object: Idefics' perceiver holds a dict-less one)
    drops = [(o, name, v) for o in owners.values()
             for name, v in getattr(o, "__dict__", {}).items()
             if name.endswith("layerdrop") and isinstance(v, float) and v > 0]
    notes: list[str] = []
    if drops:
        ps = sorted({v for _, _, v in drops})
        notes.append(f"LayerDrop (p = {', '.join(f'{p:g}' for p in ps)}) skips a layer of a "
                     "training step by a random draw, which no trace can follow: every layer "
                     "traced as run, an upper bound (eager skips each with probability p)")
    for o, name, _ in drops:
        setattr(o, name, 0.0)
    try:
        yield notes
    finally:
        for o, name, v in drops:
            setattr(o, name, v)


@contextmanager
def eager_paths():
    """transformers takes, while traced, the branches its eager forward takes: the attention
    masks (``_eager_masks``), the triangular solves of the chunked gated delta rule
    (``_eager_solves``) and the grouped matmul's kernel (``_eager_grouped_mm``)."""
    with _eager_masks(), _eager_solves(), _eager_grouped_mm():
        yield


@contextmanager
def _patched(modules: list[Any], names: tuple[str, ...], values: tuple[Any, ...]):
    """Each of ``modules`` with its attributes ``names`` set to ``values`` meanwhile."""
    saved = [[getattr(m, n) for n in names] for m in modules]
    for m in modules:
        for n, v in zip(names, values):
            setattr(m, n, v)
    try:
        yield
    finally:
        for m, old in zip(modules, saved):
            for n, f in zip(names, old):
                setattr(m, n, f)


def _eager_masks():
    """transformers builds the attention mask the eager forward builds. Eager, with no
    padding mask and one sequence per row, a decoder's SDPA call gets ``is_causal=True`` and
    no mask (and grouped key/value heads as they are), which lets PyTorch dispatch flash or
    cuDNN. While tracing, transformers cannot read the values that decision needs and
    materializes the mask: under ``torch.export`` always (``_ignore_causal_mask_sdpa``), and
    in a training step whenever position ids might pack several sequences in a row
    (``find_packed_sequence_indices``). graphcost costs the step as it runs on unpadded,
    unpacked batches, so both are answered as eager code answers them there. A padding mask
    given as an input still keeps the mask (its values are unknown while tracing)."""
    masking = sys.modules.get("transformers.masking_utils")
    names = ("is_torchdynamo_exporting", "find_packed_sequence_indices")
    if masking is None or not all(hasattr(masking, n) for n in names):
        return nullcontext()
    return _patched([masking], names, (lambda: False, lambda position_ids: None))


def _eager_grouped_mm():
    """transformers' experts pick PyTorch's grouped matmul or their own fallback op by
    ``_can_use_grouped_mm``, which on CPU with torch <= 2.10 reads the weights' and rows'
    data pointers (the kernel wants 16-byte alignment, which memory-mapped safetensors may
    lack). A traced tensor has no data pointer, so the check would fail the trace (torch 2.8
    to 2.10, weights in bf16). A tensor PyTorch allocates is aligned, so eager passes the
    alignment clause: while traced, that clause's version test answers "not this torch"
    (5.24: it is the only use of "2.10.0" there); the other tests stand."""
    moe = sys.modules.get("transformers.integrations.moe")
    older = getattr(moe, "is_torch_less_or_equal", None)
    if moe is None or older is None:
        return nullcontext()

    def aligned(library_version: str, accept_dev: bool = False) -> bool:
        return library_version != "2.10.0" and older(library_version, accept_dev)
    return _patched([moe], ("is_torch_less_or_equal",), (aligned,))


def _eager_solves():
    """The chunked gated delta rule (Qwen3-Next, Qwen3.5, OLMo-hybrid's linear attention:
    ``torch_chunk_gated_delta_rule``) solves each chunk's unit lower-triangular system with
    ``torch.linalg.solve_triangular`` when it runs eagerly, and under ``torch.export``, for
    export targets without that kernel (ONNX), inverts it by forward substitution instead: a
    Python loop of chunk_size − 1 row updates, a clone each, then two more matmuls: a graph
    PyTorch never runs, four times the eager one (a two-layer Qwen3.5: 1,817 nodes against
    469), whose row copies a training step keeps. torch.export traces the solve itself, so
    the modeling modules defining the rule are told they are not exporting; in them (5.24)
    that flag decides nothing else."""
    modules = [m for name, m in list(sys.modules.items())
               if name.startswith("transformers.models.") and ".modeling_" in name
               and hasattr(m, "torch_chunk_gated_delta_rule")
               and hasattr(m, "is_torchdynamo_exporting")]
    return _patched(modules, ("is_torchdynamo_exporting",), (lambda: False,))
