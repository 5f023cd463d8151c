"""``graphcost`` command line. Bad input: one line on stderr, exit status 2, no traceback."""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

from ...passes.errors import GraphcostError
from .help import (
    Parser,  # (the subcommands import it here)
    Version,
    bare_usage,
)
from .model_options import add_model_args, analysis_kwargs, progress, run_analysis
from .output import (  # noqa: F401
    check_writable,
    console_for,
    refuse_overwrite,
    strict_failure,
    terminal_width,
    wrote,
)
from .serve import add_serve_args, serve_kwargs

EXIT_OK, EXIT_INCOMPLETE, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 3, 2, 70
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: what `yes | head -1` reports for yes
DETAILS = "--details"   # the whole view: what the answer-alone view's first line names


SUBCOMMANDS = {
    "check": ("graphcost.analyzer.cli.check", "budgets for CI: exit 0 pass, 1 over budget, 2 bad input"),
    "diff": ("graphcost.analyzer.cli.diff", "compare two models: totals, per-node/module deltas, peak"),
    "verify": ("graphcost.analyzer.cli.verify", "run the model on this CPU and compare with the prediction"),
    "devices": ("graphcost.analyzer.cli.devices", "the known devices and their peaks"),
    "plan": ("graphcost.analyzer.cli.plan",
             "the fastest training layout, batch and checkpointing that fits N GPUs"),
    "calibrate": ("graphcost.analyzer.cli.calibrate",
                  "measure this machine's kernels: a profile for --device-profile"),
}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="graphcost", description=(
        "Static cost analysis of a neural-network graph: per-node params, MACs, FLOPs, bytes "
        "read/written, and activation memory by liveness. Reads shapes only: weights and "
        "external data files are never read, and the input file is never written."),
        epilog="subcommands: " + "; ".join(f"graphcost {k} … ({v[1]})"
                                          for k, v in SUBCOMMANDS.items()))
    p.add_argument("--version", action=Version, nargs=0,
                   help="graphcost's version and those of the libraries it runs on")
    add_model_args(p)
    add_serve_args(p)
    p.add_argument("--depth", type=int, default=None,
                   help="print the module tree down to this depth instead of the node table")
    p.add_argument("--format", choices=("table", "json", "csv", "markdown"), default="table")
    p.add_argument("-o", "--output", help="write the report to this file instead of stdout")
    p.add_argument("--strict", action="store_true",
                   help=f"exit {EXIT_INCOMPLETE} if any node has no cost rule or no shape, or "
                        "counts beyond any device (over 2^64)")
    p.add_argument("--plot", metavar="FILE.svg|png",
                   help="with --train: write the memory timeline chart (SVG, or PNG with the "
                        "png extra: matplotlib)")
    p.add_argument("--max-batch", action="store_true",
                   help="the largest batch whose memory (with --overhead) fits --device; prints "
                        "memory and FLOPs as affine functions of the batch")
    p.add_argument("--advise", action="store_true",
                   help="with --train and a GPU --device: instead of the report, the three "
                        "single changes (checkpointing, tensor parallel, allocator, compile, "
                        "batch, optimizer step) that most reduce the memory or raise the "
                        "throughput, each analyzed")
    p.add_argument("--html", metavar="FILE.html",
                   help="also write a self-contained HTML report (no network access needed)")
    p.add_argument("--max-rows", type=int, default=None,
                   help="node rows in the table format: N the first N, 0 all (default: the "
                        "15 heaviest by FLOPs, in graph order)")
    p.add_argument("--columns", metavar="NAME,…",
                   help="the node table's columns (table format), e.g. name,op,macs,flops; "
                        "names: index, name, op, input_shapes, output_shapes, params, macs, "
                        "flops, output_bytes, bytes_read, bytes_written, bytes_total, share, "
                        "status, and receptive_field, jump, start, roofline_seconds, "
                        "intensity, bound when the report has them")
    p.add_argument(DETAILS, action="store_true",
                   help="table format: the whole view (the heaviest nodes, the op types, the "
                        "slowest nodes, every summary line); with --train, --device, "
                        "--parallel or --serve the default is the answer alone")
    p.add_argument("--wide", action="store_true",
                   help="table format: every column at full width instead of fitting the "
                        "terminal")
    return p


def console() -> int:
    """The ``graphcost`` command (and ``python -m graphcost``): ``main()``, then every object
    left is frozen out of the cyclic collector, whose sweeps at interpreter exit would walk
    torch's and the IR's millions of objects for nothing (0.6 s of a 5 s --max-batch run)."""
    rc = main()
    sys.stdout.flush()
    gc.freeze()
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:  # a first run: what to type, not argparse's "required: model"
        sys.stderr.write(bare_usage(SUBCOMMANDS))
        return EXIT_BAD_INPUT
    if argv and argv[0] in SUBCOMMANDS:  # `graphcost check …`; a file named so: ./check
        import importlib
        module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
        return guarded(module.run, module.build_parser().parse_args(argv[1:]))
    return guarded(_run, build_parser().parse_args(argv))


def guarded(run, args) -> int:
    """Run a command: GraphcostError -> one line and exit 2; a bug -> one line and exit 70."""
    from .text import escape  # names in messages come from the model
    from .wording import cli_message

    try:
        return run(args)
    except GraphcostError as exc:
        sys.stderr.write(f"graphcost: error: {escape(cli_message(exc))}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        sys.stderr.write("graphcost: interrupted\n")
        return 130
    except BrokenPipeError:  # the reader stopped (| head): no error of anyone's, nothing to say
        return _pipe_closed()
    except OSError as exc:  # a file that cannot be read or written (-o, --html, --plot)
        where = f"{exc.filename}: " if exc.filename else ""
        sys.stderr.write(f"graphcost: error: {escape(f'{where}{exc.strerror or exc}')}\n")
        return EXIT_BAD_INPUT
    except Exception as exc:  # a bug of ours: still one line, and a distinct status
        first = next((line for line in str(exc).splitlines() if line.strip()), "")
        sys.stderr.write(f"graphcost: internal error ({type(exc).__name__}: "
                         f"{escape(first[:300])}); please report it with the model and the "
                         "output of `graphcost --version`\n")
        return EXIT_INTERNAL


def _pipe_closed() -> int:
    """Quietly, as a Unix tool whose reader went: what is still buffered for stdout goes to
    the null device, so the flush at exit fails no more (Python's signal docs' recipe)."""
    import os
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), sys.stdout.fileno())
    return EXIT_PIPE_CLOSED


def _run(args) -> int:
    for flag, out in (("-o", args.output), ("--html", args.html), ("--plot", args.plot)):
        refuse_overwrite(out, args.model)
        check_writable(out, flag)  # now, not after the analysis it would throw away
    if args.plot is not None:
        if not args.train:
            raise GraphcostError("--plot draws the training timeline: add --train")
        if not args.plot.lower().endswith((".svg", ".png")):
            raise GraphcostError(f"--plot {args.plot}: write .svg or .png")
        if args.plot.lower().endswith(".png"):
            from ..render.plot_png import require_matplotlib
            require_matplotlib()  # a missing extra fails now, not after the analysis
    if args.html is not None and not args.html.lower().endswith((".html", ".htm")):
        raise GraphcostError(f"--html {args.html}: the HTML report is written to a .html file")
    serve = serve_kwargs(args)  # (checked before --max-batch, which it excludes)
    if args.max_batch or args.advise:   # (answers of their own)
        return _max_batch(args) if args.max_batch else _advise(args)
    report = run_analysis(args.model, args, **serve)
    if args.format != "json":  # JSON escapes control characters itself; text shows them
        from .text import escape_strings
        report = escape_strings(report)

    from ..render import terminal as render
    if args.format == "table":
        columns = _columns(args, report)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as fh:
                render.render_table(report, console_for(fh, None), args.max_rows, args.depth,
                                    columns=columns, wide=args.wide, details=args.details,
                                    details_option=DETAILS)
        else:
            width = terminal_width()
            render.render_table(report, console_for(sys.stdout, width), args.max_rows, args.depth,
                                columns=columns, wide=args.wide, width=width,
                                details=args.details, details_option=DETAILS)
    else:
        from ..render.files import render_csv, render_markdown
        text = {"json": report.to_json, "csv": lambda: render_csv(report),
                "markdown": lambda: render_markdown(report)}[args.format]()
        if args.output:
            Path(args.output).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
    if args.html:
        from ..render.html import html_report
        Path(args.html).write_text(html_report(report), encoding="utf-8")
        wrote(args.html, "HTML report")
    if args.plot and args.plot.lower().endswith(".png"):
        from ..render.plot_png import timeline_png
        timeline_png(report, args.plot)
        wrote(args.plot, "memory timeline")
    elif args.plot:
        from ..render.plot import timeline_svg
        Path(args.plot).write_text(timeline_svg(report), encoding="utf-8")
        wrote(args.plot, "memory timeline")
    failure = args.strict and strict_failure(report)
    if failure:
        sys.stderr.write(f"graphcost: strict: {failure}\n")
        return EXIT_INCOMPLETE
    return EXIT_OK


def _columns(args, report) -> list[str] | None:
    if not args.columns:
        return None
    from ..render.terminal import column_names
    known = column_names(report)
    names = [c.strip() for c in args.columns.split(",") if c.strip()]
    bad = [c for c in names if c not in known]
    if bad or not names:
        raise GraphcostError(f"--columns: unknown column(s) {', '.join(bad) or '(none given)'}; "
                             f"known: {', '.join(known)}")
    return names


def _advise(args) -> int:
    from ..app.advise import advise
    from ..render.advise import advice_json, advice_lines
    from .wording import cli_text

    if args.format not in ("table", "json"):
        raise GraphcostError(f"--advise writes a table or JSON, not {args.format}")
    with progress() as note:
        advice = advise(args.model, analysis_kwargs(args), note)
    text = advice_json(args.model, advice, cli_text) if args.format == "json" else \
        "\n".join(advice_lines(args.model, advice, cli_text)) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _max_batch(args) -> int:
    from ..app.by_batch import max_batch_search
    from ..app.request import build_request
    from ..render.batch import max_batch_lines

    request = build_request(**analysis_kwargs(args))
    with progress() as note:
        result = max_batch_search(args.model, request, note)
    if args.format == "json":
        import json
        text = json.dumps({"schema_version": 1, "kind": "max_batch", "model": args.model,
                           **result.to_dict()}, indent=1) + "\n"
    else:
        width = None if args.output else terminal_width()
        text = "\n".join(max_batch_lines(args.model, result, width)) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
