"""``graphcost`` command line. Bad input: one line on stderr, exit status 2, no traceback."""
from __future__ import annotations

import argparse
import gc
import sys
from contextlib import contextmanager
from pathlib import Path

from ...passes.choices import Attention, Lifetimes, Optimizer
from ...passes.errors import GraphcostError
from ...passes.precision import CHOICES
from ..app.api_checks import DTYPE_WORDS
from ..app.devices import get_device, parse_device_spec, parse_overhead
from .help import (
    Parser,  # (the subcommands import it here)
    Version,
    bare_usage,
)
from .output import (  # noqa: F401
    check_writable,
    console_for,
    refuse_overwrite,
    strict_failure,
    terminal_width,
    wrote,
)
from .parallel import add_parallel_args, parallel_args
from .serve import add_serve_args, serve_kwargs

EXIT_OK, EXIT_INCOMPLETE, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 3, 2, 70


def _kv(text: str, what: str) -> tuple[str, str]:
    if "=" not in text:
        raise GraphcostError(f"{what} expects NAME=VALUE, got {text!r}")
    k, v = text.split("=", 1)
    return k.strip(), v.strip()


SUBCOMMANDS = {
    "check": ("graphcost.analyzer.cli.check", "budgets for CI: exit 0 pass, 1 over budget, 2 bad input"),
    "diff": ("graphcost.analyzer.cli.diff", "compare two models: totals, per-node/module deltas, peak"),
    "verify": ("graphcost.analyzer.cli.verify", "run the model on this CPU and compare with the prediction"),
    "devices": ("graphcost.analyzer.cli.devices", "the known devices and their peaks"),
}


# long: the option table: one add_argument per option
def add_model_args(p: argparse.ArgumentParser, *, model: bool = True) -> None:
    """The options that say which model to analyze and at what size (shared by the main
    command and the subcommands)."""
    if model:
        p.add_argument("model", help=(
            "an .onnx file; a saved torch.export program (.pt2: its JSON graph is read, its "
            "pickled weights never); zoo:NAME for a bundled reference model; timm:NAME for a "
            "timm architecture (built on the meta device); a Hugging Face "
            "id ORG/NAME[@REV], a config.json or a snapshot folder (only config.json is "
            "read; the model is built on the meta device); or "
            "path/to/file.py:Class — "
            "this IMPORTS AND RUNS that Python file, builds Class() with no arguments on the "
            "meta device (no weights allocated) and traces its forward with torch.export on "
            "fake inputs of the --input-shape sizes"))
    p.add_argument("--fx", action="store_true",
                   help="zoo models: trace the torch module with torch.export instead of "
                        "analyzing its ONNX export")
    p.add_argument("--all-layers", action="store_true",
                   help="PyTorch models: trace every block of a stack of 8+ identical blocks "
                        "(default: three traced, the middle one repeated in the IR)")
    p.add_argument("--input-dtype", action="append", default=[], metavar="NAME=DTYPE",
                   help="dtype of a traced module's input (default float32), e.g. "
                        "--input-dtype input_ids=int64")
    p.add_argument("--batch", type=int, default=None,
                   help="bind the batch dim (axis 0) of the graph inputs (default 1)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="bind a symbolic input dim by name, e.g. --dim sequence=128; on the "
                        "torch route, u0, u1… set the maximum of a size the data decides")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=SHAPE",
                   help="override an input's shape, e.g. --input-shape x=1x3x224x224")
    p.add_argument("--exclude-inputs", action="store_true",
                   help="leave graph inputs out of activation memory")
    p.add_argument("--inplace-activations", action="store_true",
                   help="what-if: unary activations write into their dying input")
    p.add_argument("--lifetimes", choices=Lifetimes.words(), default=None,
                   help="how long tensors live: dataflow = freed after the last use (a graph "
                        "runtime; default for ONNX), eager = module arguments held until the "
                        "module returns (PyTorch eager; default for traced torch models)")
    p.add_argument("--train", action="store_true",
                   help="analyze one training step (forward + real backward traced with "
                        "AOTAutograd + optimizer step) of a PyTorch model; of an ONNX file, "
                        "an ESTIMATE (backward synthesized from per-op save rules)")
    p.add_argument("--optimizer", choices=Optimizer.words(),
                   default="adam", help="with --train: optimizer state and step (default adam)")
    p.add_argument("--precision", choices=CHOICES, default="fp32",
                   help="with --train, Lightning's names: fp32 (32-true); bf16-mixed / "
                        "16-mixed: torch.autocast (fp32 weights, gradients and optimizer state, "
                        "autocast's ops in half); bf16-master / 16-master: half weights, "
                        "activations and gradients with fp32 master weights and optimizer "
                        "state; bf16-true / 16-true: everything half, optimizer state too")
    p.add_argument("--attention", choices=Attention.words(), default="auto",
                   help="with --train: the kernel scaled_dot_product_attention is traced as "
                        "(default auto: the one PyTorch picks on --device, or this CPU, in "
                        "the --precision dtype)")
    add_parallel_args(p)
    p.add_argument("--checkpoint", metavar="NAMES|sqrt|auto",
                   help="with --train: checkpoint these modules (comma-separated paths), √N "
                        "segments of the repeated blocks (sqrt), or the cheapest plan that fits "
                        "--budget (auto)")
    p.add_argument("--checkpoint-every", type=int, metavar="N",
                   help="with --train: one checkpoint segment per N repeated blocks")
    p.add_argument("--budget", metavar="SIZE",
                   help="memory budget for --checkpoint auto, e.g. 40GiB, 4GB, 4e9")
    p.add_argument("--device", metavar="NAME",
                   help="roofline time per node and whether the memory fits on this device "
                        "(a lower bound, not a benchmark); `graphcost devices` lists the known ones")
    p.add_argument("--device-spec", metavar="flops=…,bandwidth=…,memory=…",
                   help="a device of your own, e.g. flops=19.5T,bandwidth=1555G,memory=40GiB "
                        "(optional fp16=…, bf16=…, tf32=…, int8=… rates)")
    p.add_argument("--tf32", action="store_true",
                   help="with a device: fp32 matmuls and convolutions run at the TF32 rate")
    p.add_argument("--dtype", choices=DTYPE_WORDS,
                   help="the weights' dtype for inference and --serve (a PyTorch model; "
                        "default: the published config's where known, e.g. zoo:llama7b "
                        "float16, a hub model's config.json's)")
    p.add_argument("--allocator", metavar="CONF",
                   help="the CUDA caching allocator's settings for the reserved replay and "
                        "the fit, as PYTORCH_CUDA_ALLOC_CONF spells them: "
                        "expandable_segments:True, max_split_size_mb:N (default: PyTorch's)")
    p.add_argument("--overhead", metavar="context=SIZE,allocator=PCT",
                   help="your own figures for 'fits' and --max-batch, replacing the model's: "
                        "context = everything beyond the tensors and the allocator's cache, "
                        "allocator = tensors x (1 + PCT) instead of the replay; 'none': "
                        "tensors only")


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
    p.add_argument("--wide", action="store_true",
                   help="table format: every column at full width instead of fitting the "
                        "terminal")
    return p


def _checkpoint_args(args) -> dict | None:
    from ..app.units import parse_size

    if args.budget is not None and args.checkpoint != "auto":
        raise GraphcostError("--budget goes with --checkpoint auto")
    if args.checkpoint_every is not None:
        if args.checkpoint:
            raise GraphcostError("use either --checkpoint or --checkpoint-every")
        return {"every": args.checkpoint_every}
    if not args.checkpoint:
        return None
    if args.checkpoint == "sqrt":
        return {"sqrt": True}
    if args.checkpoint == "auto":
        if args.budget is None:
            raise GraphcostError("--checkpoint auto needs --budget SIZE (e.g. 40GiB)")
        return {"budget": parse_size(args.budget, "--budget")}
    return {"names": [n.strip() for n in args.checkpoint.split(",") if n.strip()]}


@contextmanager
def _progress():
    """A rich spinner on stderr while the model is read, traced and analyzed (terminals only:
    nothing when stderr is redirected, so pipes and CI logs stay clean)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    with Console(stderr=True).status("graphcost: starting") as status:
        yield lambda msg: status.update(f"graphcost: {msg}")


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


def analysis_kwargs(args) -> dict:
    """analyze()'s keyword arguments from the shared model options (see add_model_args)."""
    from ..frontends.binding import parse_shape

    dims = {}
    for text in args.dim:
        k, v = _kv(text, "--dim")
        try:
            dims[k] = int(v)
        except ValueError:
            raise GraphcostError(f"--dim {text}: the value must be an integer") from None
    shapes = {}
    for text in args.input_shape:
        k, v = _kv(text, "--input-shape")
        shapes[k] = parse_shape(v)
    dtypes = dict(_kv(text, "--input-dtype") for text in args.input_dtype)
    return dict(device=device_from_args(args), tf32=args.tf32,
                overhead=parse_overhead(args.overhead) if args.overhead else None,
                batch=args.batch, dims=dims, input_shapes=shapes, input_dtypes=dtypes,
                include_inputs=not args.exclude_inputs, inplace=args.inplace_activations,
                lifetimes=args.lifetimes, zoo_exporter="fx" if args.fx else "onnx",
                train=args.train, optimizer=args.optimizer,
                checkpoint=_checkpoint_args(args), precision=args.precision,
                parallel=parallel_args(args), optimizer_impl=args.optimizer_impl,
                all_layers=args.all_layers, attention=args.attention,
                allocator=args.allocator, dtype=args.dtype)


def device_from_args(args):
    if args.device and args.device_spec:
        raise GraphcostError("use either --device or --device-spec")
    if args.device_spec:
        return parse_device_spec(args.device_spec)
    if args.device:
        return get_device(args.device)
    if args.tf32:
        raise GraphcostError("--tf32 goes with --device or --device-spec")
    return None


def run_analysis(model: str, args, **overrides):
    """The analysis the shared options ask for, under the terminal progress spinner."""
    from ..app.api import run_request
    from ..app.request import build_request

    request = build_request(**{**analysis_kwargs(args), **overrides})
    with _progress() as note:
        return run_request(model, request, progress=note)


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
    if args.max_batch:
        return _max_batch(args)
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
                                    columns=columns, wide=args.wide)
        else:
            width = terminal_width()
            render.render_table(report, console_for(sys.stdout, width), args.max_rows, args.depth,
                                columns=columns, wide=args.wide, width=width)
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


def _max_batch(args) -> int:
    from ..app.by_batch import max_batch_search
    from ..app.request import build_request
    from ..render.batch import max_batch_lines

    request = build_request(**analysis_kwargs(args))
    with _progress() as note:
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
