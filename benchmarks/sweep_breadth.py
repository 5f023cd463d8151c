"""Breadth sweep (issue 24): every transformers model type and every timm architecture family
through graphcost and PyTorch's FlopCounterMode.

    python -m benchmarks.sweep_breadth --transformers [--json OUT]   (from the repository root)
    python -m benchmarks.sweep_breadth --timm [--json OUT]           (an environment with timm)
    python -m benchmarks.sweep_breadth --one hf:llama                (one model, one JSON line)
    python -m benchmarks.sweep_breadth --transformers --train        (the SGD training step:
        forward and backward FLOPs, and the peak against MemTracker's; sweep_training.py)

Options: --limit N (the first N names), --only NAME ... (model types, timm families or timm
model names), --timeout S (per model, default 60), --workers N (default 2), --fresh,
--json OUT (the records), --resume (run only the models missing from OUT).

Models:
  * transformers: every model_type of CONFIG_MAPPING_NAMES with an AutoModelForCausalLM class
    (else AutoModel; a type with neither is skipped). Its default config is shrunk where the
    attribute exists and its default is a larger int: width 64, MLP 128, 4 heads (2 KV
    heads, head_dim 16), 128 positions; 2 layers (per-layer lists and dicts such as
    layer_types cut to the first layer and the last), 4 experts (top 2), vocabulary 256
    (special token ids above 199 moved to 200..255), images 32×32 with 8×8 patches; nested
    configs (text_config, vision_config, ...) likewise, a backbone (out_features set) keeping
    its depth. What fails to configure, build or run is retried: with the first 2 layers,
    then without the width cut, then at the default image size too (the record's profile).
    Eager attention where the model builds with it, use_cache=False where its forward takes
    it, random weights (seed 0), float32; more than 300M parameters (counted on meta) skipped.
    Inputs by the class's main_input_name: input_ids (1, 16) (ids 4..199; plus
    decoder_input_ids for an encoder-decoder; plus pixel_values when the forward refuses ids
    alone and the config has an image size), pixel_values (1, C, H, W) for an image model
    (224×224 when its config has no image_size), input_values for a speech encoder of the
    wav2vec2 family (a config with conv_stride: one second of 16 kHz audio, (1, 16,000)) or a
    spectrogram transformer (a config with max_length and num_mel_bins: (1, max_length,
    num_mel_bins)); any other input (audio codecs, video, time series, ...) is skipped as
    "not a text, image or speech model".
  * timm: one architecture per family, a family being (timm module, the letters the model
    name starts with), test_* models left out; its representative is the smallest-looking
    name (size words such as tiny/small, then the first number, then the default input
    size), created with pretrained=False at its pretrained_cfg input_size, batch 1.

Measured per model: the module's sum(p.numel()) against graphcost's params (exact?), and
FlopCounterMode's total over one real CPU forward under torch.no_grad() against graphcost's
2·MACs (within 1%?), graphcost analyzing the same module with the same inputs. Two kernels
FlopCounterMode has no formula for are swapped for its forward only, as
benchmarks/accuracy_hf.py does for Mixtral: scaled_dot_product_attention runs on its math
kernel (CPU's fused kernel would count 0) and transformers' MoE experts run batched_mm
instead of grouped_mm (likewise), an LSTM/GRU without oneDNN (mkldnn_rnn: likewise); a
triangular solve (the gated delta rule's: Qwen3-Next, Qwen3.5, OLMo-hybrid), for which it has
no formula either, is counted by LAPACK's xTRSM count; no parameter requires grad during it.
Computations whose results no output reads (a recurrent state after the last chunk, a
backbone stage no head uses) run eagerly and are counted on both sides (graphcost keeps them
through the decompositions: docs/accuracy.md). graphcost's figure for an op whose size the
data decides is an upper bound: the records keep its "bounded" ops (coverage.bounded).

Each model runs in a process of its own (forked from a parent that imported torch,
transformers/timm and graphcost once, to spare ~2-4 s of imports per model; --fresh starts a
new interpreter per model instead, `--one KIND:NAME`), killed at the timeout; one thread per
process. Prints one row per model, then the counts (constructed, reference forward ran,
analyzed, params exact, MACs within 1%) and the failures grouped by their message's first 80
characters (digits folded to #). A graphcost failure that is not a one-line GraphcostError
naming the problem (an "internal error", another exception type, a crash) is marked BUG.
With --json the records are written as they come; a run stopped by SIGTERM (an outer
`timeout`) prints what finished, and --resume runs only the models missing from the file.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter, defaultdict
from typing import Any, Callable

warnings.filterwarnings("ignore")

SEQ = 16
ID_LOW, ID_HIGH = 4, 200            # random token ids; special ids are moved to 200..255
VOCAB = 256
MAX_PARAMS = 300_000_000
STAGES = ("config", "build", "inputs", "forward", "step", "graphcost", "compare")
STEP = {"train": False}  # --train: the SGD step (benchmarks/sweep_training.py), not a forward
TRAIN_STEP = dict(train=True, optimizer="sgd", include_inputs=False)  # graphcost's, the same

# Shrunk config attributes (set where the attribute exists and its default is a larger int).
WIDTH = dict(hidden_size=64, d_model=64, n_embd=64, dim=64, embedding_size=64,
             intermediate_size=128, encoder_ffn_dim=128, decoder_ffn_dim=128, d_ff=128,
             ffn_dim=128, hidden_dim=128, n_inner=128, decoder_intermediate_size=128,
             moe_intermediate_size=64, shared_expert_intermediate_size=64, projection_dim=64,
             num_attention_heads=4, encoder_attention_heads=4, decoder_attention_heads=4,
             num_heads=4, n_head=4, n_heads=4, decoder_num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, d_kv=16,
             max_position_embeddings=128, n_positions=128)
DEPTH = dict(num_hidden_layers=2, encoder_layers=2, decoder_layers=2, num_layers=2,
             num_decoder_layers=2, n_layer=2, n_layers=2, decoder_num_hidden_layers=2,
             num_local_experts=4, num_experts=4, n_routed_experts=4, moe_num_experts=4,
             num_experts_per_tok=2, num_experts_per_token=2, moe_k=2, n_group=1, topk_group=1,
             n_shared_experts=1, first_k_dense_replace=1, num_kv_shared_layers=0)
IMAGE = dict(image_size=32, patch_size=8, num_channels=3)   # all attempts but the last
IMAGE_DEFAULT = 224     # an image model's input side when its config has no image_size
SPEECH_SAMPLES = 16_000  # a speech encoder's input: one second at 16 kHz
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


# ---------------------------------------------------------------------------------------------
# transformers


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _per_layer(own: dict, old: int, n: int, mixed: bool) -> dict[str, Any]:
    """The per-layer settings of a stack cut from ``old`` to ``n`` layers: lists of length
    ``old`` (a "layer" name, or any name when old >= 6) and dicts by layer index. ``mixed``:
    its first n-1 layers and its last (a pattern such as 5 sliding + 1 global keeps both
    kinds), else its first n."""
    kw: dict[str, Any] = {}
    keep = list(range(n - 1)) + [old - 1] if mixed else list(range(n))
    for name, value in own.items():
        if isinstance(value, (list, tuple)) and len(value) == old and (old >= 6 or "layer" in name):
            kw[name] = [value[i] for i in keep]
        elif "layer" in name and isinstance(value, dict) and value \
                and all(_is_int(k) or str(k).isdigit() for k in value):
            by_index = {int(k): v for k, v in value.items()}
            kw[name] = {new: by_index[i] for new, i in enumerate(keep) if i in by_index}
    return kw


def _overrides(cfg, width: bool, mixed: bool, image: bool = True) -> dict[str, Any]:
    """The shrunk attributes of ``cfg`` (its own level; nested configs apart). A backbone
    (out_features / out_indices set) keeps its depth: its stages are named by index."""
    own = {**cfg.to_dict(), **vars(cfg)}   # (to_dict: what a property keeps elsewhere too)
    table = {**DEPTH, **(IMAGE if image else {}), **(WIDTH if width else {})}
    if any(own.get(k) for k in ("out_features", "out_indices", "_out_features", "_out_indices")):
        table = {k: v for k, v in table.items() if k not in LAYER_COUNTS and "layers" not in k}
    kw = {k: v for k, v in table.items() if _is_int(own.get(k)) and own[k] > v}
    for key in LAYER_COUNTS:
        if key in kw:
            kw.update(_per_layer(own, own[key], kw[key], mixed))
    if _is_int(own.get("vocab_size")) and own["vocab_size"] > VOCAB:
        kw["vocab_size"] = VOCAB
        spare = iter(range(ID_HIGH, VOCAB))
        moved: dict[int, int] = {}

        def move(t: Any) -> Any:
            if _is_int(t) and t >= ID_HIGH:
                if t not in moved:
                    moved[t] = next(spare, VOCAB - 1)
                return moved[t]
            return t
        for name, value in own.items():
            if name.endswith(("_token_id", "_token_index", "_token_ids")):
                new = [move(t) for t in value] if isinstance(value, list) else move(value)
                if new != value:
                    kw[name] = new
    if "use_cache" in own:
        kw["use_cache"] = False
    return kw


def shrink(cfg, width: bool, mixed: bool = True, image: bool = True, top: bool = True):
    """A config like ``cfg`` (a default one) with the sweep's sizes (``width``: the width too,
    not only depth, experts and vocabulary; ``mixed``: see _per_layer; ``image``: the image
    and patch sizes too); nested configs alike."""
    from transformers import PretrainedConfig

    kw = _overrides(cfg, width, mixed, image)
    for name, value in vars(cfg).items():
        if isinstance(value, PretrainedConfig):
            kw[name] = shrink(value, width, mixed, image, top=False)
    if not kw:
        return cfg
    # the top level is the class's defaults (rebuilt from kw alone, derived fields fresh); a
    # nested config keeps the defaults its parent chose for it
    new = type(cfg)(**kw) if top else type(cfg)(**{**cfg.to_dict(), **kw})
    for name, value in kw.items():  # where __init__ ignored an override
        if not isinstance(value, PretrainedConfig) and getattr(new, name, value) != value:
            try:
                setattr(new, name, value)
            except Exception:
                pass
    return new


def hf_names() -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return sorted(CONFIG_MAPPING_NAMES)


def _hf_class(model_type: str):
    import transformers
    from transformers.models.auto import modeling_auto as ma

    for mapping in (ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, ma.MODEL_MAPPING_NAMES):
        if model_type in mapping:
            name = mapping[model_type]
            name = name[0] if isinstance(name, (tuple, list)) else name
            return getattr(transformers, name)
    return None


def _image_size(cfg) -> tuple[int, int, int] | None:
    """(channels, height, width) of the config's (or its vision_config's) images."""
    for c in (cfg, getattr(cfg, "vision_config", None)):
        size = getattr(c, "image_size", None) if c is not None else None
        channels = getattr(c, "num_channels", 3)
        channels = channels if _is_int(channels) else 3
        if _is_int(size):
            return channels, size, size
        if isinstance(size, (list, tuple)) and size and all(_is_int(d) for d in size):
            return channels, size[0], size[-1]
    return None


def _build_hf(cls, cfg):
    """The model (eager attention where it builds with it), after its size on meta."""
    import torch
    try:
        with torch.device("meta"):
            meta = cls._from_config(cfg, attn_implementation="eager")
        attn: str | None = "eager"
    except Exception:
        with torch.device("meta"):
            meta = cls._from_config(cfg)
        attn = None
    n = sum(p.numel() for p in meta.parameters())
    del meta
    if n > MAX_PARAMS:
        raise _Skip(f"size: {n / 1e6:.0f}M parameters after shrinking (> {MAX_PARAMS // 10**6}M)")
    torch.manual_seed(0)
    model = cls._from_config(cfg, attn_implementation=attn) if attn else cls._from_config(cfg)
    return model.eval()


def _hf_inputs(model, cfg, with_pixels: bool) -> dict[str, Any]:
    import torch
    main = getattr(model, "main_input_name", "input_ids")
    params = inspect.signature(model.forward).parameters
    gen = torch.Generator().manual_seed(0)
    if main == "input_ids":
        try:
            vocab = model.get_input_embeddings().num_embeddings
        except Exception:  # (no single input embedding: a dual encoder's, say)
            vocab = VOCAB
        high = max(ID_LOW + 1, min(vocab, ID_HIGH))
        ids = torch.randint(min(ID_LOW, high - 1), high, (1, SEQ), generator=gen)
        inputs: dict[str, Any] = {"input_ids": ids}
        if getattr(cfg, "is_encoder_decoder", False) and "decoder_input_ids" in params:
            inputs["decoder_input_ids"] = ids.clone()
        if with_pixels:
            size = _image_size(cfg)
            if size is None or "pixel_values" not in params:
                raise _Skip("inputs: not a text or image model")
            inputs["pixel_values"] = torch.randn((1, *size), generator=gen)
    elif main == "pixel_values":
        size = _image_size(cfg) or (3, IMAGE_DEFAULT, IMAGE_DEFAULT)
        inputs = {"pixel_values": torch.randn((1, *size), generator=gen)}
    elif main == "input_values" and (shape := _speech_shape(cfg)) is not None:
        inputs = {"input_values": torch.randn(shape, generator=gen)}
    else:
        raise _Skip(f"inputs: not a text, image or speech model (main input {main})")
    if "use_cache" in params:
        inputs["use_cache"] = False
    return inputs


def _speech_shape(cfg) -> tuple[int, ...] | None:
    """A speech model's input_values: raw audio for the wav2vec2 family (its convolutional
    feature encoder: conv_stride), a spectrogram for a spectrogram transformer."""
    if getattr(cfg, "conv_stride", None):
        return (1, SPEECH_SAMPLES)
    frames, bins = getattr(cfg, "max_length", None), getattr(cfg, "num_mel_bins", None)
    if isinstance(frames, int) and isinstance(bins, int):
        return (1, frames, bins)
    return None


def _prepare_hf(model_type: str, stage: Callable[[str], None], rec: dict) -> tuple:
    """(model, inputs, reference FLOPs) of ``model_type``: the shrunk config first, then the
    retries the module docstring lists; where all fail, the attempt that got furthest names
    the failure (a retry too large to run does not hide an earlier attempt's failure)."""
    from transformers import CONFIG_MAPPING

    stage("config")
    try:  # (a class whose optional dependency is missing fails here)
        cls = _hf_class(model_type)
        if cls is None:
            raise _Skip("model: no AutoModel or AutoModelForCausalLM class")
        rec["model"] = cls.__name__
        main = getattr(cls, "main_input_name", "input_ids")
    except _Skip:
        raise
    except Exception as exc:
        raise _Failed("build", exc) from None
    if main not in ("input_ids", "pixel_values", "input_values"):
        raise _Skip(f"inputs: not a text, image or speech model (main input {main})")
    try:
        default = CONFIG_MAPPING[model_type]()
    except Exception as exc:
        raise _Failed("config", exc) from None
    best: tuple[int, BaseException] | None = None
    tried: list[str] = []
    for width, mixed, image in ((True, True, True), (True, False, True), (False, True, True),
                                (False, True, False)):
        step = "config"
        try:
            cfg = shrink(default, width, mixed, image)
            try:
                text = cfg.to_json_string()
            except Exception:
                text = f"attempt {len(tried)}"
            if text in tried:  # (no per-layer lists: the same config again)
                continue
            tried.append(text)
            step = "build"
            stage(step)
            model = _build_hf(cls, cfg)
            for with_pixels in (False, True):
                step = "inputs"
                inputs = _hf_inputs(model, cfg, with_pixels)
                step = "forward"
                stage(step)
                try:
                    flops = _reference(model, (), inputs)
                except Exception:
                    if with_pixels or _image_size(cfg) is None or \
                            "pixel_values" not in inspect.signature(model.forward).parameters:
                        raise
                    continue
                rec["profile"] = ("small" if width else "depth only") + \
                    ("" if mixed else ", first layers") + ("" if image else ", default image")
                return model, inputs, flops
        except _Skip:
            if best is None:
                raise
        except Exception as exc:
            if best is None or STAGES.index(step) > best[0]:
                best = (STAGES.index(step), exc)
    assert best is not None
    raise _Failed(STAGES[best[0]], best[1])


# ---------------------------------------------------------------------------------------------
# timm

SIZE_WORDS = ("pico", "femto", "atto", "zepto", "nano", "micro", "xxxs", "xxs", "xs", "tiny",
              "mini", "small", "s", "t", "lite", "medium", "m", "base", "b", "l", "large",
              "huge", "h", "giant", "g")


def _size_key(name: str) -> tuple:
    """Smaller-looking timm names first: a size word (s18 counts as s), a size in the name
    (5m, 1b), the first number, the default input's pixels."""
    from timm.models import get_pretrained_cfg
    tokens = re.split(r"[_.]", name)
    rank = min((SIZE_WORDS.index(w) for t in tokens for w in (t, t.rstrip("0123456789"))
                if w in SIZE_WORDS), default=len(SIZE_WORDS))
    sizes = [int(m.group(1)) * (1000 if m.group(2) == "b" else 1)
             for t in tokens if (m := re.fullmatch(r"(\d+)([mb])", t))]
    number = re.search(r"\d+", tokens[0]) or re.search(r"\d+", name)
    try:
        size = get_pretrained_cfg(name).input_size
        pixels = size[-1] * size[-2]
    except Exception:
        pixels = 224 * 224
    return (rank, min(sizes, default=10**6), int(number.group()) if number else 0, pixels,
            len(name), name)


def timm_families() -> dict[str, str]:
    """{family: its representative model}: one per (timm module, leading letters)."""
    import timm

    families: dict[str, list[str]] = defaultdict(list)
    for module in timm.list_modules():
        for name in timm.list_models(module=module):
            if not name.startswith("test_"):
                lead = re.match(r"[a-z]*", name)
                families[f"{module}/{lead.group() if lead else name}"].append(name)
    return {fam: min(names, key=_size_key) for fam, names in sorted(families.items())}


def _prepare_timm(name: str, stage: Callable[[str], None], rec: dict) -> tuple:
    import timm
    import torch

    stage("build")
    try:
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False).eval()
    except Exception as exc:
        raise _Failed("build", exc) from None
    rec["model"] = type(model).__name__
    size = (getattr(model, "pretrained_cfg", None) or {}).get("input_size") or (3, 224, 224)
    rec["input"] = "x".join(str(d) for d in (1, *size))
    x = torch.randn((1, *size), generator=torch.Generator().manual_seed(0))
    stage("forward")
    try:
        flops = _reference(model, (x,), {})
    except Exception as exc:
        raise _Failed("forward", exc) from None
    return model, (x,), flops


# ---------------------------------------------------------------------------------------------
# one model


class _Skip(Exception):
    pass


class _Failed(Exception):
    def __init__(self, stage: str, exc: BaseException):
        super().__init__(stage)
        self.stage, self.exc = stage, exc


def _first_line(exc: BaseException) -> str:
    """The exception's type and first line (with the next one where it ends in a colon)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()] or [""]
    first = " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]
    return f"{type(exc).__name__}: {first}".strip()


@contextlib.contextmanager
def _batched_experts(model):
    """transformers' MoE experts as batched_mm while FlopCounterMode counts: it has no formula
    for the default grouped_mm and would count the experts' matmuls as 0."""
    try:
        switch = getattr(model, "_can_set_experts_implementation", lambda: False)()
        saved = model.get_experts_implementation() if switch else None
        if switch:
            model.set_experts_implementation("batched_mm")
    except Exception:
        switch = False
    try:
        yield
    finally:
        if switch:
            model.set_experts_implementation(saved)


def _reference(model, args: tuple, kwargs: dict, train: bool = False) -> int:
    """FlopCounterMode's total over one forward under no_grad, on the swapped kernels (module
    docstring). Parameters stop requiring grad meanwhile: FlopCounterMode's module tracker
    asserts "Expected gradient function to be set" on a module that returns one as is.
    ``train``: over the training step's forward (train mode) and backward instead."""
    if train:
        from .sweep_training import reference_step
        return reference_step(model, args, kwargs, _counted_kernels)
    # (a model with an RNN runs without oneDNN: its fused mkldnn_rnn has no formula either)
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    grad = [p for p in model.parameters() if p.requires_grad]
    from .flop_formulas import solve_triangular_flops

    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten.linalg_solve_triangular: solve_triangular_flops})
    try:
        for p in grad:
            p.requires_grad_(False)
        with counter, torch.no_grad(), _counted_kernels(model):
            model(*args, **kwargs)
    finally:
        for p in grad:
            p.requires_grad_(True)
    return int(counter.get_total_flops())


@contextlib.contextmanager
def _counted_kernels(model):
    """The kernels FlopCounterMode has formulas for (module docstring): SDPA's math kernel,
    batched_mm experts, an RNN without oneDNN."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rnn = any(isinstance(m, torch.nn.RNNBase) for m in model.modules())
    with sdpa_kernel(SDPBackend.MATH), _batched_experts(model), \
            torch.backends.mkldnn.flags(enabled=not rnn):
        yield


def _step_reference(model, args, stage: Callable[[str], None]) -> int:
    """The training step's FLOPs (sweep_training.py); its failure is the step's."""
    stage("step")
    try:
        if isinstance(args, dict):
            return _reference(model, (), args, train=True)
        return _reference(model, tuple(args), {}, train=True)
    except Exception as exc:
        raise _Failed("step", exc) from None


def run_one(spec: str, stage: Callable[[str], None] = lambda s: None) -> dict:
    """One model, ``hf:MODEL_TYPE`` or ``timm:NAME``, measured; never raises."""
    import torch

    torch.set_num_threads(1)
    kind, _, name = spec.partition(":")
    rec: dict[str, Any] = dict(kind=kind, name=name, model="", constructed=False, ran=False,
                               analyzed=False, params_exact=False, macs_ok=False, skipped="",
                               stage="", error="", bug=False)
    t0 = time.perf_counter()
    try:
        if kind == "hf":
            import transformers
            transformers.logging.set_verbosity_error()
            model, inputs, flops = _prepare_hf(name, stage, rec)
            args: Any = inputs
        elif kind == "timm":
            model, args, flops = _prepare_timm(name, stage, rec)
        else:
            raise _Skip(f"unknown kind {kind!r} (hf or timm)")
        if STEP["train"]:
            flops = _step_reference(model, args, stage)
        rec.update(constructed=True, ran=True, flops_ref=flops,
                   params_module=sum(p.numel() for p in model.parameters()))
        rec["build_forward_s"] = round(time.perf_counter() - t0, 2)
        stage("graphcost")
        from graphcost import GraphcostError, analyze
        t1 = time.perf_counter()
        try:
            r = analyze(model, args, **(TRAIN_STEP if STEP["train"] else {}))
        except Exception as exc:
            rec["graphcost_s"] = round(time.perf_counter() - t1, 2)
            one_line = isinstance(exc, GraphcostError) and "\n" not in str(exc).strip()
            rec["bug"] = not one_line or str(exc).startswith("internal error")
            if not isinstance(exc, GraphcostError):
                rec["traceback"] = traceback.format_exc()[-3000:]
            raise _Failed("graphcost", exc) from None
        rec["graphcost_s"] = round(time.perf_counter() - t1, 2)
        stage("compare")
        rec.update(analyzed=True, params_gc=r.totals.params, flops_gc=2 * r.totals.macs,
                   coverage=round(r.coverage.percent, 2),
                   unsupported=dict(r.coverage.unsupported), bounded=dict(r.coverage.bounded),
                   warnings=len(r.warnings))
        rec["params_exact"] = r.totals.params == rec["params_module"]
        ref, ours = flops, 2 * r.totals.macs
        rec["macs_ok"] = ours == ref if ref == 0 else abs(ours / ref - 1) <= 0.01
        if STEP["train"]:
            from .sweep_training import compare_peak
            compare_peak(model, args, r, rec)
    except _Skip as exc:
        rec["skipped"] = str(exc)
    except _Failed as exc:
        rec.update(stage=exc.stage, error=_first_line(exc.exc))
        rec["constructed"] = rec["constructed"] or exc.stage in ("forward", "graphcost")
    except BaseException as exc:  # the harness itself: never crash the sweep
        rec.update(stage=rec.get("stage") or "harness", error=_first_line(exc),
                   traceback=traceback.format_exc()[-3000:])
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    return rec


# ---------------------------------------------------------------------------------------------
# the sweep: one process per model


class _Job:
    def __init__(self, spec: str, fresh: bool, folder: str):
        self.spec, self.start = spec, time.monotonic()
        self.path = os.path.join(folder, re.sub(r"[^\w.-]", "_", spec) + ".out")
        if fresh:
            with open(self.path, "wb") as out:
                self.proc: subprocess.Popen | None = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.sweep_breadth", "--one", spec,
                     *(["--train"] if STEP["train"] else [])],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.pid = self.proc.pid
            return
        self.proc = None
        pid = os.fork()
        if pid == 0:  # the child: its own process group, quiet, the record in its file
            code = 0
            try:
                os.setpgid(0, 0)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.dup2(null, 2)
                with open(self.path, "w", buffering=1) as f:
                    rec = run_one(spec, lambda s: f.write(f"# stage {s}\n"))
                    f.write(json.dumps(rec) + "\n")
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        self.pid = pid

    def poll(self) -> int | None:
        """The exit status once finished (negative: the signal), else None."""
        if self.proc is not None:
            return self.proc.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        if self.proc is not None:
            self.proc.wait()
        else:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass

    def record(self, status: int | None, timeout: float) -> dict:
        kind, _, name = self.spec.partition(":")
        try:
            with open(self.path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        for line in reversed(lines):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    break
        stages = [ln.split()[-1] for ln in lines if ln.startswith("# stage ")]
        where = stages[-1] if stages else "start"
        why = f"timeout ({timeout:g} s)" if status is None else \
            f"crashed (signal {-status})" if status < 0 else f"exited {status} with no record"
        return dict(kind=kind, name=name, model="", constructed=where in ("forward", "step",
                    "graphcost", "compare"), ran=where in ("graphcost", "compare"), analyzed=False,
                    params_exact=False, macs_ok=False, skipped="", stage=where,
                    error=f"{why} in {where}", bug=where == "graphcost" and status is not None,
                    seconds=round(time.monotonic() - self.start, 1))


def warm_up(kind: str) -> None:
    """One tiny model through both sides in this process before it forks: every child then
    starts with transformers' (or timm's) shared modules and graphcost's tracing imported,
    ~1.5-3 s less per model."""
    import torch
    torch.set_num_threads(1)  # (before any op: no thread pool for the children to inherit)
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        if kind == "hf":
            import transformers
            transformers.logging.set_verbosity_error()
            cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32,
                                           num_hidden_layers=1, num_attention_heads=2,
                                           vocab_size=32, use_cache=False)
            model = transformers.LlamaForCausalLM(cfg).eval()
            args: Any = {"input_ids": torch.ones((1, 4), dtype=torch.long)}
        else:
            model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                        torch.nn.LazyLinear(2)).eval()
            args = (torch.randn(1, 3, 8, 8),)
            model(*args)
        from graphcost import analyze
        _reference(model, args if isinstance(args, tuple) else (),
                   args if isinstance(args, dict) else {})
        try:
            analyze(model, args)
        except Exception:
            pass


class _Stop(Exception):
    """SIGTERM (an outer `timeout`): stop, and print what has finished."""


def _stop(signum, frame):
    raise _Stop()


def sweep(specs: list[str], workers: int, timeout: float, fresh: bool,
          done: Callable[[dict], None]) -> bool:
    """Run ``specs``, ``workers`` at a time, each killed after ``timeout`` s; ``done`` gets
    each record as it comes. False when stopped (SIGTERM, Ctrl-C) before the end."""
    import torch
    torch.set_num_threads(1)  # (before forking: no thread pool to inherit)
    queue, running, finished = list(specs), [], 0
    old = signal.signal(signal.SIGTERM, _stop)
    with tempfile.TemporaryDirectory(prefix="sweep_breadth_") as folder:
        try:
            while queue or running:
                while queue and len(running) < workers:
                    running.append(_Job(queue.pop(0), fresh, folder))
                time.sleep(0.1)
                for job in list(running):
                    status = job.poll()
                    late = status is None and time.monotonic() - job.start > timeout
                    if status is None and not late:
                        continue
                    if late:
                        job.kill()
                    running.remove(job)
                    rec = job.record(None if late else status, timeout)
                    finished += 1
                    print(f"[{finished}/{len(specs)}] {job.spec}: {_verdict(rec)} "
                          f"{rec.get('seconds', 0):.1f}s", file=sys.stderr, flush=True)
                    done(rec)
        except (_Stop, KeyboardInterrupt):
            print(f"stopped: {len(running) + len(queue)} models not run", file=sys.stderr)
            return False
        finally:
            signal.signal(signal.SIGTERM, old)
            for job in running:
                job.kill()
    return True


# ---------------------------------------------------------------------------------------------
# the table


def _verdict(rec: dict) -> str:
    if rec["skipped"]:
        return f"skipped ({rec['skipped']})"
    if not rec["analyzed"]:
        return f"{'BUG ' if rec.get('bug') else ''}failed in {rec['stage']}: {rec['error'][:100]}"
    return (f"params {'exact' if rec['params_exact'] else 'differ'}, "
            f"MACs {'within 1%' if rec['macs_ok'] else 'off'}"
            + (f", peak {rec['peak_gc'] / rec['peak_ref'] - 1:+.1%}" if rec.get("peak_ref")
               else ""))


def _ratio(rec: dict) -> str:
    ref, ours = rec.get("flops_ref", 0), rec.get("flops_gc", 0)
    if ref == 0:
        return "0 = 0" if ours == 0 else "ref 0"
    return f"{100 * (ours / ref - 1):+.1f}%"


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def _matmuls(ops: dict) -> dict:
    return {op: n for op, n in ops.items()
            if any(k in op for k in ("mm", "conv", "linear", "matmul", "einsum"))}


def _group(rec: dict) -> str:
    msg = rec["skipped"] or f"{rec['stage']}: {rec['error']}"
    return re.sub(r"\d+", "#", msg)[:80]


def print_table(records: list[dict], title: str, wall: float) -> None:
    from .sweep_training import peak_cell, peak_counts, print_peak_misses
    train = any("peak_ref" in r or "peak_error" in r for r in records)
    print(f"\n## {title}\n")
    print("| name | model | analyzed | params gc / module | 2·MACs vs FlopCounterMode | "
          + ("peak vs MemTracker | " if train else "") + "s | failure |")
    print("|---|---|---|---|---|" + ("---|" if train else "") + "---:|---|")
    for rec in records:
        if rec["analyzed"]:
            params = ("exact " if rec["params_exact"] else "DIFFER ") + \
                f"{rec['params_gc']:,} / {rec['params_module']:,}"
            macs = ("ok " if rec["macs_ok"] else "OFF ") + _ratio(rec)
        else:
            params = macs = ""
        failure = rec["skipped"] and f"skipped: {rec['skipped']}" or \
            (f"{'BUG ' if rec.get('bug') else ''}{rec['stage']}: {rec['error']}"
             if rec["stage"] else "")
        name = rec["name"] if rec.get("family", rec["name"]) == rec["name"] else \
            f"{rec['family']}: {rec['name']}"
        print(f"| {name} | {rec.get('model', '')} | "
              f"{'yes' if rec['analyzed'] else 'no'} | {params} | {macs} | "
              + (f"{peak_cell(rec)} | " if train else "") +
              f"{rec.get('seconds', 0):.1f} | {_cell(failure[:160])} |")
    n = len(records)
    count = Counter()
    for rec in records:
        for key in ("constructed", "ran", "analyzed", "params_exact", "macs_ok"):
            count[key] += bool(rec[key])
        count["skipped"] += bool(rec["skipped"])
    analyzed = count["analyzed"]
    print(f"\n{title}: {n} models, wall {wall:.0f} s\n")
    print("| count | models |")
    print("|---|---:|")
    print(f"| skipped (not applicable) | {count['skipped']} |")
    print(f"| constructed (model and inputs built) | {count['constructed']} |")
    print(f"| reference forward ran (FlopCounterMode) | {count['ran']} |")
    print(f"| analyzed by graphcost | {analyzed} of {count['ran']} |")
    print(f"| params exact | {count['params_exact']} of {analyzed} |")
    print(f"| 2·MACs within 1% of FlopCounterMode | {count['macs_ok']} of {analyzed} |")
    for label, value in peak_counts(records) if train else ():
        print(f"| {label} | {value} |")
    print(f"| graphcost bugs (not a one-line GraphcostError) | "
          f"{sum(bool(r.get('bug')) for r in records)} |")
    for label, keep in (("Skipped", lambda r: r["skipped"]),
                        ("Failures", lambda r: not r["skipped"] and not r["analyzed"]),
                        ("Analyzed, params not exact", lambda r: r["analyzed"]
                         and not r["params_exact"]),
                        ("Analyzed, MACs off by more than 1%", lambda r: r["analyzed"]
                         and not r["macs_ok"])):
        chosen = [r for r in records if keep(r)]
        if not chosen:
            continue
        print(f"\n{label} ({len(chosen)}):\n")
        if label.startswith("Analyzed"):
            for r in chosen:
                print(f"* {r['name']}: params {r['params_gc']:,} / {r['params_module']:,}, "
                      f"2·MACs {r['flops_gc']:,} vs {r['flops_ref']:,} ({_ratio(r)}), "
                      f"coverage {r.get('coverage', 0)}%"
                      + (f", unsupported {r['unsupported']}" if r.get("unsupported") else "")
                      + (f", upper bounds (data-dependent sizes): {_matmuls(r['bounded'])}"
                         if _matmuls(r.get("bounded") or {}) else ""))
            continue
        groups: dict[str, list[str]] = defaultdict(list)
        for r in chosen:
            groups[_group(r)].append(r["name"] + (" (BUG)" if r.get("bug") else ""))
        print("| count | message (first 80 chars, digits as #) | e.g. |")
        print("|---:|---|---|")
        for msg, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            print(f"| {len(names)} | {_cell(msg)} | {', '.join(names[:3])} |")
    if train:
        print_peak_misses(records)


# ---------------------------------------------------------------------------------------------


def _specs(kind: str, only: list[str], limit: int) -> tuple[list[str], dict[str, str], str]:
    """(the specs to run, {name: family}, the table's title)."""
    import torch
    if kind == "hf":
        import transformers
        names = [n for n in hf_names() if not only or n in only]
        labels = {n: n for n in names}
        title = f"transformers {transformers.__version__} (torch {torch.__version__})"
    else:
        import timm
        families = timm_families()
        if only:
            families = {f: m for f, m in families.items()
                        if f in only or m in only or f.split("/")[1] in only}
            families.update({n: n for n in only if n not in families.values()
                             and timm.is_model(n)})
        names = list(families.values())
        labels = {m: f for f, m in families.items()}
        title = f"timm {timm.__version__} (torch {torch.__version__})"
    names = names[:limit] if limit else names
    return [f"{kind}:{n}" for n in names], labels, title


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sweep_breadth",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--transformers", action="store_true", help="every transformers model type")
    ap.add_argument("--timm", action="store_true", help="one timm model per family")
    ap.add_argument("--limit", type=int, default=0, help="the first N names of each sweep")
    ap.add_argument("--only", nargs="+", default=[], metavar="NAME",
                    help="model types, timm families or timm model names")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per model")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fresh", action="store_true",
                    help="a new interpreter per model (--one) instead of a fork")
    ap.add_argument("--json", metavar="OUT", help="the records, written as they come")
    ap.add_argument("--resume", action="store_true",
                    help="keep the records already in --json OUT and run only the others")
    ap.add_argument("--train", action="store_true",
                    help="the SGD training step: FLOPs of forward and backward, and the peak "
                         "against MemTracker's (benchmarks/sweep_training.py)")
    ap.add_argument("--one", metavar="KIND:NAME", help="one model (hf:TYPE or timm:NAME): "
                    "its record as one JSON line")
    a = ap.parse_args(argv)
    STEP["train"] = a.train
    if a.one:
        rec = run_one(a.one, lambda s: print(f"# stage {s}", file=sys.stderr, flush=True))
        print(json.dumps(rec), flush=True)
        return
    if not (a.transformers or a.timm):
        ap.error("pass --transformers and/or --timm (or --one KIND:NAME)")
    if a.resume and not a.json:
        ap.error("--resume needs --json OUT")
    out: dict[str, Any] = {}
    if a.resume and os.path.exists(a.json):
        with open(a.json) as f:
            out = json.load(f)

    def save() -> None:
        if a.json:
            with open(a.json + ".tmp", "w") as f:
                json.dump(out, f, indent=1)
            os.replace(a.json + ".tmp", a.json)
    for kind, wanted in (("hf", a.transformers), ("timm", a.timm)):
        if not wanted:
            continue
        specs, labels, title = _specs(kind, a.only, a.limit)
        title += " — the SGD training step" if a.train else ""
        part = out.setdefault(kind + ("-train" if a.train else ""), {})
        part.update(title=title, timeout_s=a.timeout, workers=a.workers)
        kept = {f"{r['kind']}:{r['name']}": r for r in part.get("records", [])}
        part["records"] = list(kept.values())
        todo = [s for s in specs if s not in kept]
        if kept:
            print(f"{len(specs) - len(todo)} records kept from {a.json}; running {len(todo)}",
                  file=sys.stderr)
        if not a.fresh:
            warm_up(kind)
        t0 = time.perf_counter()
        wall0 = part.get("wall_s", 0.0) if kept else 0.0

        def done(rec: dict) -> None:
            rec["family"] = labels.get(rec["name"], rec["name"])
            part["records"].append(rec)
            part["wall_s"] = round(wall0 + time.perf_counter() - t0, 1)
            save()
        complete = sweep(todo, a.workers, a.timeout, a.fresh, done)
        part["wall_s"] = round(wall0 + time.perf_counter() - t0, 1)
        save()
        by_spec = {f"{r['kind']}:{r['name']}": r for r in part["records"]}
        records = [by_spec[s] for s in specs if s in by_spec]
        print_table(records, title, part["wall_s"])
        if len(records) < len(specs):
            print(f"\nNOT RUN (stopped): {len(specs) - len(records)} of {len(specs)} models"
                  + (f"; rerun with --resume --json {a.json} to finish" if a.json else ""))
        if not complete:
            sys.exit(124)


if __name__ == "__main__":
    main()
