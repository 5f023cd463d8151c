"""``graphcost diff OLD NEW [model options]``: two models side by side.

Both models are analyzed with the same options; the comparison itself is analyzer/app/diff.py.
Exit 0 whatever changed (a diff informs, it does not judge: `graphcost check` sets budgets),
2 for bad input (an unreadable model, a bad option).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..app.diff import diff_reports
from ..render.diff import render_markdown, render_table
from .main import DETAILS, EXIT_OK, Parser, refuse_overwrite
from .model_options import add_model_args, run_analysis
from .output import check_writable
from .serve import add_serve_args, serve_kwargs

LIST_ROWS = 20   # rows per list of the markdown format, and of the table's under --details


def build_parser() -> Parser:
    p = Parser(prog="graphcost diff", description=(
        "Compare two models (ONNX files, zoo:NAME, .pt2, file.py:Class) analyzed with the same "
        "options: totals, per-module and per-node deltas (nodes matched by name, or by op "
        "sequence when names differ wholesale), added/removed nodes, and what changed in the "
        "tensors live at the activation peak."))
    p.add_argument("old", help="the baseline model")
    p.add_argument("new", help="the changed model")
    add_model_args(p, model=False)
    add_serve_args(p)
    p.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    p.add_argument("-o", "--output", help="write the diff to this file instead of stdout")
    p.add_argument("--top", type=int, default=None,
                   help="rows per list (modules, changed/added/removed nodes, op types) in "
                        "the table and markdown formats (default 20, 0 = all; JSON has every "
                        "row); the table shows the lists with it or --details")
    p.add_argument(DETAILS, action="store_true",
                   help="table format: the modules, nodes and op types that changed above "
                        "the totals (by default the table is the totals, why the peak moved, "
                        "the time and the fit alone)")
    return p


def run(args) -> int:
    for model in (args.old, args.new):
        refuse_overwrite(args.output, model)
    check_writable(args.output, "-o")
    serve = serve_kwargs(args)
    old = run_analysis(args.old, args, **serve)
    new = run_analysis(args.new, args, **serve)
    d = diff_reports(old, new)
    if args.format != "json":  # names from the models never reach the terminal as controls
        from .text import escape_strings
        d = escape_strings(d)
    if args.format == "json":
        text = json.dumps(d.to_dict(), ensure_ascii=False, separators=(",", ":")) + "\n"
    elif args.format == "markdown":
        text = render_markdown(d, LIST_ROWS if args.top is None else args.top)
    else:
        from .output import console_for, terminal_width
        top = LIST_ROWS if args.details and args.top is None else args.top
        if args.output:
            with open(args.output, "w", encoding="utf-8") as fh:
                render_table(d, console_for(fh, None), top, details_option=DETAILS)
        else:
            width = terminal_width()
            render_table(d, console_for(sys.stdout, width), top, width, DETAILS)
        return EXIT_OK
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return EXIT_OK
