"""The report as files: every node row as CSV, the summary and tables as Markdown (the
terminal view is terminal.py's; the same cells and lines). The model's names are written to
stay text in a spreadsheet and a Markdown renderer (cells.py)."""
from __future__ import annotations

import csv
import io

from ..app.report import Report
from .cells import csv_cell, markdown_text, one_line
from .serving import serving_markdown
from .summary import summary_lines
from .terminal import NODE_COLUMNS, extra_columns, op_text, top_nodes_lines


def render_csv(r: Report) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    extra = extra_columns(r)
    w.writerow(NODE_COLUMNS + ("upper_bound",) + tuple(name for name, *_ in extra))
    for n in r.nodes:
        w.writerow(map(csv_cell, [
            n.index, n.name, n.op, " ".join(n.input_shapes), " ".join(n.output_shapes),
            n.params, n.output_bytes, n.macs, n.flops, n.bytes_read, n.bytes_written,
            n.bytes_total, n.status, n.bound or "", *(raw(n.index) for *_, raw in extra)]))
    return buf.getvalue()


def render_markdown(r: Report) -> str:
    esc = markdown_text
    out = [f"# graphcost: {esc(r.model)}", "", "## Summary", ""]
    # (an indented code block shows its text as it is: only a line break could leave it)
    out += [f"    {one_line(line)}" for line in summary_lines(r)]
    out += ["", "## By op type", "", "| op | count | MACs | FLOPs | bytes read | bytes written |",
            "|---|---:|---:|---:|---:|---:|"]
    for op, o in sorted(r.by_op_type.items(), key=lambda kv: (-kv[1].flops, kv[0])):
        out.append(f"| {esc(op)} | {o.count} | {o.macs:,} | {o.flops:,} | {o.bytes_read:,} | "
                   f"{o.bytes_written:,} |")
    out += serving_markdown(r)
    top = top_nodes_lines(r)
    if top:
        out += ["", "## Slowest nodes (roofline lower bound)", ""] + \
            [f"    {one_line(x)}" for x in top]
    extra = extra_columns(r)
    out += ["", "## Nodes", "",
            "| # | node | op | input shape(s) | output shape | params | out bytes | MACs | FLOPs "
            "| read | written | R+W |" + "".join(f" {h} |" for _, h, *_ in extra),
            "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(extra)]
    for n in r.nodes:
        op = op_text(n)
        ins, outs = esc("; ".join(n.input_shapes)), esc("; ".join(n.output_shapes))
        out.append(f"| {n.index} | {esc(n.name)} | {esc(op)} | {ins} | {outs} | "
                   f"{n.params:,} | {n.output_bytes:,} | "
                   f"{n.macs:,} | {n.flops:,} | {n.bytes_read:,} | {n.bytes_written:,} | "
                   f"{n.bytes_total:,} |" + "".join(f" {esc(text(n.index))} |"
                                                    for _, _, text, _ in extra))
    return "\n".join(out) + "\n"

