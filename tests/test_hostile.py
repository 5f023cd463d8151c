"""Hostile input: nothing but the named input is opened, nothing in a file runs, outputs never
replace what the model references, names never reach the terminal as control characters, and
cost stays bounded (speed itself is measured in benchmarks/bench_hostile.py)."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from graphcost.analyzer.app.api import analyze
from graphcost.analyzer.cli.main import main
from graphcost.passes.errors import GraphcostError
from graphcost.passes.memory.arena import WORK_MIN_TENSORS, WORK_PER_TENSOR, plan_arena
from graphcost.passes.memory.liveness import Storage
from onnx import TensorProto, helper, numpy_helper

from tests.hostile_files import pt2_variant, tiny_program
from tests.onnx_builders import model, node

ROOT = Path(__file__).resolve().parent.parent
SECRET = np.array([5, 7], np.int64)  # a Reshape target: would show up as an output shape


def _external(name: str, dtype: int, dims, location: str) -> TensorProto:
    t = TensorProto(name=name, data_type=dtype, dims=list(dims))
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    return t


def leaky_model(folder: Path) -> Path:
    """A Constant whose value is external ('secret.txt' in the current directory), a weight
    in 'weights.bin' beside the model, and Shape→Gather→Range arithmetic that makes the
    folding pass run."""
    (folder / "secret.txt").write_bytes(SECRET.tobytes())
    (folder / "weights.bin").write_bytes(np.ones((35, 4), np.float32).tobytes())
    nodes = [helper.make_node("Constant", [], ["shape"], name="leak",
                              value=_external("v", TensorProto.INT64, [2], "secret.txt")),
             node("Reshape", ["x", "shape"], ["y"], name="reshape"),
             node("MatMul", ["x", "W"], ["z"], name="matmul"),
             node("Shape", ["x"], ["s"], name="shape_of"),
             node("Gather", ["s", "zero"], ["n"], name="gather", axis=0),
             node("Range", ["start", "n", "one"], ["r"], name="range")]
    m = model(nodes, [("x", ["batch", 35])], [("y", None), ("z", ["batch", 4])],
              inits=[("zero", np.array(0, np.int64)), ("start", np.array(0, np.int64)),
                     ("one", np.array(1, np.int64))])
    m.graph.output.append(helper.make_tensor_value_info("r", TensorProto.INT64, None))
    m.graph.initializer.append(_external("W", TensorProto.FLOAT, [35, 4], "weights.bin"))
    path = folder / "model.onnx"
    onnx.save(m, path)
    return path


AUDIT = """
import json, os, sys
from graphcost.analyzer.cli.main import main
args = sys.argv[1:]
main(args)                     # warm-up: every import and lazily loaded module
opened = set()
def hook(event, a):
    if event == "open" and isinstance(a[0], (str, bytes)):
        opened.add(os.path.realpath(a[0]))
sys.addaudithook(hook)
code = main(args)
print(json.dumps({"code": code, "opened": sorted(opened)}))
"""


def test_analysis_opens_nothing_but_the_input(tmp_path):
    path = leaky_model(tmp_path)
    p = subprocess.run([sys.executable, "-c", AUDIT, str(path), "--format", "json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    audit = json.loads(p.stdout.strip().splitlines()[-1])
    assert audit == {"code": 0, "opened": [os.path.realpath(path)]}
    report = json.loads(p.stdout.strip().splitlines()[0])
    shapes = {n["name"]: n["output_shapes"] for n in report["nodes"]}
    assert shapes["reshape"] == ["?"]          # 5×7 would be secret.txt's bytes
    assert shapes["matmul"] == ["1×4"] and shapes["range"] == ["1"]  # batch 1: Range(0, 1)


def test_constant_of_shape_is_not_evaluated_when_too_big(tmp_path):
    # 213 bytes on disk; evaluating it would allocate 10^10 floats
    n = 100_000
    nodes = [helper.make_node("ConstantOfShape", ["dims"], ["c"], name="cos",
                              value=numpy_helper.from_array(np.array([1], np.float32))),
             node("NonZero", ["c"], ["nz"], name="nz"), node("Shape", ["nz"], ["s"]),
             node("Relu", ["x"], ["y"], name="relu")]
    m = model(nodes, [("x", ["batch", 2])], [("y", None)],
              inits=[("dims", np.array([n, n], np.int64))])
    m.graph.output.append(helper.make_tensor_value_info("s", TensorProto.INT64, None))
    path = tmp_path / "cos.onnx"
    onnx.save(m, path)
    limited = ("import resource, sys; from graphcost.analyzer.cli.main import main; "
               "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
               "sys.exit(main([sys.argv[1], '--format', 'json']))")
    p = subprocess.run([sys.executable, "-c", limited, str(path)], capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr


# ----------------------------------------------------------------------------- .pt2

@pytest.fixture(scope="module")
def tiny_pt2(tmp_path_factory):
    """A saved program with a symbolic batch (so its JSON holds expr_str entries)."""
    return tiny_program(tmp_path_factory.mktemp("pt2") / "tiny.pt2")


def _rewrite(src: Path, dst: Path, edit) -> None:
    """Copies the archive, passing the program's JSON through ``edit``."""
    pt2_variant(src, dst, edit)


def _first(doc, key):
    stack = [doc]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            if key in obj:
                return obj
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
    raise AssertionError(f"no {key} in the program")


def test_pt2_payload_in_expr_str_is_refused_and_never_runs(tiny_pt2, tmp_path, monkeypatch):
    import sympy

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "PWNED"
    payload = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    sympy.sympify(payload)  # what torch's deserializer would do with it: it runs
    assert marker.exists()
    marker.unlink()
    assert analyze(tiny_pt2).totals.params == 15  # the untouched program: 4·3 + 3
    evil = tmp_path / "evil.pt2"
    _rewrite(tiny_pt2, evil, lambda d: _first(d, "expr_str").update(expr_str=payload))
    with pytest.raises(GraphcostError, match="refused: the program holds"):
        analyze(evil)
    assert main(["diff", str(evil), str(tiny_pt2)]) == 2
    assert main([str(evil)]) == 2
    assert not marker.exists()


def test_pt2_call_target_outside_the_operators_is_refused(tiny_pt2, tmp_path):
    evil = tmp_path / "target.pt2"

    def edit(doc):
        nodes = _first(doc, "nodes")["nodes"]
        nodes[-1]["target"] = "torch.serialization.save"
    _rewrite(tiny_pt2, evil, edit)
    with pytest.raises(GraphcostError, match="call target 'torch.serialization.save'"):
        analyze(evil)


def test_pt2_guards_code_is_never_executed(tiny_pt2, tmp_path):
    """torch exec()s guards_code in .module() when the program carries example inputs
    (graphcost never gives it any); it is dropped anyway, so a change in torch cannot run it."""
    marker = tmp_path / "GUARD"
    evil = tmp_path / "guards.pt2"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch() is None"
    _rewrite(tiny_pt2, evil, lambda d: d.update(guards_code=[code]))
    from graphcost.analyzer.frontends.torch.pt2 import load_pt2
    load_pt2(evil).module()  # where torch would exec the guards (a --train analysis calls it)
    assert analyze(evil).totals.params == 15 and not marker.exists()


# ----------------------------------------------------------------------------- verify

def test_verify_refuses_external_data_beyond_the_model(tmp_path, monkeypatch):
    import onnxruntime
    from graphcost.analyzer.measure.verify import verify

    def never(*a, **k):
        raise AssertionError("onnxruntime was handed the model")
    monkeypatch.setattr(onnxruntime, "InferenceSession", never)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.bin").write_bytes(np.ones(6, np.float32).tobytes())
    sparse = helper.make_sparse_tensor(
        _external("S", TensorProto.FLOAT, [2], "secret.bin"),
        numpy_helper.from_array(np.array([0, 4], np.int64), "S_idx"), [2, 3])
    m = model([node("Add", ["x", "S"], ["y"], name="add")], [("x", [2, 3])], [("y", [2, 3])])
    m.graph.sparse_initializer.append(sparse)
    onnx.save(m, tmp_path / "sparse.onnx")
    with pytest.raises(GraphcostError, match="sparse initializer 'S' references external data"):
        verify(str(tmp_path / "sparse.onnx"))
    sub = tmp_path / "sub"
    sub.mkdir()
    m = model([node("Add", ["x", "W"], ["y"], name="add")], [("x", [2, 3])], [("y", [2, 3])])
    m.graph.initializer.append(_external("W", TensorProto.FLOAT, [2, 3], "../secret.bin"))
    onnx.save(m, sub / "escape.onnx")
    with pytest.raises(GraphcostError, match="outside the model's folder"):
        verify(str(sub / "escape.onnx"))


# ----------------------------------------------------------------------------- outputs

def test_outputs_never_replace_external_data_or_the_zoo_cache(tmp_path, monkeypatch, capsys):
    m = model([node("MatMul", ["x", "W"], ["y"], name="mm")], [("x", ["batch", 64])],
              [("y", ["batch", 64])], inits=[("W", np.ones((64, 64), np.float32))])
    path = tmp_path / "model.onnx"
    onnx.save(m, path, save_as_external_data=True, location="model.data")
    data = (tmp_path / "model.data").read_bytes()
    for flag in ("-o", "--html"):
        assert main([str(path), flag, str(tmp_path / "model.data")]) == 2
        assert "holds the model's external data" in capsys.readouterr().err
    assert (tmp_path / "model.data").read_bytes() == data
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("GRAPHCOST_CACHE", str(cache))
    assert main([str(path), "--format", "json", "-o", str(cache / "r.json")]) == 2
    assert "zoo's export cache" in capsys.readouterr().err
    assert not (cache / "r.json").exists()


# ----------------------------------------------------------------------------- terminal

def test_names_never_reach_the_terminal_raw(tmp_path, capsys):
    m = model([node("Relu", ["x"], ["y"], name="relu\x1b]0;pwned\x07\x1b[2J")],
              [("x", ["ba\x1b[31mtch", 3])], [("y", ["ba\x1b[31mtch", 3])])
    path = tmp_path / "names.onnx"
    onnx.save(m, path)
    for fmt in ("table", "csv", "markdown"):
        assert main([str(path), "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and "relu\\x1b]0;pwned" in out
    assert main([str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"][0]["name"] == \
        "relu\x1b]0;pwned\x07\x1b[2J"  # JSON keeps the exact name, escaped by json
    bad = tmp_path / "two\nlines\x1b.onnx"
    bad.write_bytes(b"not a model")
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "two\\nlines\\x1b.onnx" in err


# ----------------------------------------------------------------------------- cost

def test_arena_work_is_bounded_and_its_plan_valid(monkeypatch):
    # 20k equal tensors alive together (one Split's outputs): greedy compares each with every
    # placed one; past the budget they are stacked — on top of each other, as greedy would.
    n = 20_000
    plan = plan_arena(tuple(Storage(f"t{i}", 100, 0, 3) for i in range(n)))
    assert plan.stacked > 0 and plan.work <= WORK_PER_TENSOR * max(WORK_MIN_TENSORS, n) + n
    assert plan.arena_bytes == n * 128  # 100 bytes aligned to 64: 128 each, none overlap
    assert sorted(plan.offsets) == [128 * i for i in range(n)]
    # Random lifetimes with stacking forced early: the plan stays valid (no two tensors live
    # at the same time share a byte) and never below the peak of live bytes.
    monkeypatch.setattr("graphcost.passes.memory.arena.WORK_PER_TENSOR", 1)
    rnd = random.Random(0)
    storages = []
    for i in range(3000):
        b = rnd.randrange(500)
        storages.append(Storage(f"t{i}", rnd.choice([64, 100, 1000, 4096]), b,
                                b + rnd.randrange(60)))
    plan = plan_arena(tuple(storages))
    assert plan.stacked > 2000
    spans = [(s.birth, s.death, off, off + -(-s.nbytes // 64) * 64)
             for s, off in zip(storages, plan.offsets)]
    for t in range(500):
        live = sorted((lo, hi) for b, d, lo, hi in spans if b <= t <= d)
        assert all(a[1] <= b[0] for a, b in zip(live, live[1:])), t
        assert plan.arena_bytes >= sum(hi - lo for lo, hi in live)


def test_split_with_40k_outputs_is_analyzed(tmp_path):
    """Linear-ish: the quadratic planner took minutes here; the bound is 10x generous (the
    ratio to onnx.load is measured in benchmarks/bench_hostile.py)."""
    import time
    n = 40_000
    outs = [f"o{i}" for i in range(n)]
    m = model([helper.make_node("Split", ["x"], outs, name="split", axis=1)], [("x", [1, n])],
              [])
    m.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                          for o in outs)
    path = tmp_path / "split.onnx"
    onnx.save(m, path)
    t = time.perf_counter()
    r = analyze(path)
    assert time.perf_counter() - t < 30
    assert r.memory.peak_bytes == 2 * n * 4  # x and its 40k one-float slices, all outputs
    assert any("stacked" in w for w in r.warnings)


# ----------------------------------------------------------------------------- arguments

@pytest.mark.parametrize("kwargs", [
    {"batch": "2"}, {"batch": True}, {"batch": 2.5}, {"batch": 2 ** 70}, {"batch": -1},
    {"dims": {"batch": -3}}, {"dims": {"batch": 2 ** 63}}, {"dims": [("batch", 2)]},
    {"input_shapes": {"x": [1, -3]}}, {"input_shapes": {"x": "1x3"}},
    {"input_shapes": {"x": [2 ** 40, 2 ** 40]}}, {"inplace": "yes"}, {"lifetimes": "lazy"},
    {"optimizer": "adagrad"}, {"checkpoint": 3}, {"progress": 5}])
def test_api_bad_arguments_raise_graphcost_error(tmp_path, kwargs):
    m = model([node("Relu", ["x"], ["y"])], [("x", ["batch", 3])], [("y", ["batch", 3])])
    with pytest.raises(GraphcostError):
        analyze(m, **kwargs)


def test_cli_sizes_beyond_int64_and_directories(tmp_path, capsys):
    m = model([node("Relu", ["x"], ["y"])], [("x", ["batch", "seq"])], [("y", ["batch", "seq"])])
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    for extra in (["--dim", "seq=2", "--batch", "9223372036854775808"],
                  ["--dim", "seq=9223372036854775808"],
                  ["--dim", "seq=4294967296", "--batch", "4294967296"]):  # 2^64 elements
        assert main([str(path), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "int64" in err, err
    assert main([str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
