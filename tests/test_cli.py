"""The installed ``graphcost`` command, run as a user would (a subprocess, real files): one
process per thing the command itself does (its streams, statuses, files, a closed pipe); what
is not the command's own (the binding flags, the CSV, the coverage line) runs its ``main`` in
this process (tests/cli_runner.py), and one run serves the tests that read it."""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import subprocess

import onnx
import pytest

from tests.cli_runner import run as in_process
from tests.onnx_builders import model, node, weight

GRAPHCOST = shutil.which("graphcost")
pytestmark = pytest.mark.skipif(GRAPHCOST is None, reason="graphcost is not installed: run "
                                "`pip install -e .` (the README's set-up) first")


def run(*args, check_rc=None):
    p = subprocess.run([GRAPHCOST, *map(str, args)], capture_output=True, text=True,
                       env=dict(os.environ, COLUMNS="200"), timeout=300)
    if check_rc is not None:
        assert p.returncode == check_rc, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory):
    # x[batch,64] → Gemm(64→32) → Relu → Gemm(32→10) → Softmax; one file for the module, its
    # digest and mtime taken before any run reads it (test_input_file_is_never_written)
    m = model([node("Gemm", ["x", "W1", "b1"], ["h"], name="fc1", transB=1),
               node("Relu", ["h"], ["r"], name="relu"),
               node("Gemm", ["r", "W2", "b2"], ["y"], name="fc2", transB=1),
               node("Softmax", ["y"], ["p"], name="softmax")],
              [("x", ["batch", 64])], [("p", ["batch", 10])],
              inits=[weight("W1", 32, 64), weight("b1", 32), weight("W2", 10, 32),
                     weight("b2", 10)])
    path = tmp_path_factory.mktemp("cli") / "mlp.onnx"
    onnx.save(m, path)
    return path, _stamp(path)


def _stamp(path):
    return hashlib.sha256(path.read_bytes()).hexdigest(), os.stat(path).st_mtime_ns


@pytest.fixture(scope="module")
def mlp(mlp_file):
    return mlp_file[0]


# The runs several tests read (each is a process importing onnx and the passes: ~1 s)
@pytest.fixture(scope="module")
def table16(mlp):
    return run(mlp, "--batch", 16, check_rc=0)


@pytest.fixture(scope="module")
def json16(mlp):
    return run(mlp, "--batch", 16, "--format", "json", check_rc=0)


def test_table(table16):
    for text in ("fc1", "Gemm", "Softmax", "16×32", "by op type", "params      2,410",
                 "activations peak", "arena", "coverage    4/4"):
        assert text in table16.stdout, text
    assert table16.stderr == ""


def test_json(json16):
    r = json.loads(json16.stdout)
    # params: 32·64 + 32 + 10·32 + 10 = 2,410
    assert r["totals"]["params"] == 2_410
    # MACs: 16·32·64 + 16·10·32 = 32,768 + 5,120 = 37,888
    assert r["totals"]["macs"] == 37_888
    # FLOPs: 2·37,888 + bias 16·32 + 16·10 + relu 16·32 + softmax 5·16·10 = 75,776+512+160+512+800
    assert r["totals"]["flops"] == 77_760
    assert r["batch"] == 16 and r["dims"] == {"batch": 16}
    for key in ("model", "convention", "by_op_type", "coverage", "memory", "nodes"):
        assert key in r
    assert r["convention"]["macs"].startswith("multiply-accumulates")
    assert r["coverage"] == {"nodes": 4, "covered": 4, "percent": 100.0, "unsupported": {},
                             "unknown_shape": {}, "bounded": {}}
    assert len(r["memory"]["timeline"]) == 4
    assert set(r["memory"]) >= {"naive_sum_bytes", "peak_bytes", "peak_node", "live_at_peak",
                                "arena_bytes", "timeline"}


def test_json_is_deterministic(mlp, json16):
    # a second process (another hash seed) writes the same bytes
    assert run(mlp, "--batch", 16, "--format", "json", check_rc=0).stdout == json16.stdout


def test_csv_and_markdown(mlp, tmp_path):
    # the CSV in this process (a format, rendered as the command renders it); the Markdown
    # written to a file by the command
    rows = list(csv.DictReader(io.StringIO(in_process(mlp, "--format", "csv",
                                                      check_rc=0).stdout)))
    assert [r["op"] for r in rows] == ["Gemm", "Relu", "Gemm", "Softmax"]
    assert rows[0]["macs"] == str(32 * 64)  # batch defaults to 1
    out = tmp_path / "r.md"
    run(mlp, "--format", "markdown", "-o", out, check_rc=0)
    md = out.read_text()
    assert md.startswith("# graphcost: mlp.onnx") and "| fc1 | Gemm |" in md


def test_input_file_is_never_written(mlp_file, json16):
    # json16 (and whichever tests ran before) read the file after its stamp was taken
    mlp, before = mlp_file
    p = run(mlp, "--format", "json", "-o", mlp, check_rc=2)
    assert "never writes its input" in p.stderr
    assert _stamp(mlp) == before


def test_strict_fails_on_unsupported(tmp_path):
    # an op of a domain graphcost has no rules for (every ONNX op has one)
    m = model([node("Relu", ["x"], ["a"]), node("Det", ["a"], ["d"], domain="org.acme")],
              [("x", [1, 4, 4])], [("d", [1])])
    m.opset_import.append(onnx.helper.make_opsetid("org.acme", 1))
    path = tmp_path / "det.onnx"
    onnx.save(m, path)
    p = in_process(path, check_rc=0)  # (the coverage line; the status 3 on a subprocess)
    assert "unsupported org.acme::Det×1" in p.stdout
    p = run(path, "--strict", check_rc=3)
    assert "org.acme::Det×1" in p.stderr


def test_zoo_model_runs():
    p = run("zoo:mnist_net", "--batch", 2, "--format", "json", check_rc=0)
    assert json.loads(p.stdout)["totals"]["params"] == 21_840
    p = run("zoo:nope", check_rc=2)
    assert "no zoo model 'nope'" in p.stderr


def test_dims_bind_symbolic_sequence(tmp_path):
    # the binding flags, run in this process (tests/cli_runner.py: the same main() the
    # command calls; what is the installed command's own, its statuses and streams, the
    # other tests here check on a subprocess)
    # y = MatMul(x[batch, seq, 8], W[8, 4]): MACs = batch·seq·4·8
    m = model([node("MatMul", ["x", "W"], ["y"])], [("x", ["batch", "seq", 8])],
              [("y", ["batch", "seq", 4])], inits=[weight("W", 8, 4)])
    path = tmp_path / "seq.onnx"
    onnx.save(m, path)
    r = json.loads(in_process(path, "--batch", 2, "--dim", "seq=5", "--format", "json",
                              check_rc=0).stdout)
    assert r["totals"]["macs"] == 2 * 5 * 4 * 8 and r["dims"] == {"batch": 2, "seq": 5}
    r = json.loads(in_process(path, "--input-shape", "x=3x7x8", "--format", "json",
                              check_rc=0).stdout)
    assert r["totals"]["macs"] == 3 * 7 * 4 * 8
    p = in_process(path, "--batch", 2, check_rc=2)  # seq left unbound
    assert "'x' dim 1" in p.stderr and "--dim seq=" in p.stderr


def test_piped_text_has_no_trailing_blanks(table16):
    # rich pads a table's title and a left-justified last column (devices' arch) to the
    # table's width: blanks an editor or `diff` shows at the end of a piped line
    for name, p in (("table", table16), ("devices", run("devices", check_rc=0))):
        padded = [line for line in p.stdout.splitlines() if line != line.rstrip()]
        assert not padded, (name, padded[:3])
    assert "by op type\n" in table16.stdout  # the title, on its own


def test_a_reader_that_stops_early_gets_no_error(mlp):
    # `graphcost … | head`: the read end is closed before graphcost writes a byte, so its
    # first write fails with EPIPE every time; a Unix tool then stops without a word, with
    # 128 + SIGPIPE (13) = 141 as its status, where graphcost said "error: Broken pipe", exit 2
    p = subprocess.Popen([GRAPHCOST, str(mlp), "--batch", "16"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read()
    assert (p.wait(timeout=300), err) == (141, "")
