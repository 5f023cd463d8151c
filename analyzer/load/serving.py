"""``--serve`` / ``analyze(..., serve={...})``: the model resolved, its prefill and one decode
step traced with the KV cache as graph inputs and outputs, the serving pass's input built.

A torch model (a transformers causal LM, the zoo's decoders, a module with the same cache
protocol) is traced by analyzer/frontends/torch/serve.py; an ONNX decoder exported with its
cache (``past_key_values.*`` inputs, ``present.*`` outputs) is bound twice by
analyzer/frontends/onnx/serve.py. The report is the prefill graph's; the pass
(passes/serving/analysis.py) adds the decode step and the serving figures.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Mapping

from ...passes.errors import GraphcostError, opt
from ...passes.serving.analysis import ServingTrace
from ...passes.serving.dtypes import KV_DTYPES, WEIGHT_DTYPES, check_dtype, deployed
from ..frontends.binding import check_size
from .rank_program import in_routed_experts, in_tensor_parallel
from .recipes import in_dtype
from .resolve import Bindings, Resolved, batch_of, is_torch, resolve

KEYS = ("prompt", "generate", "kv_dtype", "weight_dtype", "engine", "logits")
ENGINES = ("eager", "vllm")   # how the steps' time is priced (passes/serving/analysis.py)
# the prefill's logits: each sequence's last position (what a generation loop samples from:
# transformers' generate passes logits_to_keep=1, vLLM's LogitsProcessor takes the last hidden
# state) or every prompt position (a plain forward: prompt log-probabilities)
LOGITS = ("last", "all")


@dataclass(frozen=True)
class ServeSpec:
    """The serving review asked: ``prompt`` tokens prefilled, one decode step over the cache
    of prompt + generate − 1 tokens, at these dtypes, their time priced as ``engine`` runs
    them. Checked when built."""
    prompt: int
    generate: int
    kv_dtype: str | None = None
    weight_dtype: str | None = None
    engine: str = "eager"
    logits: str | None = None   # LOGITS; None: "last" (an ONNX export's: its graph's)

    def __post_init__(self):
        for key in ("prompt", "generate"):
            check_size(getattr(self, key), opt("serve." + key))
        check_dtype(self.kv_dtype, KV_DTYPES, opt("serve.kv_dtype"))
        check_dtype(self.weight_dtype, WEIGHT_DTYPES, opt("serve.weight_dtype"))
        if self.engine not in ENGINES:
            raise GraphcostError(f"{opt('serve.engine', value=self.engine)}: one of "
                                 + ", ".join(ENGINES))
        if self.logits is not None and self.logits not in LOGITS:
            raise GraphcostError(f"{opt('serve.logits', value=self.logits)}: one of "
                                 + ", ".join(LOGITS))


def check_serve(serve: Any) -> ServeSpec:
    """The ``serve`` mapping, checked as the CLI checks --prompt, --generate and the dtypes."""
    if not isinstance(serve, Mapping):
        raise GraphcostError(f"serve must be a mapping such as {{'prompt': 512, 'generate': "
                             f"128}}, got {type(serve).__name__}")
    unknown = [k for k in serve if k not in KEYS]
    if unknown:
        raise GraphcostError(f"serve: unknown key(s) {', '.join(map(repr, unknown))}; known: "
                             + ", ".join(KEYS))
    for key in ("prompt", "generate"):
        if key not in serve:
            raise GraphcostError(f"{opt('serve')} needs {opt('serve.' + key)} N")
    return ServeSpec(serve["prompt"], serve["generate"], serve.get("kv_dtype"),
                     serve.get("weight_dtype"), serve.get("engine", "eager"),
                     serve.get("logits"))


def _text_alone(r) -> tuple[str, ...]:
    """The served steps' note for a vision-language model: its prompt is text (no image's
    prefill is modelled), its tower's weights held."""
    config = getattr(r.module, "config", None) if r.kind == "torch" else None
    if getattr(config, "vision_config", None) is None:
        return ()
    return ("text alone: no image in the prompt; the vision tower held, not run",)


def load_serving(model, example_inputs, *, batch: int | None, serve: ServeSpec,
                 progress=None, all_layers: bool = False, dtype: str | None = None,
                 tensor_parallel: int = 1):
    """(the prefill graph at the dtypes asked: the report's, ServingTrace) for ``model`` at
    ``batch`` sequences; ``all_layers``: trace every block of a repeated stack;
    ``tensor_parallel``: one of that many ranks, under a serving engine's plan."""
    note = progress or (lambda _m: None)
    prompt, generate = serve.prompt, serve.generate
    if example_inputs is None and is_torch(model) and hasattr(model, "forward"):
        r = Resolved("torch", type(model).__name__, module=model)  # --serve makes the inputs
    else:
        r = resolve(model, example_inputs, Bindings(batch), fx=True, note=note)
    # (the steps below make their own token ids: the inputs resolve made, and their notes —
    # a vision-language model's image and its tokens —, are not the served steps')
    r = replace(r, notes=_text_alone(r))
    r = in_dtype(r, dtype, train=False)
    if serve.engine == "vllm" or tensor_parallel > 1:   # (vLLM's layout: routed experts)
        r = in_routed_experts(r)
    r = in_tensor_parallel(r, tensor_parallel, serving=True)
    b = batch or batch_of((*r.inputs, *r.kwargs.values()))
    if r.kind == "torch":
        from ..frontends.torch.layer_stack import REPEAT_AT
        from ..frontends.torch.serve import capture
        steps = capture(r.module, batch=b, prompt=prompt, generate=generate, name=r.name,
                        note=note, repeat_at=0 if all_layers else REPEAT_AT,
                        last_logits=serve.logits != "all")
    elif r.kind == "onnx":
        if serve.logits is not None:
            raise GraphcostError(f"{opt('serve.logits', value=serve.logits)}: {r.name} computes "
                                 "the logits its export computes")
        from ..frontends.onnx.serve import capture_onnx
        steps = capture_onnx(r.onnx, batch=b, prompt=prompt, generate=generate, name=r.name,
                             note=note)
    else:
        raise GraphcostError(f"{opt('serve')}: {r.name} is an exported program of fixed shapes; "
                             f"{opt('serve')} traces the prefill and a decode step itself: pass the "
                             "module (or its ONNX export with past_key_values inputs)")
    if len(steps.decode_past) != len(steps.decode_cache) or not steps.decode_past:
        raise GraphcostError(f"{opt('serve')}: {r.name}'s decode step takes {len(steps.decode_past)} "
                             f"cache tensors and returns {len(steps.decode_cache)}: not a KV "
                             "cache graphcost can follow")
    dims = MappingProxyType({"prompt": prompt, "generate": generate})
    # (the rank program's notes — replicated key/value heads — are the report's warnings)
    prefill = replace(steps.prefill, name=r.name, dims=dims,
                      warnings=steps.prefill.warnings + tuple(r.notes))
    decode = replace(steps.decode, name=f"{r.name} decode", dims=dims)
    shown = deployed(prefill, steps.prefill_cache, serve.weight_dtype,
                     serve.kv_dtype)
    return shown, ServingTrace(
        prefill=prefill, decode=decode, prompt=prompt, generate=generate,
        prefill_cache=steps.prefill_cache, decode_past=steps.decode_past,
        decode_cache=steps.decode_cache, appends=steps.appends,
        weight_dtype=serve.weight_dtype, kv_dtype=serve.kv_dtype,
        traced_layers=steps.traced_layers, positions=steps.positions,
        tensor_parallel=tensor_parallel, engine=serve.engine)

