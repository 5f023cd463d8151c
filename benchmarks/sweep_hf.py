"""The breadth sweep's transformers models (sweep_breadth.py's docstring says how): every
model type's default config shrunk, built, given inputs and run once under FlopCounterMode."""
from __future__ import annotations

import inspect
from typing import Any, Callable

from .sweep_reference import STAGES, Failed, Skip, reference

SEQ = 16
ID_LOW, ID_HIGH = 4, 200            # random token ids; special ids are moved to 200..255
VOCAB = 256
MAX_PARAMS = 300_000_000

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


def hf_class(model_type: str):
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
        raise Skip(f"size: {n / 1e6:.0f}M parameters after shrinking (> {MAX_PARAMS // 10**6}M)")
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
                raise Skip("inputs: not a text or image model")
            inputs["pixel_values"] = torch.randn((1, *size), generator=gen)
    elif main == "pixel_values":
        size = _image_size(cfg) or (3, IMAGE_DEFAULT, IMAGE_DEFAULT)
        inputs = {"pixel_values": torch.randn((1, *size), generator=gen)}
    elif main == "input_values" and (shape := _speech_shape(cfg)) is not None:
        inputs = {"input_values": torch.randn(shape, generator=gen)}
    else:
        raise Skip(f"inputs: not a text, image or speech model (main input {main})")
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


def prepare_hf(model_type: str, stage: Callable[[str], None], rec: dict) -> tuple:
    """(model, inputs, reference FLOPs) of ``model_type``: the shrunk config first, then the
    retries the module docstring lists; where all fail, the attempt that got furthest names
    the failure (a retry too large to run does not hide an earlier attempt's failure)."""
    from transformers import CONFIG_MAPPING

    stage("config")
    try:  # (a class whose optional dependency is missing fails here)
        cls = hf_class(model_type)
        if cls is None:
            raise Skip("model: no AutoModel or AutoModelForCausalLM class")
        rec["model"] = cls.__name__
        main = getattr(cls, "main_input_name", "input_ids")
    except Skip:
        raise
    except Exception as exc:
        raise Failed("build", exc) from None
    if main not in ("input_ids", "pixel_values", "input_values"):
        raise Skip(f"inputs: not a text, image or speech model (main input {main})")
    try:
        default = CONFIG_MAPPING[model_type]()
    except Exception as exc:
        raise Failed("config", exc) from None
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
                    flops = reference(model, (), inputs)
                except Exception:
                    if with_pixels or _image_size(cfg) is None or \
                            "pixel_values" not in inspect.signature(model.forward).parameters:
                        raise
                    continue
                rec["profile"] = ("small" if width else "depth only") + \
                    ("" if mixed else ", first layers") + ("" if image else ", default image")
                return model, inputs, flops
        except Skip:
            if best is None:
                raise
        except Exception as exc:
            if best is None or STAGES.index(step) > best[0]:
                best = (STAGES.index(step), exc)
    assert best is not None
    raise Failed(STAGES[best[0]], best[1])
