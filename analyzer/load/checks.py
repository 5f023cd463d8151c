"""A caller's values checked before anything reads them, as the command line checks its options.

Every bad argument is a GraphcostError naming it (``opt``: each face words it), never an
AttributeError or TypeError from deep in a pass: sizes are positive ints within int64 (not
"2", True or 2.5), mappings are mappings, choices are words. A caller's object is never
trusted to behave: ``plain_arguments`` turns every argument into builtins before any check
reads it (an object that raises in __len__, __hash__, __eq__, __repr__ or __iter__ is a bad
argument, named, not an internal error), and messages show values with ``shown``. The
loading options are checked here when they are built (analyzer/load/options.py); the
passes' options in analyzer/app/api_checks.py, with these helpers.
"""
from __future__ import annotations

import functools
import math
import sys
from typing import Any, Callable, Mapping, ParamSpec, Sequence, TypeVar

from ...passes.device.fits import Overhead
from ...passes.device_rates import DeviceRates
from ...passes.errors import GraphcostError, opt
from ...passes.parallel.comm import InterconnectRates
from ..frontends.binding import check_shape, check_size

INT64_MAX = 2 ** 63 - 1
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
    "device": "a device name such as 'a100-40gb' or a passes.device_rates.DeviceRates",
    "device_profile": "the path of a profile graphcost calibrate wrote or a "
                      "passes.device.profile.DeviceProfile",
    "overhead": "a passes.device.fits.Overhead or text such as 'context=512MiB,allocator=10%'",
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
    from os import PathLike

    from ...passes.device.profile import DeviceProfile

    torch = sys.modules.get("torch")  # (a torch dtype implies torch is imported)
    return {"device": (DeviceRates,), "overhead": (Overhead,),
            "device_profile": (DeviceProfile, PathLike),
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
    if word(zoo_exporter) not in ("onnx", "fx"):
        raise GraphcostError(f"zoo_exporter must be 'onnx' or 'fx', got {shown(zoo_exporter)}")
    if progress is not None and not callable(progress):
        raise GraphcostError(f"progress must be callable, got {type(progress).__name__}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise GraphcostError(f"{name} must be True or False, got {shown(value)}")
    for name, (value, allowed) in choices.items():
        said = word(value)
        if not (said is None or type(said) is str) or said not in allowed:
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


def word(value: Any) -> Any:
    """A choice as an exact str (a str subclass's __eq__ never runs); anything else as it is,
    to be refused as no choice."""
    return str.__str__(value) if isinstance(value, str) else value


def positive(value, what: str, integer: bool = False) -> None:
    ok = not isinstance(value, bool) and (isinstance(value, int) or (
        not integer and isinstance(value, float) and math.isfinite(value)))
    if not ok or value <= 0 or value > INT64_MAX:
        raise GraphcostError(f"{what} must be a positive {'integer' if integer else 'number'}"
                             f" within int64, got {shown(value)}")


DTYPE_WORDS = ("fp32", "fp16", "bf16")


def check_dtype(dtype, train: bool) -> None:
    """--dtype / dtype=: one of DTYPE_WORDS (or torch's names), for inference and serving."""
    from .recipes import DTYPES

    if dtype is None:
        return
    dtype = word(dtype)
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
