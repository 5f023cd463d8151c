"""Text from the model written into files that other programs interpret: a spreadsheet opens
the CSV, a Markdown renderer (GitHub, GitLab, MkDocs) the Markdown. Node, op, module and dim
names are the file author's, so they are written so that they stay text there (the HTML
report escapes its own, analyzer/render/html.py)."""
from __future__ import annotations

from typing import Any

# A spreadsheet (Excel, LibreOffice, Google Sheets) reads a cell that begins with one of these
# as a formula: =HYPERLINK(…), =cmd|…, +…, -…, @SUM(…); tab and CR are OWASP's too. The csv
# module's quoting does not help: the quotes are gone once the cell is read.
FORMULA_LEADS = ("=", "+", "-", "@", "\t", "\r")
# In a Markdown table cell: & < > would be HTML (<script>, <img onerror=…>), | ends the cell,
# ` opens a code span (MkDocs' tables do not split one at a |) and [ a link or an image.
# Character references, not backslashes: a name's own trailing backslash would escape a
# backslash before a |, and no renderer reads a reference as structure.
_MARKDOWN = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "&#124;",
                           "`": "&#96;", "[": "&#91;"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def csv_cell(value: Any) -> Any:
    """A text cell on one line (a CR is no line end to the csv module's writer, which left it
    unquoted: a reader split the row there) and, when it would begin a formula, behind a
    leading ' (OWASP's advice: the quote makes the cell text, the name stays readable after
    it). Only text: the numbers the report writes as numbers stay numbers."""
    if not isinstance(value, str):
        return value
    value = one_line(value)
    return "'" + value if value.startswith(FORMULA_LEADS) else value


def one_line(text: str) -> str:
    """Every non-printable character shown as an escape ('\\n', '\\x1b', '\\u2028'): a line of
    a Markdown file stays one line (a table row, an indented code line). The command line
    has already escaped them (analyzer/cli/text.py); the API's callers render reports too."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _NAMED.get(c) or
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in text)


def markdown_text(text: str) -> str:
    """``text`` for a Markdown table cell, heading or list item: one line, no HTML, no cell
    break, code span, link or image of its own."""
    return one_line(text).translate(_MARKDOWN)
