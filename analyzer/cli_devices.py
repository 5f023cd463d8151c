"""``graphcost devices``: the device table the roofline and --max-batch use."""
from __future__ import annotations

import json
import sys

from graphcost.analyzer.cli import _Parser
from graphcost.analyzer.devices import DEVICES, DTYPES, INTERCONNECTS


def build_parser():
    p = _Parser(prog="graphcost devices",
                description="List the known devices: dense datasheet peaks per dtype, memory "
                            "bandwidth and size; and the interconnects between ranks.")
    p.add_argument("--format", choices=("table", "json"), default="table")
    return p


def run(args) -> int:
    if args.format == "json":
        sys.stdout.write(json.dumps({d.name: {"label": d.label, "peak_flops": dict(d.peak_flops),
                                              "bandwidth": d.bandwidth, "memory_bytes": d.memory}
                                     for d in DEVICES.values()}, indent=1) + "\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="devices (dense peaks, TFLOP/s; int8 TOP/s; — = no fast path)",
                  header_style="bold")
    for col in ("name", "device", *DTYPES, "GB/s", "GiB"):
        table.add_column(col, justify="left" if col in ("name", "device") else "right")
    for d in DEVICES.values():
        rates = [f"{d.peak_flops[k] / 1e12:g}" if d.peak_flops[k] else "—" for k in DTYPES]
        table.add_row(d.name, d.label, *rates, f"{d.bandwidth / 1e9:,.0f}",
                      f"{d.memory / 2**30:g}")
    links = Table(title="interconnects (--interconnect; GB/s per GPU, each direction)",
                  header_style="bold")
    for col in ("name", "link", "GB/s"):
        links.add_column(col, justify="right" if col == "GB/s" else "left")
    for link in INTERCONNECTS.values():
        links.add_row(link.name, link.label, f"{link.bandwidth / 1e9:g}")
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    console.print(links)
    return 0
