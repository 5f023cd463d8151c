"""The default terminal view answers "where is the work" on one screen (issue 26): the table
shows the 15 heaviest nodes by FLOPs, in graph order, not the first 500 rows; --max-rows N
the first N, 0 every node."""
from __future__ import annotations

import functools
import re

import pytest

from graphcost import analyze
from tests.cli_runner import run_cli
from tests.shared_loads import shared_loads


@pytest.fixture(scope="module", autouse=True)
def _one_trace_per_model():
    # the views of one run are read from several runs of it: one trace serves them
    # (tests/shared_loads.py)
    with shared_loads():
        yield


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


def _labels(stdout: str) -> list[str]:
    """The summary's labels, from its first line (model) on, in order."""
    lines = stdout.splitlines()
    summary = lines[next(i for i, line in enumerate(lines) if line.startswith("model ")):]
    return [line[:11].strip() for line in summary if line[:1].strip()]


def test_a_serving_review_ends_on_its_capacity_and_fit():
    # issue 24: --serve answers without the prefill's node tables (172 nodes) — the phases,
    # then what the batch holds, its capacity and whether it fits; issue 48: ending on them,
    # one screen at 80×24
    args = ["zoo:llama_tiny", "--serve", "--prompt", "64", "--generate", "16", "--batch", "2",
            "--device", "a100-80gb"]
    done = run_cli(*args, env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= 80
    assert lines[0] == "graphcost — the prefill's 172 nodes, every figure: --details"
    assert not _rows(done.stdout.split("serving: prefill")[0]) and "by op type" not in lines
    labels = _labels(done.stdout)
    order = [labels.index(x) for x in ("model", "serving", "KV cache", "weights", "device",
                                       "capacity", "on device", "fits")]
    assert order == sorted(order) and labels[-2:] == ["on device", "fits"]
    # asked for, the tables are there, and every line of the summary (still ending on the fit)
    done = run_cli(*args, "--max-rows", "5", env={"COLUMNS": "80"})
    assert _rows(done.stdout) == [0, 1, 2, 3, 4] and "by op type" in done.stdout
    labels = _labels(done.stdout)
    assert {"params", "prefill", "decode", "reserved"} <= set(labels) and labels[-1] == "fits"


GPT2_FSDP = ("zoo:gpt2", "--train", "--optimizer", "adam", "--parallel", "fsdp", "--world-size",
             "4", "--device", "a100-80gb")


@functools.cache
def gpt2_fsdp_details() -> str:
    """The whole view of one rank's step, which two tests read (each run traces gpt2)."""
    done = run_cli(*GPT2_FSDP, "--details", env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_training_report_ends_on_the_rank_and_its_fit():
    # issue 26 led with the step; issue 48: the context first, the answer last — the rank's
    # peak, then what the device must hold and whether it fits. The one device's step peak is
    # no line of its own under a strategy (the rank's line names it)
    done = run_cli(*GPT2_FSDP, env={"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    labels = _labels(done.stdout)
    order = [labels.index(x) for x in ("model", "params", "parallel", "rank peak", "device",
                                       "per rank", "on device", "fits")]
    assert order == sorted(order) and labels[-3:] == ["per rank", "on device", "fits"]
    assert "training" not in labels and "step peak" not in labels
    # --details: every line, the one device's step among the detail, the same last lines
    every = _labels(gpt2_fsdp_details())
    assert every.index("one device") < every.index("parallel") and every[-3:] == labels[-3:]
    assert {"MACs", "activations", "live", "units"} <= set(every)


def test_the_op_types_are_the_ten_heaviest_by_default():
    # a training graph has dozens of ATen op types, most of them moving data: the whole view
    # (--details; the default view of --train is its answer) lists the 10 with the most FLOPs
    # and says how many more there are (one rank's step: the whole view the test above reads)
    r = analyze("zoo:gpt2", train=True, optimizer="adam", device="a100-80gb",
                parallel={"strategy": "fsdp", "world_size": 4})
    more = len(r.by_op_type) - 10
    assert more > 0 and f"… {more} more op types (--max-rows 0 shows all)" in gpt2_fsdp_details()
    every = run_cli(*GPT2_FSDP, "--max-rows", "0", env={"COLUMNS": "100"})
    assert "more op types" not in every.stdout
