"""Text renderings of a Report: the terminal view, CSV and Markdown. Rendering never computes
costs.

The terminal view fits a width (analyzer/render/table.py): by default the node table shows
node, op, output shape, MACs, FLOPs, output bytes and each node's share of the FLOPs, the
heaviest five marked; ``columns`` picks others, ``wide`` shows every column unshortened.
Summary lines are label + items and wrap only between items, never inside a number.
"""
from __future__ import annotations

from typing import Any, Callable

from ..app.report import Report
from ..app.units import axes_text, human, human_bytes, human_time
from . import explain
from .parallel import parallel_summary
from .serving import render_serving_table, serving_summary
from .table import Col, print_prose, print_table, short_name, short_op

NODE_COLUMNS = ("index", "name", "op", "input_shapes", "output_shapes", "params",
                "output_bytes", "macs", "flops", "bytes_read", "bytes_written", "bytes_total",
                "status")
LABEL = 12           # the summary's label column
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


# ----------------------------------------------------------------------------- summary

def summary(r: Report) -> list[tuple[str, list[str]]]:
    """The summary as (label, items): each item is one unbreakable phrase. Each mode leads
    with its own answer (issue 26): a serving review with the batch (``_serving_first``), a
    training step — and a data-parallel rank — with the step, then the device's fit; the
    graph's counts and memory after."""
    dims = ", ".join(f"{k}={v}" for k, v in r.dims.items())
    head = [("model", [f"{r.model} ({r.source}),", f"batch {r.batch}" + ("," if dims else "")]
             + ([f"dims {dims}"] if dims else []))]
    tail = ([("traced", [r.traced_layers])] if r.traced_layers else []) + \
        [("warning", [w]) for w in r.warnings]
    counts, memory, moe = _counts(r), _memory(r), _moe(r)
    if r.serving is not None:
        return _serving_first(head + counts + memory + moe + serving_summary(r)
                              + _roofline_summary(r) + tail)
    if r.training is not None:
        return head + _training_summary(r) + parallel_summary(r) + _roofline_summary(r) \
            + _attention_summary(r) + counts + memory + moe + tail
    return head + counts + memory + moe + _attention_summary(r) + _roofline_summary(r) + tail


def _counts(r: Report) -> list[tuple[str, list[str]]]:
    """Parameters, MACs, FLOPs, bytes moved, and what was not costed or only bounded."""
    t, c = r.totals, r.coverage
    out: list[tuple[str, list[str]]] = [
        ("params", [f"{t.params:,} ({human_bytes(t.param_bytes)})"]
         + ([f"+ buffers {t.buffers:,} ({human_bytes(t.buffer_bytes)})"] if t.buffers else [])),
        ("MACs", [f"{t.macs:,} ({human(t.macs)})"]),
        ("FLOPs", [f"{t.flops:,} ({human(t.flops)})", "[2·MACs + other arithmetic]"]),
        ("bytes", [f"read {human_bytes(t.bytes_read)},",
                   f"written {human_bytes(t.bytes_written)}"]),
        ("coverage", [f"{c.covered}/{c.nodes} nodes costed ({c.percent:.1f}%)"]),
    ]
    if c.unsupported:
        out.append(("unsupported", [f"{k}×{v}" for k, v in c.unsupported.items()]
                    + ["(counted as 0 — not costed)"]))
    if c.unknown_shape:
        out.append(("no shape", [f"{k}×{v}" for k, v in c.unknown_shape.items()]
                    + ["(shapes unknown — not costed)"]))
    if c.bounded:
        out.append(("bound", [f"{sum(c.bounded.values())} node(s) costed at an upper bound:"]
                    + [f"{k}×{v}" for k, v in c.bounded.items()]
                    + ["(data-dependent sizes or worst-case counts; see each node's bound)"]))
    out += _bounds_summary(r)
    if t.quant_meta:
        out.append(("quant meta", [f"{t.quant_meta:,} scales/zero points "
                                   f"({human_bytes(t.quant_meta_bytes)}), not in params"]))
    return out


def _memory(r: Report) -> list[tuple[str, list[str]]]:
    """The activation peak, the arena, the reserved replay (inference), the live tensors and
    the one peak."""
    m = r.memory
    out = [("activations", [
        f"peak {human_bytes(m.peak_bytes)} ({m.peak_bytes:,} B)",
        f"at {m.peak_node} (#{m.peak_node_index});",
        f"naive sum {human_bytes(m.naive_sum_bytes)}", f"({explain.activations_includes(r)})"])]
    if m.arena_bytes is not None:
        out.append(("arena", [f"{human_bytes(m.arena_bytes)} ({m.arena_bytes:,} B, greedy by "
                              f"size; fragmentation {100 * m.fragmentation:.1f}%)"]))
    if m.reserved_peak_bytes is not None and r.serving is None:  # (serving: its own line)
        out.append(("reserved", [f"{human_bytes(m.reserved_peak_bytes)}",
                                 f"({m.reserved_peak_bytes:,} B)", "on PyTorch's CUDA caching",
                                 "allocator, two batches", f"({_settings(r)}its rounding and",
                                 "segments; parameters"
                                 + (", cuBLAS workspace, kernel temporaries" if r.roofline
                                    else ""),
                                 "included)"]))
    if m.live_at_peak:
        more = len(m.live_at_peak) - 5
        out.append(("live", ["at the peak:"] + [f"{x.name} {human_bytes(x.bytes)},"
                                                 for x in m.live_at_peak[:5]]
                    + ([f"(+{more} more)"] if more > 0 else [])))
    out.append(("peak", [f"{human_bytes(r.peak_bytes)} ({r.peak_bytes:,} B)",
                         f"= {explain.peak_includes(r)}"]))
    return out


def _moe(r: Report) -> list[tuple[str, list[str]]]:
    if r.moe is None:
        return []
    e, first = r.moe, r.moe.layers[0]
    return [("experts", [f"{len(e.layers)} MoE layer(s), top-{first.top_k} of "
                         f"{first.experts}:", f"params {e.active_params:,} active per token "
                         f"of {e.total_params:,};", f"FLOPs per token {human(e.flops_per_token)}",
                         f"(all experts: {human(e.dense_flops_per_token)});",
                         f"rows per expert ≈ {first.rows_per_expert_estimate:g} balanced "
                         "(ESTIMATE),", f"≤ {first.rows_per_expert_bound:,} (BOUND)"])]


# A serving review answers first (issue 24): what the batch holds, how fast it runs, how many
# sequences fit and whether it fits; then the prefill graph's counts. The prefill's own
# activation peak, arena, live tensors and roofline total describe one inference of it, which
# the serving lines already price (its working peak, its time): left out there.
SERVING_FIRST = ("model", "serving", "KV cache", "weights", "reserved", "prefill", "decode",
                 "capacity", "device", "fits", "", "what-if")
SERVING_LEFT_OUT = frozenset({"activations", "arena", "live", "peak", "roofline", "bytes"})


def _serving_first(out: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    first = [item for label in SERVING_FIRST for item in out if item[0] == label]
    return first + [item for item in out
                    if item[0] not in SERVING_FIRST and item[0] not in SERVING_LEFT_OUT]


def _bounds_summary(r: Report) -> list[tuple[str, list[str]]]:
    """The sizes the data decides: the totals at their lower ends, then each size's range,
    the node that makes it, what declares its maximum and the flag that sets it."""
    b = r.bounds
    if b is None:
        return []
    out = [("sizes", ["data-dependent: MACs, FLOPs, bytes and memory above are upper bounds;",
                      "at the lower bounds", f"MACs {human(b.lower_macs)},",
                      f"FLOPs {human(b.lower_flops)},",
                      f"activation peak {human_bytes(b.lower_activation_peak)}"])]
    for s in b.sizes:
        if s.upper is None:
            out.append(("", [f"{s.symbol} ≥ {s.lower}: from {s.origin};", "no upper bound",
                             f"(--dim {s.symbol}=MAX sets one)"]))
        else:
            out.append(("", [f"{s.symbol} ∈ [{s.lower}, {s.upper}] at {s.upper}:",
                             f"from {s.origin};", f"max: {s.source}" + (";" if s.capped else "")]
                        + ([f"capped by the model: {', '.join(s.capped)}"] if s.capped else [])
                        + [f"(--dim {s.symbol}=N lowers it)"]))
    return out


def _impl(r: Report) -> str:
    """Which implementation the step's temporaries are of, where it matters (an adaptive
    optimizer's): the device decides PyTorch's default, so a report with one says so."""
    t = r.training
    if t is None or not t.step_temp_bytes:
        return ""
    where = "a GPU" if t.optimizer_impl == "foreach" else "a CPU"
    return (f" ({t.optimizer_impl} step: PyTorch's default with the parameters on {where})")


def _training_summary(r: Report) -> list[tuple[str, list[str]]]:
    t = r.training
    if t is None:
        return []
    where = f"{t.peak_phase}" + (f" at {t.peak_node}" if t.peak_node else " step")
    first = explain.first_step(r)
    out = [("training", [f"optimizer {t.optimizer}" + _impl(r) + ":",
                         f"step peak {human_bytes(t.peak_bytes)} "
                         f"({t.peak_bytes:,} B) in {where}",
                         "(steady state)" + (";" if first else "")]
            + ([first] if first else [])),
           ("at peak", [f"{k.replace('_', ' ')} {human_bytes(v)},"
                        for k, v in t.breakdown_at_peak.items() if v])]
    if t.reserved_peak_bytes is not None:
        out.append(("reserved", [f"{human_bytes(t.reserved_peak_bytes)}",
                                 f"({t.reserved_peak_bytes:,} B)", "on PyTorch's CUDA caching",
                                 "allocator, two steps",
                                 f"({_settings(r)}its rounding and segments"
                                 + ("; cuBLAS workspaces, kernel temporaries included"
                                    if r.roofline else "") + ")"]))
    out += [("what-if", [explain.what_if_line(r, name)]) for name in t.what_if]
    ck = t.checkpoint
    if ck is not None:
        note = explain.checkpoint_note(r)
        out += [("checkpoint", [f"{ck.mode}:", ", ".join(ck.segments) or "none needed"]),
                ("", [f"peak {human_bytes(ck.peak_without_bytes)} → {human_bytes(ck.peak_bytes)}",
                      f"({ck.peak_without_bytes:,} → {ck.peak_bytes:,} B)",
                      f"recompute {human(ck.recompute_flops)} FLOPs "
                      f"({ck.recompute_pct:.1f}% of the step)"]
                 + ([f"budget {human_bytes(ck.budget_bytes)}"] if ck.budget_bytes else [])
                 + ([f"— {note}"] if note else []))]
    return out


def _attention_summary(r: Report) -> list[tuple[str, list[str]]]:
    """One line per kernel the step's attention runs: which, how many calls, for what
    target, and why PyTorch's first choices were passed over."""
    return [("attention", [f"{u.kernel} kernel ×{u.calls}", f"(as PyTorch dispatches on "
                           f"{u.target})" + (";" if u.reason else "")]
             + ([u.reason] if u.reason else [])) for u in r.attention]


def _settings(r: Report) -> str:
    return f"{r.allocator}; " if r.allocator else ""


def fit_words(f) -> list[str]:
    """The one fits line (passes/fits.py's Fit): the answer, needs against offers with the
    margin, then the parts it adds up."""
    margin = f"{human_bytes(abs(f.margin))} {'to spare' if f.fits else 'short'}"
    parts = " + ".join(f"{p.what} {human_bytes(p.bytes)}" for p in f.parts)
    return [f"{'yes' if f.fits else 'NO'}: needs {human_bytes(f.needs)} of",
            f"{human_bytes(f.offers)} ({margin}) =", parts]


def _roofline_summary(r: Report) -> list[tuple[str, list[str]]]:
    ro = r.roofline
    if ro is None:
        return []
    rate = ro.peak_flops["tf32" if ro.tf32 and ro.peak_flops.get("tf32") else "fp32"] or 0
    out = [
        ("device", [f"{ro.label}:", f"{rate / 1e12:.1f} TFLOP/s {'tf32' if ro.tf32 else 'fp32'}",
                    f"{ro.bandwidth / 1e9:,.0f} GB/s", human_bytes(ro.memory_bytes)]),
        ("roofline", [f"{human_time(ro.total_seconds)} lower bound",
                      f"(compute-bound nodes {human_time(ro.compute_seconds)},",
                      f"memory-bound {human_time(ro.memory_seconds)});",
                      "max(FLOPs/peak, bytes/bandwidth) per node — not a benchmark"]),
        ("fits", fit_words(ro.fit)),
    ]
    if ro.fallbacks:
        out.append(("", [f"no fast path for {', '.join(ro.fallbacks)} on {ro.device}:",
                         "those nodes use the fp32 rate"]))
    return out


_UNITS = frozenset({"B", "KiB", "MiB", "GiB", "TiB", "s", "ms", "µs", "ns", "FLOPs",
                    "TFLOP/s", "GB/s", "→"})


def _pieces(item: str, room: int) -> list[str]:
    """An item that fits ``room`` whole, else its words — a number kept with its unit and
    with an arrow, so that no value is ever split across lines."""
    if len(item) <= room:
        return [item]
    out: list[str] = []
    for word in item.split(" "):
        if out and (word in _UNITS or out[-1].endswith("→")):
            out[-1] += " " + word
        else:
            out.append(word)
    return out


def wrap(label: str, items: list[str], width: int | None) -> list[str]:
    """``label`` then ``items`` joined by spaces, wrapped between items (or between the words
    of an item longer than a line, never inside a number)."""
    lines, line = [], label.ljust(LABEL - 1) + " "
    fresh = True
    room = None if width is None else max(20, width - LABEL)
    pieces = [p for item in items for p in (_pieces(item, room) if room else [item])]
    for piece in pieces:
        if not fresh and width is not None and len(line) + 1 + len(piece) > width:
            lines.append(line.rstrip())
            line, fresh = " " * LABEL, True
        line += ("" if fresh else " ") + piece
        fresh = False
    lines.append(line.rstrip().rstrip(","))
    return lines


def summary_lines(r: Report, width: int | None = None) -> list[str]:
    return [line for label, items in summary(r) for line in wrap(label, items, width)]


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


def render_table(r: Report, console, max_rows: int | None = None, depth: int | None = None, *,
                 columns: list[str] | None = None, wide: bool = False,
                 width: int | None = None) -> None:
    """The terminal view fitted to ``width`` (None: natural widths); ``wide``: every column,
    unshortened; ``columns``: these node columns (names from ``column_names``).
    ``max_rows``: None, the DEFAULT_ROWS heaviest nodes; 0 every node; N the first N."""
    if wide:
        width = None
    # a serving review leads with its answer: the node tables on request
    serving_view = r.serving is not None and max_rows is None and depth is None \
        and not wide and not columns
    if serving_view:
        print_prose(console, f"graphcost: {r.model} — the prefill's {len(r.nodes):,} nodes: "
                    f"{MAX_ROWS} N (0: all)", width)
    elif depth is not None:
        render_modules(r, console, depth, width)
    else:
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
    if not serving_view:
        _render_op_types(r, console, width, DEFAULT_OP_ROWS if max_rows is None else 0)
    render_serving_table(r, console, width)
    top = [] if serving_view else top_nodes_lines(r, width)
    for line in top + summary_lines(r, width):
        console.print(line, markup=False, highlight=False, overflow="ignore", crop=False)


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
