"""analyze()'s arguments checked as the command line checks its options.

Every bad argument is a GraphcostError naming it (``opt``: each face words it), never an
AttributeError or TypeError from deep in a pass: sizes are positive ints within int64 (not "2", True or 2.5), the world size is
within the bound the passes search (passes.parallel.MAX_WORLD), a device is a name or a
DeviceRates with positive rates, an overhead a passes.fits.Overhead (or its command-line
text), a checkpoint plan one of the four forms the CLI builds.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ...passes.caching_allocator import AllocatorConfig
from ...passes.checkpoint import CheckpointSpec
from ...passes.choices import Strategy
from ...passes.errors import GraphcostError, opt

INT64_MAX = 2 ** 63 - 1
CHECKPOINT_KEYS = ("names", "every", "sqrt", "budget")


def check_arguments(*, batch=None, dims=None, input_shapes=None, input_dtypes=None,
                    zoo_exporter: str = "onnx", progress=None, flags: Mapping[str, Any] = {},
                    choices: Mapping[str, tuple[Any, Sequence]] = {}) -> None:
    """Every bad argument is a GraphcostError, validated as the CLI validates its options:
    sizes are positive ints within int64 (not "2", True or 2.5), mappings are mappings."""
    from ..frontends.binding import check_shape, check_size

    if batch is not None:
        check_size(batch, opt("batch"))
    for what, value in (("dims", dims), ("input_shapes", input_shapes),
                        ("input_dtypes", input_dtypes)):
        if value is not None and not isinstance(value, Mapping):
            raise GraphcostError(f"{what} must be a mapping of input or dim names, got "
                                 f"{type(value).__name__}")
        for k in value or ():
            if not isinstance(k, str):
                raise GraphcostError(f"{what}: names must be strings, got {k!r}")
    for k, v in (dims or {}).items():
        check_size(v, opt("dims", k))
    for k, v in (input_shapes or {}).items():
        check_shape(v, opt("input_shapes", k))
    if zoo_exporter not in ("onnx", "fx"):
        raise GraphcostError(f"zoo_exporter must be 'onnx' or 'fx', got {zoo_exporter!r}")
    if progress is not None and not callable(progress):
        raise GraphcostError(f"progress must be callable, got {type(progress).__name__}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise GraphcostError(f"{name} must be True or False, got {value!r}")
    for name, (value, allowed) in choices.items():
        if value not in allowed:
            raise GraphcostError(f"{name} must be one of {', '.join(map(repr, allowed))}, "
                                 f"got {value!r}")


def check_unknown(extra: tuple, unknown: Mapping[str, Any], known: Sequence[str]) -> None:
    """Positional arguments past ``example_inputs`` and keywords analyze does not take."""
    if extra:
        raise GraphcostError(f"analyze takes the model and example_inputs as positional "
                             f"arguments; {len(extra)} more given (pass the rest by name)")
    if unknown:
        raise GraphcostError(f"unknown argument(s) {', '.join(sorted(map(str, unknown)))}; "
                             f"known: {', '.join(k for k in known if not k.startswith('_'))}")


def _positive(value, what: str, integer: bool = False) -> None:
    ok = not isinstance(value, bool) and (isinstance(value, int) or (
        not integer and isinstance(value, float) and math.isfinite(value)))
    if not ok or value <= 0 or value > INT64_MAX:
        raise GraphcostError(f"{what} must be a positive {'integer' if integer else 'number'}"
                             f" within int64, got {value!r}")


def device_of(device):
    """A device name as its DeviceRates; a DeviceRates checked; None as None."""
    from ...passes.roofline import DTYPES, DeviceRates

    if device is None:
        return None
    if isinstance(device, str):
        from .devices import get_device
        return get_device(device)
    if not isinstance(device, DeviceRates):
        raise GraphcostError(f"{opt('device')} must be a device name such as 'a100-40gb' or a "
                             f"passes.roofline.DeviceRates, got {type(device).__name__}")
    rates = device.peak_flops
    if not isinstance(rates, Mapping) or set(rates) - set(DTYPES):
        raise GraphcostError(f"{opt('device')}: peak_flops must map some of {', '.join(DTYPES)} to "
                             f"FLOP/s, got {rates!r}"[:300])
    _positive(rates.get("fp32"), f"{opt('device')} peak_flops['fp32']")
    for k, v in rates.items():
        if v is not None:
            _positive(v, f"{opt('device')} peak_flops[{k!r}]")
    _positive(device.bandwidth, f"{opt('device')} bandwidth")
    _positive(device.memory, f"{opt('device')} memory", integer=True)
    if not isinstance(device.name, str) or not isinstance(device.label, str):
        raise GraphcostError(f"{opt('device')}: name and label must be strings")
    return device


DTYPE_WORDS = ("fp32", "fp16", "bf16")


def check_dtype(dtype, train: bool) -> None:
    """--dtype / dtype=: one of DTYPE_WORDS (or torch's names), for inference and serving."""
    from .resolve import DTYPES

    if dtype is None:
        return
    if not isinstance(dtype, str) or dtype.lower() not in DTYPES:
        raise GraphcostError(f"{opt('dtype', value=str(dtype))}: expected one of "
                             f"{', '.join(DTYPE_WORDS)}")
    if train:
        raise GraphcostError(f"{opt('dtype')} sets the weights for inference and serving; a "
                             f"training step's dtypes are its {opt('precision')} recipe's "
                             "(bf16-true: everything bf16)")


def check_dtype_applies(r, dtype):
    """An ONNX file's dtypes are the file's: --dtype applies to PyTorch models."""
    if dtype is not None and r.kind != "torch":
        raise GraphcostError(f"{opt('dtype')} casts a PyTorch model; {r.name}'s dtypes are "
                             f"the file's (a zoo model: add {opt('zoo_exporter')} to trace "
                             "its PyTorch module)")
    return r


def allocator_of(text) -> AllocatorConfig:
    """The caching allocator's settings, as ``PYTORCH_CUDA_ALLOC_CONF`` spells them
    (``expandable_segments:True,max_split_size_mb:128``; None or "default": PyTorch's
    defaults). Settings the replay does not model are refused, never ignored."""
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "default")):
        return AllocatorConfig()
    if not isinstance(text, str):
        raise GraphcostError(f"{opt('allocator')} must be text such as "
                             f"'expandable_segments:True', got {type(text).__name__}")
    expandable, split = False, None
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (x.strip() for x in part.partition(":"))
        if key == "expandable_segments" and value in ("True", "False"):
            expandable = value == "True"
        elif key == "max_split_size_mb" and value.isdigit() and int(value) > 20:
            split = int(value) << 20  # CUDAAllocatorConfig: at least kLargeBuffer (20 MiB)
        elif key in ("expandable_segments", "max_split_size_mb"):
            raise GraphcostError(f"{opt('allocator')} {part}: expected expandable_segments:True "
                                 "or False, max_split_size_mb: a number of MiB over 20")
        else:
            raise GraphcostError(f"{opt('allocator')} {part}: not modelled (the replay models "
                                 "expandable_segments and max_split_size_mb)")
    return AllocatorConfig(expandable, split)


def overhead_of(overhead):
    """An Overhead checked, its command-line text (``context=1GiB,allocator=5%``) parsed."""
    from ...passes.fits import Overhead

    if overhead is None:
        return None
    if isinstance(overhead, str):
        from .devices import parse_overhead
        return parse_overhead(overhead)
    if not isinstance(overhead, Overhead):
        raise GraphcostError(f"{opt('overhead')} must be a passes.fits.Overhead or text such as "
                             f"'context=512MiB,allocator=10%', got {type(overhead).__name__}")
    c, f = overhead.context_bytes, overhead.allocator_fraction
    if c is not None and (isinstance(c, bool) or not isinstance(c, int)
                          or not 0 <= c <= INT64_MAX):
        raise GraphcostError(f"{opt('overhead')} context_bytes must be an integer ≥ 0 within int64, "
                             f"got {c!r}")
    if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float))
                          or not 0 <= f < 10):
        raise GraphcostError(f"{opt('overhead')} allocator_fraction must be a number in [0, 10), got "
                             f"{f!r}")
    return overhead


def check_checkpoint(checkpoint, train: bool) -> CheckpointSpec | None:
    """One of the forms the CLI builds: {"names": [...]}, {"every": N}, {"sqrt": True},
    {"budget": BYTES}."""
    if checkpoint is None:
        return None
    if not isinstance(checkpoint, Mapping):
        raise GraphcostError(f"checkpoint must be a mapping such as {{'every': 2}}, got "
                             f"{type(checkpoint).__name__}")
    if checkpoint and not train:
        raise GraphcostError(f"checkpoint plans need a training analysis ({opt('train')})")
    unknown = sorted(map(str, set(checkpoint) - set(CHECKPOINT_KEYS)))
    if unknown or len(checkpoint) > 1:
        raise GraphcostError(f"checkpoint takes one of the keys {', '.join(CHECKPOINT_KEYS)}, "
                             f"got {', '.join(unknown) or ', '.join(map(str, checkpoint))}")
    for key, value in checkpoint.items():
        if key == "names" and (isinstance(value, str) or not isinstance(value, Sequence) or
                               not value or not all(isinstance(n, str) and n for n in value)):
            raise GraphcostError(f"checkpoint['names'] must be a list of module paths, got "
                                 f"{value!r}"[:300])
        if key == "every":
            _positive(value, opt("checkpoint.every"), integer=True)
        if key == "budget":
            _positive(value, opt("checkpoint.budget"), integer=True)
        if key == "sqrt" and value is not True:
            raise GraphcostError(f"checkpoint['sqrt'] must be True, got {value!r}")
    if not checkpoint:
        return None
    names = checkpoint.get("names")
    return CheckpointSpec(names=tuple(names) if names else None, every=checkpoint.get("every"),
                          sqrt=bool(checkpoint.get("sqrt")), budget=checkpoint.get("budget"))


_PARALLEL_KEYS = ("strategy", "world_size", "offload", "bucket_cap_mb", "units", "interconnect")


def parallel_spec(parallel, train: bool):
    """``analyze``'s ``parallel`` mapping as the pass's ParallelSpec (checked)."""
    if not parallel:
        return None
    from ...passes.comm import InterconnectRates
    from ...passes.parallel import ParallelSpec, check_spec
    from .devices import get_interconnect

    if not isinstance(parallel, Mapping):
        raise GraphcostError(f"{opt('parallel')}: expected a mapping such as "
                             "{'strategy': 'fsdp', 'world_size': 8}")
    unknown = sorted(map(str, set(parallel) - set(_PARALLEL_KEYS)))
    if unknown:
        raise GraphcostError(f"{opt('parallel')}: unknown key(s) {', '.join(unknown)}; known: "
                             + ", ".join(_PARALLEL_KEYS))
    if "strategy" not in parallel:
        raise GraphcostError(f"{opt('parallel')}: name a strategy: "
                             f"{', '.join(Strategy.words()[:-1])} or {Strategy.FSDP}")
    if not train:
        raise GraphcostError(f"{opt('parallel', value=parallel['strategy'])} divides a training step "
                             f"across ranks: add {opt('train')}")
    if "world_size" not in parallel:
        raise GraphcostError(f"{opt('parallel', value=parallel['strategy'])} needs "
                             f"{opt('parallel.world_size', value='N')} (or auto with {opt('device')})")
    world = parallel["world_size"]
    if world == "auto":
        world = None
    elif isinstance(world, bool) or not isinstance(world, int):
        raise GraphcostError(f"{opt('parallel.world_size', value=world)}: expected a whole number ≥ 1 or auto")
    units, link = parallel.get("units"), parallel.get("interconnect")
    if units is not None and (isinstance(units, str) or not isinstance(units, Sequence)
                              or not all(isinstance(u, str) for u in units)):
        raise GraphcostError(f"{opt('parallel.units')}: expected a list of module paths, got {units!r}"
                             [:300])
    if link is not None and not isinstance(link, (str, InterconnectRates)):
        raise GraphcostError(f"{opt('parallel.interconnect')}: expected a name such as 'nvlink4', got "
                             f"{type(link).__name__}")
    cap = parallel.get("bucket_cap_mb", 25.0)
    if cap is not None:
        _positive(cap, opt("parallel.bucket_cap_mb"))
    spec = ParallelSpec(
        str(parallel["strategy"]), world, parallel.get("offload"),
        float(cap if cap is not None else 25.0), tuple(units) if units else None,
        get_interconnect(link) if isinstance(link, str) else link)
    check_spec(spec)
    return spec
