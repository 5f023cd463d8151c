"""analyzer/frontends/onnx/validate.py: each rule refused with one line naming the node and the rule; an
unsorted but valid graph is sorted, not refused."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from graphcost.analyzer.app.api import analyze
from graphcost.analyzer.cli.main import main
from graphcost.analyzer.frontends.onnx.validate import validate_model
from graphcost.passes.errors import GraphcostError
from onnx import TensorProto, helper, numpy_helper

from tests import hostile_files as hf
from tests.onnx_builders import model, node, shape_const, weight


def refused(m, *needles):
    with pytest.raises(GraphcostError) as err:
        analyze(m)
    msg = str(err.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


def relu_chain():
    return model([node("Relu", ["x"], ["a"], name="first"), node("Relu", ["a"], ["y"], name="second")],
                 [("x", [1, 3])], [("y", [1, 3])])


def test_two_nodes_write_one_name():
    m = model([node("Relu", ["x"], ["y"], name="r1"), node("Relu", ["x"], ["y"], name="r2")],
              [("x", [1, 3])], [("y", [1, 3])])
    refused(m, "node 'r2' (Relu)", "writes 'y'", "also written by node 'r1'", "SSA")


def test_node_writes_a_graph_input_or_initializer():
    refused(model([node("Relu", ["x"], ["x"], name="r")], [("x", [1, 3])], [("x", [1, 3])]),
            "node 'r' (Relu)", "writes 'x'", "graph input or initializer")
    m = model([node("Relu", ["x"], ["W"], name="r")], [("x", [1, 3])], [("W", [1, 3])],
              inits=[weight("W", 1, 3)])
    refused(m, "node 'r' (Relu)", "writes 'W'")


def test_initializer_defined_twice():
    m = model([node("Add", ["x", "W"], ["y"], name="add")], [("x", [1, 3])], [("y", [1, 3])],
              inits=[weight("W", 1, 3), weight("W", 1, 3)])
    refused(m, "initializer 'W'", "defined twice")


def test_input_that_nothing_defines():
    m = model([node("Add", ["x", "ghost"], ["y"], name="add")], [("x", [1, 3])], [("y", [1, 3])])
    refused(m, "node 'add' (Add)", "reads 'ghost', which nothing defines")
    m = model([node("Relu", ["x"], ["a"], name="r")], [("x", [1, 3])], [("y", [1, 3])])
    refused(m, "graph output 'y'", "nothing produces it")


def test_cycle_is_named():
    m = model([node("Add", ["x", "b"], ["a"], name="A"), node("Relu", ["a"], ["b"], name="B"),
               node("Relu", ["a"], ["y"], name="out")], [("x", [1, 3])], [("y", [1, 3])])
    refused(m, "cycle", "node 'A' (Add) -> node 'B' (Relu) -> node 'A' (Add)")


def test_self_loop():
    m = model([node("Add", ["x", "a"], ["a"], name="A"), node("Relu", ["a"], ["y"], name="out")],
              [("x", [1, 3])], [("y", [1, 3])])
    refused(m, "cycle", "node 'A' (Add) -> node 'A' (Add)")


def test_unsorted_graph_is_sorted_with_the_same_shapes():
    # A small conv net; the file lists its nodes in reverse (onnxruntime runs it as is).
    nodes = [node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             node("Relu", ["c"], ["r"], name="relu"),
             node("Reshape", ["r", "shape"], ["f"], name="flat"),
             node("Gemm", ["f", "Wf"], ["y"], name="fc", transB=1)]
    inits = [weight("W", 4, 3, 3, 3), shape_const("shape", [1, -1]), weight("Wf", 10, 256)]
    ordered = model(nodes, [("x", [1, 3, 8, 8])], [("y", [1, 10])], inits=inits)
    shuffled = model(nodes[::-1], [("x", [1, 3, 8, 8])], [("y", [1, 10])], inits=inits)
    before = shuffled.SerializeToString()
    a, b = analyze(ordered), analyze(shuffled)
    assert shuffled.SerializeToString() == before  # the caller's proto is never modified
    assert [(n.name, n.output_shapes) for n in a.nodes] == \
        [(n.name, n.output_shapes) for n in b.nodes]
    # exact: conv 1×4×8×8 (pads 1), gemm 1×10 — no unknown shape anywhere
    assert [n.output_shapes for n in b.nodes] == [("1×4×8×8",), ("1×4×8×8",), ("1×256",), ("1×10",)]
    assert a.totals == b.totals and b.coverage.unknown_shape == {}


def test_sorted_file_is_returned_as_is():
    m = relu_chain()
    assert validate_model(m) is m


def test_attribute_of_the_wrong_type():
    m = model([helper.make_node("Conv", ["x", "W"], ["y"], name="conv", kernel_shape="33")],
              [("x", [1, 3, 8, 8])], [("y", [1, 4, 6, 6])], inits=[weight("W", 4, 3, 3, 3)])
    refused(m, "node 'conv' (Conv)", "attribute 'kernel_shape' is STRING", "schema says INTS")
    m = model([helper.make_node("Conv", ["x", "W"], ["y"], name="conv", group=1.0)],
              [("x", [1, 3, 8, 8])], [("y", [1, 4, 6, 6])], inits=[weight("W", 4, 3, 3, 3)])
    refused(m, "attribute 'group' is FLOAT")


def test_unknown_and_missing_attributes_and_counts():
    refused(model([node("Relu", ["x"], ["y"], name="r", alpha=1.0)], [("x", [1])], [("y", [1])]),
            "node 'r' (Relu)", "attribute 'alpha' is not in the Relu schema")
    refused(model([node("Cast", ["x"], ["y"], name="c")], [("x", [1])], [("y", [1])]),
            "node 'c' (Cast)", "required attribute 'to' is missing")
    refused(model([node("Relu", ["x", "x"], ["y"], name="r")], [("x", [1])], [("y", [1])]),
            "node 'r' (Relu)", "2 inputs", "takes 1")


def test_custom_domain_is_left_alone():
    m = model([helper.make_node("Frob", ["x"], ["y"], name="f", domain="com.example",
                                anything="goes")], [("x", [1, 3])], [("y", [1, 3])])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    assert analyze(m).coverage.unsupported == {"com.example::Frob": 1}
    del m.opset_import[1:]
    refused(m, "node 'f' (Frob)", "domain 'com.example' is not in the model's opset_import")


@pytest.mark.parametrize("version", [0, -1, 99])
def test_opset_out_of_range(version):
    m = relu_chain()
    m.opset_import[0].version = version
    refused(m, f"opset {version} of domain 'ai.onnx' is outside the range")


def test_negative_and_overflowing_dims():
    refused(model([node("Relu", ["x"], ["y"])], [("x", [1, -3])], [("y", [1, 3])]),
            "graph input 'x'", "negative dim -3")
    refused(model([node("Relu", ["x"], ["y"])], [("x", [2 ** 62, 4])], [("y", [1, 3])]),
            "graph input 'x'", "overflows int64")
    w = numpy_helper.from_array(np.zeros(3, np.float32), "W")
    w.dims[0] = -3
    m = model([node("Add", ["x", "W"], ["y"], name="add")], [("x", [3])], [("y", [3])])
    m.graph.initializer.append(w)
    refused(m, "initializer 'W'", "negative dim -3")


def test_unknown_element_type():
    m = relu_chain()
    m.graph.input[0].type.tensor_type.elem_type = 999
    refused(m, "graph input 'x'", "unknown element type 999")
    m = model([node("Add", ["x", "W"], ["y"], name="add")], [("x", [3])], [("y", [3])],
              inits=[weight("W", 3)])
    m.graph.initializer[0].data_type = 999
    refused(m, "initializer 'W'", "unknown element type 999")


def test_initializer_size_must_match_dims():
    m = model([node("Reshape", ["x", "shape"], ["y"], name="r")], [("x", [2, 3])], [("y", [6])],
              inits=[shape_const("shape", [6])])
    m.graph.initializer[0].raw_data = b"\0" * 12  # an int64 holds 8 bytes
    refused(m, "initializer 'shape'", "raw_data holds 12 bytes, its dims say 8")
    m = model([node("Add", ["x", "W"], ["y"], name="add")], [("x", [3])], [("y", [3])])
    w = m.graph.initializer.add(name="W", data_type=TensorProto.FLOAT, dims=[3])
    w.float_data.extend([1.0, 2.0])
    refused(m, "initializer 'W'", "holds 2 values, its dims say 3")


def test_external_initializer_is_checked_without_being_read(tmp_path):
    m = model([node("Add", ["x", "W"], ["y"], name="add")], [("x", [3])], [("y", [3])])
    t = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[3])
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "weights.bin"), ("offset", "0"), ("length", "8")):
        t.external_data.add(key=k, value=v)
    m.graph.initializer.append(t)
    refused(m, "initializer 'W'", "external data length 8 does not match its dims (12 bytes)")
    t = m.graph.initializer[0]
    t.external_data[2].value = "12"
    assert analyze(m).totals.params == 3  # weights.bin does not exist: never opened


def test_non_utf8_names():
    m = relu_chain()
    data = m.SerializeToString().replace(b"\x05first", b"\x05fi\xffst")
    bad = onnx.load_from_string(data)
    refused(bad, "node #0", "not valid UTF-8")


def test_strict_shape_inference_refuses_type_errors():
    # Add has no string kernel: onnx.checker and onnxruntime refuse the file
    g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"], name="add")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    refused(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
            "invalid graph: ONNX shape inference", "tensor(string)")


def test_declared_output_shape_contradicted_by_the_binding_is_no_error():
    # exported at batch 2 with a fixed output shape; --batch 4 contradicts it (onnxruntime
    # warns). The declared shape is kept, as it always was (tests/test_verify.py relies on it).
    m = model([node("Relu", ["x"], ["y"])], [("x", ["batch", 3])], [("y", [2, 3])])
    assert analyze(m, batch=4).nodes[0].output_shapes == ("2×3",)


def test_negative_inferred_dim_is_refused():
    # Resize with a NaN scale: ONNX inference computes the dim as (int)NaN = -9.2e18
    m = model([node("Resize", ["x", "", "scales"], ["y"], name="resize")],
              [("x", [1, 1, 4, 4])], [("y", [1, 1, 8, 8])],
              inits=[("scales", np.array([1, 1, math.nan, 2], np.float32))])
    refused(m, "invalid graph", "node 'resize' (Resize)", "negative dim")


def _scan(n_scan, axes=None):
    """One state (s) and one scanned input (xs, 5×2): the body adds each row to the state."""
    body = helper.make_graph(
        [node("Add", ["s_in", "x_t"], ["s_out"], name="add"),
         node("Identity", ["s_out"], ["y_t"], name="id")], "body",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("s_in", "x_t")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("s_out", "y_t")])
    kw = {"scan_input_axes": axes} if axes is not None else {}
    scan = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], name="scan", body=body,
                            num_scan_inputs=n_scan, **kw)
    return model([scan], [("s0", [2]), ("xs", [5, 2])], [("s", [2]), ("ys", [5, 2])])


@pytest.mark.parametrize("n_scan", [0, 5, -3])
def test_scan_num_scan_inputs_out_of_range(n_scan):
    refused(_scan(n_scan), "node 'scan' (Scan)", f"num_scan_inputs={n_scan}")


def test_scan_axes():
    refused(_scan(1, axes=[0, 1]), "node 'scan' (Scan)", "scan_input_axes has 2 entries")
    refused(_scan(1, axes=[7]), "scan", "scan_input_axes", "7", "rank 2")
    ok = analyze(_scan(1, axes=[-2]))  # axis -2 of 5×2: 5 iterations
    assert [n.repeat for n in ok.nodes if n.op == "Add"] == [5]


def _loop(trip):
    body = helper.make_graph(
        [node("Identity", ["c_in"], ["c_out"], name="cond"),
         node("Add", ["v_in", "one"], ["v_out"], name="inc")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2])])
    loop = helper.make_node("Loop", ["M", "", "v0"], ["v"], name="loop", body=body)
    return model([loop], [("v0", [2])], [("v", [2])],
                 inits=[("M", trip), ("one", np.ones(2, np.float32))])


@pytest.mark.parametrize("trip", [np.array(math.nan, np.float32), np.array(math.inf),
                                  np.zeros((0,), np.int64)], ids=["nan", "inf", "empty"])
def test_loop_trip_count_must_be_one_integer(trip):
    refused(_loop(trip), "invalid graph", "loop")


def test_loop_body_counts():
    m = _loop(np.array(3, np.int64))
    assert [n.repeat for n in analyze(m).nodes if n.op == "Add"] == [3]
    m.graph.node[0].attribute[0].g.output.pop()
    refused(m, "node 'loop' (Loop)", "the body gives 1 outputs")


def test_subgraph_redefining_an_outer_name():
    m = _loop(np.array(3, np.int64))
    m.graph.node[0].attribute[0].g.node[1].output[0] = "v0"
    refused(m, "writes 'v0'", "enclosing graph")


def test_cli_exit_2_one_line(tmp_path, capsys):
    m = model([node("Relu", ["x"], ["y"], name="r1"), node("Relu", ["x"], ["y"], name="r2")],
              [("x", [1, 3])], [("y", [1, 3])])
    p = tmp_path / "ssa.onnx"
    onnx.save(m, p)
    assert main([str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ssa.onnx: invalid graph: node 'r2' (Relu)" in err
    assert main([str(p), "--strict"]) == 2


# ---- what onnx.checker (full_check) and onnxruntime both refuse, judged by them ------------

def _verdicts(m, tmp_path) -> tuple[bool, bool]:
    """(onnx.checker full_check refuses, onnxruntime refuses) — the independent judges."""
    import onnxruntime as ort
    path = tmp_path / "judged.onnx"
    onnx.save(m, path)
    try:
        onnx.checker.check_model(m, full_check=True)
        checker = False
    except Exception:
        checker = True
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        runtime = False
    except Exception:
        runtime = True
    return checker, runtime


@pytest.mark.parametrize("build, needle", [
    (lambda: hf.fused_conv_inputs(1), "1 inputs, the FusedConv schema takes 2..4"),
    (lambda: hf.fused_conv_inputs(5), "5 inputs, the FusedConv schema takes 2..4"),
    (lambda: hf.op_before_its_opset("Gelu", 1),
     "no operator 'Gelu' in domain 'ai.onnx' at opset 1 (onnx has it from opset 20)"),
    (lambda: hf.sparse_initializer("S", 500),  # a 4×4 tensor: flat positions 0..15
     "sparse initializer 'S': index 500 is out of bounds [0, 16)"),
    (lambda: hf.sparse_initializer(""), "sparse initializer '': it has no name"),
    (hf.lying_value_info, "value_info declares 'r' of node 'relu' (Relu) int64, inference "
                          "gives float")])
def test_refused_as_the_checker_or_onnxruntime_refuses(build, needle, tmp_path):
    m = build()
    assert _verdicts(m, tmp_path) != (False, False)  # at least one judge refuses it
    refused(m, needle)


def test_accepted_where_onnxruntime_runs_it(tmp_path):
    # onnxruntime registers its own LayerNormalization:1 in the ai.onnx domain (onnx's
    # arrived in opset 17): it runs at opset 16, so graphcost analyzes it
    m = hf.op_before_its_opset("LayerNormalization", 16)
    m.graph.node[0].input.extend(["scale"])
    m.graph.initializer.append(numpy_helper.from_array(np.ones(8, np.float32), "scale"))
    assert _verdicts(m, tmp_path)[1] is False
    assert analyze(m).coverage.nodes == 1
    # a value_info whose shape (not dtype) contradicts inference: onnxruntime runs it, and
    # graphcost's shapes come from inference (the Relu's output: 2×8 floats = 64 bytes)
    m = hf.lying_value_info()
    m.graph.value_info[0].CopyFrom(helper.make_tensor_value_info("r", TensorProto.FLOAT, [3, 7]))
    assert _verdicts(m, tmp_path) == (True, False)
    relu = next(n for n in analyze(m).nodes if n.name == "relu")
    assert relu.output_bytes == 64
