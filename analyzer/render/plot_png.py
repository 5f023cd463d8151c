"""The training memory timeline as a PNG, rasterized by matplotlib (the optional `png` extra).

The same chart as analyzer/render/plot.py's SVG (same geometry, same colours): forward, backward and the
optimizer step shaded, the plain curve, the checkpointed one over it when there is a plan, each
peak marked and labelled. matplotlib is imported only when a PNG is asked for, so graphcost
without the extra still works; the Agg canvas is used directly, so no display is ever needed.
"""
from __future__ import annotations

from ...passes.errors import GraphcostError, opt
from ..app.report import Report
from ..app.units import human_bytes
from .plot import SHADES, nice_axis, size_label, tick_label, training_curves

INSTALL_HINT = "PNG output needs matplotlib: pip install 'graphcost[png]'"


def require_matplotlib():
    """(Figure, FigureCanvasAgg), or the one-line install hint. The CLI calls this before the
    analysis, so a missing extra is reported at once, not after a long run."""
    try:
        import matplotlib  # noqa: F401  (first: a blocked parent must fail even if submodules are cached)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise GraphcostError(INSTALL_HINT) from None
    return Figure, FigureCanvasAgg


def _x(i: int, n: int) -> float:
    """As in the SVG: the schedule spans 94% of the width, the optimizer step the last 6%."""
    return 1.0 if i >= n - 1 else 0.94 * i / max(1, n - 2)


def timeline_png(report: Report, path) -> None:
    t = report.training
    if t is None:
        raise GraphcostError(f"the timeline plot needs a training analysis ({opt('train')})")
    Figure, FigureCanvasAgg = require_matplotlib()
    curves = training_curves(report)
    n = len(t.timeline)
    top = max(max(c[1]) for c in curves) or 1

    fig = Figure(figsize=(9, 4), dpi=100, facecolor="white")
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.1, 0.16, 0.87, 0.75))
    ax.set_title(f"{report.model}: training step memory ({t.optimizer})", loc="left", fontsize=12)
    ticks, labels = [], []
    start = 0
    for i in range(1, n + 1):  # shade each run of one phase, edges halfway between nodes
        if i == n or t.phases[i] != t.phases[start]:
            phase = t.phases[start]
            x0 = 0.0 if start == 0 else (_x(start - 1, n) + _x(start, n)) / 2
            x1 = 1.0 if i == n else (_x(i - 1, n) + _x(i, n)) / 2
            ax.axvspan(x0, x1, color=SHADES.get(phase, "#eeeeee"), lw=0, zorder=0)
            ticks.append((x0 + x1) / 2)
            labels.append("step" if phase == "optimizer" else phase)
            start = i
    ax.set_xticks(ticks, labels, color="#555555")
    ax.tick_params(axis="x", length=0)
    ax.set_xlabel("nodes of the forward + backward schedule, then the optimizer step "
                  "(peak marked)", color="#555555")
    if top > 1e300:  # matplotlib draws floats; the report labels such a step absurd
        raise GraphcostError(f"{opt('plot')}: the step's memory ({human_bytes(top)}) is beyond what "
                             f"a PNG axis can scale: write the SVG ({opt('plot')} FILE.svg) instead")
    axis_top, step = nice_axis(top)  # round sizes, as the SVG's
    ax.set_yticks(range(0, axis_top + 1, step),
                  [tick_label(v) for v in range(0, axis_top + 1, step)])
    ax.grid(axis="y", color="#cccccc", lw=0.5)
    ax.set_axisbelow(True)
    ax.set_xlim(0, 1)
    # headroom for the peak labels: one line each, as they may stack (below)
    ax.set_ylim(0, max(axis_top, top * (1.15 if len(curves) == 1 else 1.3)))
    placed: list[tuple[float, float]] = []
    for label, series, color in curves:
        xs = [_x(i, len(series)) for i in range(len(series))]
        ax.plot(xs, series, color=color, lw=1.5, zorder=2)
        p = max(range(len(series)), key=series.__getitem__)
        px, py = xs[p], series[p]
        ax.plot([px], [py], "o", color=color, ms=8, zorder=3, clip_on=False)  # may sit on the edge
        # a second peak at (nearly) the same spot gets its label one line higher, not on top
        near = sum(abs(px - qx) < 0.25 and abs(py - qy) < 0.08 * top for qx, qy in placed)
        placed.append((px, py))
        right = px > 0.7  # keep the label inside the chart
        ax.annotate(f"{label} peak {size_label(py)}", (px, py), color=color, fontsize=11,
                    xytext=(-8 if right else 8, 6 + 15 * near), textcoords="offset points",
                    ha="right" if right else "left", va="bottom", zorder=4)
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise GraphcostError(f"{opt('plot')} {path}: cannot write: {exc.strerror or exc}") from None
