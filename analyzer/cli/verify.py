"""``graphcost verify MODEL``: run the model on this CPU and compare with the prediction.

Exit status: 0 verified, 1 some inferred shape differs from the real one (ONNX), 2 bad input.
Relative errors are predicted / measured − 1. The measuring is in analyzer/measure/verify.py.
"""
from __future__ import annotations

import argparse
import json
import sys

from ...passes.errors import GraphcostError
from .main import EXIT_BAD_INPUT, EXIT_OK, Parser
from .model_options import add_model_args, analysis_kwargs

EXIT_MISMATCH = 1


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="graphcost verify", description=(
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
    from ..app.request import build_request
    from ..measure.verify import OnnxVerification, verify_request

    request = build_request(**analysis_kwargs(args))
    if args.per_module_depth < 0:
        raise GraphcostError("--per-module-depth must be 0 or more")
    result = verify_request(args.model, request, repeat=args.repeat,
                            depth=args.per_module_depth)
    if args.format == "json":
        sys.stdout.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
    else:
        from ..render.verify import onnx_view, torch_view
        from .output import console_for, terminal_width
        from .text import escape_strings
        result = escape_strings(result)  # names from the model: no terminal controls
        width = terminal_width()
        view = onnx_view if isinstance(result, OnnxVerification) else torch_view
        view(result, console_for(sys.stdout, width), width)
    if isinstance(result, OnnxVerification) and result.shapes_mismatched:
        return EXIT_MISMATCH
    return EXIT_OK
