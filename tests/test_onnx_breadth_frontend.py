"""ONNX frontend behaviour added by issue #9: bounds for data-dependent sizes in every format,
sequence and optional inputs, IR < 4 files, com.microsoft shapes checked against onnxruntime,
unknown domains reported with their domain."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from graphcost.analyzer.app.api import analyze
from graphcost.analyzer.app.request import LoadOptions
from graphcost.analyzer.load.loading import load_graph
from graphcost.analyzer.measure.verify import verify
from graphcost.analyzer.render.files import render_csv, render_markdown
from graphcost.analyzer.render.html import html_report
from graphcost.analyzer.render.summary import summary_lines
from onnx import TensorProto, helper, numpy_helper

F32, I64, I32, U8 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.UINT8
vi = helper.make_tensor_value_info
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def _model(nodes, inputs, outputs, inits=(), opset=17, extra=()):
    g = helper.make_graph(nodes, "t", inputs, outputs,
                          [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), *extra])


# -- bounds ------------------------------------------------------------------------------------

def _nonzero_model():
    # x (2,3) → NonZero → Transpose → y; no output shape declared, so ONNX leaves NonZero's
    # count symbolic and the rule bounds it: every element non-zero → (rank 2, 6) int64.
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["y"])]
    return _model(nodes, [vi("x", F32, (2, 3))], [vi("y", I64, None)])


def test_nonzero_is_costed_at_its_bound_and_downstream_follows():
    r = analyze(_nonzero_model())
    nz, tr = r.nodes
    assert (nz.status, nz.output_shapes) == ("ok", ("2×6",))
    # NonZero: one compare per input element (6); read 24; written 2·6·8 = 96
    assert (nz.flops, nz.bytes_read, nz.bytes_written) == (6, 24, 96)
    assert "every element non-zero" in nz.bound
    # the Transpose's size follows from the bound: (6, 2), read 96, written 96
    assert (tr.status, tr.output_shapes, tr.bytes_written) == ("ok", ("6×2",), 96)
    assert "NonZero" in tr.bound
    assert r.coverage.bounded == {"NonZero": 1, "Transpose": 1}


def test_bound_is_marked_in_every_format():
    r = analyze(_nonzero_model())
    nodes = json.loads(r.to_json())["nodes"]
    assert all(n["bound"] for n in nodes)
    assert json.loads(r.to_json())["coverage"]["bounded"] == {"NonZero": 1, "Transpose": 1}
    rows = list(csv.DictReader(io.StringIO(render_csv(r))))
    assert all(row["upper_bound"] for row in rows)
    assert render_markdown(r).count("(upper bound)") == 2
    assert any(line.startswith("bound       2 node(s) costed at an upper bound")
               for line in summary_lines(r))
    assert html_report(r).count("(upper bound)") >= 2


def test_an_exact_size_is_not_a_bound():
    # TopK with a constant k: ONNX infers the size, nothing is bounded
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"])]
    m = _model(nodes, [vi("x", F32, (3, 4))], [vi("v", F32, None), vi("i", I64, None)],
               inits=[("k", np.array([2], np.int64))])
    r = analyze(m)
    assert r.nodes[0].output_shapes == ("3×2", "3×2") and not r.nodes[0].bound
    assert r.coverage.bounded == {}


def test_topk_with_a_tensor_k_is_bounded_by_the_axis():
    # k from a graph input: values and indices at most (3, 4)
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"])]
    m = _model(nodes, [vi("x", F32, (3, 4)), vi("k", I64, (1,))],
               [vi("v", F32, None), vi("i", I64, None)])
    n = analyze(m).nodes[0]
    assert n.output_shapes == ("3×4", "3×4") and "k (a tensor" in n.bound


def test_non_max_suppression_bound():
    # boxes (2, 5, 4), scores (2, 3, 5), at most 4 per class:
    #   2 batches · 3 classes · min(4, 5) = 24 rows of (batch, class, box)
    nodes = [helper.make_node("NonMaxSuppression", ["b", "s", "m"], ["sel"])]
    m = _model(nodes, [vi("b", F32, (2, 5, 4)), vi("s", F32, (2, 3, 5))], [vi("sel", I64, None)],
               inits=[("m", np.array([4], np.int64))])
    n = analyze(m).nodes[0]
    assert n.output_shapes == ("24×3",)
    assert n.bytes_written == 24 * 3 * 8
    # FLOPs: 2·3·(5 + 5·⌈log2 5⌉ + 13·10) + 2·5·3 = 6·(5 + 15 + 130) + 30 = 930
    assert n.flops == 930
    assert n.bound


# -- sequences and optionals -------------------------------------------------------------------

def test_sequence_and_optional_inputs_are_values():
    # a sequence input (a 0-byte handle in the IR) and an optional tensor input (its element)
    seq = helper.make_value_info("seq", helper.make_sequence_type_proto(
        helper.make_tensor_type_proto(F32, (2, 3))))
    opt = helper.make_value_info("opt", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(F32, ("batch", 4))))
    nodes = [helper.make_node("SequenceLength", ["seq"], ["n"]),
             helper.make_node("OptionalGetElement", ["opt"], ["o"]),
             helper.make_node("Relu", ["o"], ["y"])]
    m = _model(nodes, [seq, opt], [vi("n", I64, None), vi("y", F32, None)], opset=18)
    g = load_graph(m, LoadOptions(batch=2))
    assert g.spec("seq").dtype == "sequence" and g.spec("seq").nbytes == 0
    assert g.spec("opt").shape == (2, 4)
    r = analyze(m, batch=2)
    assert r.coverage.percent == 100.0
    # SequenceLength reads nothing, writes an int64 scalar; Relu (2,4): 8 FLOPs
    assert (r.nodes[0].bytes_read, r.nodes[0].bytes_written) == (0, 8)
    assert r.nodes[2].flops == 8


# -- IR < 4 ------------------------------------------------------------------------------------

def test_ir3_initializers_give_their_shapes():
    # IR 3: every initializer is also a graph input. Unsqueeze(axes=[0]) of a 64-element weight
    # → (1, 64), times x (4, 64) → (4, 64): the shapes onnx.shape_inference gives the file.
    nodes = [helper.make_node("Unsqueeze", ["w"], ["u"], axes=[0]),
             helper.make_node("Mul", ["x", "u"], ["y"])]
    m = _model(nodes, [vi("x", F32, (4, 64)), vi("w", F32, (64,))], [vi("y", F32, None)],
               inits=[("w", np.ones(64, np.float32))], opset=9)
    m.ir_version = 3
    inferred = onnx.shape_inference.infer_shapes(m)
    want = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
            for v in [*inferred.graph.value_info, *inferred.graph.output]}
    assert want == {"u": (1, 64), "y": (4, 64)}
    r = analyze(m)
    assert r.coverage.percent == 100.0
    assert [n.output_shapes for n in r.nodes] == [("1×64",), ("4×64",)]
    assert r.nodes[1].flops == 4 * 64


@pytest.mark.parametrize("name", ["light_densenet121", "light_inception_v2"])
def test_onnx_light_models_fully_costed(name):
    # onnx's own IR 3 test models (61.9% and 60% costed before IR 3 files kept their shapes)
    path = LIGHT / f"{name}.onnx"
    assert onnx.load(str(path)).ir_version == 3
    assert analyze(str(path)).coverage.percent == 100.0


# -- com.microsoft shapes against onnxruntime -----------------------------------------------------

MS = helper.make_opsetid("com.microsoft", 1)


def _ms(op, inputs, outputs, inits=(), **attrs):
    node = helper.make_node(op, [n for n, *_ in inputs] + [n for n, _ in inits],
                            [n for n, _ in outputs], domain="com.microsoft", **attrs)
    return _model([node], [vi(n, t, s) for n, t, s in inputs],
                  [vi(n, t, None) for n, t in outputs], inits, extra=[MS])


CONTRIB_SHAPES = {
    "GroupQueryAttention": _ms(
        # 4 heads of 8 on 2 KV heads, 4 cached + 4 new tokens: present (1, 2, 8, 8)
        "GroupQueryAttention", [("q", F32, (1, 4, 32)), ("k", F32, (1, 4, 16)),
                                ("v", F32, (1, 4, 16))],
        [("y", F32), ("pk", F32), ("pv", F32)],
        [("past_k", np.zeros((1, 2, 4, 8), np.float32)),
         ("past_v", np.zeros((1, 2, 4, 8), np.float32)),
         ("seqlens", np.array([7], np.int32)), ("total", np.array(8, np.int32))],
        num_heads=4, kv_num_heads=2),
    "MultiHeadAttention": _ms(
        "MultiHeadAttention", [("q", F32, (1, 4, 8)), ("k", F32, (1, 6, 8)),
                               ("v", F32, (1, 6, 8))], [("y", F32)], num_heads=2),
    "RotaryEmbedding": _ms(
        "RotaryEmbedding", [("x", F32, (1, 4, 16)), ("pos", I64, (1, 4))], [("y", F32)],
        [("cos", np.ones((8, 4), np.float32)), ("sin", np.ones((8, 4), np.float32))],
        num_heads=2),
    "MatMulNBits": _ms(
        "MatMulNBits", [("a", F32, (2, 64))], [("y", F32)],
        [("b", np.zeros((3, 2, 16), np.uint8)), ("sc", np.ones(6, np.float32))],
        K=64, N=3, bits=4, block_size=32),
    "SkipLayerNormalization": _ms(
        "SkipLayerNormalization", [("x", F32, (2, 3, 8)), ("s", F32, (2, 3, 8))],
        [("y", F32), ("mean", F32), ("inv", F32), ("sum", F32)],
        [("g", np.ones(8, np.float32)), ("b", np.zeros(8, np.float32))]),
    "QLinearConcat": _ms(
        "QLinearConcat", [("ys", F32, ()), ("yz", U8, ()), ("a", U8, (2, 3)), ("as", F32, ()),
                          ("az", U8, ()), ("b", U8, (2, 1)), ("bs", F32, ()), ("bz", U8, ())],
        [("y", U8)], axis=1),
}


@pytest.mark.parametrize("op", sorted(CONTRIB_SHAPES))
def test_contrib_shapes_match_onnxruntime(op):
    v = verify(CONTRIB_SHAPES[op], repeat=1)
    assert v.shapes_mismatched == 0 and v.shapes_unknown == 0, (v.mismatches, v.unknown)
    assert v.shapes_matched >= 1


def test_unknown_op_of_a_known_domain_is_reported_with_its_domain():
    m = _ms("NotAnOnnxruntimeOp", [("x", F32, (2, 2))], [("y", F32)])
    r = analyze(m)
    assert r.coverage.unsupported == {"com.microsoft::NotAnOnnxruntimeOp": 1}
    assert r.nodes[0].status == "unsupported"
