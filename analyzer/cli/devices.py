"""``graphcost devices``: the device table the roofline and --max-batch use."""
from __future__ import annotations

import json
import sys

from ..app.devices import DEVICES, DTYPES, INTERCONNECTS
from .main import Parser


def build_parser():
    p = Parser(prog="graphcost devices",
                description="List the known devices: dense datasheet peaks per dtype, memory "
                            "bandwidth and size; and the interconnects between ranks.")
    p.add_argument("--format", choices=("table", "json"), default="table")
    return p


def run(args) -> int:
    if args.format == "json":
        sys.stdout.write(json.dumps({d.name: {"label": d.label, "peak_flops": dict(d.peak_flops),
                                              "bandwidth": d.bandwidth, "memory_bytes": d.memory,
                                              "arch": _arch(d)}
                                     for d in DEVICES.values()}, indent=1) + "\n")
        return 0
    from ..render.table import Col, print_table
    from .output import console_for, terminal_width

    width = terminal_width()
    console = console_for(sys.stdout, width)
    # the label goes whole or not at all (its name column says which part it is)
    cols = [Col("name", min_width=9, priority=2),
            Col("device", min_width=10, priority=1, optional=True),
            *(Col(k, numeric=True) for k in DTYPES), Col("GB/s", numeric=True),
            Col("GiB", numeric=True), Col("arch", min_width=4)]
    rows = [[d.name, d.label,
             *(f"{v / 1e12:,g}" if (v := d.peak_flops[k]) else "—" for k in DTYPES),
             f"{d.bandwidth / 1e9:,.0f}", f"{d.memory / 2**30:g}", _arch(d)]
            for d in DEVICES.values()]
    print_table(console, "devices (dense peaks, TFLOP/s; int8 TOP/s; — = no fast path; arch: "
                         "CUDA compute capability)", cols,
                rows, width=width)
    print_table(console, "interconnects (--interconnect; GB/s per GPU, each direction)",
                [Col("name", min_width=8, priority=2), Col("link", min_width=10, priority=1),
                 Col("GB/s", numeric=True)],
                [[link.name, link.label, f"{link.bandwidth / 1e9:g}"]
                 for link in INTERCONNECTS.values()], width=width)
    return 0


def _arch(d) -> str:
    return f"sm{d.capability[0]}{d.capability[1]}" if d.capability else "rocm" if d.rocm else "—"
