"""``graphcost verify``'s terminal view (the result objects are analyzer/measure/verify_onnx.py's and
verify_torch.py's); tables fit the width (analyzer/render/table.py)."""
from __future__ import annotations

from ..app.units import human_bytes, human_time
from .table import Col, print_prose, print_table

MAX_LISTED = 20  # shape mismatches / unknowns listed in the table (JSON lists all)


def _b(n: int | None) -> str:
    if n is None:
        return "—"
    return human_bytes(n) if n < 1024 else f"{human_bytes(n)} ({n:,} B)"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:+.1f}%"


def onnx_view(r, console, width: int | None) -> None:
    cpu = r.cpu
    dims = "".join(f", {k}={v}" for k, v in sorted(r.dims.items()) if v != r.batch or
                   k != "batch")
    console.print(f"graphcost verify {r.model} — onnxruntime on this CPU, batch "
                  f"{r.batch}{dims}", markup=False, highlight=False)
    ok = "all match" if not r.shapes_mismatched else f"{r.shapes_mismatched} MISMATCHED"
    rows = [["output shapes", f"{r.shapes_checked} inferred", f"{r.shapes_checked} real",
             f"{r.shapes_matched}/{r.shapes_checked} match ({ok})"]]
    if r.shapes_unknown:
        rows.append(["  not checked", f"{r.shapes_unknown} unknown", "", ""])
    rows += [["latency", f"≥ {human_time(r.roofline_seconds)} (roofline)",
              f"{human_time(r.latency_seconds)} (median of {r.repeat})",
              f"measured / roofline = {r.ratio:.1f}"],
             ["  compute-bound", human_time(r.roofline_compute_seconds),
              f"fastest {human_time(r.latency_min_seconds)}", ""],
             ["  memory-bound", human_time(r.roofline_memory_seconds), "", ""],
             ["activation peak", f"{_b(r.predicted_peak_bytes)} ({r.lifetimes})",
              "not measured", "onnxruntime's arena has no peak"]]
    print_table(console, None, [Col("", min_width=10, priority=1, wrap=True),
                                Col("predicted", min_width=12, priority=3, wrap=True),
                                Col("measured", min_width=12, priority=2, wrap=True),
                                Col("comparison", min_width=10, wrap=True)], rows,
                width=width)
    print_prose(console, f"roofline device: this CPU, measured with numpy: "
                f"{cpu.peak_flops / 1e9:.1f} GFLOP/s (one thread's float32 512³ matmul, "
                f"{cpu.thread_flops / 1e9:.1f}, × {cpu.cores} cores), "
                f"{cpu.bandwidth / 1e9:.1f} GB/s (128 MiB copy); the model: "
                f"{r.flops / 1e9:.3g} GFLOP, {_b(r.bytes_moved)} moved", width)
    if r.ratio < 1:
        print_prose(console, "the run beat the lower bound: its data stayed in cache (the "
                    "bound charges every byte to memory), or the machine was busier while its "
                    "peak was measured", width)
    for title, listed in (("shape mismatches", r.mismatches),
                          ("not checked: graphcost has no concrete shape", r.unknown)):
        if not listed:
            continue
        print_table(console, title, [Col("value", priority=2), Col("node", priority=1),
                                     Col("graphcost inferred", priority=3),
                                     Col("onnxruntime real", priority=3)],
                    [[x.value, x.node, x.predicted, x.measured or "not fetched"]
                     for x in listed[:MAX_LISTED]], width=width)
        if len(listed) > MAX_LISTED:
            console.print(f"… and {len(listed) - MAX_LISTED} more (--format json lists all)",
                          markup=False)


def torch_view(r, console, width: int | None) -> None:
    what = "one training step" + (f" ({r.optimizer})" if r.optimizer else "") \
        if r.mode == "training" else "one forward, torch.no_grad()"
    console.print(f"graphcost verify {r.model} — MemTracker on this CPU, {what}, batch "
                  f"{r.batch}", markup=False, highlight=False)
    rows = [["(whole model)", "", "1", _b(r.predicted_peak_bytes), _b(r.measured_peak_bytes),
             _pct(r.rel_error)]]
    rows += [["  " + p.category, "", "", _b(p.predicted_bytes), _b(p.measured_bytes),
              _pct(p.rel_error)] for p in r.parts]
    rows += [["  " * (m.depth - 1) + m.path, m.type, str(m.calls), _b(m.predicted_bytes),
              _b(m.measured_bytes), _pct(m.rel_error)] for m in r.modules if m.path]
    print_table(console, None, [
        Col("module", min_width=12, priority=2), Col("type", min_width=6, optional=True),
        Col("calls", numeric=True), Col("predicted peak", numeric=True),
        Col("measured peak", numeric=True), Col("rel. error", numeric=True)], rows,
        width=width)
    print_prose(console, f"{r.note}; rel. error = predicted / measured − 1", width)
