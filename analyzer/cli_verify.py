"""``graphcost verify MODEL``: run the model on this CPU and compare with the prediction.

Exit status: 0 verified, 1 some inferred shape differs from the real one (ONNX), 2 bad input.
Relative errors are predicted / measured − 1. The measuring is in analyzer/verify.py.
"""
from __future__ import annotations

import argparse
import json
import sys

from graphcost.analyzer.cli import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    _Parser,
    add_model_args,
    analysis_kwargs,
)
from graphcost.analyzer.errors import GraphcostError

EXIT_MISMATCH = 1
MAX_LISTED = 20  # rows of mismatched / unknown values in the table


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="graphcost verify", description=(
        "Run the model for real on this CPU and compare with graphcost's prediction. ONNX "
        "(a file, or zoo:NAME's export): onnxruntime checks every inferred shape and measures "
        "latency beside the roofline lower bound for this CPU's measured peak. PyTorch "
        "(zoo:NAME --fx, file.py:Class, which builds Class() with random weights): MemTracker "
        "measures the peak, overall and per module. The input file is only read."),
        epilog=f"exit status: 0 verified, {EXIT_MISMATCH} an inferred shape is wrong, "
               f"{EXIT_BAD_INPUT} bad input")
    add_model_args(p)
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--repeat", type=int, default=10,
                   help="ONNX: timed runs after 2 warm-up runs; the median is shown (default 10)")
    p.add_argument("--per-module-depth", type=int, default=1, metavar="N",
                   help="PyTorch: compare the peak for modules down to this depth (default 1; "
                        "0 = the whole model only)")
    return p


def run(args) -> int:
    from graphcost.analyzer.verify import OnnxVerification, verify

    kw = analysis_kwargs(args)
    if kw["checkpoint"] or kw["precision"] != "fp32":
        raise GraphcostError("verify measures plain fp32 steps: --checkpoint and --precision "
                             "are not measured")
    if args.per_module_depth < 0:
        raise GraphcostError("--per-module-depth must be 0 or more")
    result = verify(args.model, fx=args.fx, batch=kw["batch"], dims=kw["dims"],
                    input_shapes=kw["input_shapes"], input_dtypes=kw["input_dtypes"],
                    train=kw["train"], optimizer=kw["optimizer"], repeat=args.repeat,
                    depth=args.per_module_depth, lifetimes=kw["lifetimes"],
                    include_inputs=kw["include_inputs"], inplace=kw["inplace"])
    if args.format == "json":
        sys.stdout.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
    else:
        from rich.console import Console

        from graphcost.analyzer.text import escape_strings
        console = Console(width=None if sys.stdout.isatty() else 160)
        result = escape_strings(result)  # names from the model: no terminal controls
        (_onnx_table if isinstance(result, OnnxVerification) else _torch_table)(result, console)
    if isinstance(result, OnnxVerification) and result.shapes_mismatched:
        return EXIT_MISMATCH
    return EXIT_OK


def _b(n: int | None) -> str:
    from graphcost.analyzer.render import human_bytes
    if n is None:
        return "—"
    return human_bytes(n) if n < 1024 else f"{human_bytes(n)} ({n:,} B)"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def _t(seconds: float) -> str:
    from graphcost.analyzer.render import human_time
    return human_time(seconds)


def _onnx_table(r, console) -> None:
    from rich.table import Table

    cpu = r.cpu
    dims = "".join(f", {k}={v}" for k, v in sorted(r.dims.items()) if v != r.batch or
                   k != "batch")
    console.print(f"[bold]graphcost verify {r.model}[/] — onnxruntime on this CPU, batch "
                  f"{r.batch}{dims}")
    t = Table(show_header=True, header_style="bold")
    for col, just in (("", "left"), ("predicted", "right"), ("measured", "right"),
                      ("comparison", "right")):
        t.add_column(col, justify=just)
    ok = "all match" if not r.shapes_mismatched else f"{r.shapes_mismatched} MISMATCHED"
    t.add_row("output shapes", f"{r.shapes_checked} inferred", f"{r.shapes_checked} real",
              f"{r.shapes_matched}/{r.shapes_checked} match ({ok})")
    if r.shapes_unknown:
        t.add_row("  not checked", f"{r.shapes_unknown} unknown", "", "")
    t.add_row("latency", f"≥ {_t(r.roofline_seconds)} (roofline)",
              f"{_t(r.latency_seconds)} (median of {r.repeat})",
              f"measured / roofline = {r.ratio:.1f}")
    t.add_row("  roofline parts", f"compute-bound {_t(r.roofline_compute_seconds)}, "
              f"memory-bound {_t(r.roofline_memory_seconds)}",
              f"fastest {_t(r.latency_min_seconds)}", "")
    t.add_row("activation peak", f"{_b(r.predicted_peak_bytes)} ({r.lifetimes})",
              "not measured", "onnxruntime's arena has no peak")
    console.print(t)
    console.print(f"roofline device: this CPU, measured with numpy: {cpu.peak_flops / 1e9:.1f} "
                  f"GFLOP/s (one thread's float32 512³ matmul, {cpu.thread_flops / 1e9:.1f}, "
                  f"× {cpu.cores} cores), {cpu.bandwidth / 1e9:.1f} GB/s (128 MiB copy); "
                  f"the model: {r.flops / 1e9:.3g} GFLOP, {_b(r.bytes_moved)} moved")
    if r.ratio < 1:
        console.print("the run beat the lower bound: its data stayed in cache (the bound "
                      "charges every byte to memory), or the machine was busier while its peak "
                      "was measured")
    for title, rows in (("shape mismatches", r.mismatches),
                        ("not checked: graphcost has no concrete shape", r.unknown)):
        if not rows:
            continue
        m = Table(title=title, header_style="bold")
        for col in ("value", "node", "graphcost inferred", "onnxruntime real"):
            m.add_column(col)
        for x in rows[:MAX_LISTED]:
            m.add_row(x.value, x.node, x.predicted, x.measured or "not fetched")
        console.print(m)
        if len(rows) > MAX_LISTED:
            console.print(f"… and {len(rows) - MAX_LISTED} more (--format json lists all)")


def _torch_table(r, console) -> None:
    from rich.table import Table

    what = "one training step" + (f" ({r.optimizer})" if r.optimizer else "") \
        if r.mode == "training" else "one forward, torch.no_grad()"
    console.print(f"[bold]graphcost verify {r.model}[/] — MemTracker on this CPU, {what}, "
                  f"batch {r.batch}")
    t = Table(show_header=True, header_style="bold")
    for col, just in (("module", "left"), ("type", "left"), ("calls", "right"),
                      ("predicted peak", "right"), ("measured peak", "right"),
                      ("rel. error", "right")):
        t.add_column(col, justify=just)
    t.add_row("(whole model)", "", "1", _b(r.predicted_peak_bytes), _b(r.measured_peak_bytes),
              _pct(r.rel_error), style="bold")
    for p in r.parts:
        t.add_row("  " + p.category, "", "", _b(p.predicted_bytes), _b(p.measured_bytes),
                  _pct(p.rel_error))
    for m in r.modules:
        if not m.path:
            continue  # the whole model's row is the one above
        t.add_row("  " * (m.depth - 1) + m.path, m.type, str(m.calls), _b(m.predicted_bytes),
                  _b(m.measured_bytes), _pct(m.rel_error))
    console.print(t)
    console.print(f"{r.note}; rel. error = predicted / measured − 1")
