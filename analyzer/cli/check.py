"""``graphcost check MODEL --max-… …``: budgets as a CI gate.

Exit 0 when every check passes, 1 when any is over its limit, 2 for bad input (an unreadable
model, a threshold that does not parse). Every result lists each check with its value and limit.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ...passes.errors import GraphcostError
from ..app.units import (
    human,
    human_bytes,
    human_time,
    parse_count,
    parse_size,
    parse_time,
)
from .main import Parser, refuse_overwrite
from .model_options import add_model_args, run_analysis
from .output import check_writable
from .serve import add_serve_args, serve_kwargs

EXIT_PASS, EXIT_OVER = 0, 1


@dataclass(frozen=True)
class Check:
    name: str
    value: float
    limit: float
    unit: str           # bytes | count | seconds | percent
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "limit": self.limit, "unit": self.unit,
                "passed": self.passed, "detail": self.detail}


def build_parser():
    p = Parser(prog="graphcost check", description=(
        "Fail CI when a model goes over budget: exit 0 all checks pass, 1 a check fails, "
        "2 bad input. Sizes: 4GiB, 4GB, 4e9; counts: 50M, 1.5G, 2e9; times: 5ms, 0.2s."))
    add_model_args(p)
    p.add_argument("--max-peak", metavar="SIZE",
                   help="peak tensor memory: params + buffers + activation peak (inference), "
                        "the training step's peak (--train), or one rank's peak (--parallel)")
    p.add_argument("--max-activations", metavar="SIZE", help="activation peak alone")
    p.add_argument("--max-params", metavar="COUNT", help="trainable parameters, e.g. 50M")
    p.add_argument("--max-macs", metavar="COUNT", help="multiply-accumulates, e.g. 10G")
    p.add_argument("--max-gmacs", metavar="N", help="the same in units of 10^9")
    p.add_argument("--max-flops", metavar="COUNT", help="FLOPs (2·MACs + other arithmetic)")
    p.add_argument("--max-gflops", metavar="N", help="the same in units of 10^9")
    p.add_argument("--max-latency", metavar="TIME",
                   help="roofline lower-bound time on --device / --device-spec, e.g. 5ms")
    p.add_argument("--max-step-time", metavar="TIME",
                   help="the time estimate (a GPU --device, or --device-profile) of a "
                        "training step or a forward, e.g. 3s; its band is shown beside")
    p.add_argument("--min-tokens-per-s", metavar="N",
                   help="tokens/s per GPU the time estimate gives (a GPU --device), "
                        "e.g. 5000; with --serve the batch's output tokens")
    p.add_argument("--max-ttft", metavar="TIME",
                   help="with --serve: time to the first token (the prefill) the estimate "
                        "gives on a GPU --device, e.g. 500ms")
    p.add_argument("--max-tpot", metavar="TIME",
                   help="with --serve: time per output token (a decode step at the full "
                        "context), e.g. 50ms")
    # (no default here: a --min-coverage given alone is a threshold; _limits uses 100)
    p.add_argument("--min-coverage", metavar="PCT",
                   help="percent of nodes that must have a cost rule and known shapes "
                        "(default 100: a budget on uncounted ops would pass by mistake)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("-o", "--output", help="write the result to this file instead of stdout")
    add_serve_args(p)
    return p


def _thresholds() -> list[str]:
    """The threshold options, as the parser has them."""
    return [a.option_strings[0] for a in build_parser()._actions
            if a.dest.startswith(("max_", "min_"))]


def _limits(args) -> list[tuple[str, float, str]]:
    """(check name, limit, unit) for every threshold given, parsed before any analysis."""
    flags = _thresholds()
    if not (args.device or args.device_spec) and \
            all(getattr(args, f[2:].replace("-", "_")) is None for f in flags):
        # the coverage default alone would pass nearly any model: "all checks passed" for a
        # gate that checks nothing asked for
        raise GraphcostError("no thresholds given: add one or more of " + ", ".join(flags)
                             + " (or --device NAME: the model must fit in it)")
    out = []
    if args.max_peak:
        out.append(("peak memory", parse_size(args.max_peak, "--max-peak"), "bytes"))
    if args.max_activations:
        out.append(("activation peak", parse_size(args.max_activations, "--max-activations"),
                    "bytes"))
    if args.max_params:
        out.append(("params", parse_count(args.max_params, "--max-params"), "count"))
    if args.max_macs:
        out.append(("MACs", parse_count(args.max_macs, "--max-macs"), "count"))
    if args.max_gmacs:
        out.append(("MACs", 1e9 * parse_count(args.max_gmacs, "--max-gmacs"), "count"))
    if args.max_flops:
        out.append(("FLOPs", parse_count(args.max_flops, "--max-flops"), "count"))
    if args.max_gflops:
        out.append(("FLOPs", 1e9 * parse_count(args.max_gflops, "--max-gflops"), "count"))
    if args.max_latency:
        latency = parse_time(args.max_latency, "--max-latency")
        if not (args.device or args.device_spec):
            raise GraphcostError("--max-latency needs --device NAME or --device-spec")
        out.append(("latency (roofline)", latency, "seconds"))
    out += _time_limits(args)
    min_coverage = args.min_coverage if args.min_coverage is not None else "100"
    try:
        coverage = float(min_coverage.rstrip("%"))
    except ValueError:
        raise GraphcostError(f"--min-coverage {min_coverage!r}: expected a percentage "
                             "such as 100 or 99.5") from None
    if not 0 <= coverage <= 100:
        raise GraphcostError(f"--min-coverage {min_coverage!r}: must be within 0..100")
    out.append(("coverage", coverage, "percent"))
    return out


def _time_limits(args) -> list[tuple[str, float, str]]:
    """The budgets on the time estimate, which a GPU device or a device profile gives."""
    out = []
    if args.serve:
        for given in ("--max-step-time", "--max-latency"):
            if getattr(args, given[2:].replace("-", "_")):
                raise GraphcostError(f"{given}: a serving review's times are --max-ttft "
                                     "(the prefill) and --max-tpot (a decode step)")
    for given, name in (("--max-ttft", TTFT), ("--max-tpot", TPOT)):
        value = getattr(args, given[2:].replace("-", "_"))
        if value and not args.serve:
            raise GraphcostError(f"{given} goes with --serve")
        if value:
            out.append((name, parse_time(value, given), "seconds"))
    if args.max_step_time:
        out.append(("time (estimate)", parse_time(args.max_step_time, "--max-step-time"),
                    "seconds"))
    if args.min_tokens_per_s:
        out.append(("tokens/s per GPU", parse_count(args.min_tokens_per_s,
                                                    "--min-tokens-per-s"), "rate"))
    if out and not (args.device or args.device_profile):
        raise GraphcostError("--max-step-time, --max-ttft, --max-tpot and --min-tokens-per-s "
                             "need a time estimate: a GPU --device NAME, or --device-profile "
                             "FILE")
    return out


TTFT, TPOT = "TTFT (estimate)", "TPOT (estimate)"


def _time_values(report) -> dict:
    """The time estimate's figures a budget can check (None: the report has no estimate)."""
    s = report.serving
    if s is not None:   # (the batch's output tokens a GPU: a replica is tp GPUs)
        t, gpus = s.time, s.collectives.tensor_parallel if s.collectives else 1
        return {TTFT: t.ttft_seconds if t else None, TPOT: t.tpot_seconds if t else None,
                "tokens/s per GPU": t.tokens_per_second / gpus if t else None}
    t = report.time
    return {"time (estimate)": t.seconds if t else None,
            "tokens/s per GPU": t.tokens_per_second if t else None}


def _band(report) -> float | None:
    t = report.serving.time if report.serving is not None else report.time
    return t.band if t is not None else None


def evaluate(report, limits) -> list[Check]:
    t, m = report.totals, report.memory
    # (serving: the batch's weights, cache and working peak, which the fit judges)
    peak = report.peak.allocated_bytes if report.serving else report.peak_bytes
    values = {"peak memory": peak, "activation peak": m.peak_bytes, "params": t.params,
              "MACs": t.macs, "FLOPs": t.flops, "coverage": report.coverage.percent,
              "latency (roofline)": report.roofline.total_seconds if report.roofline else None,
              **_time_values(report)}
    checks = []
    for name, limit, unit in limits:
        value = values[name]
        if value is None:   # (a time budget on a report that carries no estimate)
            raise GraphcostError(f"check {name}: {report.model} has no time estimate here "
                                 "(an ONNX model on a GPU keeps the roofline's bound; a model "
                                 "without a seq dimension has no tokens/s; a serving review "
                                 "is timed on a GPU --device)")
        if name == "peak memory":
            name = _peak_name(report)
        ok = value >= limit if unit in ("percent", "rate") else value <= limit
        band = _band(report) if name in _time_values(report) else None
        detail = f"estimate ± {band:.0%}" if band is not None else ""
        if name.startswith("peak memory (serving"):
            detail = "weights + KV cache + the larger step's working peak"
        if name == "coverage" and not ok:
            c = report.coverage
            detail = "not costed: " + ", ".join(f"{k}×{v}" for k, v in
                                                sorted({**c.unsupported,
                                                        **c.unknown_shape}.items()))
        checks.append(Check(name, value, limit, unit, ok, detail))
    ro = report.roofline
    if ro is not None:  # a device was named: the model must fit in it
        f = ro.fit
        checks.append(Check(f"fits {ro.device}", f.needs, f.offers, "bytes", f.fits,
                            " + ".join(p.what for p in f.parts)))
    return checks


def _peak_name(report) -> str:
    """The peak checked: the run's, or one rank's under a layout, named as it was asked (a
    data-parallel strategy as itself, a mesh as the command line spells it; a pipeline's
    largest stage's)."""
    from ...passes.parallel.mesh import Mesh

    p, pp = report.parallel, report.pipeline
    if pp is not None:
        return f"peak memory per rank ({Mesh(tuple(pp.mesh.items())).words}: stage " \
               f"{pp.worst_stage})"
    if report.serving is not None:
        return "peak memory (serving batch)"
    if p is None:
        return "peak memory"
    return f"peak memory per rank ({p.layout}" + \
        (f"×{p.world_size})" if p.layout == p.strategy else ")")


def _fmt(value: float, unit: str) -> str:
    return {"bytes": human_bytes, "count": human, "seconds": human_time,
            "percent": lambda v: f"{v:.1f}%", "rate": lambda v: f"{v:,.0f}"}[unit](value)


def _check_lines(checks, width: int | None) -> list[str]:
    """One row per check, the names padded to the longest; a detail that would run past
    ``width`` goes under its row, wrapped between words."""
    from ..render.table import wrap_prose
    pad = max((len(c.name) for c in checks), default=0)
    out = []
    for c in checks:
        op = "≥" if c.unit in ("percent", "rate") else "≤"
        row = (f"  {'PASS' if c.passed else 'FAIL'}  {c.name:<{pad}} "
               f"{_fmt(c.value, c.unit):>12} {op} {_fmt(c.limit, c.unit)}")
        if c.detail and width and len(row) + 2 + len(c.detail) > width:
            out += [row, *wrap_prose(c.detail, width, " " * 8, " " * 8)]
        else:
            out.append(row + (f"  {c.detail}" if c.detail else ""))
    return out


def _batch(report) -> int:
    """The batch checked: a pipeline stage's per step (the report's other sections are one
    micro-batch's), else the report's."""
    return report.pipeline.per_rank_batch if report.pipeline else report.batch


def run(args) -> int:
    refuse_overwrite(args.output, args.model)
    check_writable(args.output, "-o")
    limits = _limits(args)
    report = run_analysis(args.model, args, **serve_kwargs(args))
    checks = evaluate(report, limits)
    passed = all(c.passed for c in checks)
    if args.format == "json":
        text = json.dumps({"schema_version": 1, "kind": "check", "model": report.model,
                           "batch": _batch(report), "passed": passed,
                           "checks": [c.to_dict() for c in checks]},
                          ensure_ascii=False, indent=1) + "\n"
    else:
        from .output import terminal_width
        p = report.pipeline
        from ..render.table import wrap_prose
        s, width = report.serving, None if args.output else terminal_width()
        head = (f"graphcost check {report.model} (batch {_batch(report)}"
                + (f" in {p.microbatches:,} micro-batches)" if p else
                   f" × {s.prompt} + {s.generate} tokens)" if s else ")"))
        lines = wrap_prose(head, width, "", "  ") if width else [head]
        lines += _check_lines(checks, width)
        failed = sum(not c.passed for c in checks)
        lines.append("all checks passed" if passed else f"{failed} check(s) over budget")
        from .text import escape
        text = "\n".join(escape(line) for line in lines) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return EXIT_PASS if passed else EXIT_OVER
