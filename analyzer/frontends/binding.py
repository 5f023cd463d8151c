"""Binding symbolic input dims (batch, sequence length …) to concrete sizes.

Shared by every frontend: the frontend lists its inputs' dims (ints for fixed sizes, strings for
named symbols, None for anonymous ones); this module applies --batch, --dim and --input-shape
and returns concrete shapes or raises a GraphcostError that names the input and the dim.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ...passes.errors import GraphcostError, did_you_mean, opt

RawDim = int | str | None
INT64_MAX = 2 ** 63 - 1  # ONNX dims and element counts are int64


def check_size(value, what: str) -> int:
    """A size the caller binds (batch, a --dim, an input dim): a positive int within int64.
    Strings, floats and bools are refused, not converted (the CLI parses its own text)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise GraphcostError(f"{what} must be a positive integer, got {value!r} "
                             f"({type(value).__name__})")
    if value <= 0:
        raise GraphcostError(f"{what} must be a positive integer, got {value}")
    if value > INT64_MAX:
        raise GraphcostError(f"{what} = {value} does not fit in int64")
    return value


def check_shape(shape, what: str) -> tuple[int, ...]:
    """A whole input shape: a sequence of sizes whose element count fits in int64."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise GraphcostError(f"{what} must be a sequence of sizes, got {shape!r}")
    out = tuple(check_size(d, f"{what} dim {axis}") for axis, d in enumerate(shape))
    if not out:
        raise GraphcostError(f"{what}: an empty shape")
    count = 1
    for d in out:
        count *= d
    if count > INT64_MAX:
        raise GraphcostError(f"{what} {'x'.join(map(str, out))}: its element count "
                             "does not fit in int64")
    return out


def parse_shape(text: str) -> tuple[int, ...]:
    """'1x3x224x224' (or '1,3,224,224') -> (1, 3, 224, 224)."""
    parts = text.replace(",", "x").replace("×", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts if p.strip() != "")
    except ValueError:
        raise GraphcostError(f"bad shape {text!r}: expected sizes like 1x3x224x224") from None
    if not shape or any(d <= 0 for d in shape):
        raise GraphcostError(f"bad shape {text!r}: sizes must be positive integers")
    return check_shape(shape, f"shape {text!r}")


def bind_inputs(inputs: Sequence[tuple[str, Sequence[RawDim]]], *, batch: int | None,
                dims: Mapping[str, int], input_shapes: Mapping[str, Sequence[int]],
                ) -> tuple[dict[str, tuple[int, ...]], dict[str, int], int]:
    """Returns (input name -> concrete shape, symbol -> value, the batch size used)."""
    # the order of the steps is the order the messages promise: the options checked on their
    # own, whole shapes, then the batch, then each input's dims
    shapes = _checked_options(inputs, batch, dims, input_shapes)
    values: dict[str, int] = dict(dims)
    _bind_whole_shapes(inputs, shapes, values)
    used_batch = _bind_batch(inputs, shapes, batch, values)
    bound = {name: tuple(int(x) for x in shapes[name]) if name in shapes
             else _bound_shape(name, shape, values, used_batch) for name, shape in inputs}
    return bound, dict(sorted(values.items())), used_batch


def _checked_options(inputs: Sequence[tuple[str, Sequence[RawDim]]], batch: int | None,
                     dims: Mapping[str, int], input_shapes: Mapping[str, Sequence[int]],
                     ) -> dict[str, tuple[int, ...]]:
    """The options checked against the graph's inputs; returns the checked whole shapes."""
    if batch is not None:
        check_size(batch, opt("batch"))
    for k, v in dims.items():
        check_size(v, opt("dims", k))
    shapes = {k: check_shape(v, opt("input_shapes", k)) for k, v in input_shapes.items()}
    names = {name for name, _ in inputs}
    for name in shapes:
        if name not in names:
            raise GraphcostError(f"{opt('input_shapes')} names no graph input {name!r}; inputs are: "
                                 + ", ".join(sorted(names)))
    symbols = {d for _, shape in inputs for d in shape if isinstance(d, str)}
    for k in dims:
        if k not in symbols:
            known = ", ".join(sorted(symbols)) or "none (every input dim is fixed)"
            raise GraphcostError(f"{opt('dims', k)}: no symbolic dim named {k!r} in the graph inputs"
                                 f"{did_you_mean(k, symbols)}; symbolic dims: {known}")
    return shapes


def _bind_whole_shapes(inputs: Sequence[tuple[str, Sequence[RawDim]]],
                       shapes: Mapping[str, tuple[int, ...]], values: dict[str, int]) -> None:
    """Binds into ``values`` the symbols of the inputs given whole shapes, each checked
    against the graph's rank, fixed dims and the symbol's other bindings."""
    for name, shape in inputs:
        if name not in shapes:
            continue
        given = tuple(shapes[name])
        if len(given) != len(shape):
            raise GraphcostError(f"{opt('input_shapes', name)}: rank {len(given)} given, the graph input "
                                 f"has rank {len(shape)} ({_fmt(shape)})")
        for axis, (d, g) in enumerate(zip(shape, given)):
            if isinstance(d, int) and d != g:
                raise GraphcostError(f"{opt('input_shapes', name)}: dim {axis} is fixed to {d} in the "
                                     f"graph, {g} given")
            if isinstance(d, str):
                old = values.get(d)
                if old is not None and old != g:
                    raise GraphcostError(f"dim {d!r} bound twice: {old} and {g} "
                                         f"({opt('input_shapes', name)})")
                values[d] = g


def _bind_batch(inputs: Sequence[tuple[str, Sequence[RawDim]]],
                shapes: Mapping[str, tuple[int, ...]], batch: int | None,
                values: dict[str, int]) -> int:
    """Binds into ``values`` the symbols leading the other inputs to the batch; returns the
    batch size used (1 when none is given)."""
    used_batch = batch if batch is not None else 1
    batch_symbols = {shape[0] for name, shape in inputs
                     if name not in shapes and shape and isinstance(shape[0], str)}
    for sym in batch_symbols:
        if sym not in values:
            values[sym] = used_batch
        elif batch is not None and values[sym] != batch:
            raise GraphcostError(f"{opt('batch', value=batch)} conflicts with {opt('dims', sym, values[sym])}")
    if batch is not None:
        fixed = [(name, shape[0]) for name, shape in inputs
                 if name not in shapes and shape and isinstance(shape[0], int)
                 and shape[0] != batch]
        if fixed and not batch_symbols:
            name, d = fixed[0]
            raise GraphcostError(
                f"input {name!r} has a fixed batch dimension {d}, so {opt('batch', value=batch)} cannot be "
                f"applied: re-export with a dynamic batch dim (torch.onnx.export(..., "
                f"dynamic_axes={{'{name}': {{0: 'batch'}}}}) or dynamic_shapes=...), or omit {opt('batch')}")
    return used_batch


def _bound_shape(name: str, shape: Sequence[RawDim], values: Mapping[str, int],
                 used_batch: int) -> tuple[int, ...]:
    """Input ``name``'s concrete shape from its dims and the bound symbols."""
    out = []
    for axis, d in enumerate(shape):
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str) and d in values:
            out.append(values[d])
        elif d is None and axis == 0:
            out.append(used_batch)
        elif isinstance(d, str):
            raise GraphcostError(f"input {name!r} dim {axis} is the symbol {d!r} and has no "
                                 f"value: pass {opt('dims', d, 'N')} "
                                 f"(or {opt('input_shapes', name, '...')})")
        else:
            sizes = "x".join("N" if not isinstance(x, int) else str(x) for x in shape)
            raise GraphcostError(f"input {name!r} dim {axis} is unknown in the graph: pass "
                                 + opt("input_shapes", name, sizes))
    count = 1
    for d in out:  # fixed dims may be 0 (an empty tensor); the product must fit int64
        count *= d
    if count > INT64_MAX:
        raise GraphcostError(f"input {name!r} bound to {_fmt(out)}: its element count "
                             "does not fit in int64")
    return tuple(out)


def _fmt(shape: Sequence[RawDim]) -> str:
    return "x".join("?" if d is None else str(d) for d in shape)
