"""ONNX Loop/If whose run count depends on the data (issue #14): costed at the upper bound the
user gives (``--dim M=MAX``) and labelled a bound, or costed once with a warning naming the flag
that bounds it; both If branches are labelled."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphcost import analyze

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def loop_model():
    # y = x, then M times: y = y·W (MatMul 1×8 · 8×8 → 64 MACs per iteration); M is an input
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["y_in", "W"], ["y_out"], name="step")],
        "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond_in", BOOL, []),
         helper.make_tensor_value_info("y_in", F32, [1, 8])],
        [helper.make_tensor_value_info("cond_out", BOOL, []),
         helper.make_tensor_value_info("y_out", F32, [1, 8])])
    loop = helper.make_node("Loop", ["M", "cond", "x"], ["y"], name="repeat", body=body)
    graph = helper.make_graph(
        [loop], "g",
        [helper.make_tensor_value_info("M", I64, []),
         helper.make_tensor_value_info("x", F32, [1, 8])],
        [helper.make_tensor_value_info("y", F32, [1, 8])],
        initializer=[numpy_helper.from_array(np.ones((8, 8), np.float32), "W"),
                     numpy_helper.from_array(np.array(True), "cond")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_data_dependent_loop_is_bounded_by_the_user():
    once = analyze(loop_model())
    # without a bound: the body once (64 MACs), and a warning naming the flag
    assert once.totals.macs == 64
    assert any("--dim M=MAX" in w for w in once.warnings)
    ten = analyze(loop_model(), dims={"M": 10})
    # at most 10 iterations: 10 · 64 = 640 MACs, and the body's nodes say it is a bound
    assert ten.totals.macs == 640
    step = next(n for n in ten.nodes if n.op == "MatMul")
    assert step.repeat == 10 and "at most 10 times" in step.bound
    assert ten.coverage.bounded == {"MatMul": 1, "Identity": 1}


def test_if_branches_are_labelled_bounds():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["a"])], "then", [],
                             [helper.make_tensor_value_info("a", F32, [4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["b"])], "else", [],
                              [helper.make_tensor_value_info("b", F32, [4])])
    node = helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then,
                            else_branch=other)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", BOOL, []),
                                            helper.make_tensor_value_info("x", F32, [4])],
                              [helper.make_tensor_value_info("y", F32, [4])])
    r = analyze(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    # both branches: Relu 4 + Neg 4 FLOPs, each labelled
    assert r.totals.flops == 8
    assert all("both branches of If" in n.bound for n in r.nodes if n.op in ("Relu", "Neg"))


def test_bound_in_cli_output(tmp_path):
    import json
    import shutil
    import subprocess

    import onnx
    exe = shutil.which("graphcost")
    if exe is None:
        pytest.skip("graphcost is not installed")
    path = tmp_path / "loop.onnx"
    onnx.save(loop_model(), path)
    out = json.loads(subprocess.run([exe, path, "--dim", "M=3", "--format", "json"],
                                    capture_output=True, text=True, check=True).stdout)
    assert out["totals"]["macs"] == 3 * 64
    assert any("at most 3 times" in (n["bound"] or "") for n in out["nodes"])
