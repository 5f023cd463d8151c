"""Local functions that grow past the node count (issue 49): a graph attribute passed down by
reference is copied into every place that refers to it, and a node's inputs are copied with it.
What inlining makes is counted before anything is expanded (analyzer/frontends/onnx/inline.py):
the hostile files are refused in one line, their small twins analyze to the right nodes."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import pytest
from graphcost.analyzer.app.api import analyze
from graphcost.analyzer.frontends.onnx import inline as onnx_inline
from graphcost.passes.errors import GraphcostError
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from tests.hostile_files import doubling_functions

ROOT = Path(__file__).resolve().parent.parent
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, functions, inputs=(("x", [1, 4]),)):
    ins = [_vi("c", [], TensorProto.BOOL) if n == "c" else _vi(n, s) for n, s in inputs]
    g = helper.make_graph(nodes, "g", ins, [_vi("y", [1, 4])])
    m = helper.make_model(g, opset_imports=OPSETS, functions=functions)
    m.ir_version = 8
    return m


def _ref(name: str, refers_to: str) -> AttributeProto:
    """A graph attribute that is the caller's attribute ``refers_to``."""
    return AttributeProto(name=name, ref_attr_name=refers_to, type=AttributeProto.GRAPH)


def _call(fn: str, ins, outs, *attrs, **literal):
    node = helper.make_node(fn, ins, outs, domain="local", **literal)
    node.attribute.extend(attrs)
    return node


def _doubling(k: int, first: onnx.NodeProto, ins, attributes=()):
    """f0 holds ``first``; f_j calls f_(j-1) twice (x -> t -> y), passing its attributes on
    by reference; the graph calls f_(k-1) once (the caller adds the call)."""
    extra = ins[:-1]  # inputs passed through as they are (the If's condition)
    fs = [helper.make_function("local", "f0", ins, ["y"], [first], OPSETS,
                               attributes=list(attributes))]
    for j in range(1, k):
        refs = [_ref(a, a) for a in attributes]
        fs.append(helper.make_function("local", f"f{j}", ins, ["y"], [
            _call(f"f{j - 1}", [*extra, "x"], ["t"], *refs),
            _call(f"f{j - 1}", [*extra, "t"], ["y"], *refs)], OPSETS, attributes=list(attributes)))
    return fs


def relu_chain(n: int) -> onnx.GraphProto:
    """A branch of n Relu nodes over the outer-scope value x."""
    nodes = [helper.make_node("Relu", ["x" if i == 0 else f"r{i - 1}"], [f"r{i}"])
             for i in range(n)]
    return helper.make_graph(nodes, "branch", [], [_vi(f"r{n - 1}", [1, 4])])


def if_by_reference(k: int, n: int):
    """Shape (a): f0 is an If whose two branches are the attribute g of its caller; f_j calls
    f_(j-1) twice passing g on; the graph calls f_(k-1) with g = n Relu nodes."""
    iff = helper.make_node("If", ["c"], ["y"])
    iff.attribute.extend([_ref("then_branch", "g"), _ref("else_branch", "g")])
    fs = _doubling(k, iff, ["c", "x"], ["g"])
    call = _call(f"f{k - 1}", ["c", "x"], ["y"], g=relu_chain(n))
    return _model([call], fs, [("c", []), ("x", [1, 4])])


def wide_sum(k: int, n: int):
    """Shape (b): f0 is one Sum of n inputs (all x) in a doubling function of k levels."""
    fs = _doubling(k, helper.make_node("Sum", ["x"] * n, ["y"]), ["x"])
    return _model([_call(f"f{k - 1}", ["x"], ["y"])], fs)


def _cli(path: Path):
    """The command on ``path`` in a child (4 GiB of address space at most): its exit code,
    stderr, seconds and peak RSS in KB."""
    # VmHWM, this process's own high-water mark: ru_maxrss keeps the forking parent's across
    # exec (Linux's signal->maxrss), and a pytest worker holds over a GB
    code = ("import sys; from graphcost.analyzer.cli.main import main; "
            "rc = main([sys.argv[1]]); "
            "print(next(line.split()[1] for line in open('/proc/self/status') "
            "if line.startswith('VmHWM:'))); sys.exit(rc)")

    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                       timeout=120, preexec_fn=limit, env={**os.environ, "PYTHONPATH": str(ROOT)})
    rss = int(p.stdout.split()[-1]) if p.stdout.split() else -1
    return p.returncode, p.stderr, time.perf_counter() - t, rss


def _refused_fast(m, match):
    t = time.perf_counter()
    with pytest.raises(GraphcostError, match=match):
        onnx_inline.check_inline_budget(m, "m")
    return time.perf_counter() - t


# ----------------------------------------------------------------------------- (a)

def test_graph_passed_by_reference_is_counted_per_copy():
    # K = 10: 2^9 = 512 copies of f0, each an If and two copies of the 1,000-node branch:
    # 512 · (1 + 2 · 1,000) = 1,024,512 nodes (the count before: 512 Ifs + the branch once)
    m = if_by_reference(10, 1000)
    assert _refused_fast(m, r"1,024,512 nodes out of the 1,020 in the file \(a call to "
                            r"'local::f9' alone expands to 1,024,512\); the budget is 32,640") < 2


def test_graph_by_reference_refused_on_the_command_line(tmp_path):
    path = tmp_path / "if_ref.onnx"
    onnx.save(if_by_reference(10, 1000), path)
    rc, err, seconds, rss = _cli(path)
    print(f"\n(a) K=10, 1,000 nodes: {seconds:.2f} s, {rss / 1024:.0f} MB")
    assert rc == 2 and err.count("\n") == 1 and "1,024,512 nodes" in err, err
    assert rss < 200 * 1024  # KB; the inliner took 6.2 GB


def test_small_graph_by_reference_is_analyzed():
    # K = 2, a 3-node branch: f1 = 2 · f0, f0 = an If + 2 · 3 Relu = 7: 14 nodes, 2 If and
    # 12 Relu; onnx.inliner itself makes as many
    m = if_by_reference(2, 3)
    assert len(list(onnx_inline._walk(onnx.inliner.inline_local_functions(m).graph.node))) == 14
    r = analyze(m)
    assert r.coverage.nodes == 14
    assert sorted(n.op for n in r.nodes).count("Relu") == 12
    assert sorted(n.op for n in r.nodes).count("If") == 2


# ----------------------------------------------------------------------------- (b)

def test_wide_nodes_are_counted_by_their_names():
    # K = 14: 2^13 = 8,192 Sums, each its name, 10,000 inputs and an output: 8,192 · 10,002 =
    # 81,936,384 names (at 32 bytes each, 2.6 GB: over 16 MiB); only 8,192 nodes
    m = wide_sum(14, 10_000)
    assert _refused_fast(m, r"8,192 nodes holding 81,936,384 names, .* the budget is "
                            r"16,777,216: max\(16,777,216, 32 per byte in the file\)") < 2


def test_wide_nodes_refused_on_the_command_line(tmp_path):
    path = tmp_path / "sum.onnx"
    onnx.save(wide_sum(14, 10_000), path)
    rc, err, seconds, rss = _cli(path)
    print(f"\n(b) K=14, 10,000 inputs: {seconds:.2f} s, {rss / 1024:.0f} MB")
    assert rc == 2 and err.count("\n") == 1 and "81,936,384 names" in err, err
    assert rss < 200 * 1024  # the inliner took 8 GB before the process died


def test_small_wide_sum_is_analyzed():
    # K = 2, 5 inputs: 2 Sums; each adds 5 tensors of 1×4: 4 additions per element, 16 FLOPs
    r = analyze(wide_sum(2, 5))
    assert [n.op for n in r.nodes] == ["Sum", "Sum"]
    assert r.totals.flops == 2 * 16


# ----------------------------------------------------------------------------- the others

def test_a_formal_input_is_as_long_as_the_name_bound_to_it():
    # f0 reads its formal x 10,000 times; the call binds a 10,240-character name to it: the
    # inliner writes that name 10,000 times, 102,400,000 bytes (over 16 MiB), in one node
    big = "v" * 10_240
    fs = [helper.make_function("local", "f0", ["x"], ["y"],
                               [helper.make_node("Sum", ["x"] * 10_000, ["y"])], OPSETS)]
    m = _model([helper.make_node("Relu", ["x"], [big]), _call("f0", [big], ["y"])], fs)
    nodes, names, nbytes = onnx_inline.inlined_size(m)
    assert (nodes, names) == (2, 3 + 10_002) and nbytes > 10_000 * 10_240
    _refused_fast(m, "2 nodes holding 10,005 names")


def test_attribute_tensors_are_counted_per_copy():
    # a Constant of 262,144 floats (1 MiB) in a doubling function of 8 levels: 128 copies,
    # 128 MiB, over 32 times the ~1 MiB file (and its 16 MiB floor); 256 nodes
    value = numpy_helper.from_array(np.zeros(1 << 18, np.float32), "v")
    first = helper.make_node("Constant", [], ["y"], value=value)
    fs = _doubling(8, first, ["x"])
    m = _model([_call("f7", ["x"], ["y"])], fs)
    assert onnx_inline.inlined_size(m)[0] == 128
    _refused_fast(m, "128 nodes holding")


@pytest.mark.parametrize("build", [
    lambda: if_by_reference(4, 5), lambda: wide_sum(5, 7), lambda: doubling_functions(8)])
def test_counts_match_what_onnx_inliner_makes(build):
    # the independent figure: onnx.inliner's own output, its nodes (subgraphs included) and
    # their names (each node's name, inputs and outputs; a subgraph's inputs and outputs)
    m = build()
    out = onnx.inliner.inline_local_functions(m)
    nodes = list(onnx_inline._walk(out.graph.node))
    names = sum(1 + len(n.input) + len(n.output) for n in nodes) + \
        sum(len(g.input) + len(g.output) + len(g.initializer)
            for n in nodes for g in onnx_inline._subgraphs(n))
    assert onnx_inline.inlined_size(m)[:2] == (len(nodes), names)


def test_an_unbound_reference_and_a_repeated_attribute_are_counted_as_onnx_binds_them():
    # onnx.inliner binds the last attribute of a name and drops a reference nothing binds:
    # the first call's If gets the 9-node branch twice (1 + 18), the second's none (1)
    iff = helper.make_node("If", ["c"], ["y"])
    iff.attribute.extend([_ref("then_branch", "g"), _ref("else_branch", "g")])
    f0 = helper.make_function("local", "f0", ["c", "x"], ["y"], [iff], OPSETS, attributes=["g"])
    first = _call("f0", ["c", "x"], ["t"], g=relu_chain(3))
    first.attribute.append(helper.make_attribute("g", relu_chain(9)))
    m = _model([first, _call("f0", ["c", "t"], ["y"])], [f0], [("c", []), ("x", [1, 4])])
    assert onnx_inline.inlined_size(m)[0] == 20
    out = onnx.inliner.inline_local_functions(m)
    assert len(list(onnx_inline._walk(out.graph.node))) == 20


def test_deep_nesting_is_refused_in_one_line():
    # 300 Ifs each in the then-branch of the one outside (built in place: helper's copies
    # stop at protobuf's depth limit, a proto made in memory does not): counting them by
    # recursion would overflow Python's stack; refused by name instead
    fs = [helper.make_function("local", "f0", ["x"], ["y"],
                               [helper.make_node("Relu", ["x"], ["y"])], OPSETS)]
    m = _model([_call("f0", ["x"], ["y"])], fs)
    g = m.graph
    for _ in range(300):
        node = g.node.add(op_type="If", input=["c"], output=["r"])
        g = node.attribute.add(name="then_branch", type=AttributeProto.GRAPH).g
    with pytest.raises(GraphcostError, match="graphs nested over 100 deep"):
        onnx_inline.check_inline_budget(m, "m")
