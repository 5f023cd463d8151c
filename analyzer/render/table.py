"""Terminal tables that fit the terminal they are printed on.

Numbers are never cut: a numeric column is as wide as its widest cell. A column may first
abbreviate its cells (ATen ops without ``aten.``; a node name without the op type it ends
with). Then whole columns go before any text is cut: the optional ones, lowest priority first,
while the rest does not fit at its natural widths (issue 26: a shape column dropped rather
than every name cut) — unless even without all of them it would not fit, when only as many go
as the minimum widths need. Text columns (node names, op types, shapes) then share what is
left by priority, down to a minimum width; a text that does not fit is shortened in the middle
(``1×64…6×56``), or, for names (``keep_end``), at its start, keeping the informative end
(``…layer1.0/conv2``). A prose column wraps between words instead of being cut.
Every table here (the node table, op types, modules, diff and verify) goes through ``fit``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable

ELLIPSIS = "…"
SEP = 2            # columns are separated by two spaces (rich box=None, padding (0, 1))


@dataclass(frozen=True)
class Col:
    header: str
    numeric: bool = False       # right-aligned, never cut
    min_width: int = 6          # text: the narrowest it may be squeezed to
    priority: int = 0           # text: higher keeps more width; optional: dropped last
    optional: bool = False      # may be dropped when the table cannot fit
    # text: a shorter spelling of the same cell, used before anything is cut or dropped
    # (an ATen op without its namespace and default overload: ``aten.relu.default`` → ``relu``)
    abbreviate: Callable[[str], str] | None = None
    wrap: bool = False          # text: wrapped onto more lines instead of cut (prose cells)
    # a shorter header (``time (roofline)`` → ``time ≥``) for a table that does not fit: a
    # numeric column is as wide as its header, and a header must not cost a name its width
    short: str = ""
    keep_end: bool = False      # text: cut at the start, keeping the end (a module path's)


def shorten(text: str, width: int, keep_end: bool = False) -> str:
    """``text`` in at most ``width`` characters, cut in the middle (``keep_end``: at the
    start)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    if keep_end:
        return ELLIPSIS + text[len(text) - width + 1:]
    head = width // 2
    tail = width - 1 - head
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")


def fit(cols: list[Col], rows: list[list[str]], width: int | None) -> tuple[list[Col],
                                                                          list[list[str]]]:
    """The columns that fit in ``width`` (None: all, unshortened) and the rows' cells
    shortened to them (a ``wrap`` column's cells are left whole: printed, they wrap)."""
    if width is None:
        return cols, rows
    natural = _natural(cols, rows)
    if sum(natural) + SEP * (len(cols) - 1) > width and any(c.abbreviate for c in cols):
        rows = [[c.abbreviate(cell) if c.abbreviate else cell for c, cell in zip(cols, r)]
                for r in rows]
        natural = _natural(cols, rows)
    if sum(natural) + SEP * (len(cols) - 1) > width and any(c.short for c in cols):
        cols = [replace(c, header=c.short) if c.short else c for c in cols]
        natural = _natural(cols, rows)
    keep = list(range(len(cols)))

    def need(idx: list[int], texts_at_min: bool) -> int:
        total = sum(natural[i] if cols[i].numeric or not texts_at_min
                    else min(natural[i], max(cols[i].min_width, len(cols[i].header)))
                    for i in idx)
        return total + SEP * (len(idx) - 1)

    droppable = sorted((i for i in keep if cols[i].optional), key=lambda i: cols[i].priority)
    whole = [i for i in keep if not cols[i].optional]
    texts_cut = need(whole, False) > width   # even without every optional column
    while need(keep, texts_cut) > width and droppable:
        keep.remove(droppable.pop(0))
    widths = {i: natural[i] for i in keep}
    over = need(keep, False) - width
    if over > 0:  # squeeze text columns, the least important first, down to their minimum
        for i in sorted((i for i in keep if not cols[i].numeric),
                        key=lambda i: cols[i].priority):
            floor = min(natural[i], max(cols[i].min_width, len(cols[i].header)))
            cut = min(over, widths[i] - floor)
            widths[i] -= cut
            over -= cut
            if over <= 0:
                break
    out_rows = [[r[i] if cols[i].numeric or cols[i].wrap
                 else shorten(r[i], widths[i], cols[i].keep_end) for i in keep] for r in rows]
    return [cols[i] for i in keep], out_rows


_UNIT = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|FLOPs|s|ms|µs|ns)\b")


def print_prose(console, text: str, width: int | None) -> None:
    """A sentence under a table, wrapped between words at ``width`` (None: one line), never
    between a number and its unit; continuation lines are indented two columns past the
    text's own indent."""
    if width and len(text) > width:
        indent = " " * (len(text) - len(text.lstrip(" ")))
        text = "\n".join(wrap_prose(text, width, "", indent + "  "))
    console.print(text, markup=False, highlight=False, crop=False)


def wrap_prose(text: str, width: int, first: str, rest: str) -> list[str]:
    """``text`` as lines of at most ``width`` (but a word longer than that), the first
    indented by ``first``, the others by ``rest``: broken between words, never between a
    number and its unit."""
    import textwrap
    # textwrap breaks at ASCII spaces only: a value's spaces become no-break ones
    glued = _UNIT.sub("\\1\u00a0\\2", text).replace(" × ", "\u00a0×\u00a0")
    return [line.replace("\u00a0", " ") for line in textwrap.wrap(
        glued, width, initial_indent=first, subsequent_indent=rest, break_long_words=False,
        break_on_hyphens=False)]


def short_op(text: str) -> str:
    """An op cell in fewer characters: ATen's namespace and default overload dropped (the
    node table at 80 columns; the wide view and every file keep the full name)."""
    text = text.replace(" (upper bound)", " (bound)")
    if not text.startswith("aten."):
        return text
    op, _, rest = text[5:].partition(" ")
    op = op.removesuffix(".default")
    return f"{op} {rest}" if rest else op


_OP_SEGMENT = re.compile(r"[A-Z][A-Za-z0-9]*")   # "Conv", not "MatMul_1": names stay distinct


def short_name(text: str) -> str:
    """A node name in fewer characters: an ONNX exporter's ``/layer1/layer1.0/conv2/Conv``
    is ``layer1.0/conv2`` — the leading slash, a scope repeated as the start of the next one
    and a last segment that is an op type (the op column says it) left out."""
    if "/" not in text:
        return text
    parts = [p for p in text.split("/") if p]
    if len(parts) > 1 and _OP_SEGMENT.fullmatch(parts[-1]):
        parts = parts[:-1]
    kept = [p for k, p in enumerate(parts)
            if not (k + 1 < len(parts) and parts[k + 1].startswith(p + "."))]
    return "/".join(kept) or text


def _natural(cols: list[Col], rows: list[list[str]]) -> list[int]:
    return [max([len(c.header)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]


def print_table(console, title: str | None, cols: list[Col], rows: list[list[str]], *,
                width: int | None, styles: list[str | None] | None = None) -> None:
    """Print ``rows`` under ``cols`` fitted to ``width`` (None: every column at its natural
    width, for files and pipes)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    kept, cells = fit(cols, rows, width)
    # prose cells (``wrap``): rich narrows those columns in proportion, breaking between words
    squeeze = width if width and any(c.wrap for c in kept) and \
        sum(_natural(kept, cells)) + SEP * (len(kept) - 1) > width else None
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1), header_style="bold", collapse_padding=True,
                  width=squeeze)
    for c in kept:
        table.add_column(c.header, justify="right" if c.numeric else "left",
                         no_wrap=not c.wrap,
                         # numbers fold rather than cut (fit gives them their full width;
                         # rich 15 drops right-justification under overflow="ignore")
                         overflow="fold" if c.wrap or c.numeric else "ellipsis")
    for k, r in enumerate(cells):
        table.add_row(*r, style=styles[k] if styles else None)
    if title:
        # a line of its own, as rich styles a table's title (rich pads a title to the
        # table's width)
        console.print(Text(title, style="table.title"), width=width)
    if console.is_terminal:
        console.print(table)
        return
    # rich pads a left-justified last column to its width: no trailing blanks in a pipe or file
    with console.capture() as captured:
        console.print(table)
    console.file.write("".join(line.rstrip() + "\n"
                               for line in captured.get().splitlines()))
