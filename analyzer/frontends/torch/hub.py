"""Models named as users name them: a Hugging Face hub id (``ORG/NAME``, optionally
``@REVISION``), a local ``config.json`` or a local snapshot folder holding one.

Only ``config.json`` is read — through huggingface_hub's download and cache for a hub id, so
``HF_HOME`` and ``HF_HUB_OFFLINE`` are honoured; never a weight file. The model is the class
the config's ``architectures`` names, built by transformers on the meta device (no weight
memory) in the config's own dtype, and traced like any module. graphcost runs no code from a
model repository: a config whose ``auto_map`` points at the repository's own modelling code
is built with transformers' class for its ``model_type`` where transformers has one (Phi-3
and DeepSeek-V2 still ship ``auto_map`` though transformers builds them natively; the model
line says so), and refused where it has none.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ....passes.errors import GraphcostError

# ORG/NAME[@REV]: the hub's repository id grammar (letters, digits, '-', '_', '.')
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}(@[\w./-]{1,128})?")
# a missing file of these kinds is a path that is wrong, not a hub id
FILE_SUFFIXES = frozenset({".onnx", ".pt2", ".py", ".json", ".pt", ".pth", ".bin", ".ckpt",
                           ".safetensors"})
# the sequence a decoder is analyzed at by default (--dim seq), capped by its context length
DECODER_SEQ, ENCODER_SEQ = 2048, 512


def is_hub_name(text: str) -> bool:
    """A hub id, or a local config.json / snapshot folder (a path that exists)."""
    path = Path(text)
    if path.is_dir():
        return (path / "config.json").is_file()
    if path.is_file():
        return path.suffix == ".json"
    return HUB_ID.fullmatch(text) is not None and path.suffix.lower() not in FILE_SUFFIXES


def config_file(text: str) -> Path:
    """The config.json that ``text`` names: local, or from the hub cache (fetched if online)."""
    path = Path(text)
    if path.is_dir():
        return path / "config.json"
    if path.is_file():
        return path
    repo, _, revision = text.partition("@")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )
    from huggingface_hub.utils import logging as hub_logging

    # The client logs each retry of a failed request ("Retrying in 1s [Retry 1/5]"): graphcost
    # says one line when it gives up (below), so only the client's errors are let through.
    verbosity = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()
    try:
        return Path(hf_hub_download(repo, "config.json", revision=revision or None,
                                    local_files_only=not _hub_host_resolves()))
    except GatedRepoError:
        raise GraphcostError(f"{repo}: a gated repository: accept its licence on the hub and "
                             "log in (huggingface-cli login), or pass a local config.json") from None
    except LocalEntryNotFoundError:
        raise GraphcostError(f"{text}: not in the local Hugging Face cache and the hub cannot "
                             "be reached (or HF_HUB_OFFLINE is set); online graphcost fetches "
                             "only its config.json") from None
    except (RepositoryNotFoundError, EntryNotFoundError):
        raise GraphcostError(f"{text}: no such model on the hub (or it has no config.json)") \
            from None
    except Exception as exc:  # noqa: BLE001 - the hub client's network errors, one line
        raise GraphcostError(f"{text}: could not fetch config.json ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    finally:
        hub_logging.set_verbosity(verbosity)


def _hub_host_resolves() -> bool:
    """Whether the hub's host name has an address. Without one (no network, no DNS) the hub
    client retries a config it has not cached for 23 s (1 + 2 + 4 + 8 + 8) before it gives up;
    told to use its cache only, it reads a cached config at once or fails as offline does."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname
    if constants.HF_HUB_OFFLINE or not host:  # offline: the client reads its cache itself
        return True
    try:
        return bool(socket.getaddrinfo(host, 443))
    except OSError:  # socket.gaierror: the name does not resolve
        return False


def read_config(path: Path, name: str) -> dict[str, Any]:
    """config.json as data, checked for what graphcost needs before transformers sees it."""
    try:
        if path.stat().st_size > 4 << 20:
            raise GraphcostError(f"{name}: {path.name} is over 4 MiB; not a model config")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GraphcostError(f"{name}: {path.name} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise GraphcostError(f"{name}: {path.name} is not a JSON object")
    archs = data.get("architectures")
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
        raise GraphcostError(f"{name}: {path.name} has no 'architectures': it does not say "
                             "which model class to build")
    return data


def build(text: str) -> tuple[Any, Any, Any, str]:
    """(the model on the meta device, its config, its torch dtype, where that came from)."""
    path = config_file(text)
    data = read_config(path, text)
    try:
        import torch
        import transformers
    except ImportError:
        raise GraphcostError(f"{text} needs transformers (pip install 'graphcost[hf]')") \
            from None
    cls = getattr(transformers, data["architectures"][0], None)
    if "auto_map" in data and (cls is None or data.get("model_type")
                               not in transformers.CONFIG_MAPPING):
        raise GraphcostError(f"{text}: the model needs its repository's own Python code "
                             "(auto_map, trust_remote_code), which graphcost never runs, and "
                             f"transformers {transformers.__version__} has no class of its own "
                             f"for model_type {data.get('model_type')!r}")
    if cls is None:
        raise GraphcostError(f"{text}: transformers {transformers.__version__} has no class "
                             f"{data['architectures'][0]!r}")
    try:
        config = transformers.AutoConfig.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - transformers' config errors, one line
        raise GraphcostError(f"{text}: transformers cannot read its config "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    config.use_cache = False  # a training or prefill trace returns no cache
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    source = "config.json" if isinstance(dtype, torch.dtype) else "default"
    if "auto_map" in data:   # (the model line names the class and where the dtype came from)
        source += f"; transformers' own {cls.__name__}, not the repository's code"
    dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
    try:
        with torch.device("meta"):
            model = cls(config).to(dtype).eval()
    except Exception as exc:  # noqa: BLE001 - a model that cannot be built from its config
        raise GraphcostError(f"{text}: building {cls.__name__} from its config failed "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0]})") from None
    return model, config, dtype, source


def input_shapes(config, batch: int, dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """The inputs a model of this config takes by default: pixel values at the config's image
    size for vision models, else token ids of ``seq`` (a decoder 2048, others 512, at most
    the model's context length)."""
    image = getattr(config, "image_size", None)
    if isinstance(image, int):
        channels = getattr(config, "num_channels", 3)
        return {"pixel_values": (batch, channels, image, image)}
    limit = getattr(config, "max_position_embeddings", None) or DECODER_SEQ
    default = DECODER_SEQ if getattr(config, "is_decoder", False) or _causal(config) \
        else ENCODER_SEQ
    seq = dims.get("seq", min(default, limit))
    return {"input_ids": (batch, seq)}


def _causal(config) -> bool:
    return any(a.endswith("ForCausalLM") for a in getattr(config, "architectures", None) or ())
