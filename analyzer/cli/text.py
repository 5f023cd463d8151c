"""Terminal-safe text. Names come from the model file (node, value, dim and module names):
they are data and never reach a terminal as control characters — an ESC byte would be a
terminal escape sequence, a newline would break the one-line error or forge a table row."""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, TypeVar

from ..render.cells import one_line

_T = TypeVar("_T")


def escape(text: str) -> str:
    """Every non-printable character (controls, line and paragraph separators, bidi and other
    format characters) as a visible escape: '\\x1b', '\\n', '\\u202e'. Printable text, including
    any script, is unchanged (render/cells.one_line, which the files' renderers use too)."""
    return one_line(text)


def escape_strings(obj: _T) -> _T:
    """``obj`` with every string inside it escaped: frozen dataclasses (a Report, a diff), tuples,
    lists and mappings are rebuilt only where something changed."""
    return _escaped(obj)


_LEAVES = frozenset({int, float, bool, type(None)})  # most of a report: returned at once
_INIT_FIELDS: dict[type, tuple[str, ...]] = {}       # a dataclass type's init fields


def _init_fields(cls: type) -> tuple[str, ...]:
    names = _INIT_FIELDS.get(cls)
    if names is None:
        names = _INIT_FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return names


def _escaped(obj: Any) -> Any:  # escape_strings: an object of the same type comes back
    if type(obj) in _LEAVES:
        return obj
    if isinstance(obj, str):
        return escape(obj)
    if isinstance(obj, (tuple, list)):
        items = [_escaped(x) for x in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        return type(obj)(items) if isinstance(obj, list) or type(obj) is tuple else \
            type(obj)(*items)  # a named tuple
    if isinstance(obj, (dict, MappingProxyType)):
        pairs = [(_escaped(k), _escaped(v)) for k, v in obj.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, obj.items())):
            return obj
        out = dict(pairs)
        return MappingProxyType(out) if isinstance(obj, MappingProxyType) else out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changed = {}
        for name in _init_fields(type(obj)):
            value = getattr(obj, name)
            new = _escaped(value)
            if new is not value:
                changed[name] = new
        return dataclasses.replace(obj, **changed) if changed else obj
    return obj
