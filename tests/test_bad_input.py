"""Bad input: one clear line on stderr, exit status 2, no traceback, the input untouched."""
from __future__ import annotations

import hashlib
import os

import onnx
import pytest
from onnx import helper

from tests.cli_runner import (
    run,  # graphcost's main in this process (tests/test_cli.py runs the installed command)
)
from tests.onnx_builders import model, node, weight


def assert_one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("graphcost: error: ")
    assert "Traceback" not in p.stderr and p.stdout == ""
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.fixture
def good(tmp_path):
    m = model([node("Conv", ["x", "W"], ["y"], name="conv", pads=[1, 1, 1, 1])],
              [("x", ["batch", 3, 8, 8])], [("y", ["batch", 4, 8, 8])],
              inits=[weight("W", 4, 3, 3, 3)])
    p = tmp_path / "good.onnx"
    onnx.save(m, p)
    return p


def digest(p):
    return hashlib.sha256(p.read_bytes()).hexdigest(), os.stat(p).st_mtime_ns


def test_not_onnx(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("this is not a model\n" * 20)
    before = digest(p)
    assert_one_line_error(run(p), "notes.onnx", "ONNX")
    assert digest(p) == before


def test_truncated(good):
    data = good.read_bytes()
    good.write_bytes(data[: len(data) // 2])
    assert_one_line_error(run(good), "good.onnx")


def test_missing_file(tmp_path):
    assert_one_line_error(run(tmp_path / "nope.onnx"), "no such file")


def test_empty_graph(tmp_path):
    m = model([], [("x", [1, 3])], [("x", [1, 3])])
    p = tmp_path / "empty.onnx"
    onnx.save(m, p)
    assert_one_line_error(run(p), "no nodes")


def test_unknown_domain_is_reported_not_a_crash(tmp_path):
    m = model([node("Relu", ["x"], ["a"]), helper.make_node("Frobnicate", ["a"], ["y"],
                                                            domain="com.example", name="frob")],
              [("x", [1, 3])], [("y", [1, 3])])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    p = tmp_path / "custom.onnx"
    onnx.save(m, p)
    r = run(p, "--format", "json")
    assert r.returncode == 0, r.stderr
    import json
    cov = json.loads(r.stdout)["coverage"]
    assert cov["unsupported"] == {"com.example::Frobnicate": 1} and cov["covered"] == 1
    assert run(p, "--strict").returncode == 3


@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_batch(good, value):
    assert_one_line_error(run(good, "--batch", value), "--batch must be a positive integer")


def test_batch_on_fixed_batch_dim(tmp_path):
    m = model([node("Relu", ["x"], ["y"])], [("x", [1, 3, 8, 8])], [("y", [1, 3, 8, 8])])
    p = tmp_path / "fixed.onnx"
    onnx.save(m, p)
    assert_one_line_error(run(p, "--batch", 16), "fixed batch dimension 1", "dynamic_axes")
    assert run(p, "--batch", 1).returncode == 0  # matching the fixed size is fine


def test_unknown_dim_name(good):
    assert_one_line_error(run(good, "--dim", "seq=128"), "no symbolic dim named 'seq'",
                          "batch")


def test_unknown_dim_of_a_zoo_torch_model_names_it_and_the_known_ones():
    # zoo:gpt2's one dim besides the batch is seq; the message said "does not accept dims
    # ['bogus', 'seq']", blaming the default seq as well
    assert_one_line_error(run("zoo:gpt2", "--fx", "--dim", "bogus=3"), "no dim 'bogus'",
                          "its dims: seq")


def test_bad_dim_and_shape_syntax(good):
    assert_one_line_error(run(good, "--dim", "batch"), "NAME=VALUE")
    assert_one_line_error(run(good, "--dim", "batch=many"), "integer")
    assert_one_line_error(run(good, "--input-shape", "x=1xthreex8"), "bad shape")
    assert_one_line_error(run(good, "--input-shape", "y=1x3x8x8"), "no graph input 'y'")
    assert_one_line_error(run(good, "--input-shape", "x=1x3x8"), "rank 3")


def test_bad_option_is_one_line(good):
    p = run(good, "--format", "yaml")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_unwritable_output_is_one_line_and_exit_2(tmp_path, capsys):
    from graphcost.analyzer.cli.main import main
    missing = tmp_path / "no-such-dir"
    for extra in (["--html", str(missing / "r.html")],
                  ["--format", "json", "-o", str(missing / "r.json")]):
        assert main(["zoo:small_cnn", *extra]) == 2
        err = capsys.readouterr().err  # (checked before the analysis: tests/test_first_contact)
        assert f"the folder {missing} does not exist" in err and err.count("\n") == 1
