"""The training memory timeline as a self-contained SVG (no plotting dependency: the chart is a
few polylines and rectangles, written as text).

Forward, backward and the optimizer step are shaded; the peak is marked; with a checkpoint plan
its curve is drawn over the plain one.
"""
from __future__ import annotations

from typing import Any, Callable
from xml.sax.saxutils import escape

from ..app.report import Report

W, H, LEFT, RIGHT, TOP, BOTTOM = 900, 360, 80, 20, 40, 50
SHADES = {"forward": "#e8f0fe", "backward": "#fdf1e5", "optimizer": "#e9f7ef"}
PLAIN, CHECKPOINTED = "#1a73e8", "#d93025"   # curve colours (the PNG and HTML use them too)
PER_RANK = "#188038"


def training_curves(report: Report) -> list[tuple[str, tuple[int, ...], str]]:
    """(label, bytes per node then the step, colour) of each curve the charts draw: the
    single-device step, the checkpointed one when there is a plan, and one rank's under a
    data-parallel strategy (the same nodes: every rank runs the whole joint graph)."""
    t = report.training
    assert t is not None  # a training report's
    plan = t.checkpoint if t.checkpoint is not None and t.checkpoint.segments else None
    # "plain" only beside a checkpointed curve: alone, it is the step
    curves = [("one device" if report.parallel else "plain" if plan else "step",
               t.timeline, PLAIN)]
    if plan is not None:
        curves.append(("checkpointed", plan.timeline, CHECKPOINTED))
    p = report.parallel
    if p is not None:
        who = f"{p.layout} x{p.world_size:,}" if p.layout == p.strategy else p.layout
        curves.append((f"per rank ({who})", p.timeline, PER_RANK))
    return curves


def size_label(n: float) -> str:
    """Bytes as the charts' axis and peak labels write them (plot_png.py's too)."""
    for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def nice_axis(top: int) -> tuple[int, int]:
    """A memory chart's y axis for a peak of ``top`` bytes: (the axis's top, its tick step).
    The step is a power of two bytes with 3 to 5 of them to the top, so every tick is a
    round size (256 KiB, 1 MiB, 1.5 MiB, 16 GiB), not a quarter of the peak (778.50 KiB)."""
    top = max(int(top), 1)
    step = 1
    while -(-top // step) > 5:
        step *= 2
    return -(-top // step) * step, step


def tick_label(v: int) -> str:
    """A round size as an axis writes it: "0", "768 KiB", "1.25 MiB", "16 GiB"."""
    for div, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if v >= div:  # (a step past 2^1000 B: a labelled absurd peak; floats end at 2^1024)
            return f"{v / div:g} {unit}" if v < div << 900 else size_label(v)
    return f"{v} B" if v else "0"


def y_grid(top, y: Callable[[float], float], fmt: Callable[[Any], str],
           step: int | None = None) -> list[str]:
    """Horizontal grid lines and labels (shared by the training chart here and the HTML
    report's charts): with ``step`` (a bytes axis from nice_axis) at every step up to
    ``top``, in integers (an absurd peak past 2^53 B would not survive a float's rounding);
    without, at 0, ¼, ½, ¾ and all of ``top`` (a time axis)."""
    values = range(0, top + 1, step) if step else [top * k / 4 for k in range(5)]
    out = []
    for v in values:
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="#ccc" stroke-width="0.5"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
    return out


def timeline_svg(report: Report) -> str:
    t = report.training
    if t is None:
        raise ValueError("the timeline plot needs a training analysis (--train)")
    curves = training_curves(report)
    n = len(t.timeline)
    top, step = nice_axis(max(max(c[1]) for c in curves))
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    joint = 0.94 * pw  # the schedule; the optimizer step gets the last 6% of the width

    def x(i: int) -> float:
        if i >= n - 1:
            return LEFT + pw
        return LEFT + joint * i / max(1, n - 2)

    def y(v: float) -> float:
        return TOP + ph * (1 - v / top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT}" y="22" font-size="14">{escape(report.model)}: training step memory '
           f'({escape(t.optimizer)})</text>']
    start = 0
    for i in range(1, n + 1):  # shade each run of one phase
        if i == n or t.phases[i] != t.phases[start]:
            phase = t.phases[start]
            x0 = LEFT if start == 0 else (x(start - 1) + x(start)) / 2
            x1 = LEFT + pw if i == n else (x(i - 1) + x(i)) / 2
            out.append(f'<rect x="{x0:.1f}" y="{TOP}" width="{max(1.0, x1 - x0):.1f}" '
                       f'height="{ph}" fill="{SHADES.get(phase, "#eee")}"/>')
            label = "step" if phase == "optimizer" else phase
            out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{TOP + ph + 16}" text-anchor="middle" '
                       f'fill="#555">{label}</text>')
            start = i
    out += y_grid(top, y, tick_label, step)
    for label, series, color in curves:
        pts = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(series))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        p = max(range(len(series)), key=series.__getitem__)
        out.append(f'<circle cx="{x(p):.1f}" cy="{y(series[p]):.1f}" r="4" fill="{color}"/>')
        right = x(p) > LEFT + pw * 0.7  # keep the label inside the chart
        out.append(f'<text x="{x(p) + (-6 if right else 6):.1f}" y="{y(series[p]) - 6:.1f}" '
                   f'text-anchor="{"end" if right else "start"}" fill="{color}">'
                   f'{label} peak {size_label(series[p])}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 8}" text-anchor="middle" fill="#555">'
               f'nodes of the forward + backward schedule, then the optimizer step '
               f'(peak marked)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
