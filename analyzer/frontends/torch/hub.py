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

The config is data from elsewhere, checked before transformers (or torch) is imported
(config_json.py); the class it names must be a model class before it is called. A hub id and its
revision are checked as the hub checks them before the cache is read (a revision is a path
under the cache's ``refs``).
"""
from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ....passes.errors import GraphcostError, first_line
from .config_json import ONLY_MODELS, config_dtype, read_config
from .optional_imports import check_transformers_companions

# ORG/NAME[@REV]: the shape of a hub id, which sends a name here; config_file then checks the
# id and the revision as the hub does
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}(@[\w./-]+)?")
# A revision: a commit hash, or a branch or tag name (refs/pr/1). huggingface_hub reads a
# name's commit from the file refs/REVISION in its cache, so a part may not start with '.'
# ('..' climbed out of the cache), be empty or make the path absolute
REVISION = re.compile(r"[\w-][\w.-]*(/[\w-][\w.-]*)*", re.ASCII)
# a missing file of these kinds is a path that is wrong, not a hub id
FILE_SUFFIXES = frozenset({".onnx", ".pt2", ".py", ".json", ".pt", ".pth", ".bin", ".ckpt",
                           ".safetensors"})
# the sequence a decoder is analyzed at by default (--dim seq), capped by its context length
# the modules transformers' model classes live in (its private index of lazy names says)
MODELING = re.compile(r"(transformers\.)?models\.(?!auto\.)\w+\.modeling_\w+")
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
    _check_hub_id(text, repo, revision)
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
                             "only its config.json, or pass a local config.json or a folder "
                             "holding one") from None
    except (RepositoryNotFoundError, EntryNotFoundError):
        raise GraphcostError(f"{text}: no such model on the hub (or it has no config.json)") \
            from None
    except Exception as exc:  # noqa: BLE001 - the hub client's network errors, one line
        raise GraphcostError(f"{text}: could not fetch config.json ({type(exc).__name__}: "
                             f"{first_line(exc)})") from None
    finally:
        hub_logging.set_verbosity(verbosity)


def _check_hub_id(text: str, repo: str, revision: str) -> None:
    """The id and the revision as the hub checks them, before its cache is read: the cache
    takes each for part of a path."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise GraphcostError(f"{text}: not a hub id ({exc})") from None
    if revision and not (len(revision) <= 128 and REVISION.fullmatch(revision)
                         and ".." not in revision and not revision.endswith((".", ".lock"))):
        raise GraphcostError(f"{text}: {revision!r} is no revision: a commit hash, or a branch "
                             "or tag name of letters, digits and '-_./' with no part that is "
                             "empty or starts with '.'")


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


def build(text: str) -> tuple[Any, Any, Any, str]:
    """(the model on the meta device, its config, its torch dtype, where that came from)."""
    path = config_file(text)
    data = read_config(path, text)
    about = f"{text}: {path.name}'s"  # (the messages' subject)
    dtype_name = config_dtype(data, about)
    try:
        import transformers  # (not torch yet: its import is lazy)
        _refuse_other_exports(transformers, data["architectures"][0], about)
        import torch
    except ImportError:
        raise GraphcostError(f"{text} needs transformers (pip install 'graphcost[hf]')") \
            from None
    with _quiet(transformers):
        cls = _model_class(transformers, data, text, about)
        # transformers' config takes "auto" for a torch attribute's name: said "auto", it is
        # told none (the model is built in the default dtype)
        unset = {k: None for k in ("dtype", "torch_dtype") if data.get(k) == "auto"}
        try:
            config = transformers.AutoConfig.from_pretrained(str(path), **unset)
        except Exception as exc:  # noqa: BLE001 - transformers' config errors, one line
            raise GraphcostError(f"{text}: transformers cannot read its config "
                                 f"({type(exc).__name__}: {first_line(exc)})") from None
        _no_cache(transformers, config)
        dtype = getattr(torch, dtype_name) if dtype_name else torch.float32
        source = "config.json" if dtype_name else "default"
        if "auto_map" in data:   # (the model line names the class and where the dtype came from)
            source += f"; transformers' own {cls.__name__}, not the repository's code"
        try:
            with torch.device("meta"):
                model = _parameters_on_meta(cls(config).to(dtype).eval())
        except Exception as exc:  # noqa: BLE001 - a model that cannot be built from its config
            raise GraphcostError(f"{text}: building {cls.__name__} from its config failed "
                                 f"({type(exc).__name__}: {first_line(exc)})") from None
    return model, config, dtype, source


def _no_cache(transformers, config) -> None:
    """A training or prefill trace returns no cache: ``use_cache`` off in the config and in
    each config it holds (Gemma 3's text_config, T5Gemma's encoder and decoder), which its
    inner models read (transformers_tracing.call_defaults passes no ``use_cache`` to a
    model whose config has it off)."""
    config.use_cache = False
    for sub in vars(config).values():
        if isinstance(sub, transformers.PretrainedConfig) and hasattr(sub, "use_cache"):
            sub.use_cache = False


def _parameters_on_meta(model):
    """``model`` with every parameter on the meta device: a model's own init may make one on
    the CPU whatever the device context says (DiffLlama's ``nn.Parameter(torch.normal(0, std,
    size=…))``: torch.normal of two floats ignores it), and a training trace then failed
    copying its gradient out of meta ("Cannot copy out of meta tensor"). A parameter held
    under two names stays one."""
    import torch

    moved: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and not p.is_meta:
                if id(p) not in moved:
                    moved[id(p)] = torch.nn.Parameter(p.to("meta"), p.requires_grad)
                module._parameters[name] = moved[id(p)]
    return model


def _refuse_other_exports(transformers, name: str, about: str) -> None:
    """``name`` refused, unimported, where transformers' index of its lazy names places it
    outside its modelling modules (Trainer, TextStreamer, GenerationConfig): before torch is
    imported, so that such a refusal takes no longer than the others. The index is private;
    without it _model_class's check alone decides."""
    index = vars(transformers).get("_class_to_module")
    where = index.get(name) if isinstance(index, dict) else None
    if isinstance(where, str) and not MODELING.fullmatch(where):
        raise GraphcostError(f"{about} architectures names {name}, transformers' "
                             f"{where.removeprefix('transformers.')}.{name}, not a model "
                             f"class: {ONLY_MODELS}")


def _model_class(transformers, data: dict[str, Any], text: str, about: str) -> type:
    """The model class ``architectures`` names, found without calling anything: graphcost
    calls it with the config, and transformers exports set_seed, Trainer and pipeline beside
    its models; the object found must be a PreTrainedModel subclass."""
    name = data["architectures"][0]
    try:
        cls = getattr(transformers, name, None)
    except Exception as exc:  # noqa: BLE001 - its module failed to import, one line
        check_transformers_companions(text)  # (the usual cause: optional_imports)
        raise GraphcostError(f"{text}: transformers cannot import {name} "
                             f"({type(exc).__name__}: {first_line(exc)})") from None
    if "auto_map" in data and (cls is None or data.get("model_type")
                               not in transformers.CONFIG_MAPPING):
        raise GraphcostError(f"{text}: the model needs its repository's own Python code "
                             "(auto_map, trust_remote_code), which graphcost never runs, and "
                             f"transformers {transformers.__version__} has no class of its own "
                             f"for model_type {data.get('model_type')!r}")
    if cls is None:
        raise GraphcostError(f"{text}: transformers {transformers.__version__} has no class "
                             f"{name!r}")
    if not (inspect.isclass(cls) and issubclass(cls, transformers.PreTrainedModel)):
        raise GraphcostError(f"{about} architectures names {name}, not a model class: "
                             f"{ONLY_MODELS}")
    return cls


@contextmanager
def _quiet(transformers) -> Iterator[None]:
    """transformers' log lines (below errors) and Python warnings held back while it reads the
    config and builds the model, as they were after: a config's deprecated or unusual fields
    (torch_dtype, rope parameters, token ids past the vocabulary) each logged a line ahead of
    the report or of graphcost's one line of error."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
