"""`graphcost check`: the CI gate's exit codes (0 pass, 1 over budget, 2 bad input) and its JSON,
with values that are published or hand-computed, run through the installed command."""
from __future__ import annotations

import json
import shutil

import pytest
from onnx import helper

from tests.cli_runner import run_cli
from tests.onnx_builders import model, node, weight

GRAPHCOST = shutil.which("graphcost")
pytestmark = pytest.mark.skipif(GRAPHCOST is None, reason="graphcost is not installed")


def run(*args):
    return run_cli("check", *args, env={"COLUMNS": "200"})  # in this process: tests/cli_runner


def test_resnet50_gate_in_the_issue_fails_on_flops_only():
    p = run("zoo:resnet50", "--batch", "16", "--max-peak", "4GiB", "--max-gflops", "20",
            "--max-params", "50M", "--format", "json")
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    assert doc["passed"] is False and doc["kind"] == "check"
    # torchvision's ResNet-50: 25,557,032 params ≤ 50M
    assert checks["params"] == {"name": "params", "value": 25_557_032, "limit": 50e6,
                                "unit": "count", "passed": True, "detail": ""}
    # 16 × 4.09 GMACs × 2 ≈ 131 GFLOPs > 20 GFLOPs
    assert checks["FLOPs"]["value"] > 2 * 16 * 4.08e9 and not checks["FLOPs"]["passed"]
    assert checks["FLOPs"]["limit"] == 20e9
    assert checks["peak memory"]["passed"] and checks["coverage"]["passed"]


def test_passing_gate_exits_0_and_prints_every_check():
    p = run("zoo:resnet50", "--max-params", "26M", "--max-macs", "4.2G", "--device", "t4",
            "--max-latency", "50ms")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    for name in ("params", "MACs", "latency (roofline)", "coverage", "fits t4"):
        assert any(line.strip().startswith(f"PASS  {name}") for line in lines), name
    assert lines[-1] == "all checks passed"


def test_exact_limit_passes_and_one_below_fails(tmp_path):
    # x[1,64] → MatMul W[64,32]: 2,048 params exactly
    m = model([node("MatMul", ["x", "W"], ["y"], name="mm")], [("x", [1, 64])],
              [("y", [1, 32])], inits=[weight("W", 64, 32)])
    path = tmp_path / "mm.onnx"
    path.write_bytes(m.SerializeToString())
    assert run(path, "--max-params", "2048").returncode == 0
    assert run(path, "--max-params", "2047").returncode == 1
    # peak = params 8,192 B + x 256 B + y 128 B (both live at the MatMul) = 8,576 B
    assert run(path, "--max-peak", "8576").returncode == 0
    assert run(path, "--max-peak", "8575").returncode == 1


def test_uncosted_ops_fail_the_coverage_check_unless_allowed(tmp_path):
    # org.acme::Det has no cost rule (every ONNX op has one): 1 of 2 nodes costed = 50%
    m = model([node("Relu", ["x"], ["a"]), node("Det", ["a"], ["d"], domain="org.acme")],
              [("x", [1, 4, 4])], [("d", [1])])
    m.opset_import.append(helper.make_opsetid("org.acme", 1))
    path = tmp_path / "det.onnx"
    path.write_bytes(m.SerializeToString())
    p = run(path, "--max-flops", "1G")
    assert p.returncode == 1 and "FAIL  coverage" in p.stdout and "org.acme::Det×1" in p.stdout
    assert run(path, "--max-flops", "1G", "--min-coverage", "50").returncode == 0


@pytest.mark.parametrize("args, message", [
    (["--max-peak", "four"], "--max-peak 'four'"),
    (["--max-params", "lots"], "--max-params 'lots'"),
    (["--max-latency", "5"], "--max-latency '5'"),
    (["--max-latency", "5ms"], "needs --device"),
    (["--min-coverage", "101"], "0..100"),
])
def test_bad_thresholds_exit_2_with_one_line(args, message):
    p = run("zoo:small_cnn", *args)
    assert p.returncode == 2 and message in p.stderr and p.stderr.count("\n") == 1
    assert p.stdout == ""


def test_sizes_in_every_accepted_spelling():
    for size in ("4GB", "4GiB", "4e9"):
        assert run("zoo:small_cnn", "--max-peak", size).returncode == 0


def test_rows_align_and_fit_80_columns():
    # issue 26: "fits a100-80gb" is longer than the other names (rows misaligned), and its
    # parts ran to 139 characters at 80 columns; now the names pad to the longest and the
    # parts wrap under their row, a number kept with its unit
    from tests.cli_runner import run_cli
    done = run_cli("check", "zoo:resnet50", "--max-params", "30M", "--max-flops", "5G",
                   "--device", "a100-80gb", env={"COLUMNS": "80"})
    lines = done.stdout.splitlines()
    assert done.returncode == 1 and max(map(len, lines)) <= 80
    rows = [line for line in lines if line.startswith(("  PASS", "  FAIL"))]
    assert len(rows) == 4 and len({line.replace("≥", "≤").index("≤") for line in rows}) == 1
    assert not any(line.rstrip().endswith(("×", "8.125")) for line in lines)
