"""A model named by text, checked before anything reads, imports or probes it: its length,
its characters, the file system's own limits, and whether it is ``path/to/file.py:Class``
(importing that runs the file, so only an unmistakable spec is one)."""
from __future__ import annotations

import errno
import os

from ...passes.errors import GraphcostError

# Linux's PATH_MAX: a longer model name is no path, zoo name or hub id (a 1 MB one made each
# file system call fail with ENAMETOOLONG, an OSError no check expected)
PATH_MAX = 4096


def model_text(model: str | os.PathLike) -> str:
    """A model named by text or a path object, as a plain str; anything no path can be is
    refused here, before a file system call, an import or the caller's own methods (a str
    subclass's) could run on it."""
    try:
        text = os.fspath(model)
    except Exception as exc:  # the caller's __fspath__ raised, or returned neither str nor bytes
        raise GraphcostError(f"model: os.fspath() on the {type(model).__name__} failed "
                             f"({type(exc).__name__})") from None
    if isinstance(text, bytes):
        raise GraphcostError("pass the model path as str, not bytes")
    text = str.__str__(text)  # an exact str: a subclass's own methods never run on it
    if len(text) > PATH_MAX:
        raise GraphcostError(f"model: a name of {len(text):,} characters is no path, zoo name "
                             f"or hub id (paths are at most {PATH_MAX})")
    if "\0" in text:
        raise GraphcostError("model: a name with a NUL character is no path")
    try:
        os.stat(text)
    except OSError as exc:  # a part past NAME_MAX (255 bytes) fails every later probe
        if exc.errno == errno.ENAMETOOLONG:
            raise GraphcostError(f"model: {text[:60]}…: {exc.strerror}") from None
    return text


def file_class(text: str) -> tuple[str, str] | None:
    """(file, class) when ``text`` is ``path/to/file.py:Class``, else None. Importing the file
    runs it, so only an unmistakable spec is one: the text as a whole names no existing file
    (``models.py:v2/model.onnx`` may be a folder's ONNX file: it is read, never imported), the
    part before the last ':' ends in .py and the part after is a Python identifier (the
    class is looked up by that name in the module; ``x.py:y.onnx`` is no class)."""
    path, sep, name = text.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier() \
            or os.path.lexists(text):
        return None
    return path, name


def not_a_class(text: str) -> str:
    """The hint for a missing file that reads as file.py:SOMETHING: why it was not imported."""
    path, sep, name = text.rpartition(":")
    if sep and path.endswith(".py") and not name.isidentifier():
        return f" (nor file.py:Class: {name[:60]!r} is no class name, so it was not imported)"
    return ""
