"""``graphcost diff``'s renderings (the comparison itself is analyzer/app/diff.py): the terminal
view, fitted to the width (analyzer/render/table.py), and Markdown."""
from __future__ import annotations

from ..app.diff import Change, ReportDiff
from ..app.diff_answer import ServingDiff
from ..app.units import human, human_bytes, human_time
from .cells import markdown_text, one_line
from .table import Col, print_prose, print_table, short_op


def _num(name: str, v: int) -> str:
    return human_bytes(v) if "bytes" in name else f"{v:,}"


def _signed(name: str, v: int) -> str:
    if v == 0:
        return "0"
    sign = "+" if v > 0 else "-"
    return sign + (human_bytes(abs(v)) if "bytes" in name else f"{abs(v):,}")


def _pct(c: Change) -> str:
    p = c.pct
    if c.delta == 0:
        return ""
    return "new" if p is None else f"{p:+.1f}%"


def _short(c: Change) -> str:
    """A compact delta for node/module rows: '+1.23M' / '-4.00 KiB' / ''."""
    if c.delta == 0:
        return ""
    mag = human_bytes(abs(c.delta)) if "bytes" in c.name else human(abs(c.delta))
    return ("+" if c.delta > 0 else "-") + mag


def _cap(rows, top: int):
    return rows if top == 0 else rows[:max(top, 0)]


def _header(d: ReportDiff) -> list[str]:
    counts = {s: len(d.by_status(s)) for s in ("changed", "added", "removed")}
    return [f"graphcost diff: {d.old_model} ({d.old_source}) → {d.new_model} ({d.new_source})",
            f"nodes matched by {d.matching} ({d.matched_by_name} by name"
            + (f", {d.matched_otherwise} by {d.matching.split('+')[-1]}" if d.matched_otherwise
               else "")
            + f"): {d.unchanged_nodes} unchanged, {counts['changed']} changed, "
              f"{counts['added']} added, {counts['removed']} removed"]


def _peak_lines(d: ReportDiff) -> list[str]:
    p = d.peak
    c = p.peak
    pct = f", {_pct(c)}" if _pct(c) else ""
    lines = [(f"activation peak {human_bytes(c.old)} → {human_bytes(c.new)} "
              f"({_signed(c.name, c.delta)}{pct}); "
              f"at {p.old_node} (#{p.old_node_index}) → {p.new_node} (#{p.new_node_index})")]

    def listing(items, fmt, limit=5):
        text = ", ".join(fmt(x) for x in items[:limit])
        return text + (f" (+{len(items) - limit} more)" if len(items) > limit else "")

    if p.only_new:
        lines.append("  live at peak only in new: "
                     + listing(p.only_new, lambda t: f"{t[0]} {human_bytes(t[1])}"))
    if p.only_old:
        lines.append("  live at peak only in old: "
                     + listing(p.only_old, lambda t: f"{t[0]} {human_bytes(t[1])}"))
    if p.resized:
        lines.append("  resized at peak: " + listing(
            p.resized, lambda t: f"{t[0]} {human_bytes(t[1])} → {human_bytes(t[2])}"))
    if p.unchanged_bytes:
        lines.append(f"  unchanged at both peaks: {human_bytes(p.unchanged_bytes)}")
    return lines


def _node_cells(n) -> list[str]:
    o, w = n.old, n.new
    name = n.name if not (o and w and o.name != w.name) else f"{o.name} → {w.name}"
    op = n.op if not (o and w and o.op != w.op) else f"{o.op} → {w.op}"
    out_old = "; ".join(o.output_shapes) if o else ""
    out_new = "; ".join(w.output_shapes) if w else ""
    shape = out_new if out_old == out_new else (f"{out_old} → {out_new}" if o and w
                                                else out_old or out_new)
    ch = {c.name: c for c in n.changes()}
    return [n.status, name, op, shape, _short(ch["params"]), _short(ch["macs"]),
            _short(ch["flops"]),
            _short(Change("rw_bytes", 0, ch["bytes_read"].delta + ch["bytes_written"].delta))]


def _node_groups(d: ReportDiff, top: int):
    """(status, shown rows, total) — changed nodes largest |ΔFLOPs| first, then added/removed
    in graph order."""
    changed = sorted(d.by_status("changed"),
                     key=lambda n: (-abs(n.changes()[2].delta), -abs(n.changes()[0].delta),
                                    n.row.index))  # (a changed node's new row)
    return [(s, _cap(rows, top), len(rows)) for s, rows in
            (("changed", changed), ("added", d.by_status("added")),
             ("removed", d.by_status("removed"))) if rows]


def _top_modules(d: ReportDiff, top: int):
    mods = sorted(d.modules, key=lambda m: (-abs(m.changes()[3].delta),
                                            -abs(m.changes()[1].delta), m.path))
    return _cap(mods, top), len(mods)


def render_table(d: ReportDiff, console, top: int | None = None, width: int | None = None,
                 details_option: str = "") -> None:
    """The terminal view, fitted to ``width`` (None: natural widths), ending on the answer:
    the totals, why the activation peak moved, the time and the fit. The modules, nodes and
    op types that changed come above them when asked for (``top``: rows per list, 0 all; None:
    not asked, and the first lines name ``details_option``, the face's word for asking)."""
    def say(line):
        print_prose(console, line, width)

    for line in _header(d):
        say(line)
    if top is None and details_option and not d.identical:
        say(f"the modules, nodes and op types that changed: {details_option}")
    for note in d.notes:
        say(f"note: {note}")
    if top is not None:
        _render_lists(d, console, top, width)
    rows = _total_rows(d, brief=top is None)
    print_table(console, "totals", [Col("", min_width=8, priority=1),
                                    Col("old", numeric=True), Col("new", numeric=True),
                                    Col("Δ", numeric=True), Col("Δ%", numeric=True)],
                [[_label(c.name), _num(c.name, c.old), _num(c.name, c.new),
                  _signed(c.name, c.delta), _pct(c)] for c in rows], width=width)
    same = [_label(c.name) for c in d.totals if c not in rows and not c.delta]
    if same:
        say("unchanged: " + ", ".join(same))
    peak = _peak_lines(d)
    for line in (peak[:1] if top is None else peak) + answer_lines(d):
        say(line)
    if d.identical:
        say("no differences")


# the peaks' rows named without "bytes": their cells say it (and 80 columns keep the name)
_LABELS = {"activation_peak_bytes": "activation peak", "training_peak_bytes": "training peak",
           "peak_bytes": "peak", "reserved_peak_bytes": "reserved peak", "arena_bytes": "arena"}


def _label(name: str) -> str:
    return _LABELS.get(name, name.replace("_", " "))


# the totals the brief table always shows, changed or not
_ALWAYS = ("params", "flops", "peak_bytes")


def _total_rows(d: ReportDiff, brief: bool) -> list[Change]:
    """The totals the table shows: every one, or (``brief``) those that changed and
    ``_ALWAYS``'s, without the training peak where it is the peak budgets check."""
    peak, training = (next((c for c in d.totals if c.name == n), None)
                      for n in ("peak_bytes", "training_peak_bytes"))
    twice = training is not None and peak is not None and \
        (training.old, training.new) == (peak.old, peak.new)
    return [c for c in d.totals if not brief or
            ((c.delta or c.name in _ALWAYS) and not (twice and c is training))]


def answer_lines(d: ReportDiff) -> list[str]:
    """The time estimates and the fit on the device, both runs' side by side."""
    out = []
    t = d.time
    if t is not None:
        bands = {b for b in (t.old_band, t.new_band)}
        band = (f"; estimates ± {t.old_band:.0%} each" if len(bands) == 1 and None not in bands
                else "; estimates" + ("" if None in bands else
                                      f" ± {t.old_band:.0%} and ± {t.new_band:.0%}"))
        pct = f" ({t.pct:+.1f}%)" if t.pct is not None and t.old_seconds != t.new_seconds \
            else ""
        out.append(f"time ≈ {human_time(t.old_seconds)} → {human_time(t.new_seconds)} per "
                   f"{t.per}{pct}{band}")
        if t.gpu_hours is not None and t.run_tokens is not None:
            cost = "" if t.cost is None else \
                f"; ${t.cost[0]:,.0f} → ${t.cost[1]:,.0f}"
            out.append(f"run of {human(t.run_tokens)} tokens: {t.gpu_hours[0]:,.0f} → "
                       f"{t.gpu_hours[1]:,.0f} GPU-hours{cost} (estimates)")
    if d.serving is not None:
        out += _serving_lines(d.serving, d.fit.device if d.fit is not None else None)
    f = d.fit
    if f is not None:
        who = "each rank needs" if f.per_rank else "needs"
        verdict = " → ".join("yes" if ok else "NO" for ok in f.fits)
        out.append(f"fits on {f.device}: {verdict}, {who} {human_bytes(f.needs.old)} → "
                   f"{human_bytes(f.needs.new)} of {human_bytes(f.offers)}")
    return out


def _serving_lines(s: ServingDiff, device: str | None) -> list[str]:
    """Both serving reviews: the cache and weights, what the device holds, each step's
    time."""
    kv, w = s.kv_bytes_per_token, s.weight_bytes
    out = [f"KV cache {human_bytes(kv.old)} → {human_bytes(kv.new)} per token a sequence; "
           f"weights {human_bytes(w.old)} → {human_bytes(w.new)}"]
    n = s.max_concurrent_sequences
    if n is not None and device is not None:
        out.append(f"{device} holds ≈ {n.old:,} → {n.new:,} sequences of {s.tokens:,} "
                   "tokens at once")
    if s.ttft is not None and s.tpot is not None and s.bands is not None:
        a, b = s.bands
        band = f" ± {a:.0%} each" if a == b else f" ± {a:.0%} → ± {b:.0%}"
        out.append(f"TTFT ≈ {human_time(s.ttft[0])} → {human_time(s.ttft[1])}, TPOT ≈ "
                   f"{human_time(s.tpot[0])} → {human_time(s.tpot[1])}; estimates{band}")
    return out


def _render_lists(d: ReportDiff, console, top: int, width: int | None) -> None:
    """The modules, nodes and op types that changed, ``top`` rows each (0: all)."""
    mods, total = _top_modules(d, top)
    if mods:
        rows = []
        for m in mods:
            ch = m.changes()
            nodes = f"{ch[0].old} → {ch[0].new}" if ch[0].delta else str(ch[0].new)
            rows.append([m.status, m.path or "(model)", _short(ch[1]), _short(ch[2]),
                         _short(ch[3]), _short(ch[4]), nodes])
        print_table(console, f"modules ({len(mods)} of {total} changed, largest |ΔFLOPs| "
                             "first)",
                    [Col("", min_width=5, priority=3), Col("module", min_width=12, priority=1, keep_end=True),
                     Col("Δparams", numeric=True), Col("ΔMACs", numeric=True),
                     Col("ΔFLOPs", numeric=True), Col("Δout bytes", numeric=True),
                     Col("nodes", numeric=True)], rows, width=width)
    for status, rows, total in _node_groups(d, top):
        print_table(console, f"{status} nodes ({len(rows)} of {total})",
                    [Col("", min_width=5, priority=4), Col("node", min_width=12, priority=1, keep_end=True),
                     Col("op", min_width=8, priority=2, abbreviate=short_op),
                     Col("output shape", min_width=8, priority=3, optional=True),
                     Col("Δparams", numeric=True), Col("ΔMACs", numeric=True),
                     Col("ΔFLOPs", numeric=True), Col("ΔR+W", numeric=True)],
                    [_node_cells(n) for n in rows], width=width)
    if d.op_types:
        print_table(console, "by op type (changed)",
                    [Col("op", min_width=8, priority=1, abbreviate=short_op), Col("count", numeric=True),
                     Col("ΔMACs", numeric=True), Col("ΔFLOPs", numeric=True)],
                    [[o.op, f"{o.count.old} → {o.count.new}", _short(o.macs), _short(o.flops)]
                     for o in sorted(d.op_types, key=lambda o: (-abs(o.flops.delta), o.op))],
                    width=width)


def render_markdown(d: ReportDiff, top: int = 20) -> str:
    esc = markdown_text  # (the models' names: no HTML, cell break, code span or link)

    def sd(v: int) -> str:
        return f"{v:+,}" if v else "0"

    out = [f"# {esc(_header(d)[0])}", "", esc(_header(d)[1]), "", "## Totals", "",
           "| | old | new | Δ | Δ% |", "|---|---:|---:|---:|---:|"]
    out += [f"| {_label(c.name)} | {c.old:,} | {c.new:,} | {sd(c.delta)} | {_pct(c)} |"
            for c in d.totals]
    out += ["", "## Activation peak", ""] + [f"    {one_line(line)}" for line in _peak_lines(d)]
    mods, total = _top_modules(d, top)
    if mods:
        out += ["", f"## Modules ({len(mods)} of {total} changed)", "",
                "| | module | Δparams | ΔMACs | ΔFLOPs | Δout bytes |",
                "|---|---|---:|---:|---:|---:|"]
        for m in mods:
            ch = m.changes()
            out.append(f"| {m.status} | {esc(m.path or '(model)')} | {sd(ch[1].delta)} | "
                       f"{sd(ch[2].delta)} | {sd(ch[3].delta)} | {sd(ch[4].delta)} |")
    for status, rows, total in _node_groups(d, top):
        out += ["", f"## {status.capitalize()} nodes ({len(rows)} of {total})", "",
                "| node | op | output shape | Δparams | ΔMACs | ΔFLOPs | ΔR+W |",
                "|---|---|---|---:|---:|---:|---:|"]
        out += ["| " + " | ".join(esc(x) for x in _node_cells(n)[1:]) + " |" for n in rows]
    if d.op_types:
        out += ["", "## By op type (changed)", "", "| op | count | ΔMACs | ΔFLOPs |",
                "|---|---:|---:|---:|"]
        out += [f"| {esc(o.op)} | {o.count.old} → {o.count.new} | {sd(o.macs.delta)} | "
                f"{sd(o.flops.delta)} |" for o in sorted(d.op_types, key=lambda o: o.op)]
    answer = answer_lines(d)
    if answer:
        out += ["", "## Time and fit", ""] + [f"* {esc(line)}" for line in answer]
    if d.notes:
        out += ["", "## Notes", ""] + [f"* {esc(n)}" for n in d.notes]
    return "\n".join(out) + "\n"
