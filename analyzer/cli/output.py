"""Where the command writes: files it may not replace, the terminal it fits, what it says it
wrote, and what ``--strict`` fails on. (analyzer/cli/main.py and the subcommands use these.)"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ...models_zoo.cache import cache_dir
from ...passes.errors import GraphcostError
from ..load.model_names import file_class
from ..load.resolve import WEIGHTS_FILES


def refuse_overwrite(output: str | None, model: str) -> None:
    """Outputs never replace the input model, a file it references (its external data, read
    from the proto without opening them) or anything in the zoo's export cache."""
    if not output:
        return
    cache = os.path.realpath(cache_dir())
    target = os.path.realpath(output)
    if target == cache or target.startswith(cache + os.sep):
        raise GraphcostError(f"{output} is in the zoo's export cache ({cache}); graphcost "
                             "never writes there")
    if not os.path.exists(output):
        return  # nothing there to replace
    spec = file_class(model)  # (the resolver's own test: a path that exists is a file)
    source = spec[0] if spec else model
    if os.path.exists(source) and os.path.samefile(output, source):
        raise GraphcostError(f"{output} is the input model; graphcost never writes its input")
    if model.startswith("zoo:") or spec or model.endswith(".pt2") or \
            not os.path.isfile(model) or Path(model).suffix.lower() in WEIGHTS_FILES:
        return  # (a weights file is refused by the resolver, unread)
    from ..frontends.onnx.external_data import external_refs
    from ..frontends.onnx.frontend import load_model

    folder = os.path.dirname(os.path.abspath(model))
    for what, location, _ in external_refs(load_model(model)):
        path = os.path.join(folder, location)
        if location and os.path.exists(path) and os.path.samefile(output, path):
            raise GraphcostError(f"{output} holds the model's external data ({what}); graphcost "
                                 "never writes the files its input references")


def check_writable(output: str | None, flag: str) -> None:
    """An output that cannot be written fails before the analysis: a missing folder used to
    surface only when the report was written, after the whole run. (A permission or a
    read-only file system is what access(2) says; a full disk still fails at the write.)"""
    if not output:
        return
    folder = os.path.dirname(output) or "."
    if os.path.isdir(output):
        raise GraphcostError(f"{flag} {output}: is a directory; name a file to write")
    if not os.path.isdir(folder):
        what = "is not a directory" if os.path.exists(folder) else "does not exist"
        raise GraphcostError(f"{flag} {output}: the folder {folder} {what}")
    if not os.access(output if os.path.exists(output) else folder, os.W_OK):
        where = output if os.path.exists(output) else f"the folder {folder}"
        raise GraphcostError(f"{flag} {output}: {where} is not writable")


PIPED_WIDTH = 100  # piped or redirected text (| less, > out.txt): wide enough for a table


def terminal_width() -> int:
    """The width the text view fits: the terminal's, else $COLUMNS, else PIPED_WIDTH (a pipe
    is read in a terminal or an editor too; -o FILE keeps every column at its natural
    width)."""
    import shutil
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    cols = os.environ.get("COLUMNS", "")
    return int(cols) if cols.isdigit() and int(cols) > 0 else PIPED_WIDTH


def console_for(file, width: int | None):
    from rich.console import Console

    class Report(Console):
        def on_broken_pipe(self) -> None:
            # rich's own answer to a reader that went (| head) is exit 1, check's "over
            # budget": main.guarded answers every write's alike, 141
            raise BrokenPipeError
    # a console wider than any table: the tables fit ``width`` themselves, and rich must not
    # re-wrap what they already laid out
    return Report(file=file, width=max(width or 0, 10_000), soft_wrap=False,
                  force_terminal=file is sys.stdout and sys.stdout.isatty())


def wrote(path: str, what: str) -> None:
    """Say where a file was written (stderr: stdout stays the report)."""
    sys.stderr.write(f"graphcost: wrote {what} to {path}\n")


def strict_failure(report) -> str:
    """Why ``--strict`` fails the report ("" when it does not): nodes not costed (no rule, no
    shape), or counts beyond any device (over 2^64: passes/magnitude.py)."""
    from ...passes.magnitude import beyond

    c = report.coverage
    if c.unsupported or c.unknown_shape:
        missing = dict(c.unsupported, **c.unknown_shape)
        return "not costed: " + ", ".join(f"{k}×{v}" for k, v in sorted(missing.items()))
    absurd = [r.name for r in report.nodes if beyond(r.macs, r.flops, r.bytes_read,
                                                     r.bytes_written, r.output_bytes)]
    if absurd:
        return (f"{len(absurd)} node(s) count over 2^64 (beyond any device), first "
                f"{absurd[0]!r}: see the warnings")
    return ""


def fitted(line: str, width: int | None) -> str:
    """``line`` cut to the terminal's width with an ellipsis; a command to copy stays whole."""
    if width is None or len(line) <= width or line.startswith(("run:", "torchtitan:",
                                                               "vllm:")):
        return line
    return line[:width - 1] + "…"
