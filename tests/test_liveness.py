"""Liveness, aliasing and arena planning on hand-built graphs with hand-computed peaks."""
from __future__ import annotations

import pytest
from graphcost.analyzer.frontends.onnx.frontend import lower_onnx
from graphcost.passes.memory.arena import plan_arena
from graphcost.passes.memory.liveness import Storage, analyze_liveness

from graphcost import analyze
from tests.onnx_builders import model, node, shape_const

# All tensors float32 with 1×256 = 256 elements = 1,024 B unless said otherwise.
E = 1024


def chain():
    # x -> Relu a -> Relu b -> Relu c (output)
    return model([node("Relu", ["x"], ["a"]), node("Relu", ["a"], ["b"]),
                  node("Relu", ["b"], ["c"])], [("x", [1, 256])], [("c", [1, 256])])


def test_chain_peak_is_two_tensors():
    # node0: x, a live (2 KiB); node1: a, b; node2: b, c → peak 2,048 B at node 0;
    # naive sum = x + a + b + c = 4,096 B.
    r = analyze(chain())
    assert r.memory.naive_sum_bytes == 4 * E
    assert r.memory.peak_bytes == 2 * E
    assert r.memory.timeline == (2 * E, 2 * E, 2 * E)
    assert r.memory.peak_node == "a"
    assert r.memory.arena_bytes == 2 * E  # two buffers ping-pong


def test_inputs_can_be_excluded():
    # without x: node0 holds a (1 KiB); node1 a+b; node2 b+c → peak 2,048 B, naive 3,072 B.
    r = analyze(chain(), include_inputs=False)
    assert r.memory.naive_sum_bytes == 3 * E
    assert r.memory.timeline == (E, 2 * E, 2 * E)


def test_skip_connection_keeps_tensor_alive():
    # a = Relu(x); b = Relu(a); c = Relu(b); d = Add(a, c): a lives nodes 0..3.
    # node2: a, b, c live → 3 KiB; node3: a, c, d → 3 KiB; x dies at node 0.
    m = model([node("Relu", ["x"], ["a"]), node("Relu", ["a"], ["b"]),
               node("Relu", ["b"], ["c"]), node("Add", ["a", "c"], ["d"])],
              [("x", [1, 256])], [("d", [1, 256])])
    r = analyze(m)
    assert r.memory.timeline == (2 * E, 2 * E, 3 * E, 3 * E)
    assert r.memory.peak_bytes == 3 * E
    assert r.memory.peak_node == "c"
    assert [t.name for t in r.memory.live_at_peak] == ["a", "b", "c"]
    assert r.memory.arena_bytes == 3 * E


def test_view_aliases_input_storage():
    # a = Relu(x) [1×256]; v = Reshape(a) → view of a (no allocation); b = Relu(v).
    # Storages: x, a(+v), b. node0: x,a = 2 KiB; node1 (Reshape): a = 1 KiB;
    # node2: a(v), b = 2 KiB. naive = 3 KiB (the view adds nothing).
    m = model([node("Relu", ["x"], ["a"]), node("Reshape", ["a", "s"], ["v"]),
               node("Relu", ["v"], ["b"])],
              [("x", [1, 256])], [("b", [16, 16])], inits=[shape_const("s", [16, 16])])
    r = analyze(m)
    assert r.memory.naive_sum_bytes == 3 * E
    assert r.memory.timeline == (2 * E, E, 2 * E)
    assert r.nodes[1].bytes_read == 0 and r.nodes[1].bytes_written == 0


def test_view_used_later_extends_base_lifetime():
    # v = Reshape(a) is consumed at the last node, so a's storage lives to the end.
    # nodes: a=Relu(x); v=Reshape(a); b=Relu(x... no: b = Relu(a); c = Add(b, v)
    # node0: x,a; node1: a; node2: a,b; node3: a,b,c → peak 3 KiB at node 3.
    m = model([node("Relu", ["x"], ["a"]), node("Reshape", ["a", "s"], ["v"]),
               node("Relu", ["a"], ["b"]), node("Add", ["b", "v"], ["c"])],
              [("x", [1, 256])], [("c", [1, 256])], inits=[shape_const("s", [1, 256])])
    r = analyze(m)
    assert r.memory.timeline == (2 * E, E, 2 * E, 3 * E)


def test_graph_outputs_live_to_the_end():
    # a is a graph output and is not consumed later: it stays live through node 2.
    m = model([node("Relu", ["x"], ["a"]), node("Relu", ["x"], ["b"]),
               node("Relu", ["b"], ["c"])],
              [("x", [1, 256])], [("a", [1, 256]), ("c", [1, 256])])
    r = analyze(m)
    # node0: x,a; node1: x,a,b; node2: a,b,c
    assert r.memory.timeline == (2 * E, 3 * E, 3 * E)


def test_inplace_what_if_reuses_dying_input():
    # With in-place activations the Relus write into their input: one storage x serves all.
    r = analyze(chain(), inplace=True)
    assert r.memory.naive_sum_bytes == E
    assert r.memory.peak_bytes == E


def test_weights_are_not_activations():
    # y = MatMul(x[1×256], W[256×256]): W (256 KiB) is a parameter, not activation memory.
    import numpy as np
    m = model([node("MatMul", ["x", "W"], ["y"])], [("x", [1, 256])], [("y", [1, 256])],
              inits=[("W", np.zeros((256, 256), np.float32))])
    r = analyze(m)
    assert r.totals.params == 65_536
    assert r.memory.peak_bytes == 2 * E


# --- arena on storages given directly (alignment 1 so sizes stay hand-checkable) ---

def test_arena_reuses_gaps():
    # A [0..1] 100 B, B [1..2] 50 B, C [2..3] 100 B: A and C never overlap, so C takes A's
    # offset 0 and B sits at 100 → arena 150 = peak (A+B at t1, B+C at t2 = 150).
    plan = plan_arena((Storage("A", 100, 0, 1), Storage("B", 50, 1, 2),
                       Storage("C", 100, 2, 3)), alignment=1)
    assert plan.arena_bytes == 150
    assert plan.offsets == (0, 100, 0)


def test_arena_fragmentation_case():
    # Greedy by size is not always optimal: A 60 [0..1], B 40 [1..2], C 50 [2..3], D 50 [0..0]
    # sorted: A(60)@0, C(50): overlaps B? not placed yet → @0; D(50) overlaps A → @60;
    # B(40) overlaps A[0,60) and C[0,50) → @60. arena 110; peak = max(110, 100, 90) = 110.
    plan = plan_arena((Storage("A", 60, 0, 1), Storage("B", 40, 1, 2),
                       Storage("C", 50, 2, 3), Storage("D", 50, 0, 0)), alignment=1)
    assert plan.offsets == (0, 60, 0, 60)
    assert plan.arena_bytes == 110


def test_arena_never_below_peak_on_zoo_like_chain():
    # 5 tensors of 1 KiB each living two steps in a chain: peak 2 KiB, arena 2 KiB.
    st = tuple(Storage(f"t{i}", E, i, i + 1) for i in range(5))
    assert plan_arena(st, alignment=1).arena_bytes == 2 * E


def test_liveness_does_not_mutate_graph():
    g = lower_onnx(chain())
    before = (g.nodes, dict(g.values))
    analyze_liveness(g)
    assert (g.nodes, dict(g.values)) == before
    with pytest.raises(TypeError):
        g.values["x"] = None  # read-only mapping


def _mul_backward(marks):
    """a = relu(x), b = relu(x), g = relu(a) (standing in for an incoming gradient), then a
    MulBackward-like call: ga = g·b, gb = g·a, both gradients (graph outputs); ``marks`` the
    ``Node.autograd`` of the last two nodes. Every tensor 1 KiB."""
    from graphcost.passes.ir import Graph, Node, TensorSpec, Value, ValueKind
    spec = TensorSpec((1, 256), "float32")
    steps = [("aten.relu.default", ("x",), "a"), ("aten.relu.default", ("x",), "b"),
             ("aten.relu.default", ("a",), "g"), ("aten.mul.Tensor", ("g", "b"), "ga"),
             ("aten.mul.Tensor", ("g", "a"), "gb")]
    nodes = tuple(Node(i, out, op, ins, (out,), {}, autograd=(None, None, None, *marks)[i])
                  for i, (op, ins, out) in enumerate(steps))
    values = {"x": Value("x", spec, ValueKind.INPUT)}
    values |= {out: Value(out, spec, ValueKind.ACTIVATION, i)
               for i, (_, _, out) in enumerate(steps)}
    return Graph("mul_backward", "fx", nodes, values, ("x",), ("ga", "gb"))


def test_an_autograd_call_making_two_gradients_holds_its_inputs_until_it_returns():
    # One autograd call (both nodes marked 7) makes ga, then gb: eager autograd holds what
    # the call was given (g, a and b) until it returns, so b — last read by ga's node — stays
    # through gb's: node 4 holds a, b, g, ga, gb = 5 KiB. Two calls (marks 7 and 8) free b
    # after ga's node: a, g, ga, gb = 4 KiB there.
    held = analyze_liveness(_mul_backward((7, 7)), include_inputs=False)
    apart = analyze_liveness(_mul_backward((7, 8)), include_inputs=False)
    assert held.timeline == (E, 2 * E, 3 * E, 4 * E, 5 * E)
    assert apart.timeline == (E, 2 * E, 3 * E, 4 * E, 4 * E)
    assert held.peak_bytes == 5 * E and apart.peak_bytes == 4 * E


def test_an_input_left_out_is_held_once_for_all_its_views():
    # x (1 KiB) left out of the count (include_inputs=False), read through two views by two
    # relus: the views hold x's storage, counted once while a view is held, as MemTracker
    # counts it (tests/test_training.py measures it): 1 KiB, + a, + b = 3 KiB at node 3.
    # Each view counted as its own 1 KiB, node 1 held 2 KiB.
    from graphcost.passes.ir import Graph, Node, TensorSpec, Value, ValueKind
    spec = TensorSpec((1, 256), "float32")
    steps = [("aten.view.default", ("x",), "v"), ("aten.view.default", ("x",), "w"),
             ("aten.relu.default", ("v",), "a"), ("aten.relu.default", ("w",), "b")]
    nodes = tuple(Node(i, out, op, ins, (out,), {}) for i, (op, ins, out) in enumerate(steps))
    values = {"x": Value("x", spec, ValueKind.INPUT)}
    values |= {out: Value(out, spec, ValueKind.ACTIVATION, i)
               for i, (_, _, out) in enumerate(steps)}
    g = Graph("views", "fx", nodes, values, ("x",), ("a", "b"))
    assert analyze_liveness(g, include_inputs=False).timeline == (E, E, 2 * E, 3 * E)
    assert analyze_liveness(g).timeline == (E, E, 2 * E, 3 * E)  # (x counted from the start)
    # read directly after its views are gone, x is not held for it: 1 KiB less at node 4
    late = Graph("views", "fx", (*nodes, Node(4, "c", "aten.relu.default", ("x",), ("c",), {})),
                 {**values, "c": Value("c", spec, ValueKind.ACTIVATION, 4)}, ("x",),
                 ("a", "b", "c"))
    assert analyze_liveness(late, include_inputs=False).timeline == (E, E, 2 * E, 3 * E, 3 * E)


def test_a_cache_tensor_updated_in_place_is_taken_out_of_the_working_peak_once():
    # a serving step's working peak is its liveness less the cache live at each point; a
    # recurrent state updated in place is a cache input and a cache output on one storage
    # (here v, a view of x). x (1 KiB) lives to the end (v is an output); a = Relu(x),
    # b = Relu(a): x, a and b live at node 2 (3 KiB), of which 1 KiB is the cache: 2 KiB of
    # work. Subtracting x and v each (before) left 1 KiB, and a recurrent model's decode
    # step, whose every state is so, read 0 B.
    from graphcost.passes.serving.working_memory import working_peak
    m = model([node("Reshape", ["x", "s"], ["v"]), node("Relu", ["x"], ["a"]),
               node("Relu", ["a"], ["b"])],
              [("x", [1, 256])], [("v", [16, 16]), ("b", [1, 256])],
              inits=[shape_const("s", [16, 16])])
    g = lower_onnx(m)
    assert working_peak(g, {"x", "v"}) == 2 * E


def test_a_fused_projections_cache_views_leave_its_query_third_as_work():
    # the zoo's GPT-2 (d 128, 2 layers, vocab 1,000) prefilling 64 tokens: each layer's key
    # and value are views of its fused c_attn output (64 × 384 fp32, 98,304 B), the cache; the
    # query third (32,768 B) stays alive with them, work. At the end the logits, 64 × 1,000 ×
    # 4 = 256,000 B, and both layers' query thirds are live: the working peak is at least
    # 321,536 B. Each view along a cache tensor's chain (split, unflatten, transpose) was
    # taken off the storage again, and the figure read 99,328.
    s = analyze("zoo:gpt2", serve={"prompt": 64, "generate": 32}).serving
    assert s is not None and s.prefill.peak_bytes >= 256_000 + 2 * 32_768
