"""A model's config.json read as data and checked before transformers sees it (hub.py builds
the model from it): bounded in size, nesting and the length of its integers; ``architectures``
naming a model class by its spelling (transformers exports ``set_seed``, ``Trainer`` and
``pipeline`` under the same roof, and the class is called with the config; hub.py checks the
object it finds); the sizes that shape the model within stated ranges; the dtype it names."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path
from typing import Any

from ....passes.errors import GraphcostError

# A model config is kilobytes and nests a few levels (a text config's rope_scaling). Past
# these it is none: 1,000 levels failed in json's recursion, a 5,000-digit integer in int()'s
# digit limit, each a traceback (exit 70) instead of a line
MAX_CONFIG_BYTES, MAX_DEPTH, MAX_DIGITS = 4 << 20, 64, 64
# the dtypes a config may name for the model ("auto" or none: float32, as transformers does)
DTYPES = ("float32", "float16", "bfloat16", "float64")
# architectures[0] as transformers spells its classes (NemotronH_Omni_Reasoning_V3, and
# xLSTMForCausalLM: lower case before the first capital); not a function's or a module's name
CLASS_NAME = re.compile(r"(?=[a-z]*[A-Z])[A-Za-z][A-Za-z0-9_]{0,127}")
ONLY_MODELS = ("graphcost builds only transformers' model classes (a PreTrainedModel "
               "subclass, such as LlamaForCausalLM)")

# The fields that size the model, by each name transformers' configs give them, anywhere in
# the config (text_config, vision_config), and the range each may hold: an integer, or lists
# or mappings of them (Swin's heads per stage, LXMERT's layers per tower); null is
# transformers' default. Unchecked, a negative layer count built an empty model, a vocabulary
# of 0 one with four warnings, a negative image size failed in torch, 10,000 layers took two
# minutes and 1.9 GB, 10^9 ran out of memory. The bounds are far past published models
# (Llama-3.1-405B: 126 layers, hidden 16,384, FFN 53,248, 128 heads); an expert count may be 0
# (a dense model of an MoE family) and so may head_dim (GLM's default: from hidden_size).
MAX_LAYERS = 1024
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_encoder_layers",
           "num_decoder_layers", "encoder_layers", "decoder_layers")
_WIDTHS = ("hidden_size", "n_embd", "d_model", "dim", "num_channels")
_FFN = ("intermediate_size", "n_inner", "hidden_dim", "ffn_dim", "encoder_ffn_dim",
        "decoder_ffn_dim", "moe_intermediate_size")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "num_key_value_heads",
          "encoder_attention_heads", "decoder_attention_heads")
_EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts",
            "num_experts_per_tok")
_POSITIONS = ("max_position_embeddings", "n_positions")
SIZE_FIELDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(_LAYERS, (1, MAX_LAYERS)), **dict.fromkeys(_WIDTHS, (1, 1 << 17)),
    "head_dim": (0, 1 << 17), **dict.fromkeys(_FFN, (1, 1 << 20)),
    **dict.fromkeys(_HEADS, (1, 1 << 13)), **dict.fromkeys(_EXPERTS, (0, 1 << 14)),
    "vocab_size": (1, 1 << 24), **dict.fromkeys(_POSITIONS, (1, 1 << 28)),
    "image_size": (1, 1 << 16), "patch_size": (1, 1 << 16)}


def read_config(path: Path, name: str) -> dict[str, Any]:
    """config.json as data, checked for what graphcost needs before transformers sees it."""
    data = _load_json(path, name)
    if not isinstance(data, dict):
        raise GraphcostError(f"{name}: {path.name} is not a JSON object")
    about = f"{name}: {path.name}'s"
    _check_architectures(data.get("architectures"), about, f"{name}: {path.name}")
    if not isinstance(data.get("model_type", ""), str):
        raise GraphcostError(f"{about} model_type is {_shown(data['model_type'])}, not a name")
    _check_sizes(data, about)
    return data


def _check_architectures(archs: Any, about: str, whose: str) -> None:
    """A list of class names, the first (the one built) spelled as transformers spells a model
    class: refused here are a function's or a module's name and an Auto class."""
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
        raise GraphcostError(f"{whose} has no 'architectures': it does not say which model "
                             "class to build")
    if not all(isinstance(a, str) for a in archs):  # (the default sequence reads them all)
        raise GraphcostError(f"{about} architectures is not a list of class names")
    if not CLASS_NAME.fullmatch(archs[0]):
        raise GraphcostError(f"{about} architectures names {_shown(archs[0])}, not a model "
                             f"class: {ONLY_MODELS}")
    if re.match("Auto[A-Z]", archs[0]):  # (Autoformer is a model)
        raise GraphcostError(f"{about} architectures names {archs[0]}, an Auto class, not a "
                             f"model class: {ONLY_MODELS}")


def _load_json(path: Path, name: str) -> Any:
    """The file's JSON, bounded in size, nesting and the length of its integers."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # (a file that grows is read no further)
        if len(raw) > MAX_CONFIG_BYTES:
            raise GraphcostError(f"{name}: {path.name} is over 4 MiB; not a model config")
        text = raw.decode("utf-8")
        data = json.loads(text, parse_int=_bounded_int)
    except _LongInteger:
        raise GraphcostError(f"{name}: {path.name} holds an integer of more than "
                             f"{MAX_DIGITS} digits; not a model config") from None
    except RecursionError:  # (some hundreds deep)
        raise _too_deep(path, name) from None
    except (OSError, ValueError) as exc:  # (UnicodeDecodeError, JSONDecodeError)
        raise GraphcostError(f"{name}: {path.name} is not readable JSON ({exc})") from None
    if _depth(text) > MAX_DEPTH:
        raise _too_deep(path, name)
    return data


def _too_deep(path: Path, name: str) -> GraphcostError:
    return GraphcostError(f"{name}: {path.name} nests lists or objects more than {MAX_DEPTH} "
                          "deep; not a model config")


class _LongInteger(ValueError):
    """An integer literal of more than MAX_DIGITS digits."""


def _bounded_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_DIGITS:  # int() is quadratic in digits, to 4,300
        raise _LongInteger(literal[:20])
    return int(literal)


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = str.maketrans("[{]}", "\x01\x01\xff\xff")  # +1 and, as a signed byte, -1


def _depth(text: str) -> int:
    """How deep ``text``, valid JSON (each string closed: the pattern is linear on it), nests
    lists and objects: the running sum of its brackets outside strings, at C speed."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    steps = memoryview(brackets.translate(_STEP).encode("latin-1")).cast("b")
    return max(accumulate(steps), default=0)


def _check_sizes(data: dict[str, Any], about: str) -> None:
    """Each of SIZE_FIELDS anywhere in the config within its range, before the model is
    built (``about``: whose config, for the message)."""
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:
        where, obj = todo.pop()
        if isinstance(obj, dict):
            _check_fields(obj, where, about)
        for key, value in obj.items() if isinstance(obj, dict) else enumerate(obj):
            if isinstance(value, (dict, list)) and not (isinstance(obj, dict)
                                                        and key in SIZE_FIELDS):
                todo.append((_field(where, key), value))


def _check_fields(obj: dict[str, Any], where: str, about: str) -> None:
    """The size fields of one (sub-)config, and its top-k against its experts: a top-k of 0
    routed each token to no expert and divided by zero in the MoE count, a top-k past the
    experts failed in torch.topk."""
    for key in [k for k in obj if k in SIZE_FIELDS]:  # (in the file's order)
        lo, hi = SIZE_FIELDS[key]
        bad = next(_bad_sizes(obj[key], lo, hi, key in _POSITIONS), None)
        if bad is not None:
            raise GraphcostError(f"{about} {_field(where, key)} is {_shown(bad[0])}: it must "
                                 f"be an integer from {lo} to {hi:,}")
    experts = max((obj[k] for k in _EXPERTS[:3] if isinstance(obj.get(k), int)), default=0)
    top_k = obj.get("num_experts_per_tok")
    if experts > 0 and isinstance(top_k, int) and not 1 <= top_k <= experts:
        raise GraphcostError(f"{about} {_field(where, 'num_experts_per_tok')} is {top_k}: "
                             f"it must be from 1 to its {experts:,} experts")


def _field(where: str, key: str | int) -> str:
    """A field's place in the config: ``text_config.num_hidden_layers``, ``sub[0].dim``."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    name = key if re.fullmatch(r"\w{1,40}", key) else _shown(key, 40)
    return f"{where}.{name}" if where else name


def _bad_sizes(value: Any, lo: int, hi: int, whole_floats: bool) -> Iterator[tuple[Any]]:
    """The leaves of a size field's value that are no integer in [lo, hi], each in a tuple
    (a null is fine: transformers' default). ``whole_floats``: 1200.0 is 1200 (a context
    length some configs write as a float)."""
    if isinstance(value, (dict, list)):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _bad_sizes(v, lo, hi, whole_floats)
    elif value is not None:
        number = int(value) if whole_floats and isinstance(value, float) \
            and value.is_integer() else value
        if isinstance(number, bool) or not isinstance(number, int) or not lo <= number <= hi:
            yield (value,)


def _shown(value: Any, limit: int = 60) -> str:
    """A value from the config as JSON spells it, cut to ``limit`` characters."""
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def config_dtype(data: dict[str, Any], about: str) -> str | None:
    """The dtype the config names for the model (``dtype``, or ``torch_dtype`` as older
    configs call it), read from the JSON: asked for ``torch_dtype``, transformers' config logs
    that it is deprecated. None: "auto" or none named (float32)."""
    key = "dtype" if data.get("dtype") is not None else "torch_dtype"
    value = data.get(key)
    if value is None or value == "auto":
        return None
    if isinstance(value, str) and value in DTYPES:
        return value
    raise GraphcostError(f"{about} {key} is {_shown(value)}: a model is built in "
                         f"{', '.join(DTYPES[:-1])} or {DTYPES[-1]} (\"auto\" or none: "
                         "float32)")
