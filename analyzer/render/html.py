"""One self-contained HTML file for a Report: summary, memory charts (inline SVG), and sortable
op-type / module / node tables.

No external URL of any kind: CSS and JS are inline, charts are SVG text. The output is
deterministic (no timestamps). Tables are embedded as one JSON blob and built by the inline JS,
which shows at most CAP rows until "show all" is pressed, so a 100k-node graph stays usable and
html_report stays linear in the graph size. Every model-provided string reaches the page either
through html.escape (static parts) or through JSON + textContent (tables), and the JSON blob has
<, > and & as \\u escapes so a node name can never close the script element.
"""
from __future__ import annotations

import json
import math
from html import escape

from ..app.report import Report
from ..app.units import axes_text, human, human_bytes
from . import explain
from .device_lines import fit_words, verdict_words
from .html_assets import CSS, JS, ONERROR
from .html_serving import serving_section
from .parallel import parallel_summary
from .plot import LEFT, PLAIN, RIGHT, W, nice_axis, tick_label, timeline_svg, y_grid

CAP = 1000  # table rows rendered before "show all" (a 100k-row DOM is slow to build)
H, TOP, BOTTOM = 300, 30, 40  # the inference chart's height (its width is plot.py's)
_SVG_NS = ' xmlns="http://www.w3.org/2000/svg"'  # not needed inline in HTML5; dropped


def _e(s) -> str:
    return escape(str(s), quote=True)


def _json_for_script(data) -> str:
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    # "</script", "<!--" can't appear once "<" is escaped; JSON.parse reads \u003c back as "<".
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _envelope(series, width: int) -> list[tuple[int, int]]:
    """(index, value) points: all of them when few, else each bucket's min and max in order, so
    the drawn curve keeps every spike (the peak included) at ≤ 2 points per pixel."""
    n = len(series)
    if n <= 2 * width:
        return list(enumerate(series))
    pts: list[tuple[int, int]] = []
    for b in range(width):
        lo, hi = b * n // width, (b + 1) * n // width
        i_min = min(range(lo, hi), key=series.__getitem__)
        i_max = max(range(lo, hi), key=series.__getitem__)
        pts += [(i, series[i]) for i in sorted({i_min, i_max})]
    return pts


def inference_svg(report: Report) -> str:
    """The inference activation-memory timeline (bytes live at each node), peak marked."""
    m = report.memory
    series = m.timeline
    n = len(series)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    top, step = nice_axis(max(series, default=0))

    def x(i: int) -> float:
        return LEFT + pw * i / max(1, n - 1)

    def y(v: float) -> float:
        return TOP + ph * (1 - v / top)

    out = [f'<svg id="inference-chart" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'font-family="sans-serif" font-size="12" role="img">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT}" y="18" font-size="14">activation memory live at each node '
           f'({_e(m.lifetimes)} lifetimes, inputs {"included" if m.include_inputs else "excluded"}'
           f')</text>']
    out += y_grid(top, y, tick_label, step)
    for i in sorted({round((n - 1) * k / 4) for k in range(5)} if n else ()):  # x: node index
        out.append(f'<text x="{x(i):.1f}" y="{TOP + ph + 16}" text-anchor="middle" '
                   f'fill="#555">{i}</text>')
    if n:
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in _envelope(series, pw))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{PLAIN}" stroke-width="1.5"/>')
        p = m.peak_node_index if 0 <= m.peak_node_index < n else \
            max(range(n), key=series.__getitem__)
        px, py = x(p), y(series[p])
        right = px > LEFT + pw * 0.6  # keep the label inside the chart
        out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{TOP + ph}" '
                   f'stroke="#d93025" stroke-dasharray="3,3"/>')
        out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="#d93025"/>')
        out.append(f'<text x="{px + (-6 if right else 6):.1f}" y="{max(py - 6, TOP + 12):.1f}" '
                   f'text-anchor="{"end" if right else "start"}" fill="#d93025">peak '
                   f'{human_bytes(series[p])} at {_e(m.peak_node or "")} (#{p})</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 6}" text-anchor="middle" fill="#555">'
               f'node (execution order)</text>')
    out.append("</svg>")
    return "\n".join(out)


def _kv(rows) -> str:
    return "<table class='kv'>" + "".join(
        f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _summary(r: Report) -> str:
    t, c, m = r.totals, r.coverage, r.memory
    dims = ", ".join(f"{k}={v}" for k, v in r.dims.items())
    rows = [
        ("model", f"{_e(r.model)} <span class='dim'>({_e(r.source)})</span>"),
        ("micro-batch" if r.pipeline else "batch",
         f"{r.batch}" + (f" (dims: {_e(dims)})" if dims else "")),
        ("params", f"{t.params:,} ({human_bytes(t.param_bytes)})"
         + (f" + buffers {t.buffers:,} ({human_bytes(t.buffer_bytes)})" if t.buffers else "")),
        ("MACs", f"{t.macs:,} ({human(t.macs)})"),
        ("FLOPs", f"{t.flops:,} ({human(t.flops)}) <span class='dim'>FLOPs = 2·MACs + other "
                  f"arithmetic</span>"),
        ("bytes", f"read {human_bytes(t.bytes_read)} ({t.bytes_read:,} B), written "
                  f"{human_bytes(t.bytes_written)} ({t.bytes_written:,} B)"),
        ("coverage", f"{c.covered:,}/{c.nodes:,} nodes costed ({c.percent:.1f}%)"),
        ("activations", f"naive sum {human_bytes(m.naive_sum_bytes)} "
                        f"({m.naive_sum_bytes:,} B)"),
        ("peak live", f"<b>{human_bytes(m.peak_bytes)}</b> ({m.peak_bytes:,} B) at "
                      f"{_e(m.peak_node or '—')} (#{m.peak_node_index}), {_e(m.lifetimes)} "
                      f"lifetimes, inputs {'included' if m.include_inputs else 'excluded'}"),
        ("arena", f"{human_bytes(m.arena_bytes)} ({m.arena_bytes:,} B, greedy by size; "
                  f"fragmentation {100 * m.fragmentation:.1f}%)" if m.arena_bytes is not None
         else "not planned for a training step"),
    ]
    if r.bounds is not None:
        b = r.bounds
        rows.append(("upper bounds", "MACs, FLOPs, bytes and memory depend on data-dependent "
                     f"sizes and stand at their maxima; at the minima: MACs {human(b.lower_macs)}"
                     f", FLOPs {human(b.lower_flops)}, activation peak "
                     f"{human_bytes(b.lower_activation_peak)}<br>" + "<br>".join(
                         _e(f"{s.symbol} ∈ [{s.lower}, {s.upper if s.upper is not None else '?'}]"
                            f" from {s.origin}; max: {s.source or f'none (--dim {s.symbol}=MAX)'}")
                         for s in b.sizes)))
    if m.live_at_peak:
        top = ", ".join(f"{_e(x.name)} {human_bytes(x.bytes)}" for x in m.live_at_peak[:10])
        more = len(m.live_at_peak) - 10
        rows.append(("live at peak", top + (f" (+{more} more)" if more > 0 else "")))
    if r.traced_layers:
        rows.append(("traced", _e(r.traced_layers)))
    return "<section id='summary'><h2>Summary</h2>" + _kv(rows) + "</section>"


def _warnings(r: Report) -> str:
    c = r.coverage
    items = []
    if c.unsupported:
        items.append("unsupported ops (no cost rule, counted as 0 — not costed): " + ", ".join(
            f"{_e(k)}×{v}" for k, v in c.unsupported.items()))
    if c.unknown_shape:
        items.append("ops with unknown shapes (not costed): " + ", ".join(
            f"{_e(k)}×{v}" for k, v in c.unknown_shape.items()))
    items += [_e(w) for w in r.warnings]
    items += [f"shape: {_e(s)}" for s in r.shape_issues]
    if not items:
        return ""
    return ("<section id='warnings' class='warn'><h2>Warnings</h2><ul>"
            + "".join(f"<li>{i}</li>" for i in items) + "</ul></section>")


def _training(r: Report) -> str:
    t = r.training
    if t is None:
        return ""
    run = t.run   # (under a checkpoint plan: the checkpointed step, as the text report)
    where = run.peak_phase + (f" at {run.peak_node}" if run.peak_node else " step")
    first = explain.first_step(r)
    rows = [("step peak", f"<b>{human_bytes(run.peak_bytes)}</b> ({run.peak_bytes:,} B) in "
                          f"{_e(where)}, steady state" + (f"; {_e(first)}" if first else "")),
            ("includes", _e(explain.training_includes(r))),
            ("optimizer", _e(t.optimizer)),
            ("params / grads", f"{human_bytes(t.param_bytes)} / {human_bytes(t.grad_bytes)}"),
            ("optimizer state", human_bytes(t.optimizer_state_bytes)),
            ("step temporaries", human_bytes(t.step_temp_bytes))]
    if t.buffer_bytes:
        rows.append(("buffers", human_bytes(t.buffer_bytes)))
    parts = ["<section id='training'><h2>Training step</h2>", _kv(rows),
             "<h3>At the peak</h3>",
             _kv((k.replace("_", " "), f"{human_bytes(v)} ({v:,} B)")
                 for k, v in run.breakdown_at_peak.items())]
    if t.what_if:
        parts.append("<h3>What-ifs</h3><ul>")
        for name in t.what_if:
            parts.append(f"<li>{_e(explain.what_if_line(r, name))}</li>")
        parts.append("</ul>")
    c = t.checkpoint
    if c is not None:
        parts.append("<h3>Checkpoint plan</h3>" + _kv([
            ("mode", _e(c.mode)),
            ("segments", _e(", ".join(c.segments) or "none needed")),
            ("peak", f"{human_bytes(c.peak_without_bytes)} → {human_bytes(c.peak_bytes)} "
                     f"({c.peak_without_bytes:,} → {c.peak_bytes:,} B)"),
            ("recompute", f"{human(c.recompute_flops)} FLOPs ({c.recompute_pct:.1f}% of the "
                          f"step)"),
        ] + ([("budget", human_bytes(c.budget_bytes))] if c.budget_bytes else [])
          + ([("note", _e(explain.checkpoint_note(r)))] if explain.checkpoint_note(r) else [])))
    parts.append("<div class='chart'>" + timeline_svg(r).replace(_SVG_NS, "", 1) + "</div>")
    parts.append("</section>")
    return "".join(parts)


def _parallel(r: Report) -> str:
    """One rank's step under the data-parallel strategy (its curve is in the training
    chart, beside the single-device one), or a pipeline's stages (the page's other sections
    are the whole model at one micro-batch)."""
    if r.parallel is None and r.pipeline is None:
        return ""
    title = "Pipeline: every stage" if r.pipeline else "Data parallel: one rank"
    rows = [(label or "", _e(" ".join(items))) for label, items in parallel_summary(r)]
    return f"<section id='parallel'><h2>{title}</h2>" + _kv(rows) + "</section>"


def _num(v):
    """A finite number or None: JSON has no Infinity (a node moving no bytes has infinite
    FLOP/byte intensity), and JSON.parse would reject the whole blob."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    return v if ok else None


def _roofline(r: Report, names: dict[int, tuple[str, str]]):
    """Optional section (another pass may add report.roofline): header HTML and the table of
    its top nodes, plus index -> (seconds, intensity, bound) for the node table."""
    rf = getattr(r, "roofline", None)
    if rf is None:
        return "", None, {}
    per = {}
    for n in getattr(rf, "nodes", ()) or ():
        per[getattr(n, "index", None)] = (_num(getattr(n, "seconds", None)),
                                          _num(getattr(n, "intensity", None)),
                                          str(getattr(n, "bound", "") or ""))
    device = getattr(rf, "device", "")
    device = getattr(device, "name", device)
    total = _num(getattr(rf, "total_seconds", None))
    kv = [("device", _e(device)), ("label", _e(getattr(rf, "label", "") or "")),
          ("total time", f"{total * 1e3:.3f} ms (a lower bound)" if total is not None else "—")]
    comp, mem = (_num(getattr(rf, k, None)) for k in ("compute_seconds", "memory_seconds"))
    if comp is not None and mem is not None:
        kv.append(("split", f"compute-bound {comp * 1e3:.3f} ms, memory-bound "
                            f"{mem * 1e3:.3f} ms"))
    f = getattr(rf, "fit", None)
    if f is not None:
        kv.append(("fits", _e(" ".join(fit_words(f)))))
    if getattr(rf, "fallbacks", ()):
        kv.append(("note", "no fast path for " + _e(", ".join(rf.fallbacks))
                   + ": the fp32 rate was used"))
    head = "<section id='roofline'><h2>Roofline estimate</h2>" + _kv(kv)
    rows = []
    for i in getattr(rf, "top", ()) or ():
        s, a, b = per.get(i, (None, None, ""))
        name, op = names.get(i, ("", ""))
        rows.append([i, name, op, s, a, b])
    table = {"id": "roofline-table", "cap": CAP, "rows": rows, "columns": [
        ["index", "#", "idx"], ["name", "node", "text"], ["op", "op", "text"],
        ["seconds", "time", "sec"], ["intensity", "FLOP/byte", "float"],
        ["bound", "bound", "text"]]}
    return head, table, per


# long: the page's sections in order: mostly one template string per section
def html_report(report: Report) -> str:
    r = report
    names = {n.index: (n.name, n.op) for n in r.nodes}
    rf_head, rf_table, rf_nodes = _roofline(r, names)
    repeats = any(n.repeat != 1 for n in r.nodes)
    node_cols = [["index", "#", "idx"], ["name", "node", "text"], ["op", "op", "text"],
                 ["scope", "module", "text"], ["inputs", "input shape(s)", "text"],
                 ["outputs", "output shape(s)", "text"], ["params", "params", "count"],
                 ["output_bytes", "out bytes", "bytes"], ["macs", "MACs", "si"],
                 ["flops", "FLOPs", "si"], ["bytes_read", "read", "bytes"],
                 ["bytes_written", "written", "bytes"], ["bytes_total", "R+W", "bytes"],
                 ["status", "status", "text"]]
    if repeats:
        node_cols.append(["repeat", "×", "count"])
    if rf_table is not None:
        node_cols += [["seconds", "time", "sec"], ["intensity", "FLOP/byte", "float"],
                      ["bound", "bound", "text"]]
    fields = {f.index: f for f in r.receptive_field}
    if fields:
        node_cols += [["rf", "RF", "text"], ["jump", "jump", "text"], ["start", "start", "text"]]
    node_rows = []
    for n in r.nodes:
        row = [n.index, n.name, n.op + (" (upper bound)" if n.bound else ""), n.scope,
               "; ".join(n.input_shapes),
               "; ".join(n.output_shapes), n.params, n.output_bytes, n.macs, n.flops,
               n.bytes_read, n.bytes_written, n.bytes_total, n.status]
        if repeats:
            row.append(n.repeat)
        if rf_table is not None:
            row += list(rf_nodes.get(n.index, (None, None, "")))
        if fields:
            f = fields.get(n.index)
            row += [axes_text(f.rf), axes_text(f.jump), axes_text(f.start)] if f else ["", "", ""]
        node_rows.append(row + [int(_minor(n))])  # (past the columns: never shown)
    ops = sorted(r.by_op_type.items(), key=lambda kv: (-kv[1].flops, kv[0]))
    tables = [
        {"id": "ops", "cap": CAP, "columns": [
            ["op", "op", "text"], ["count", "count", "count"], ["macs", "MACs", "si"],
            ["flops", "FLOPs", "si"], ["bytes_read", "read", "bytes"],
            ["bytes_written", "written", "bytes"]],
         "rows": [[op, o.count, o.macs, o.flops, o.bytes_read, o.bytes_written]
                  for op, o in ops]},
        {"id": "modules", "cap": CAP, "columns": [
            ["path", "module", "text"], ["type", "type", "text"], ["depth", "depth", "idx"],
            ["nodes", "nodes", "count"], ["params", "params", "count"], ["macs", "MACs", "si"],
            ["flops", "FLOPs", "si"], ["output_bytes", "out bytes", "bytes"]],
         "rows": [[m.path or "(model)", m.type, m.depth, m.nodes, m.params, m.macs, m.flops,
                   m.output_bytes] for m in r.modules]},
        {"id": "nodes", "cap": CAP, "columns": node_cols, "rows": node_rows, "minor": True},
    ]
    if rf_table is not None:
        tables.append(rf_table)

    body = [f"<h1>graphcost: {_e(r.model)}</h1>", _headline(r),
            "<pre id='errors' hidden></pre>",
            "<noscript><p class='warn'>The tables need JavaScript; the summary and charts do "
            "not.</p></noscript>",
            _summary(r), _warnings(r), serving_section(r),
            # a training step's chart first (issue 48): the step decides, not its activations
            _training(r), _parallel(r),
            "<section id='memory'><h2>Activation memory "
            + ("(liveness over the analyzed graph's nodes)" if r.training else "(inference)")
            + "</h2><div class='chart'>",
            inference_svg(r), "</div></section>"]
    if rf_head:
        body += [rf_head, _table_html("roofline-table", "Slowest nodes"), "</section>"]
    body += [
        "<section id='op-types'><h2>By op type</h2>", _table_html("ops"), "</section>",
        "<section id='module-tree'><h2>Modules</h2>",
        _table_html("modules") if r.modules else "<p class='dim'>no module information in "
                                                 "this graph</p>", "</section>",
        "<section id='node-list'><h2>Nodes</h2>",
        _table_html("nodes", filter_box=True, minor=sum(map(_minor, r.nodes))), "</section>",
        f"<script type='application/json' id='gc-data'>{_json_for_script(tables)}</script>",
        f"<script>{JS}</script>"]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>graphcost: {_e(r.model)}</title><style>{CSS}</style>"
            f"<script>{ONERROR}</script></head>\n<body>\n" + "\n".join(body)
            + "\n</body></html>\n")


def _headline(r: Report) -> str:
    """The figure that decides a fit, first (issue 26): with a device, the one fits answer
    (the serving batch's, a rank's, the training step's or the inference run's: roofline.fit);
    without one, the peak the run holds (report.peak_bytes: a rank's, the step's or the
    inference's), with what it includes."""
    ro, s = r.roofline, r.serving
    if s is not None:
        work = max(s.prefill.peak_bytes, s.decode.peak_bytes)
        peak = (f"the serving batch ({s.batch} × {s.prompt + s.generate:,} tokens): weights "
                f"{human_bytes(s.weight_bytes)} + KV cache {human_bytes(s.kv_cache_bytes)} + "
                f"working peak {human_bytes(work)}; reserved <b>"
                f"{human_bytes(s.reserved_peak_bytes)}</b> on the caching allocator")
    else:
        peak = (f"<b>{human_bytes(r.peak_bytes)}</b> ({r.peak_bytes:,} B) peak: "
                f"{_e(explain.peak_includes(r))}")
    f = getattr(ro, "fit", None)   # (the roofline section reads it the same way)
    if ro is None or f is None:
        return f"<p class='headline' id='headline'>{peak}</p>"
    _, margin = verdict_words(f)
    answer = "does NOT fit" if not f.fits else \
        "fits, flushing the allocator's cache," if f.flushes else "fits"
    return (f"<p class='headline' id='headline'><b>{answer} on {_e(ro.label)}</b>: needs "
            f"<b>{human_bytes(f.needs)}</b> of {human_bytes(f.offers)} ({margin}); "
            f"{peak}</p>")


def _minor(n) -> bool:
    """A node the table hides until asked: costed, and computing nothing, holding no
    parameter and writing no byte (views, reshapes, shape arithmetic: most of an exported
    graph's rows)."""
    return n.status == "ok" and not (n.flops or n.params or n.bytes_written)


def _table_html(tid: str, title: str = "", filter_box: bool = False, minor: int = 0) -> str:
    f = (f"<input type='search' class='filter' data-table='{tid}' "
         f"placeholder='filter by name, op, module…'>" if filter_box else "")
    if minor:  # (the table's JS hides them until the box is ticked)
        f += (f"<label class='minor'><input type='checkbox' class='minor' data-table='{tid}'> "
              f"show the {minor:,} node(s) that compute nothing and write no bytes (views, "
              "reshapes)</label>")
    h = f"<h3>{_e(title)}</h3>" if title else ""
    return (f"{h}<div class='tools'>{f}<span class='count' id='{tid}-count'></span>"
            f"<button type='button' class='show-all' id='{tid}-all' hidden>show all</button>"
            f"</div><div class='scroll'><table class='data' id='{tid}'><thead></thead>"
            f"<tbody></tbody></table></div>")


# Errors go into the DOM (a headless browser's dumped DOM shows them; so does the page).
