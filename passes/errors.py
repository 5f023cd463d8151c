"""The one exception type the user sees. The CLI prints its message as one line, exit 2.

An error about an option of the request carries it: the message names it with ``opt(name,
key, value)`` (``opt("dims", "seq", 0)``) instead of any face's spelling of it, and each face
words it — the API in its argument names (``dims={'seq': 0}``, what ``str(exc)`` gives), the
command line as its flags (``--dim seq=0``, analyzer/cli/wording.py). ``exc.about`` lists
the options an error is about.
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable

_MARK, _SEP = "\x1e", "\x1f"   # ASCII record and unit separators: never in a message's prose
_MARKED = re.compile(f"{_MARK}([^{_MARK}{_SEP}]*){_SEP}([^{_MARK}{_SEP}]*){_SEP}([^{_MARK}]*){_MARK}")


@dataclass(frozen=True)
class Option:
    """An option of the request, by its name there (``batch``, ``dims``,
    ``parallel.world_size``, ``serve.prompt``), with the key and the value the message
    names (``dims`` ``seq`` ``0``; either may be absent)."""
    name: str
    key: str | None = None
    value: str | None = None


def opt(name: str, key: object = None, value: object = None) -> str:
    """The option ``name`` (with ``key`` and ``value`` when the message names them) inside a
    message, for each face to word."""
    k = "" if key is None else str(key)
    v = "" if value is None else str(value)
    return f"{_MARK}{name}{_SEP}{k}{_SEP}{v}{_MARK}"


# options the API spells other than by their name and value
_API_SPELLED = {"checkpoint.every": "checkpoint={'every': N}",
                "checkpoint.budget": "checkpoint={'budget': BYTES}", "train": "train=True",
                "zoo_exporter": "zoo_exporter='fx'", "device_spec": "device"}


def worded(text: str, word: Callable[[Option], str]) -> str:
    """``text`` with each option ``opt`` marked in it as ``word`` spells it (a face's words
    for a message or any other text that names options)."""
    return _MARKED.sub(lambda m: word(Option(m[1], m[2] or None, m[3] or None)), text)


def api_word(o: Option) -> str:
    """An option as the Python API names it: its argument, and the key or value given."""
    if o.name in _API_SPELLED:
        return _API_SPELLED[o.name] + (f" {o.value}" if o.value is not None else "")
    head, _, field = o.name.partition(".")
    if o.key is not None and o.value is not None:
        if head == "input_shapes":
            return f"{head}={{{o.key!r}: ({o.value})}}"
        if head == "input_dtypes":
            return f"{head}={{{o.key!r}: {o.value!r}}}"
        return f"{head}={{{o.key!r}: {o.value}}}"
    if o.key is not None:
        return f"{head}[{o.key!r}]" if not field else f"{head}[{field!r}] entry {o.key!r}"
    if field:
        at = f"{head}[{field!r}]"
        if o.value is None:
            return at
        quoted = head == "parallel" and field in ("offload", "interconnect")
        return f"{at}={o.value!r}" if quoted else f"{at}={o.value}"
    if o.value is None:
        return head
    if head == "parallel":   # (a mesh's words, "dp_shard=2,ep=2", else a strategy's)
        key = "mesh" if "=" in o.value else "strategy"
        return f"parallel={{{key!r}: {o.value!r}}}"
    return f"{head}={o.value}" if head == "batch" else f"{head} {o.value}"


class GraphcostError(Exception):
    """Bad input or an analysis that cannot proceed; the message says what and how to fix it,
    in the API's words (``worded`` gives another face's)."""

    @property
    def about(self) -> tuple[Option, ...]:
        """The options this error is about."""
        return tuple(Option(n, k or None, v or None) for n, k, v in _MARKED.findall(self.raw))

    @property
    def raw(self) -> str:
        """The message with its options marked (to build another message around it)."""
        return str(self.args[0]) if self.args else ""

    def worded(self, word: Callable[[Option], str]) -> str:
        return worded(self.raw, word)

    def __str__(self) -> str:
        return self.worded(api_word)


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """An exception's message in one line: its first non-empty one (a library's message may
    start with a newline: transformers' ImportErrors do), cut at ``limit`` characters; ""
    for an empty message."""
    line = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return line[:limit] if limit is not None else line


def did_you_mean(word: str, known: Iterable[str], template: str = "{}") -> str:
    """`` (did you mean X?)`` naming the known names closest to ``word`` (difflib), or "" when
    none is close. Case is ignored (``ResNet50`` finds ``resnet50``): a name typed from a paper
    or a README is often capitalized. Only the names about as close as the best are offered,
    so a one-letter slip gets one answer. ``template`` writes a name as the user would type it
    (``zoo:{}``, ``--{}``)."""
    by_lower: dict[str, str] = {}
    for name in known:
        by_lower.setdefault(name.lower(), name)
    key = word.lower()
    scored = sorted(((difflib.SequenceMatcher(None, key, k).ratio(), k) for k in by_lower),
                    reverse=True) or [(0.0, "")]
    # 0.5 as analyzer/app/devices.py: `--dim sequence` still finds `seq`
    close = [k for r, k in scored if r >= 0.5 and r >= scored[0][0] - 0.1][:3]
    if not close:
        return ""
    return f" (did you mean {' or '.join(template.format(by_lower[c]) for c in close)}?)"
