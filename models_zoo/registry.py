"""The model registry: one :class:`ZooModel` per reference model, plus input helpers."""

from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn

from . import bert, classic, gpt2, llama, lora, mlp, mobilenet, resnet, unet, vgg
from .zoo_model import BATCH, SEQ, ZooModel


def _image(c: int, h: int, w: int, *, resizable: bool = False) -> Callable[..., dict[str, tuple[int, ...]]]:
    def resizable_shapes(batch: int, height: int = h, width: int = w
                         ) -> dict[str, tuple[int, ...]]:
        return {"x": (batch, c, height, width)}

    def shapes(batch: int) -> dict[str, tuple[int, ...]]:
        return {"x": (batch, c, h, w)}
    return resizable_shapes if resizable else shapes


def _tokens(*names: str, seq: int) -> Callable[..., dict[str, tuple[int, ...]]]:
    default_seq = seq

    def shapes(batch: int, seq: int = default_seq) -> dict[str, tuple[int, ...]]:
        return {n: (batch, seq) for n in names}

    return shapes


_X_FLOAT = {"x": torch.float32}
_X_BATCH = {"x": {0: BATCH}}

MODELS: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel(
            "small_cnn", classic.SmallCNN, _image(1, 28, 28), _X_FLOAT,
            "2x conv3x3(32) + maxpool + MLP(6272->128->10) on 1x28x28", _X_BATCH, ("logits",),
        ),
        ZooModel(
            "mnist_net", classic.MnistNet, _image(1, 28, 28), _X_FLOAT,
            "PyTorch MNIST example / torchstat README net: conv5x5(10), conv5x5(20), fc 320->50->10, log_softmax",
            _X_BATCH, ("log_probs",),
        ),
        ZooModel(
            "three_conv", classic.three_conv, _image(3, 682, 700, resizable=True), _X_FLOAT,
            "conv3x3(64) relu conv3x3(64) relu maxpool conv3x3(128); default input 3x682x700", _X_BATCH, ("output",),
        ),
        ZooModel("resnet18", resnet.resnet18, _image(3, 224, 224, resizable=True), _X_FLOAT, "torchvision ResNet-18", _X_BATCH, ("logits",)),
        ZooModel("resnet50", resnet.resnet50, _image(3, 224, 224, resizable=True), _X_FLOAT, "torchvision ResNet-50 (v1.5)", _X_BATCH, ("logits",)),
        ZooModel("vgg16", vgg.vgg16, _image(3, 224, 224), _X_FLOAT, "torchvision VGG-16 (config D, no BN)", _X_BATCH, ("logits",)),
        ZooModel(
            "mobilenet_v2", mobilenet.mobilenet_v2, _image(3, 224, 224, resizable=True), _X_FLOAT,
            "torchvision MobileNetV2 (width 1.0)", _X_BATCH, ("logits",),
        ),
        ZooModel(
            "gpt2", gpt2.gpt2_tiny, _tokens("input_ids", seq=64), {"input_ids": torch.int64},
            "tiny GPT-2 decoder: vocab 1000, 128 positions, d 128, 4 heads, 2 layers, pre-LN, causal SDPA, tied lm_head",
            {"input_ids": {0: BATCH, 1: SEQ}}, ("logits",),
            output_dynamic_dims={"logits": {0: BATCH, 1: SEQ}},
            int_ranges={"input_ids": (0, gpt2.GPT2Config.vocab_size)},
            stand_in="GPT-2 small (124M parameters)",
        ),
        ZooModel(
            "gpt2_lora", lora.gpt2_lora, _tokens("input_ids", seq=64), {"input_ids": torch.int64},
            "zoo gpt2 frozen, rank-8 LoRA adapters (alpha 16) on each block's c_attn and c_proj: only the adapters train",
            {"input_ids": {0: BATCH, 1: SEQ}}, ("logits",),
            output_dynamic_dims={"logits": {0: BATCH, 1: SEQ}},
            int_ranges={"input_ids": (0, gpt2.GPT2Config.vocab_size)},
        ),
        ZooModel(
            "bert", bert.bert_tiny, _tokens("input_ids", "attention_mask", seq=64),
            {"input_ids": torch.int64, "attention_mask": torch.int64},
            "tiny BERT encoder: vocab 1000, 128 positions, d 128, 4 heads, 2 layers, MLP 512, post-LN, tanh pooler",
            {"input_ids": {0: BATCH, 1: SEQ}, "attention_mask": {0: BATCH, 1: SEQ}},
            ("last_hidden_state", "pooler_output"),
            output_dynamic_dims={"last_hidden_state": {0: BATCH, 1: SEQ}, "pooler_output": {0: BATCH}},
            int_ranges={"input_ids": (0, bert.BertConfig.vocab_size), "attention_mask": (1, 2)},  # mask of ones
            stand_in="BERT-base (110M parameters)",
        ),
        ZooModel(
            "llama_tiny", llama.llama_tiny, _tokens("input_ids", seq=64), {"input_ids": torch.int64},
            "tiny Llama-style decoder: RMSNorm, rotary, GQA (4 heads, 2 kv), SwiGLU; d 128, 2 layers",
            {"input_ids": {0: BATCH, 1: SEQ}}, ("logits",),
            output_dynamic_dims={"logits": {0: BATCH, 1: SEQ}},
            int_ranges={"input_ids": (0, llama.TINY.vocab_size)},
        ),
        ZooModel(
            "llama7b", llama.llama7b, _tokens("input_ids", seq=2048), {"input_ids": torch.int64},
            "Llama-2-7B-shaped decoder (6.74 B params): build and trace on the meta device only",
            {"input_ids": {0: BATCH, 1: SEQ}}, ("logits",),
            output_dynamic_dims={"logits": {0: BATCH, 1: SEQ}},
            int_ranges={"input_ids": (0, 32000)}, meta_only=True,
            dtype="float16",  # Llama-2-7b-hf's config.json: "torch_dtype": "float16"
        ),
        ZooModel(
            "llama3_8b", llama.llama3_8b, _tokens("input_ids", seq=8192), {"input_ids": torch.int64},
            "Llama 3.1 8B's shape (8.03 B params) in the torchtitan-style decoder: meta device only",
            {"input_ids": {0: BATCH, 1: SEQ}}, ("logits",),
            output_dynamic_dims={"logits": {0: BATCH, 1: SEQ}},
            int_ranges={"input_ids": (0, 128256)}, meta_only=True, dtype="bfloat16",
        ),
        ZooModel(
            "llama3_70b", llama.llama3_70b, _tokens("input_ids", seq=8192), {"input_ids": torch.int64},
            "Llama 3.1 70B's shape (70.6 B params) in the torchtitan-style decoder: meta device only",
            {"input_ids": {0: BATCH, 1: SEQ}}, ("logits",),
            output_dynamic_dims={"logits": {0: BATCH, 1: SEQ}},
            int_ranges={"input_ids": (0, 128256)}, meta_only=True, dtype="bfloat16",
        ),
        ZooModel(
            "llama3_405b", llama.llama3_405b, _tokens("input_ids", seq=8192), {"input_ids": torch.int64},
            "Llama 3.1 405B's shape (406 B params) in the torchtitan-style decoder: meta device only",
            {"input_ids": {0: BATCH, 1: SEQ}}, ("logits",),
            output_dynamic_dims={"logits": {0: BATCH, 1: SEQ}},
            int_ranges={"input_ids": (0, 128256)}, meta_only=True, dtype="bfloat16",
        ),
        ZooModel(
            "mlp", mlp.MLP, lambda batch: {"x": (batch, 256)}, _X_FLOAT,
            "4 blocks of Linear(256->512)-ReLU-Linear(512->256), head Linear(256->10)", _X_BATCH, ("logits",),
        ),
        ZooModel(
            "unet", unet.unet_small, _image(3, 64, 64, resizable=True), _X_FLOAT,
            "small UNet: 3 levels (16,32,64), bottleneck 128, ConvTranspose2d up path, 2 classes; H, W divisible by 8",
            _X_BATCH, ("output",),
        ),
    ]
}


def get(name: str) -> ZooModel:
    spec = MODELS.get(name) or _detection_models().get(name) or _hf_models().get(name)
    if spec is None:
        raise KeyError(f"unknown zoo model {name!r}; available: {', '.join(names())}")
    return spec


def names() -> list[str]:
    """Every zoo model: the plain-torch ones (MODELS, then the detectors), then the
    transformers ones."""
    return [*MODELS, *_detection_models(), *_hf_models()]


def _detection_models() -> dict[str, ZooModel]:
    from .detection import DETECTION_MODELS  # registers the detectors' custom ops
    return DETECTION_MODELS


def _hf_models() -> dict[str, ZooModel]:
    from .hf import HF_MODELS  # imports no transformers until a model is built
    return HF_MODELS


def build_model(name: str, *, seed: int = 0, eval: bool = True) -> nn.Module:
    """Build a zoo model with ``torch.manual_seed(seed)`` (deterministic weights), in eval mode by default."""
    spec = get(name)
    torch.manual_seed(seed)
    if spec.meta_only:  # never materialized: weights are shapes only
        with torch.device("meta"):
            return spec.build().eval() if eval else spec.build()
    model = spec.build()
    _randomize_constant_tensors(model)
    return model.eval() if eval else model


@torch.no_grad()
def _randomize_constant_tensors(model: nn.Module) -> None:
    """Give constant-initialized tensors (fresh norm weights of 1, zero biases, running stats)
    trained-looking seeded values.

    Exporters deduplicate identical initializers: tensors that are all ones or all zeros would
    collapse into shared weights, so a graph-level parameter count would no longer equal
    ``sum(p.numel())`` as it does for a trained model.
    """
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if not t.is_floating_point() or t.numel() < 2 or not bool((t == t.flatten()[0]).all()):
            continue
        if name.endswith("running_var") or float(t.flatten()[0]) == 1.0:
            t.uniform_(0.5, 1.5)
        else:
            t.normal_(0.0, 0.1)


def input_shapes(name: str, batch: int = 1, **dims: int) -> dict[str, tuple[int, ...]]:
    spec = get(name)
    try:
        return spec.input_shapes(batch, **dims)
    except TypeError:
        known = dim_names(name)
        unknown = sorted(set(dims) - set(known)) or sorted(dims)
        raise TypeError(f"model {name!r} has no dim {', '.join(map(repr, unknown))}; its dims: "
                        f"{', '.join(sorted(known)) or 'batch only'}") from None


def dim_names(name: str) -> list[str]:
    """The sizes besides the batch that ``input_shapes(name, batch, **dims)`` takes: ``seq``,
    or ``height`` and ``width`` for the resizable image models (which have no default dims)."""
    params = list(inspect.signature(get(name).input_shapes).parameters.values())[1:]
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def example_inputs(name: str, batch: int = 1, *, seed: int | None = 0, **dims: int) -> tuple[torch.Tensor, ...]:
    """Random example inputs in ``input_shapes`` order (token ids lie in ``[0, vocab)``,
    attention masks are all ones). ``dims`` are model-specific, e.g. ``seq=32`` for the
    transformers or ``height=..., width=...`` for ``three_conv``/``unet``. With the
    default ``seed=0`` the result is deterministic; ``seed=None`` uses the global RNG."""
    spec = get(name)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    out = []
    for inp, shape in input_shapes(name, batch, **dims).items():
        dtype = spec.input_dtypes[inp]
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen, dtype=dtype))
        else:
            lo, hi = spec.int_ranges.get(inp, (0, 2))
            out.append(torch.randint(lo, hi, shape, generator=gen, dtype=dtype))
    return tuple(out)


def default_dims(name: str) -> dict[str, int]:
    """The model's default sizes of its non-batch symbolic dims, e.g. {"seq": 64}."""
    spec = get(name)
    shapes = spec.input_shapes(1)
    out: dict[str, int] = {}
    for inp, axes in spec.dynamic_dims.items():
        for axis, dim in axes.items():
            if dim != BATCH:
                out[dim] = shapes[inp][axis]
    return out
