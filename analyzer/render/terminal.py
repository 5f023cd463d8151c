"""The terminal view of a Report, fitted to a width (analyzer/render/table.py): the node table
(or the module tree), the op types, the slowest nodes and the summary lines
(analyzer/render/summary.py), which end on the line that decides. A question beyond the cost
(--train, --device, --parallel, --serve) gets its answer alone, one screen: a line naming
--details, the serving phases, the brief summary (issue 48). By default the node table
shows node, op, output shape, MACs, FLOPs, output bytes and each node's share of the FLOPs,
the heaviest five marked; ``columns`` picks others, ``wide`` shows every column unshortened.
The node columns serve the CSV and Markdown files too (analyzer/render/files.py).
"""
from __future__ import annotations

from typing import Any, Callable

from ..app.report import Report
from ..app.units import axes_text, human, human_bytes, human_time
from .serving import render_serving_table
from .summary import summary_lines
from .table import Col, print_prose, print_table, short_name, short_op

NODE_COLUMNS = ("index", "name", "op", "input_shapes", "output_shapes", "params",
                "output_bytes", "macs", "flops", "bytes_read", "bytes_written", "bytes_total",
                "status")
HEAVY = 5            # nodes marked as the heaviest (by FLOPs)
DEFAULT_ROWS = 15    # the table's rows by default: the heaviest nodes


# ----------------------------------------------------------------------------- columns

def op_text(n) -> str:
    """The op cell: the status when not costed, "(upper bound)" when costed at a bound."""
    if n.status != "ok":
        return f"{n.op} ({n.status})"
    return f"{n.op} (upper bound)" if n.bound else n.op


def _cells(r: Report) -> dict[str, tuple[Col, Callable[[Any], str]]]:
    """Every node-table column: name -> (column, cell text of a NodeRow)."""
    total = r.totals.flops or 1
    heavy = {n.index for n in sorted(r.nodes, key=lambda n: -n.flops)[:HEAVY] if n.flops}
    cols: dict[str, tuple[Col, Callable[[Any], str]]] = {
        "index": (Col("#", numeric=True), lambda n: str(n.index)),
        "name": (Col("node", min_width=12, priority=1, abbreviate=short_name, keep_end=True),
                 lambda n: n.name),
        "op": (Col("op", min_width=10, priority=2, abbreviate=short_op), op_text),
        "input_shapes": (Col("input shape(s)", min_width=8, optional=True),
                         lambda n: "; ".join(n.input_shapes)),
        "output_shapes": (Col("shape", min_width=8, priority=3, optional=True),
                          lambda n: "; ".join(n.output_shapes)),
        "params": (Col("params", numeric=True), lambda n: f"{n.params:,}" if n.params else ""),
        "macs": (Col("MACs", numeric=True), lambda n: human(n.macs) if n.macs else ""),
        "flops": (Col("FLOPs", numeric=True), lambda n: human(n.flops) if n.flops else ""),
        "output_bytes": (Col("out bytes", numeric=True), lambda n: human_bytes(n.output_bytes)),
        "bytes_read": (Col("read", numeric=True), lambda n: human_bytes(n.bytes_read)),
        "bytes_written": (Col("written", numeric=True),
                          lambda n: human_bytes(n.bytes_written)),
        "bytes_total": (Col("R+W", numeric=True), lambda n: human_bytes(n.bytes_total)),
        "share": (Col("FLOPs %", numeric=True),
                  lambda n: (f"{100 * n.flops / total:.1f}" + ("*" if n.index in heavy else ""))
                  if n.flops else ""),
        "status": (Col("status", min_width=2, optional=True), lambda n: n.status),
    }
    for name, header, text, _ in extra_columns(r):
        cols[name] = (Col(header, numeric=True, optional=True, priority=KEEP_LONGER.get(name, 0)),
                      lambda n, f=text: f(n.index))
    return cols


# Of the optional columns a narrow table drops, these go last (lowest first): the receptive
# field before its jump and start, a node's roofline time before its intensity and bound;
# the shape (priority 3) after all of them
KEEP_LONGER = {"receptive_field": 2, "start": 1, "roofline_seconds": 2, "intensity": 1,
               "bound": 1}


MAX_ROWS = "--max-rows"   # the option that shows more of the node table (the CLI's word)

DEFAULT_COLUMNS = ("index", "name", "op", "output_shapes", "macs", "flops", "output_bytes",
                   "share")


def column_names(r: Report) -> list[str]:
    return list(_cells(r))


def extra_columns(r: Report) -> list[tuple[str, str, Callable[[int], str], Callable[[int], Any]]]:
    """Optional per-node columns: (csv name, header, text of node i, raw value of node i)."""
    cols = []
    if r.receptive_field:
        rf = {f.index: f for f in r.receptive_field}
        for head, attr in (("RF", "rf"), ("jump", "jump"), ("start", "start")):
            def cell(i: int, attr=attr) -> str:
                return axes_text(getattr(rf[i], attr)) if i in rf else ""
            cols.append(("receptive_field" if attr == "rf" else attr, head, cell, cell))
    ro = r.roofline
    if ro is not None:
        t = ro.nodes
        cols += [
            ("roofline_seconds", "time (roofline)", lambda i: human_time(t[i].seconds),
             lambda i: t[i].seconds),
            ("intensity", "FLOP/B",
             lambda i: f"{t[i].intensity:.3g}" if t[i].intensity is not None else "∞",
             lambda i: t[i].intensity if t[i].intensity is not None else ""),
            ("bound", "bound", lambda i: t[i].bound, lambda i: t[i].bound),
        ]
    return cols


def top_nodes_lines(r: Report, width: int | None = None) -> list[str]:
    ro = r.roofline
    if ro is None or not ro.top:
        return []
    lines = ["slowest nodes (roofline):"]
    for i in ro.top:
        n, t = r.nodes[i], ro.nodes[i]
        share = 100 * t.seconds / ro.total_seconds if ro.total_seconds else 0
        line = f"  {human_time(t.seconds):>9}  {share:5.1f}%  {t.bound:<7}  {n.op:<16} {n.name}"
        lines.append(line if width is None or len(line) <= width else line[:width - 1] + "…")
    return lines


# ----------------------------------------------------------------------------- terminal

def render_modules(r: Report, console, depth: int, width: int | None = None) -> None:
    cols = [Col("module", min_width=12, priority=2, keep_end=True),
            Col("type", min_width=6, optional=True),
            Col("params", numeric=True), Col("MACs", numeric=True), Col("FLOPs", numeric=True),
            Col("out bytes", numeric=True), Col("nodes", numeric=True)]
    rows = [[("  " * m.depth) + (m.path.rsplit(".", 1)[-1] if m.path else "(model)"), m.type,
             f"{m.params:,}", human(m.macs) if m.macs else "", human(m.flops) if m.flops else "",
             human_bytes(m.output_bytes), str(m.nodes)] for m in r.modules if m.depth <= depth]
    print_table(console, f"graphcost: {r.model} — modules to depth {depth}", cols, rows,
                width=width)


def heaviest_rows(nodes, n: int) -> list:
    """The ``n`` nodes with the most FLOPs (then bytes moved), in graph order: the default
    view's rows, so the table shows where the work is, not the first layers."""
    keep = sorted(range(len(nodes)), key=lambda i: (-nodes[i].flops, -nodes[i].bytes_total, i))
    return [nodes[i] for i in sorted(keep[:n])]


def asks_beyond_cost(r: Report) -> bool:
    """Whether the run asked a question beyond "what does it cost" (--train, --device,
    --parallel, --serve): its default view is then the answer alone."""
    return r.training is not None or r.roofline is not None or r.serving is not None


def render_table(r: Report, console, max_rows: int | None = None, depth: int | None = None, *,
                 columns: list[str] | None = None, wide: bool = False,
                 width: int | None = None, details: bool = False,
                 details_option: str = "") -> None:
    """The terminal view fitted to ``width`` (None: natural widths); ``wide``: every column,
    unshortened; ``columns``: these node columns (names from ``column_names``).
    ``max_rows``: None, the DEFAULT_ROWS heaviest nodes; 0 every node; N the first N.
    A question beyond the cost (``asks_beyond_cost``) gets the answer alone unless a table or
    ``details`` is asked for: one line naming ``details_option`` (the face's word for
    ``details``), the serving phases, the brief summary; every view ends on the summary's
    deciding line."""
    if wide:
        width = None
    brief = asks_beyond_cost(r) and not details and max_rows is None and depth is None \
        and not wide and not columns
    if brief:
        what = f"the prefill's {len(r.nodes):,} nodes" if r.serving is not None else \
            f"the heaviest of {len(r.nodes):,} nodes"
        # (the model line names the model: this one stays one line)
        print_prose(console, f"graphcost — {what}" + (f", every figure: {details_option}"
                                                      if details_option else ""), width)
    elif depth is not None:
        render_modules(r, console, depth, width)
    else:
        _render_nodes(r, console, max_rows, columns, wide, width)
    if not brief:
        _render_op_types(r, console, width, DEFAULT_OP_ROWS if max_rows is None else 0)
    render_serving_table(r, console, width)
    top = [] if brief else top_nodes_lines(r, width)
    for line in top + summary_lines(r, width, brief):
        console.print(line, markup=False, highlight=False, overflow="ignore", crop=False)


def _render_nodes(r: Report, console, max_rows: int | None, columns: list[str] | None,
                  wide: bool, width: int | None) -> None:
    cells = _cells(r)
    names = columns or (list(cells) if wide else
                        [*DEFAULT_COLUMNS, *(n for n, *_ in extra_columns(r))])
    shown = heaviest_rows(r.nodes, DEFAULT_ROWS) if max_rows is None else \
        r.nodes if max_rows == 0 else r.nodes[:max(max_rows, 0)]
    rows = [[cells[c][1](n) for c in names] for n in shown]
    styles = [None if n.status == "ok" else "yellow" for n in shown]
    if shown:
        print_table(console, f"graphcost: {r.model}", [cells[c][0] for c in names], rows,
                    width=width, styles=styles)
    if len(shown) < len(r.nodes):
        which = f"the {len(shown)} heaviest by FLOPs; " if max_rows is None else ""
        console.print(f"… {len(r.nodes) - len(shown):,} more nodes ({which}{MAX_ROWS} 0 "
                      "shows all)", markup=False)
    if "share" in names and any(n.flops for n in r.nodes):
        console.print(f"FLOPs %: each node's share of the total; * the {HEAVY} heaviest",
                      markup=False, highlight=False)


DEFAULT_OP_ROWS = 10   # the default view's op types: the heaviest by FLOPs (a training
#                        graph has 40 and more ATen ops, most of them moving data)


def _render_op_types(r: Report, console, width: int | None, limit: int) -> None:
    """The op types, heaviest by FLOPs first; ``limit`` of them (0: all)."""
    total = r.totals.flops or 1
    every = sorted(r.by_op_type.items(), key=lambda kv: (-kv[1].flops, kv[0]))
    ops = every[:limit] if limit else every
    print_table(console, "by op type", [
        Col("op", min_width=8, priority=1, abbreviate=short_op), Col("count", numeric=True),
        Col("MACs", numeric=True), Col("FLOPs", numeric=True), Col("FLOPs %", numeric=True),
        Col("read", numeric=True), Col("written", numeric=True)],
        [[op, str(o.count), human(o.macs) if o.macs else "", human(o.flops) if o.flops else "",
          f"{100 * o.flops / total:.1f}" if o.flops else "", human_bytes(o.bytes_read),
          human_bytes(o.bytes_written)] for op, o in ops], width=width)
    if len(ops) < len(every):
        console.print(f"… {len(every) - len(ops)} more op types ({MAX_ROWS} 0 shows all)",
                      markup=False, highlight=False)
