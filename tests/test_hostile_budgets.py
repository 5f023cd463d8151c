"""Budgets before work: tiny files whose expansion, evaluation or per-node scans would grow
faster than the file (issue 27). Each case is refused in one line before the work starts, or
analyzed in time linear in the file; the time and memory of each are measured, per case, by
tests/test_fuzz.py's hostile run."""
from __future__ import annotations

import time

import onnx
import onnx.inliner
import pytest

from graphcost.analyzer.api import analyze
from graphcost.analyzer.errors import GraphcostError
from graphcost.analyzer.frontends import onnx_inline
from tests import hostile_files as hf

# ----------------------------------------------------------------------------- inlining


def test_inlined_size_is_counted_as_onnx_inlines():
    # count(f_0) = 1, count(f_k) = 2·count(f_(k-1)): depth 11 inlines to 2^10 = 1,024 Relu
    # nodes, which onnx.inliner itself makes; the file holds 1 + 1 + 2·10 = 22 nodes
    m = hf.doubling_functions(11)
    assert len(onnx.inliner.inline_local_functions(m).graph.node) == 1024
    assert analyze(m).coverage.nodes == 1024


def test_exponential_inlining_is_refused_before_expanding():
    # depth 30: 2^29 = 536,870,912 nodes from 60 in the file (1 + 1 + 2·29), over the floor
    # of 50,000 (32 × 60 = 1,920 is below it); onnx.inliner would take minutes and gigabytes
    m = hf.doubling_functions(30)
    t = time.perf_counter()
    with pytest.raises(GraphcostError, match=r"536,870,912 nodes out of the 60 in the file "
                                             r"\(a call to 'local::f29'.*budget is 50,000"):
        analyze(m)
    assert time.perf_counter() - t < 5  # counting is linear in the file: milliseconds


def test_budget_follows_the_file(monkeypatch):
    # depth 8: 2^7 = 128 nodes from 16 written; a budget of 4 per node written (64) refuses
    # it, 8 per node (128) takes it
    m = hf.doubling_functions(8)
    monkeypatch.setattr(onnx_inline, "INLINE_FLOOR", 1)
    monkeypatch.setattr(onnx_inline, "INLINE_FACTOR", 4)
    with pytest.raises(GraphcostError, match="128 nodes out of the 16 in the file"):
        analyze(m)
    monkeypatch.setattr(onnx_inline, "INLINE_FACTOR", 8)
    assert analyze(m).coverage.nodes == 128


def test_recursive_functions_are_refused():
    # f_2 -> f_1 -> f_0 -> f_2
    with pytest.raises(GraphcostError, match="'local::f2' -> 'local::f1' -> 'local::f0' -> "
                                             "'local::f2'"):
        analyze(hf.doubling_functions(3, recursive=True))


def test_function_calls_inside_loop_bodies_are_counted():
    # the graph's Loop body calls f_19 (2^19 = 524,288 nodes): counted through the subgraph
    m = hf.doubling_functions(20)
    call = m.graph.node[0]
    body = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["c"], ["c_out"]), call], "body",
        [hf._vi("i", [], onnx.TensorProto.INT64), hf._vi("c", [], onnx.TensorProto.BOOL)],
        [hf._vi("c_out", [], onnx.TensorProto.BOOL), hf._vi("y", [1, 4])])
    del m.graph.node[:]
    m.graph.node.append(onnx.helper.make_node("Loop", ["", ""], ["ys"], body=body))
    with pytest.raises(GraphcostError, match="524,2.. nodes"):
        analyze(m)
