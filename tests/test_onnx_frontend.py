"""ONNX frontend: no weight bytes read, functions inlined, control flow costed, coverage of the
zoo exports of both exporters."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from graphcost.analyzer.frontends.onnx.frontend import lower_onnx
from onnx import TensorProto, helper, numpy_helper

from graphcost import GraphcostError, analyze
from tests.onnx_builders import model, node, weight


def big_matmul_model():
    # y = MatMul(x[batch, 512], W[512, 512]) → MACs = batch·512·512
    return model([node("MatMul", ["x", "W"], ["y"])], [("x", ["batch", 512])],
                 [("y", ["batch", 512])], inits=[weight("W", 512, 512)])


def test_external_data_is_never_read(tmp_path):
    path = tmp_path / "ext.onnx"
    onnx.save(big_matmul_model(), path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    with_data = analyze(path, batch=4)
    (tmp_path / "ext.data").unlink()  # a model shipped without its weight file
    without = analyze(path, batch=4)
    assert with_data.to_json() == without.to_json()
    assert without.totals.params == 512 * 512
    assert without.totals.macs == 4 * 512 * 512


def test_caller_model_is_not_mutated():
    m = big_matmul_model()
    before = m.SerializeToString()
    analyze(m, batch=3)
    assert m.SerializeToString() == before


def test_local_functions_are_inlined():
    # f(x) = Relu(MatMul(x, W)) as a model-local function; the call costs what its body does.
    fn = helper.make_function("local", "MatRelu", ["a", "w"], ["b"],
                              [helper.make_node("MatMul", ["a", "w"], ["t"]),
                               helper.make_node("Relu", ["t"], ["b"])],
                              [helper.make_opsetid("", 17)])
    m = model([helper.make_node("MatRelu", ["x", "W"], ["y"], domain="local", name="call")],
              [("x", [2, 8])], [("y", [2, 4])], inits=[weight("W", 8, 4)], functions=[fn])
    m.opset_import.append(helper.make_opsetid("local", 1))
    r = analyze(m)
    assert sorted(n.op for n in r.nodes) == ["MatMul", "Relu"]
    assert r.totals.macs == 2 * 4 * 8  # 64
    assert r.coverage.unsupported == {}


def loop_model(trip_count_const: bool):
    # Loop M times: acc = acc + MatMul(acc, W) with acc [1, 16], W [16, 16]
    body = helper.make_graph(
        [helper.make_node("MatMul", ["acc_in", "W"], ["prod"], name="body_mm"),
         helper.make_node("Add", ["acc_in", "prod"], ["acc_out"], name="body_add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 16])])
    nodes = [helper.make_node("Loop", ["M", "cond", "x"], ["y"], body=body, name="loop")]
    inits = [numpy_helper.from_array(np.ones((16, 16), np.float32), "W"),
             numpy_helper.from_array(np.array(True), "cond")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])]
    if trip_count_const:
        inits.append(numpy_helper.from_array(np.array(5, np.int64), "M"))
    else:
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    g = helper.make_graph(nodes, "g", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_loop_body_costed_per_iteration():
    # body: MatMul 1·16·16 = 256 MACs, Add 16 FLOPs; 5 iterations → 1,280 MACs,
    # FLOPs 5·(2·256 + 16) = 2,640
    r = analyze(loop_model(True))
    assert r.totals.macs == 1_280 and r.totals.flops == 2_640
    assert {n.name: n.repeat for n in r.nodes}["loop/body/body_mm"] == 5
    assert r.warnings == ()


def test_loop_with_unknown_trip_count_warns_and_counts_once():
    r = analyze(loop_model(False))
    assert r.totals.macs == 256
    assert any("trip count" in w for w in r.warnings)


def test_if_counts_both_branches_with_warning():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="t_relu")], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, 4])])
    other = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["e"], name="e_sig")], "else",
                              [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, 4])])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")],
        "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])])
    r = analyze(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    # Relu 16·1 + Sigmoid 16·3 = 64 FLOPs: both branches, an upper bound
    assert r.totals.flops == 64
    assert any("both branches" in w for w in r.warnings)


def test_reshape_chain_resolves_through_data_propagation():
    # Shape → Gather → Concat → Reshape, as exporters write flatten: shapes must stay concrete
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 5])
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["b"], name="gather", axis=0),
             helper.make_node("Unsqueeze", ["b", "zero1"], ["b1"], name="unsq"),
             helper.make_node("Concat", ["b1", "minus1"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"], name="reshape"),
             helper.make_node("Relu", ["flat"], ["y"], name="relu")]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "zero1"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                          None)], inits)
    r = analyze(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), batch=6)
    relu = [n for n in r.nodes if n.op == "Relu"][0]
    assert relu.output_shapes == ("6×20",) and relu.flops == 120
    assert r.coverage.unknown_shape == {}


def test_ir_is_immutable():
    g = lower_onnx(big_matmul_model(), batch=2)
    with pytest.raises(Exception):
        g.nodes[0].op = "Conv"  # frozen dataclass
    with pytest.raises(TypeError):
        g.nodes[0].attrs["x"] = 1


def test_unknown_symbol_is_a_clear_error():
    m = model([node("Relu", ["x"], ["y"])], [("x", ["batch", "seq"])], [("y", ["batch", "seq"])])
    with pytest.raises(GraphcostError, match=r"input 'x' dim 1 is the symbol 'seq'"):
        analyze(m)


ZOO = ["small_cnn", "mnist_net", "three_conv", "resnet18", "resnet50", "mobilenet_v2", "gpt2",
       "bert", "unet", "llama_tiny"]


@pytest.mark.parametrize("dynamo", [False, True], ids=["legacy", "dynamo"])
@pytest.mark.parametrize("name", ZOO)
def test_zoo_exports_fully_covered(name, dynamo):
    """Every op of both exporters' output for every zoo model has a rule and a shape."""
    from graphcost.models_zoo import cached_export

    path = cached_export(name, dynamo=dynamo)
    dims = {"seq": 32} if name in ("gpt2", "bert", "llama_tiny") else {}
    r = analyze(path, batch=2, dims=dims)
    assert r.coverage.unsupported == {}, r.coverage.unsupported
    assert r.coverage.unknown_shape == {}, r.shape_issues
    assert r.coverage.covered == r.coverage.nodes
    assert r.totals.macs > 0 and r.memory.peak_bytes > 0


def test_onnx_path_does_not_import_torch(tmp_path):
    # start-up time matters: analyzing an .onnx file never imports torch
    import subprocess
    import sys
    path = tmp_path / "m.onnx"
    onnx.save(big_matmul_model(), path)
    code = ("import sys; from graphcost import analyze; analyze(sys.argv[1], batch=2).to_json(); "
            "from graphcost.analyzer.cli.main import main; main([sys.argv[1], '--format', 'json', '-o', "
            "sys.argv[1] + '.json']); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "False"


def test_a_cached_zoo_model_is_analyzed_without_torch(tmp_path):
    # zoo:gpt2 twice with an empty cache: the first run exports it (torch), the second reads
    # the export alone, with the registry's facts the file records (seq defaults to 64, the
    # token ids' range for verify); both reports are the same, at the default and a set seq
    import subprocess
    import sys
    code = ("import sys, json; from graphcost.analyzer.cli.main import main; "
            "[main(['zoo:GPT2', '--batch', '2', *a, '--format', 'json', '-o', f'{sys.argv[1]}{i}'])"
            " for i, a in enumerate([[], ['--dim', 'seq=32']])]; print('torch' in sys.modules)")
    env = dict(os.environ, GRAPHCOST_CACHE=str(tmp_path / "cache"))
    runs = []
    for run in ("export", "cached"):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / run)], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
        runs.append(out)
    assert runs == ["True", "False"]
    for i, seq in enumerate((64, 32)):
        exported, cached = (json.loads((tmp_path / f"{run}{i}").read_text())
                            for run in ("export", "cached"))
        assert exported == cached
        assert exported["model"] == "zoo:gpt2" and exported["dims"] == {"batch": 2, "seq": seq}
    from graphcost.models_zoo.cache import read_props
    (path,) = (tmp_path / "cache").iterdir()
    assert read_props(onnx.load(str(path))) == ({"seq": 64}, {"input_ids": (0, 1000)})


def test_onnx_module_tree_is_the_torch_tree():
    # '/layer2/layer2.0/downsample/downsample.0/Conv' is layer2 → 0 → downsample → 0
    from graphcost.analyzer.frontends.onnx.lowering import module_path
    assert module_path("/layer2/layer2.0/downsample/downsample.0/Conv") == \
        "layer2.0.downsample.0"
    assert module_path("/layer1/layer1.0/conv1/Conv") == "layer1.0.conv1"
    onnx_paths = {m.path for m in analyze("zoo:resnet18").modules}
    fx_paths = {m.path for m in analyze("zoo:resnet18", zoo_exporter="fx").modules}
    # the exporter names a module's second call "relu_1": the only difference
    assert {p for p in onnx_paths if not p.endswith("relu_1")} == fx_paths
