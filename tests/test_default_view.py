"""The default terminal view answers "where is the work" on one screen (issue 26): the table
shows the 15 heaviest nodes by FLOPs, in graph order, not the first 500 rows; --max-rows N
the first N, 0 every node."""
from __future__ import annotations

import re

from graphcost import analyze
from tests.cli_runner import run_cli


def _rows(stdout: str) -> list[int]:
    """The node indices of the table's rows: the lines under its rule that start with one."""
    out, inside = [], False
    for line in stdout.splitlines():
        if line.startswith("─"):
            inside = True
            continue
        m = re.match(r"\s*(\d+)\s", line) if inside else None
        if inside and m is None:
            break
        if m:
            out.append(int(m.group(1)))
    return out


def test_the_default_table_is_the_heaviest_nodes():
    # ResNet-50 at batch 1: 175 nodes; the 15 with the most FLOPs are its 3×3 convolutions
    # and the stem (236.03M FLOPs), each shown once, in graph order
    r = analyze("zoo:resnet50")
    done = run_cli("zoo:resnet50", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    shown = _rows(done.stdout)
    flops = sorted((n.flops for n in r.nodes), reverse=True)
    assert len(shown) == 15 and shown == sorted(shown)
    assert sorted((r.nodes[i].flops for i in shown), reverse=True) == flops[:15]
    more = next(line for line in done.stdout.splitlines() if line.startswith("… "))
    assert more == f"… {len(r.nodes) - 15:,} more nodes (the 15 heaviest by FLOPs; " \
                   "--max-rows 0 shows all)" and len(more) <= 80


def test_max_rows_still_takes_the_first_rows_or_all():
    assert _rows(run_cli("zoo:small_cnn", "--max-rows", "3").stdout) == [0, 1, 2]
    n = len(analyze("zoo:small_cnn").nodes)
    assert _rows(run_cli("zoo:small_cnn", "--max-rows", "0").stdout) == list(range(n))
