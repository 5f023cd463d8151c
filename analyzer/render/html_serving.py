"""The HTML report's serving section: the KV cache and the two steps, the dtype what-ifs, and
memory and decode time against the context length (inline SVG). Renders only."""
from __future__ import annotations

from collections.abc import Sequence
from html import escape

from ..app.report import Report
from ..app.units import human_bytes, human_time
from .plot import CHECKPOINTED, LEFT, PLAIN, RIGHT, W, nice_axis, tick_label, y_grid
from .serving import PHASE_COLUMNS, phase_rows, serving_summary

CW, CH, TOP, BOTTOM = 440, 260, 30, 40   # each chart


def _e(s) -> str:
    return escape(str(s), quote=True)


def _chart(title: str, xs: list[int], series: list[tuple[str, list[float], str]],
           fmt, marks: Sequence[tuple[float, float, str, str]] = (), level=None) -> str:
    """A small line chart: x = context tokens; ``series`` (label, values, colour); ``marks``
    (x, y, label, colour) drawn as points; ``level`` (value, label) a dashed line."""
    top = max([max(v) for _, v, _ in series] + [m[1] for m in marks]
              + ([level[0]] if level else []) + [1e-30])
    step = None
    if fmt is human_bytes:  # a memory axis: round sizes (plot.py's), not quarters of the top
        top, step = nice_axis(round(top))
        fmt = tick_label
    pw, ph = CW - LEFT - RIGHT, CH - TOP - BOTTOM
    x_max = max(xs)

    def x(v: float) -> float:
        return LEFT + pw * v / x_max

    def y(v: float) -> float:
        return TOP + ph * (1 - v / top)

    out = [f'<svg class="serving-chart" width="{CW}" height="{CH}" viewBox="0 0 {CW} {CH}" '
           f'font-family="sans-serif" font-size="11" role="img">',
           f'<rect width="{CW}" height="{CH}" fill="white"/>',
           f'<text x="{LEFT}" y="16" font-size="13">{_e(title)}</text>']
    out += y_grid(top, y, fmt, step)
    out = [s.replace(f'x2="{W - RIGHT}"', f'x2="{CW - RIGHT}"') for s in out]  # narrower
    for k in range(5):
        v = round(x_max * k / 4)
        out.append(f'<text x="{x(v):.1f}" y="{TOP + ph + 14}" text-anchor="middle" '
                   f'fill="#555">{v:,}</text>')
    if level is not None:
        out.append(f'<line x1="{LEFT}" x2="{CW - RIGHT}" y1="{y(level[0]):.1f}" '
                   f'y2="{y(level[0]):.1f}" stroke="#d93025" stroke-dasharray="4,3"/>')
        out.append(f'<text x="{CW - RIGHT - 4}" y="{y(level[0]) - 4:.1f}" text-anchor="end" '
                   f'fill="#d93025">{_e(level[1])}</text>')
    for label, values, color in series:
        pts = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(xs, values))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" '
                   f'stroke-width="1.5"><title>{_e(label)}</title></polyline>')
    for mx, my, label, color in marks:
        out.append(f'<circle cx="{x(mx):.1f}" cy="{y(my):.1f}" r="4" fill="{color}">'
                   f'<title>{_e(label)}</title></circle>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{CH - 6}" text-anchor="middle" fill="#555">'
               f'context (prompt + generated tokens)</text>')
    out.append("</svg>")
    return "\n".join(out)


def serving_charts(r: Report) -> str:
    s = r.serving
    assert s is not None  # (serving_section's, for a serving report)
    xs = [p.context for p in s.curve]
    ro = r.roofline
    t0 = s.prompt + s.generate
    level = None
    if ro is not None and s.max_context is not None and s.max_context != s.positions:
        # the device's line where the capacity line puts it: the curve at the longest context
        level = (s.weight_bytes + max(s.prefill.peak_bytes, s.decode.peak_bytes)
                 + s.kv_cache_bytes + s.kv_bytes_per_token * s.batch * (s.max_context - t0),
                 f"{ro.device}: {s.max_context:,} tokens at most")
    elif ro is not None:  # what the tensors may take at the traced batch's allocator share
        usable = ro.fit.tensor_room
        level = (usable, f"{ro.device}: {human_bytes(usable)} for tensors")
    memory = _chart(f"memory at batch {s.batch} (weights + KV cache + working peak)", xs,
                    [("memory", [p.memory_bytes for p in s.curve], PLAIN)], human_bytes,
                    [(t0, s.weight_bytes + s.kv_cache_bytes
                      + max(s.prefill.peak_bytes, s.decode.peak_bytes),
                      f"traced: {t0:,} tokens", PLAIN)], level)
    charts = [memory]
    if s.decode.seconds_per_token is not None:
        charts.append(_chart(
            "decode time per token", xs,
            # every point has a bound when the step has a time: both come with a device
            [("(weights + KV) / bandwidth", [p.decode_bound_seconds for p in s.curve
                                             if p.decode_bound_seconds is not None],
              PLAIN)], human_time,
            [(t0, s.decode.seconds_per_token, "roofline of the traced decode step",
              CHECKPOINTED)]))
    return "<div class='chart'>" + "".join(charts) + "</div>"


def serving_section(r: Report) -> str:
    s = r.serving
    if s is None:
        return ""
    lines = "".join(f"<tr><th>{_e(label)}</th><td>{_e(' '.join(items))}</td></tr>"
                    for label, items in serving_summary(r))
    phases = ("<table class='kv'><tr>" + "".join(f"<th>{_e(h)}</th>" for h in PHASE_COLUMNS)
              + "</tr>" + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row)
                                  + "</tr>" for row in phase_rows(r)) + "</table>")
    legend = ("<p class='dim'>Memory: the curve at the batch analyzed; the dot is the "
              "traced context. Time: the bandwidth bound of a decode step (every weight and "
              "cached byte read once) against the context; the dot is the traced step's "
              "roofline.</p>")
    return ("<section id='serving'><h2>Serving (prefill and decode)</h2>"
            f"<table class='kv'>{lines}</table>{phases}{serving_charts(r)}{legend}</section>")
