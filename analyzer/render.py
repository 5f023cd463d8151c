"""Text renderings of a Report: rich table, CSV, Markdown. Rendering never computes costs."""
from __future__ import annotations

import csv
import io

from typing import Any, Callable

from graphcost.analyzer.report import Report

NODE_COLUMNS = ("index", "name", "op", "input_shapes", "output_shapes", "params",
                "output_bytes", "macs", "flops", "bytes_read", "bytes_written", "bytes_total",
                "status")


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23M' (SI prefixes; bytes use binary units via human_bytes)."""
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}{unit}"
    return f"{int(n)}{unit}"


def human_bytes(n: float) -> str:
    for div, suffix in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}"
    return f"{int(n)} B"


def _node_cells(n) -> list[str]:
    return [str(n.index), n.name, n.op, "; ".join(n.input_shapes), "; ".join(n.output_shapes),
            f"{n.params:,}" if n.params else "", human_bytes(n.output_bytes),
            human(n.macs) if n.macs else "", human(n.flops) if n.flops else "",
            human_bytes(n.bytes_read), human_bytes(n.bytes_written), human_bytes(n.bytes_total)]


def human_time(seconds: float) -> str:
    for div, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if seconds >= div:
            return f"{seconds / div:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns" if seconds else "0"


def axes_text(values) -> str:
    """One value per spatial axis: "435" when all agree, else "435×211"."""
    texts = [f"{v:g}" for v in values]
    return texts[0] if len(set(texts)) == 1 else "×".join(texts)


def extra_columns(r: Report) -> list[tuple[str, str, Callable[[int], str], Callable[[int], Any]]]:
    """Optional per-node columns: (header, csv name, text of node i, raw value of node i)."""
    cols = []
    if r.receptive_field:
        rf = {f.index: f for f in r.receptive_field}
        for head, attr in (("RF", "rf"), ("jump", "jump"), ("start", "start")):
            def cell(i: int, attr=attr) -> str:
                return axes_text(getattr(rf[i], attr)) if i in rf else ""
            cols.append((head, "receptive_field" if attr == "rf" else attr, cell, cell))
    ro = r.roofline
    if ro is not None:
        t = ro.nodes
        cols += [
            ("time (roofline)", "roofline_seconds", lambda i: human_time(t[i].seconds),
             lambda i: t[i].seconds),
            ("FLOP/B", "intensity",
             lambda i: f"{t[i].intensity:.3g}" if t[i].intensity != float("inf") else "∞",
             lambda i: t[i].intensity if t[i].intensity != float("inf") else ""),
            ("bound", "bound", lambda i: t[i].bound, lambda i: t[i].bound),
        ]
    return cols


def roofline_lines(r: Report) -> list[str]:
    ro = r.roofline
    if ro is None:
        return []
    gb = ro.bandwidth / 1e9
    rate = ro.peak_flops["tf32" if ro.tf32 and ro.peak_flops.get("tf32") else "fp32"] or 0
    lines = [
        f"device      {ro.label}: {rate / 1e12:.1f} TFLOP/s {'tf32' if ro.tf32 else 'fp32'}, "
        f"{gb:,.0f} GB/s, {human_bytes(ro.memory_bytes)}",
        f"roofline    {human_time(ro.total_seconds)} lower bound "
        f"(compute-bound nodes {human_time(ro.compute_seconds)}, memory-bound "
        f"{human_time(ro.memory_seconds)}); max(FLOPs/peak, bytes/bandwidth) per node — "
        "not a benchmark",
        f"fits        {'yes' if ro.fits else 'NO'}: needs {human_bytes(ro.required_bytes)} = "
        f"tensors {human_bytes(ro.tensor_bytes)} × (1 + {100 * ro.allocator_fraction:.0f}% "
        f"allocator) + context {human_bytes(ro.context_bytes)}, of "
        f"{human_bytes(ro.memory_bytes)}",
    ]
    if ro.fallbacks:
        lines.append(f"            no fast path for {', '.join(ro.fallbacks)} on {ro.device}: "
                     "those nodes use the fp32 rate")
    return lines


def top_nodes_lines(r: Report) -> list[str]:
    ro = r.roofline
    if ro is None or not ro.top:
        return []
    lines = ["slowest nodes (roofline):"]
    for i in ro.top:
        n, t = r.nodes[i], ro.nodes[i]
        share = 100 * t.seconds / ro.total_seconds if ro.total_seconds else 0
        lines.append(f"  {human_time(t.seconds):>9}  {share:5.1f}%  {t.bound:<7}  "
                     f"{n.op:<16} {n.name}")
    return lines


def summary_lines(r: Report) -> list[str]:
    t, c, m = r.totals, r.coverage, r.memory
    dims = ", ".join(f"{k}={v}" for k, v in r.dims.items())
    lines = [
        f"model {r.model} ({r.source}), batch {r.batch}" + (f", dims {dims}" if dims else ""),
        f"params      {t.params:,} ({human_bytes(t.param_bytes)})"
        + (f" + buffers {t.buffers:,} ({human_bytes(t.buffer_bytes)})" if t.buffers else ""),
        f"MACs        {t.macs:,} ({human(t.macs)})",
        f"FLOPs       {t.flops:,} ({human(t.flops)})  [2·MACs + other arithmetic]",
        f"bytes       read {human_bytes(t.bytes_read)}, written {human_bytes(t.bytes_written)}",
        f"coverage    {c.covered}/{c.nodes} nodes costed ({c.percent:.1f}%)",
    ]
    if c.unsupported:
        lines.append("unsupported " + ", ".join(f"{k}×{v}" for k, v in c.unsupported.items())
                     + "  (counted as 0 — not costed)")
    if c.unknown_shape:
        lines.append("no shape    " + ", ".join(f"{k}×{v}" for k, v in c.unknown_shape.items())
                     + "  (shapes unknown — not costed)")
    inputs = ("incl." if m.include_inputs else "excl.") + f" inputs, {m.lifetimes} lifetimes"
    lines += [
        f"activations naive sum {human_bytes(m.naive_sum_bytes)} ({m.naive_sum_bytes:,} B, "
        f"{inputs})",
        f"            peak live {human_bytes(m.peak_bytes)} ({m.peak_bytes:,} B) at "
        f"{m.peak_node} (#{m.peak_node_index})",
        f"            arena     {human_bytes(m.arena_bytes)} ({m.arena_bytes:,} B, greedy by "
        f"size; fragmentation {100 * m.fragmentation:.1f}%)" if m.arena_bytes is not None else
        "            arena     not planned for a training step (PyTorch's caching allocator "
        "serves it)",
    ]
    if m.live_at_peak:
        top = ", ".join(f"{x.name} {human_bytes(x.bytes)}" for x in m.live_at_peak[:5])
        more = len(m.live_at_peak) - 5
        lines.append(f"            live at peak: {top}" + (f" (+{more} more)" if more > 0 else ""))
    t = r.training
    if t is not None:
        b = t.breakdown
        where = f"{t.peak_phase}" + (f" at {t.peak_node}" if t.peak_node else " step")
        lines += [
            f"training    step peak {human_bytes(t.peak_bytes)} ({t.peak_bytes:,} B) in {where}, "
            f"optimizer {t.optimizer}",
            "            at peak: " + ", ".join(f"{k} {human_bytes(v)}" for k, v in b.items()),
        ]
        for name, w in t.what_if.items():
            saved = t.peak_bytes - w["peak_bytes"]
            extra = (f", recompute {human(w['recompute_flops'])} FLOPs"
                     if "recompute_flops" in w else "")
            change = f"saves {human_bytes(saved)}" if saved >= 0 else \
                f"adds {human_bytes(-saved)}"
            lines.append(f"what-if     {name.replace('_', ' ')}: peak "
                         f"{human_bytes(w['peak_bytes'])} ({change}{extra})")
        c = t.checkpoint
        if c is not None:
            segs = ", ".join(c.segments) or "none needed"
            lines += [
                f"checkpoint  {c.mode}: {segs}",
                f"            peak {human_bytes(c.peak_without_bytes)} → {human_bytes(c.peak_bytes)}"
                f" ({c.peak_without_bytes:,} → {c.peak_bytes:,} B); recompute "
                f"{human(c.recompute_flops)} FLOPs ({c.recompute_pct:.1f}% of the step)"
                + (f"; budget {human_bytes(c.budget_bytes)}" if c.budget_bytes else ""),
            ]
    if r.moe is not None:
        e, first = r.moe, r.moe.layers[0]
        lines += [
            f"experts     {len(e.layers)} MoE layer(s), top-{first.top_k} of {first.experts}: "
            f"params {e.active_params:,} active per token of {e.total_params:,}",
            f"            FLOPs per token {human(e.flops_per_token)} (all experts: "
            f"{human(e.dense_flops_per_token)}); rows per expert ≈ {first.rows_per_expert:g} "
            f"balanced (ESTIMATE), ≤ {first.rows_per_expert_max:,} (BOUND)",
        ]
    lines += roofline_lines(r)
    for w in r.warnings:
        lines.append(f"warning     {w}")
    return lines


def render_modules(r: Report, console, depth: int) -> None:
    from rich.table import Table

    table = Table(title=f"graphcost: {r.model} — modules to depth {depth}", header_style="bold")
    for col in ("module", "type", "params", "MACs", "FLOPs", "out bytes", "nodes"):
        table.add_column(col, justify="left" if col in ("module", "type") else "right")
    for m in r.modules:
        if m.depth > depth:
            continue
        label = ("  " * m.depth) + (m.path.rsplit(".", 1)[-1] if m.path else "(model)")
        table.add_row(label, m.type, f"{m.params:,}", human(m.macs) if m.macs else "",
                      human(m.flops) if m.flops else "", human_bytes(m.output_bytes),
                      str(m.nodes))
    console.print(table)


def render_table(r: Report, console, max_rows: int = 500, depth: int | None = None) -> None:
    from rich.table import Table

    if depth is not None:
        render_modules(r, console, depth)
        max_rows = -1

    table = Table(title=f"graphcost: {r.model}", show_lines=False, header_style="bold")
    for col, justify in (("#", "right"), ("node", "left"), ("op", "left"),
                         ("input shape(s)", "left"), ("output shape", "left"),
                         ("params", "right"), ("out bytes", "right"), ("MACs", "right"),
                         ("FLOPs", "right"), ("read", "right"), ("written", "right"),
                         ("R+W", "right")):
        table.add_column(col, justify=justify)
    extra = extra_columns(r)
    for head, *_ in extra:
        table.add_column(head, justify="right")
    rows = r.nodes if max_rows == 0 else r.nodes[:max(max_rows, 0)]
    for n in rows:
        style = None if n.status == "ok" else "yellow"
        cells = _node_cells(n) + [text(n.index) for _, _, text, _ in extra]
        if n.status != "ok":
            cells[2] += f" ({n.status})"
        table.add_row(*cells, style=style)
    if rows:
        console.print(table)
    if rows and len(rows) < len(r.nodes):
        console.print(f"… {len(r.nodes) - len(rows):,} more nodes (--max-rows 0 shows all; "
                      "--format json/csv has every node)")
    ops = Table(title="by op type", header_style="bold")
    for col in ("op", "count", "MACs", "FLOPs", "read", "written"):
        ops.add_column(col, justify="left" if col == "op" else "right")
    for o in sorted(r.by_op_type, key=lambda o: (-o.flops, o.op)):
        ops.add_row(o.op, str(o.count), human(o.macs) if o.macs else "",
                    human(o.flops) if o.flops else "", human_bytes(o.bytes_read),
                    human_bytes(o.bytes_written))
    console.print(ops)
    for line in top_nodes_lines(r):
        console.print(line, markup=False, highlight=False)
    for line in summary_lines(r):
        console.print(line, markup=False, highlight=False)


def render_csv(r: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    extra = extra_columns(r)
    w.writerow(NODE_COLUMNS + tuple(name for _, name, _, _ in extra))
    for n in r.nodes:
        w.writerow([n.index, n.name, n.op, " ".join(n.input_shapes), " ".join(n.output_shapes),
                    n.params, n.output_bytes, n.macs, n.flops, n.bytes_read, n.bytes_written,
                    n.bytes_total, n.status] + [raw(n.index) for _, _, _, raw in extra])
    return buf.getvalue()


def render_markdown(r: Report) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    out = [f"# graphcost: {esc(r.model)}", "", "## Summary", ""]
    out += [f"    {line}" for line in summary_lines(r)]
    out += ["", "## By op type", "", "| op | count | MACs | FLOPs | bytes read | bytes written |",
            "|---|---:|---:|---:|---:|---:|"]
    for o in sorted(r.by_op_type, key=lambda o: (-o.flops, o.op)):
        out.append(f"| {esc(o.op)} | {o.count} | {o.macs:,} | {o.flops:,} | {o.bytes_read:,} | "
                   f"{o.bytes_written:,} |")
    top = top_nodes_lines(r)
    if top:
        out += ["", "## Slowest nodes (roofline lower bound)", ""] + [f"    {x}" for x in top]
    extra = extra_columns(r)
    out += ["", "## Nodes", "",
            "| # | node | op | input shape(s) | output shape | params | out bytes | MACs | FLOPs "
            "| read | written | R+W |" + "".join(f" {h} |" for h, *_ in extra),
            "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(extra)]
    for n in r.nodes:
        op = n.op if n.status == "ok" else f"{n.op} ({n.status})"
        out.append(f"| {n.index} | {esc(n.name)} | {esc(op)} | {'; '.join(n.input_shapes)} | "
                   f"{'; '.join(n.output_shapes)} | {n.params:,} | {n.output_bytes:,} | "
                   f"{n.macs:,} | {n.flops:,} | {n.bytes_read:,} | {n.bytes_written:,} | "
                   f"{n.bytes_total:,} |" + "".join(f" {text(n.index)} |"
                                                    for _, _, text, _ in extra))
    return "\n".join(out) + "\n"


def max_batch_lines(model: str, m) -> list[str]:
    """analyzer.batch_scaling.MaxBatch as text."""
    f = m.fit
    what = "training step" if m.train else "inference"
    lines = [f"{model} on {m.device} ({human_bytes(m.memory_bytes)}), {what}:"]
    if m.batch == 0:
        lines.append(f"  nothing fits: batch 1 needs {human_bytes(m.required_bytes)}")
    else:
        lines.append(f"  max batch   {m.batch:,} (needs {human_bytes(m.required_bytes)}; batch "
                     f"{m.batch + 1:,} would need {human_bytes(m.next_required_bytes)})")
    lines += [
        f"  memory(b) = {human_bytes(f.memory.fixed)} + {human_bytes(f.memory.per_sample)}·b "
        f"(tensors with overhead; fitted at b=1,2, off by {100 * f.memory_error:+.2f}% at "
        f"b={f.check_batch:,})",
        f"  FLOPs(b)  = {human(f.flops.fixed)} + {human(f.flops.per_sample)}·b "
        f"(off by {100 * f.flops_error:+.2f}% at b={f.check_batch:,})",
        f"  {m.analyses} full analyses; every answer is checked by analyzing that batch",
    ]
    return lines
