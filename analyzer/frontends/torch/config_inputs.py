"""The inputs a model built from a config.json takes by default (analyzer/load/resolve.py
hands them to the trace): token ids for a language model, pixel values for a vision model,
log-mel frames or a waveform for a speech model — by what the config names and by the first
argument of the model's forward — and the values graphcost's own token ids stand for where the
model's Python reads them (``ordinary_tokens``)."""
from __future__ import annotations

import inspect
from typing import Any

DECODER_SEQ, ENCODER_SEQ = 2048, 512

# a speech model's waveform where none is asked (--dim samples): 10 s at 16 kHz, the rate
# wav2vec 2.0's, HuBERT's and WavLM's feature extractors take
WAVEFORM_SAMPLES = 160_000
# a speech model's log-mel frames where none are asked (--dim frames): the same 10 s at the 10 ms
# hop (160 samples at 16 kHz) of Parakeet's, Speech2Text's and SeamlessM4T's feature extractors
FEATURE_FRAMES = 1000
# a vision model's image side where its config names none (ResNet, RegNet, BiT, SegFormer):
# ImageNet's crop, which their image processors' checkpoints were trained at
IMAGE_SIDE = 224


def input_shapes(config, batch: int, dims: dict[str, int],
                 model=None) -> dict[str, tuple[int, ...]]:
    """The inputs a model of this config takes by default:

    * a waveform of ``--dim samples`` (``WAVEFORM_SAMPLES``) for a speech model whose forward
      takes ``input_values`` first;
    * Whisper's window of log-mel frames (``_mel_window``); another speech model whose forward
      takes ``input_features`` first ``--dim frames`` of them (``FEATURE_FRAMES``) of its
      config's width (``_feature_width``), time first; an encoder-decoder's decoder ids of
      ``decoder_seq`` beside either (512, at most its decoder's context);
    * pixel values for a vision model (``_image_config``) of ``--dim image`` on a side, else
      its config's size, else ``IMAGE_SIDE`` — a video model's its config's ``num_frames`` of
      them — and an image-to-text encoder-decoder's decoder ids beside them;
    * a vision-language model's one image a sample at its tower's size, beside its token
      ids (``_image_tower``);
    * else token ids of ``seq`` (a decoder 2048, others 512, at most the model's context
      length), and an encoder-decoder's decoder ids of ``decoder_seq`` (by default as many as
      the encoder's)."""
    if _first_parameter(model) == "input_values":   # (wav2vec 2.0, HuBERT: a waveform)
        samples = {"input_values": (batch, dims.get("samples", WAVEFORM_SAMPLES))}
        return {**samples, **_decoder_ids(config, model, batch, dims)}   # (Moonshine)
    audio = _mel_window(config, model)
    if audio is not None:   # (Whisper: 30 s of log-mel frames, its decoder's token ids)
        return {"input_features": (batch, *audio),
                **_decoder_ids(config, model, batch, dims)}
    features = _feature_width(config) if _first_parameter(model) == "input_features" else None
    if features is not None:   # (Parakeet, Speech2Text: frames of features, time first)
        frames = {"input_features": (batch, dims.get("frames", FEATURE_FRAMES), features)}
        return {**frames, **_decoder_ids(config, model, batch, dims)}
    tower = _image_tower(config, model)
    if tower is not None:   # (LLaVA, PaliGemma, InternVL: an image per sample, then its text)
        return _image_and_text(config, tower, batch, dims)
    vision = _image_config(config, model)
    if vision is not None:
        c = vision
        side = dims.get("image") or _side(getattr(c, "image_size", None)) or IMAGE_SIDE
        channels = getattr(c, "num_channels", 3)
        image = (channels if isinstance(channels, int) else 3, side, side)
        frames = getattr(c, "num_frames", None)
        # (a video model's clip: its config's frames, each an image — VideoMAE, ViViT,
        # TimeSformer take them time first)
        clip = (frames,) if isinstance(frames, int) and frames > 0 and c is config else ()
        pixels = {"pixel_values": (batch, *clip, *image)}
        return {**pixels, **_decoder_ids(config, model, batch, dims)}
    limit = getattr(config, "max_position_embeddings", None) or DECODER_SEQ
    default = DECODER_SEQ if getattr(config, "is_decoder", False) or _causal(config) \
        else ENCODER_SEQ
    seq = dims.get("seq", min(default, limit))
    if getattr(config, "is_encoder_decoder", False):  # (T5, BART: the decoder's ids too)
        return {"input_ids": (batch, seq), "decoder_input_ids": (batch,
                                                                 dims.get("decoder_seq", seq))}
    return {"input_ids": (batch, seq)}


def _image_config(config, model):
    """The config that sizes a vision model's images: its own where it names an image size
    (unless its forward takes token ids and no pixels);
    for a model whose forward takes ``pixel_values`` first, its vision tower's or image
    encoder's where that names one (CLIP's image classifier, VisionEncoderDecoder; not Gemma
    3's text classifier, which takes token ids first beside a vision tower), else its own;
    None for a model of tokens."""
    if _side(getattr(config, "image_size", None)) is not None:
        # (not a model that takes token ids and no pixels: Perceiver's text models, whose
        # config names the image size its image classifiers take)
        params = _parameters(model)
        return None if "input_ids" in params and "pixel_values" not in params else config
    if not _takes_pixels(model):
        return None
    towers = (getattr(config, "vision_config", None), getattr(config, "encoder", None))
    return next((t for t in towers if t is not None
                 and _side(getattr(t, "image_size", None)) is not None), config)


def _image_and_text(config, tower, batch: int, dims: dict[str, int]) -> dict:
    """A vision-language model's inputs: token ids of ``seq`` (a decoder's, at most its text
    model's context) and one image a sample at its tower's side."""
    text = config.get_text_config()
    limit = getattr(text, "max_position_embeddings", None) or DECODER_SEQ
    side = _side(getattr(tower, "image_size", None)) or IMAGE_SIDE  # (_image_tower's)
    if dims.get("image", side) != side:   # (its processor resizes every image to it)
        from ....passes.errors import GraphcostError, opt
        raise GraphcostError(f"{opt('dims', 'image', dims['image'])}: this model's processor "
                             f"resizes every image to its vision tower's {side} × {side}, "
                             "which its tower requires")
    channels = getattr(tower, "num_channels", 3)
    return {"input_ids": (batch, dims.get("seq", min(DECODER_SEQ, limit))),
            "pixel_values": (batch, channels if isinstance(channels, int) else 3, side, side)}


def _image_tower(config, model):
    """The vision tower's config of a vision-language model that takes an image per sample
    as ``pixel_values`` (batch, channels, side, side) beside its token ids, placed where its
    image token stands (LLaVA, PaliGemma, Aya Vision, InternVL, Gemma 3), else None: a model
    whose ``get_image_features`` needs more than the pixels (LLaVA-NeXT's tiles of any
    resolution, Qwen2-VL's patch grid) or another layout of them (Idefics3's images a sample)
    is left with its token ids alone."""
    tower = _named_tower(config, model)
    side = _side(getattr(tower, "image_size", None))
    return tower if side and _features_per_image(model, tower, side) else None


def _named_tower(config, model):
    """``_image_tower``'s checks of the names alone (no run): the vision config of a
    generating model (not Gemma 3's sequence classifier: fine-tuned on text, it keeps its
    token ids alone) that takes token ids and pixel values and names an image token and an
    image size."""
    params = _parameters(model)
    tower = getattr(config, "vision_config", None)
    if not type(model).__name__.endswith("ForConditionalGeneration") \
            or "input_ids" not in params or "pixel_values" not in params or tower is None \
            or _image_token(config) is None or _side(getattr(tower, "image_size", None)) is None:
        return None
    return tower


def _image_token(config) -> int | None:
    token = getattr(config, "image_token_id", None)
    token = getattr(config, "image_token_index", None) if token is None else token
    return token if isinstance(token, int) and not isinstance(token, bool) else None


def _features_per_image(model, tower, side: int) -> int:
    """How many features the model's own ``get_image_features`` makes of one image of
    ``side``, run on a meta image; 0 where it cannot be run on the pixels alone."""
    import torch

    channels = getattr(tower, "num_channels", 3)
    pixels = torch.empty((1, channels if isinstance(channels, int) else 3, side, side),
                         dtype=next(model.parameters()).dtype, device="meta")
    try:
        with torch.no_grad():
            made = model.get_image_features(pixel_values=pixels)
        made = getattr(made, "pooler_output", made)
        first = made[0] if isinstance(made, (list, tuple)) else made
        return first.numel() // first.shape[-1]
    except Exception:  # noqa: BLE001 - a model that needs more than the pixels: not shaped
        return 0


def image_tokens(config, inputs: dict[str, Any], model) -> str | None:
    """A vision-language model's stand-in ids (``ordinary_tokens``') begin with its image
    token, as many times as the vision tower makes features of the image (its processor's
    expansion of ``<image>``: LLaVA's 576 at 336 pixels), then the text: the report's note,
    None for another model. A sequence too short to hold them is refused."""
    from ....passes.errors import GraphcostError, opt
    from .input_values import stand_in, stand_in_of

    ids, pixels = inputs.get("input_ids"), inputs.get("pixel_values")
    if pixels is None and getattr(config, "vision_config", None) is not None \
            and "pixel_values" in _parameters(model) and ids is not None:
        return ("no image: the step of its text alone, its vision tower not run (graphcost "
                "makes images for a model that takes one square image a sample, as LLaVA "
                "does; this one's are given as input shapes, beside ids of its image tokens)")
    tower, token = _named_tower(config, model), _image_token(config)
    if tower is None or token is None or ids is None or pixels is None \
            or ids.device.type != "meta":
        return None
    side, seq = pixels.shape[-1], ids.shape[1]
    per_image = _features_per_image(model, tower, side)   # (the tower run once here)
    if not per_image:   # (pixels given as input shapes to a model it cannot run: as given)
        return None
    if per_image >= seq:
        raise GraphcostError(f"{opt('dims', 'seq', seq)} holds no text beside the "
                             f"{per_image:,} tokens of the image: give a longer sequence")
    values = stand_in_of(ids).clone()
    values[:, :per_image] = token
    stand_in(ids, values, f"of one ordinary token after the {per_image:,} image tokens of "
                          f"one {side}×{side} image a sample")
    return (f"one {side}×{side} image a sample (its vision tower's size), its {per_image:,} "
            f"image tokens first in each sequence of {seq:,}, the text after them")


def _decoder_ids(config, model, batch: int, dims: dict[str, int]) -> dict:
    """An image-to-text or speech encoder-decoder's decoder ids (VisionEncoderDecoder: TrOCR,
    Donut; Whisper, Speech2Text, Moonshine) of ``decoder_seq`` (512, at most its decoder's
    context: ``max_target_positions``, else its decoder config's or its own
    ``max_position_embeddings``); none for another model (a CTC encoder)."""
    if not getattr(config, "is_encoder_decoder", False) or model is None \
            or "decoder_input_ids" not in _parameters(model):
        return {}
    decoder = getattr(config, "decoder", None) or config
    limit = getattr(config, "max_target_positions", None) \
        or getattr(decoder, "max_position_embeddings", None) or ENCODER_SEQ
    return {"decoder_input_ids": (batch, dims.get("decoder_seq", min(ENCODER_SEQ, limit)))}


def _mel_window(config, model) -> tuple[int, int] | None:
    """(mel bins, frames) of the window a speech encoder-decoder whose forward takes
    ``input_features`` first hears: Whisper's 30 s, ``2 · max_source_positions`` frames of
    ``num_mel_bins`` (its encoder's stride-2 convolution makes its positions; its feature
    extractor pads every clip to the window, and its encoder refuses another length)."""
    mel, positions = (getattr(config, k, None) for k in ("num_mel_bins",
                                                         "max_source_positions"))
    if not (isinstance(mel, int) and isinstance(positions, int)) \
            or _first_parameter(model) != "input_features" \
            or not getattr(config, "is_encoder_decoder", False):
        return None
    return mel, 2 * positions


def _feature_width(config) -> int | None:
    """What each frame of a speech model's ``input_features`` holds, as its config names it:
    its own or its encoder's ``num_mel_bins`` (Parakeet, LASR, Canary), Speech2Text's
    ``input_feat_per_channel`` × ``input_channels``, SeamlessM4T's
    ``feature_projection_input_dim`` (its extractor's 80 bins, two frames stacked); None where
    it names none (Granite Speech stacks frames its config does not say: refused as its
    trace fails)."""
    for c in (config, getattr(config, "encoder_config", None)):
        mel = getattr(c, "num_mel_bins", None)
        if isinstance(mel, int) and not isinstance(mel, bool) and mel > 0:
            return mel
    per, channels = (getattr(config, k, None) for k in ("input_feat_per_channel",
                                                        "input_channels"))
    if isinstance(per, int) and isinstance(channels, int) and per > 0 and channels > 0:
        return per * channels
    stacked = getattr(config, "feature_projection_input_dim", None)
    return stacked if isinstance(stacked, int) and stacked > 0 else None


def frames_first(config, model) -> bool:
    """Whether the model's ``input_features`` are frames of any number, ``--dim frames`` (not
    Whisper's window, which its encoder requires whole)."""
    return _mel_window(config, model) is None and _feature_width(config) is not None


def _side(size) -> int | None:
    """An image size's side: an int, or the first of a square (h, w)."""
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    if isinstance(size, (list, tuple)) and len(size) == 2 and size[0] == size[1] \
            and isinstance(size[0], int):
        return size[0]
    return None


def _takes_pixels(model) -> bool:
    """Whether ``model``'s forward takes ``pixel_values`` as its first argument."""
    return _first_parameter(model) == "pixel_values"


def _first_parameter(model) -> str | None:
    return next(iter(_parameters(model)), None)


def _parameters(model) -> list[str]:
    try:
        return list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError, AttributeError):
        return []


def _causal(config) -> bool:
    return any(a.endswith("ForCausalLM") for a in getattr(config, "architectures", None) or ())


def _pooling_pad(config, model) -> str | None:
    """A sequence classifier whose config names no padding token: transformers pools each
    sequence at its last token before the padding, and refuses a batch of more than one
    without a ``pad_token_id`` to find it by ("Cannot handle batch sizes > 1 if no padding
    token is defined"). Fine-tuning sets one (``tokenizer.pad_token = tokenizer.eos_token``):
    graphcost sets the config's eos token (else its bos, else 0) and says so. Set first by
    ``ordinary_tokens``, which then picks another id, so the ids hold no padding and each
    sequence is pooled at its last position, as transformers' pooling of unpadded ids is."""
    # (transformers' pooling reads the text config's: a multimodal config's text_config)
    text = getattr(config, "get_text_config", lambda: config)() or config
    if not _classifier(model) or getattr(text, "pad_token_id", 0) is not None:
        return None
    named = [(getattr(c, f"{k}_token_id", None), k) for c in (text, config) for k in ("eos", "bos")]
    named = [(i[0] if isinstance(i, (list, tuple)) and i else i, k) for i, k in named]
    pad, which = next(((i, f"its {k} token") for i, k in named if isinstance(i, int)),
                      (0, "token 0: it names no eos token"))
    text.pad_token_id = pad
    return (f"its config names no pad_token_id, which a sequence classifier's pooling needs at "
            f"a batch above 1: set to {pad} ({which}, as fine-tuning sets the tokenizer's pad "
            "token to its eos); the ids hold none, so each sequence is pooled at its last token")


def _classifier(model) -> bool:
    """A transformers sequence classifier (its pooling reads the ids' values)."""
    return type(model).__name__.endswith("ForSequenceClassification")


def ordinary_tokens(config, inputs: dict[str, Any], model=None) -> str | None:
    """The meta token ids graphcost made for ``config``'s model stand, where the model's
    Python reads their values (FSMT's ``if not padding_mask.any()``, LED's global attention),
    for ids of one ordinary token: the first of the vocabulary no ``*_token_id`` of the config
    names — no padding, as the all-ones attention mask eager makes has none
    (input_values.py); an encoder-decoder classifier's ending with its eos token. A
    classifier with no pad token is given one first (``_pooling_pad``, so that the ids hold
    none): its note, the report's, is returned."""
    import torch

    from .input_values import stand_in

    pad = _pooling_pad(config, model) if model is not None else None
    special = {i for c in (config, getattr(config, "get_text_config", lambda: None)())
               if c is not None for k, v in getattr(c, "__dict__", {}).items()
               if k.endswith("token_id")
               for i in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(i, int)}
    token = next(i for i in range(len(special) + 1) if i not in special)
    eos = _eos_pooled(config, model)
    for name, t in inputs.items():
        if name.endswith("input_ids") and t.dtype == torch.int64 and t.device.type == "meta":
            values = torch.full(tuple(t.shape), token, dtype=torch.int64)
            if eos is not None and name == "input_ids" and values.dim() == 2:
                values[:, -1] = eos
                stand_in(t, values, "of one ordinary token, each sequence ending with its eos "
                                    "token")
            else:
                stand_in(t, values)
    return pad


def _eos_pooled(config, model) -> int | None:
    """The eos token an encoder-decoder's sequence classifier (BART's, T5's families) pools
    each sequence at, which their tokenizers end every sequence with: the stand-in ids end
    with it too (eager refuses ids without one). None for any other model."""
    eos = getattr(config, "eos_token_id", None)
    if model is None or not getattr(config, "is_encoder_decoder", False) or \
            not _classifier(model):
        return None
    return eos if isinstance(eos, int) else None
