"""analyze()'s arguments checked as the command line checks its options.

Every bad argument is a GraphcostError naming it (``opt``: each face words it), never an
AttributeError or TypeError from deep in a pass: sizes are positive ints within int64 (not "2", True or 2.5), the world size is
within the bound the passes search (passes.parallel.MAX_WORLD), a device is a name or a
DeviceRates with positive rates, an overhead a passes.fits.Overhead (or its command-line
text), a checkpoint plan one of the four forms the CLI builds. A caller's object is never
trusted to behave: ``plain_arguments`` turns every argument into builtins before any check
reads it (an object that raises in __len__, __hash__, __eq__, __repr__ or __iter__ is a bad
argument, named, not an internal error), and messages show values with ``shown``.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import sys
from types import MappingProxyType
from typing import Any, Callable, Mapping, ParamSpec, Sequence, TypeVar

from ...passes.caching_allocator import AllocatorConfig
from ...passes.checkpoint import CheckpointSpec
from ...passes.choices import Strategy
from ...passes.comm import InterconnectRates
from ...passes.errors import GraphcostError, opt
from ...passes.fits import Overhead
from ...passes.roofline import DeviceRates

INT64_MAX = 2 ** 63 - 1
CHECKPOINT_KEYS = ("names", "every", "sqrt", "budget")
P = ParamSpec("P")
R = TypeVar("R")
_PLAIN = (bool, int, float, str)
# No name, path, device or setting is longer: a 1 MB string would be a 1 MB message
MAX_TEXT = 4096
_NEST = 3   # analyze's arguments nest no deeper: parallel -> units -> a module path
_FLAGS = ("include_inputs", "inplace", "train", "tf32", "what_if", "all_layers")
# what an argument takes, for the message refusing an object of another type
_TAKES = {
    "batch": "a positive integer", "dims": "a mapping of dim names to sizes",
    "input_shapes": "a mapping of input names to shapes",
    "input_dtypes": "a mapping of input names to dtypes",
    "checkpoint": "a mapping such as {'every': 2}",
    "parallel": "a mapping such as {'strategy': 'fsdp', 'world_size': 8}",
    "serve": "a mapping such as {'prompt': 512, 'generate': 128}",
    "device": "a device name such as 'a100-40gb' or a passes.roofline.DeviceRates",
    "overhead": "a passes.fits.Overhead or text such as 'context=512MiB,allocator=10%'",
    **{flag: "True or False" for flag in _FLAGS},
}


def plain_arguments(build: Callable[P, R]) -> Callable[P, R]:
    """``build`` (build_request) called with its keyword arguments made ``plain`` first: the
    checks after it run no code of the caller's."""
    @functools.wraps(build)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        call: Callable[..., R] = build  # (the keywords are the same, their values plain)
        return call(*args, **{k: plain(v, k) for k, v in kwargs.items()})
    return checked


def plain(value: Any, name: str, depth: int = 0) -> Any:
    """``value`` in builtins: a str, int or float (a subclass too: an Enum member) as the exact
    type, a mapping as a dict, a list or tuple as one, item by item. The caller's methods run
    here, once, and what they raise is a GraphcostError naming ``name``; a subclass's own
    methods never run again. Another object is kept where ``name`` takes its type (a
    DeviceRates, an Overhead, a torch dtype) and refused elsewhere."""
    if type(value) is str and len(value) > MAX_TEXT:
        raise GraphcostError(f"{opt(name)}: a text of {len(value):,} characters (at most "
                             f"{MAX_TEXT:,}): {shown(value)}")
    if value is None or type(value) in _PLAIN:
        return value
    try:
        return _plain(value, name, depth)
    except GraphcostError:
        raise
    except Exception as exc:  # the caller's __iter__, __hash__, items()… raised
        raise GraphcostError(f"{opt(name)}: reading the {type(value).__name__} given raised "
                             f"{type(exc).__name__}") from None


def _plain(value: Any, name: str, depth: int) -> Any:
    if isinstance(value, str):  # (str's own method: a copy as an exact str)
        return plain(str.__str__(value), name, depth)
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, _takes_objects(name)):
        return value
    if depth < _NEST and isinstance(value, Mapping):
        return {plain(k, name, depth + 1): plain(v, name, depth + 1)
                for k, v in list(value.items())}
    if depth < _NEST and isinstance(value, (list, tuple)):
        items = [plain(x, name, depth + 1) for x in list(value)]
        return items if isinstance(value, list) else tuple(items)
    if name == "input_dtypes" and depth:  # a dtype is read by its name (str(np.dtype('f2')))
        return plain(str(value), name, depth)
    raise GraphcostError(f"{opt(name)} takes {_TAKES.get(name, 'text or a number')}; got "
                         f"{shown(value)}")


def _takes_objects(name: str) -> tuple[type, ...]:
    """The types beyond builtins ``name`` takes."""
    torch = sys.modules.get("torch")  # (a torch dtype implies torch is imported)
    return {"device": (DeviceRates,), "overhead": (Overhead,),
            "parallel": (InterconnectRates,),
            "input_dtypes": (torch.dtype,) if torch is not None else ()}.get(name, ())


def shown(value: Any, room: int = 60, depth: int = 0) -> str:
    """``value`` for a message, without running the caller's code: a builtin's repr (cut to
    ``room`` characters; a list, tuple or dict item by item), anything else by its type.
    (repr runs an object's own __repr__, which may raise; a 1 MB string's repr is 1 MB; an
    int of 5,000 digits has none.)"""
    kind = type(value)
    if kind is str:
        text = repr(value[:room + 1])
    elif kind is int and value.bit_length() > 200:
        text = f"an integer of {value.bit_length()} bits"
    elif value is None or kind in _PLAIN:
        text = repr(value)
    elif kind in (list, tuple, dict) and depth == 0:
        pairs = list(value.items()) if isinstance(value, dict) else None
        parts = [f"{shown(k, 20, 1)}: {shown(v, 20, 1)}" for k, v in pairs[:6]] if pairs \
            is not None else [shown(x, 20, 1) for x in value[:6]]
        more = ", …" if len(value) > 6 else ""
        ends = {list: "[]", tuple: "()", dict: "{}"}[kind]
        text = ends[0] + ", ".join(parts) + more + ends[1]
    else:
        text = f"an object of type {kind.__name__}"
    return text if len(text) <= room else text[:room - 1] + "…"


def check_arguments(*, batch=None, dims=None, input_shapes=None, input_dtypes=None,
                    zoo_exporter: str = "onnx", progress=None, flags: Mapping[str, Any] = {},
                    choices: Mapping[str, tuple[Any, Sequence]] = {}) -> None:
    """Every bad argument is a GraphcostError, validated as the CLI validates its options:
    sizes are positive ints within int64 (not "2", True or 2.5), mappings are mappings."""
    from ..frontends.binding import check_shape, check_size

    if batch is not None:
        check_size(_int(batch, opt("batch")), opt("batch"))
    dims, input_shapes = plain(dims, "dims"), plain(input_shapes, "input_shapes")
    for what, value in (("dims", dims), ("input_shapes", input_shapes),
                        ("input_dtypes", plain(input_dtypes, "input_dtypes"))):
        if value is not None and not isinstance(value, Mapping):
            raise GraphcostError(f"{what} must be a mapping of input or dim names, got "
                                 f"{type(value).__name__}")
        for k in value or ():
            if not isinstance(k, str):
                raise GraphcostError(f"{what}: names must be strings, got {shown(k)}")
    for k, v in (dims or {}).items():
        check_size(_int(v, opt("dims", k)), opt("dims", k))
    for k, v in (input_shapes or {}).items():
        if isinstance(v, (list, tuple)):  # (the sizes' own message: check_shape's)
            v = [_int(d, f"{opt('input_shapes', k)} dim {axis}") for axis, d in enumerate(v)]
        else:
            raise GraphcostError(f"{opt('input_shapes', k)} must be a sequence of sizes, got "
                                 f"{shown(v)}")
        check_shape(v, opt("input_shapes", k))
    if _word(zoo_exporter) not in ("onnx", "fx"):
        raise GraphcostError(f"zoo_exporter must be 'onnx' or 'fx', got {shown(zoo_exporter)}")
    if progress is not None and not callable(progress):
        raise GraphcostError(f"progress must be callable, got {type(progress).__name__}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise GraphcostError(f"{name} must be True or False, got {shown(value)}")
    for name, (value, allowed) in choices.items():
        word = _word(value)
        if not (word is None or type(word) is str) or word not in allowed:
            raise GraphcostError(f"{name} must be one of {', '.join(map(repr, allowed))}, "
                                 f"got {shown(value)}")


def _int(value: Any, what: str) -> Any:
    """A size as an exact int for check_size, which words the message about a builtin; any
    other object is refused here, as check_size's message would run its __repr__."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = int.__index__(value)  # (int's own: an IntEnum or a subclass as an exact int)
        if value.bit_length() > 64:   # (str() of an int past 4,300 digits raises)
            raise GraphcostError(f"{what} = {shown(value)} does not fit in int64")
        return value
    raise GraphcostError(f"{what} must be a positive integer, got {shown(value)} "
                         f"({type(value).__name__})")


def _word(value: Any) -> Any:
    """A choice as an exact str (a str subclass's __eq__ never runs); anything else as it is,
    to be refused as no choice."""
    return str.__str__(value) if isinstance(value, str) else value


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
                             f" within int64, got {shown(value)}")


def device_of(device):
    """A device name as its DeviceRates; a DeviceRates checked (its rates, bandwidth and memory
    as builtins: the passes compare them); None as None."""
    from ...passes.roofline import DTYPES

    if device is None:
        return None
    if isinstance(device, str):
        from .devices import get_device
        return get_device(_word(device))
    if not isinstance(device, DeviceRates):
        raise GraphcostError(f"{opt('device')} must be a device name such as 'a100-40gb' or a "
                             f"passes.roofline.DeviceRates, got {type(device).__name__}")
    rates = plain(device.peak_flops, "device")
    if not isinstance(rates, Mapping) or set(rates) - set(DTYPES):
        raise GraphcostError(f"{opt('device')}: peak_flops must map some of {', '.join(DTYPES)} to "
                             f"FLOP/s, got {shown(rates, 200)}")
    _positive(rates.get("fp32"), f"{opt('device')} peak_flops['fp32']")
    for k, v in rates.items():
        if v is not None:
            _positive(v, f"{opt('device')} peak_flops[{k!r}]")
    bandwidth, memory = plain(device.bandwidth, "device"), plain(device.memory, "device")
    _positive(bandwidth, f"{opt('device')} bandwidth")
    _positive(memory, f"{opt('device')} memory", integer=True)
    if not isinstance(device.name, str) or not isinstance(device.label, str):
        raise GraphcostError(f"{opt('device')}: name and label must be strings")
    return dataclasses.replace(device, peak_flops=MappingProxyType(rates), bandwidth=bandwidth,
                               memory=memory, name=_word(device.name),
                               label=_word(device.label))


DTYPE_WORDS = ("fp32", "fp16", "bf16")


def check_dtype(dtype, train: bool) -> None:
    """--dtype / dtype=: one of DTYPE_WORDS (or torch's names), for inference and serving."""
    from .resolve import DTYPES

    if dtype is None:
        return
    dtype = _word(dtype)
    if not isinstance(dtype, str) or dtype.lower() not in DTYPES:
        said = dtype[:60] if isinstance(dtype, str) else shown(dtype)
        raise GraphcostError(f"{opt('dtype', value=said)}: expected one of "
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
    text = _word(text)
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
            raise GraphcostError(f"{opt('allocator')} {part[:80]}: expected expandable_segments:True "
                                 "or False, max_split_size_mb: a number of MiB over 20")
        else:
            raise GraphcostError(f"{opt('allocator')} {part[:80]}: not modelled (the replay models "
                                 "expandable_segments and max_split_size_mb)")
    return AllocatorConfig(expandable, split)


def overhead_of(overhead):
    """An Overhead checked (its figures as builtins), its command-line text
    (``context=1GiB,allocator=5%``) parsed."""
    if overhead is None:
        return None
    if isinstance(overhead, str):
        from .devices import parse_overhead
        return parse_overhead(_word(overhead))
    if not isinstance(overhead, Overhead):
        raise GraphcostError(f"{opt('overhead')} must be a passes.fits.Overhead or text such as "
                             f"'context=512MiB,allocator=10%', got {type(overhead).__name__}")
    c, f = plain(overhead.context_bytes, "overhead"), plain(overhead.allocator_fraction, "overhead")
    if c is not None and (isinstance(c, bool) or not isinstance(c, int)
                          or not 0 <= c <= INT64_MAX):
        raise GraphcostError(f"{opt('overhead')} context_bytes must be an integer ≥ 0 within int64, "
                             f"got {shown(c)}")
    if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float))
                          or not 0 <= f < 10):
        raise GraphcostError(f"{opt('overhead')} allocator_fraction must be a number in [0, 10), got "
                             f"{shown(f)}")
    return dataclasses.replace(overhead, context_bytes=c, allocator_fraction=f)


def check_checkpoint(checkpoint, train: bool) -> CheckpointSpec | None:
    """One of the forms the CLI builds: {"names": [...]}, {"every": N}, {"sqrt": True},
    {"budget": BYTES}."""
    checkpoint = plain(checkpoint, "checkpoint")
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
                                 f"{shown(value, 200)}")
        if key == "every":
            _positive(value, opt("checkpoint.every"), integer=True)
        if key == "budget":
            _positive(value, opt("checkpoint.budget"), integer=True)
        if key == "sqrt" and value is not True:
            raise GraphcostError(f"checkpoint['sqrt'] must be True, got {shown(value)}")
    if not checkpoint:
        return None
    names = checkpoint.get("names")
    return CheckpointSpec(names=tuple(names) if names else None, every=checkpoint.get("every"),
                          sqrt=bool(checkpoint.get("sqrt")), budget=checkpoint.get("budget"))


_PARALLEL_KEYS = ("strategy", "world_size", "offload", "bucket_cap_mb", "units", "interconnect")


def parallel_spec(parallel, train: bool):
    """``analyze``'s ``parallel`` mapping as the pass's ParallelSpec (checked)."""
    parallel = plain(parallel, "parallel")
    if not parallel:
        return None
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
        raise GraphcostError(f"{opt('parallel.units')}: expected a list of module paths, got "
                             f"{shown(units, 200)}")
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
