"""The ONNX training ESTIMATE (passes/training/backward_estimate.py): hand-computed on a tiny graph,
labelled, pure, reachable from the command line, and bounded against the exact FX figure."""
from __future__ import annotations

import json

import onnx
import pytest
from graphcost.analyzer.app.request import LoadOptions
from graphcost.analyzer.frontends.onnx.frontend import lower_onnx
from graphcost.analyzer.load.loading import load_graph
from graphcost.passes.training.backward_estimate import ESTIMATE_WARNING, estimate_joint
from graphcost.passes.training.memory import training_memory

from graphcost import analyze, models_zoo
from tests.cli_runner import run_cli
from tests.onnx_builders import model, node, weight


def mlp() -> onnx.ModelProto:
    # x[2,4] → MatMul(W1[4,8]) → h[2,8] → Relu → r[2,8] → MatMul(W2[8,3]) → y[2,3]
    return model([node("MatMul", ["x", "W1"], ["h"], name="mm1"),
                  node("Relu", ["h"], ["r"], name="relu"),
                  node("MatMul", ["r", "W2"], ["y"], name="mm2")],
                 [("x", [2, 4])], [("y", [2, 3])],
                 inits=[weight("W1", 4, 8), weight("W2", 8, 3)])


def test_hand_computed_mlp():
    g = estimate_joint(lower_onnx(mlp(), name="mlp"))
    by_name = {n.name: n for n in g.nodes}
    # What each backward keeps (its inputs besides the incoming gradient):
    #   mm2: r (for dW2 = rᵀ·dy) and W2 (for dr = dy·W2ᵀ; a weight, persistent anyway)
    #   relu: its output r (dh = dr·[r > 0]), not its input h
    #   mm1: x (for dW1 = xᵀ·dh) — and no dx: the graph input needs no gradient
    assert set(by_name["mm2/backward"].inputs) == {"y.grad", "r", "W2"}
    assert set(by_name["relu/backward"].inputs) == {"r.grad", "r"}
    assert set(by_name["mm1/backward"].inputs) == {"h.grad", "x"}
    assert by_name["mm1/backward"].outputs == ("W1.grad",)
    assert g.outputs[1:] == ("W1.grad", "W2.grad")

    # Schedule: 0 mm1, 1 relu, 2 mm2, 3 loss = ReduceSum(y), 4 seed (1.0, 4 B), 5 dy = a view
    # of the seed, 6 mm2/backward → dr 64 B + dW2 96 B, 7 relu/backward → dh 64 B,
    # 8 mm1/backward → dW1 128 B. Activations (fp32; the graph input x left out first, as
    # MemTracker leaves out what exists before the step): h 64 B lives 0–1, r 64 B 1–7 (kept for backward), y 24 B 2–3,
    # loss 4 B 3–end, seed 4 B 4–6, dr 6–7, dh 7–8, the weight gradients to the end.
    #   node 6: r 64 + loss 4 + seed 4 + dr 64 + dW2 96 = 232
    #   node 7: r 64 + loss 4 + dr 64 + dW2 96 + dh 64 = 292   ← the joint graph's peak
    #   node 8: loss 4 + dW2 96 + dh 64 + dW1 128 = 292
    # Parameters W1 4·8·4 = 128 B + W2 8·3·4 = 96 B = 224 B.
    none = training_memory(g, "none", include_inputs=False)
    assert none.peak_bytes == 224 + 292 == 516
    assert (none.peak_phase, none.peak_node) == ("backward", "relu/backward")
    # Adam: state 2·224 + a 4-byte step per tensor (2) = 456 B; persistent 224 + 456 = 680.
    # Backward 680 + 292 = 972; the step: 680 + gradients 224 + the for-loop's temporaries:
    # W2's sqrt and its division (2 × 96 B) while W1's denominator (128 B) is still held =
    # 320 → 1,224 — the peak (MemTracker measures 1,224 on the torch twin below).
    adam = training_memory(g, "adam", include_inputs=False)
    assert adam.peak_bytes == 1224 and adam.peak_phase == "optimizer"
    # By default the input batch counts too (the one definition of a peak, README): x is
    # 2·4·4 = 32 B, read by mm1/backward (node 8), so live at node 7: 516 + 32 = 548. The
    # optimizer step's peak holds no activation: Adam's stays 1,224. Adam's first step runs
    # its forward and backward without the 456 B of state: max(972 + 32 − 456, 1,224).
    assert training_memory(g, "none").peak_bytes == 548
    adam_in = training_memory(g, "adam")
    assert adam_in.peak_bytes == 1224 and adam_in.first_step_peak_bytes == 1224

    r = analyze(mlp(), train=True, optimizer="sgd")
    # MACs: mm1 2·8·4 = 64, mm2 2·3·8 = 48; backward mm2 2 × 48 (dr and dW2), mm1 1 × 64
    # (dW1 only) → 64 + 48 + 96 + 64 = 272. FLOPs: 2·MACs = 544, + relu 16 forward and 16
    # backward, + the loss's sum of 6 elements = 582.
    assert r.totals.macs == 272
    assert r.totals.flops == 582
    assert r.coverage.unsupported == {} and r.training.peak_bytes == 548


def test_hand_computed_mlp_matches_its_traced_twin():
    # the same network in torch, its real backward traced by AOTAutograd: the same peaks
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(4, 8, bias=False), torch.nn.ReLU(),
                              torch.nn.Linear(8, 3, bias=False))
    x = torch.randn(2, 4)
    for opt, peak in (("none", 516), ("adam", 1224)):
        r = analyze(net, (x,), train=True, optimizer=opt, include_inputs=False)
        assert r.training.peak_bytes == peak
    assert analyze(net, (x,), train=True, optimizer="none").training.peak_bytes == 548


def test_estimate_is_labelled():
    r = analyze(mlp(), train=True)
    assert ESTIMATE_WARNING in r.warnings
    assert "ESTIMATE" in json.dumps(json.loads(r.to_json())["warnings"])
    # and its synthesized nodes are named for what they are
    assert {n.op for n in r.nodes} >= {"graphcost.backward", "graphcost.grad_seed"}


def test_input_graph_is_not_mutated():
    g = lower_onnx(mlp(), name="mlp")
    before = (g.nodes, dict(g.values), g.inputs, g.outputs, g.warnings)
    joint = estimate_joint(g)
    assert (g.nodes, dict(g.values), g.inputs, g.outputs, g.warnings) == before
    assert joint is not g and len(joint.nodes) > len(g.nodes)


def test_saved_statistics_and_indices():
    # Conv → BatchNorm → MaxPool: BatchNorm runs in training mode and keeps its input plus
    # mean and 1/σ per channel (2·C floats); MaxPool keeps its input plus an int64 argmax of
    # its output's shape (as torch's max_pool2d_with_indices).
    m = model([node("Conv", ["x", "W"], ["c"], name="conv", pads=[1, 1, 1, 1]),
               node("BatchNormalization", ["c", "s", "b", "mean", "var"], ["n"], name="bn"),
               node("MaxPool", ["n"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2])],
              [("x", [2, 3, 8, 8])], [("p", [2, 4, 4, 4])],
              inits=[weight("W", 4, 3, 3, 3), weight("s", 4), weight("b", 4),
                     weight("mean", 4), weight("var", 4)])
    g = estimate_joint(lower_onnx(m, name="cbp"))
    bn = next(n for n in g.nodes if n.name == "bn")
    assert bn.attrs["training_mode"] == 1
    stat = g.values[bn.outputs[1]].spec
    assert stat.shape == (2, 4) and stat.nbytes == 32
    pool = next(n for n in g.nodes if n.name == "pool")
    idx = g.values[pool.outputs[1]].spec
    assert (idx.shape, idx.dtype) == ((2, 4, 4, 4), "int64")
    assert set(next(n for n in g.nodes if n.name == "pool/backward").inputs) == \
        {"p.grad", "n", pool.outputs[1]}
    # running statistics are buffers, not weights with gradients and optimizer state
    assert g.values["mean"].kind.value == "buffer"
    assert set(g.outputs[1:]) == {"W.grad", "s.grad", "b.grad"}


def test_undeclared_op_keeps_inputs_and_says_so():
    # org.acme::Hardmax has no rule (every ONNX op has one): its backward keeps every input
    # and is counted, never silent
    m = model([node("MatMul", ["x", "W"], ["h"], name="mm"),
               node("Hardmax", ["h"], ["y"], name="hm", domain="org.acme")],
              [("x", [2, 4])], [("y", [2, 4])], inits=[weight("W", 4, 4)])
    m.opset_import.append(onnx.helper.make_opsetid("org.acme", 1))
    r = analyze(m, train=True)
    assert any("Hardmax ×1" in w for w in r.warnings)
    assert r.coverage.unsupported.get("graphcost.backward:org.acme::Hardmax") == 1


def test_cli_train_on_onnx(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    before = path.read_bytes()
    p = run_cli(str(path), "--train", "--optimizer", "none", "--format",
                        "json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["training"]["peak_bytes"] == 548  # the hand-computed figure above
    assert any("ESTIMATE" in w for w in out["warnings"])
    p = run_cli(str(path), "--train", env={"COLUMNS": "200"})
    assert p.returncode == 0 and "ESTIMATE" in p.stdout, p.stderr
    assert path.read_bytes() == before


def test_cli_checkpoint_by_module_path_on_onnx():
    # an exported ONNX graph's node names carry the module paths: --checkpoint NAME works, and
    # the repeated blocks (found by the op types each module runs) give every/sqrt/auto
    path = str(models_zoo.cached_export("resnet18"))
    p = run_cli(path, "--batch", "2", "--train", "--optimizer", "none",
                "--checkpoint", "layer1,layer2,layer3", "--format", "json")
    assert p.returncode == 0, p.stderr
    c = json.loads(p.stdout)["training"]["checkpoint"]
    assert c["segments"] == ["layer1", "layer2", "layer3"]
    assert c["peak_bytes"] < c["peak_without_bytes"]
    p = run_cli(path, "--batch", "2", "--train", "--optimizer", "none",
                "--checkpoint", "sqrt", "--format", "json")
    assert p.returncode == 0, p.stderr
    c = json.loads(p.stdout)["training"]["checkpoint"]
    # resnet18's 8 BasicBlocks in √8 ≈ 3 segments, as the FX path groups them
    assert c["segments"] == ["layer1.0+layer1.1+layer2.0", "layer2.1+layer3.0+layer3.1",
                             "layer4.0+layer4.1"]
    assert c["peak_bytes"] < c["peak_without_bytes"]
    budget = str((c["peak_bytes"] + c["peak_without_bytes"]) // 2)
    p = run_cli(path, "--batch", "2", "--train", "--optimizer", "none",
                "--checkpoint", "auto", "--budget", budget, "--format", "json")
    assert p.returncode == 0, p.stderr
    c = json.loads(p.stdout)["training"]["checkpoint"]
    assert c["segments"] and c["peak_bytes"] <= int(budget)


# Measured with `python -m benchmarks.accuracy_onnx_training` (batch 2): small_cnn +0.7%
# (none/sgd) and +0.0% (adam); resnet18 −0.0% for every optimizer. Bound: 2%.
TOLERANCE = 0.02


@pytest.mark.parametrize("name", ["small_cnn", "resnet18"])
def test_estimate_close_to_exact_fx(name):
    est = load_graph(str(models_zoo.cached_export(name)), LoadOptions(batch=2, train=True))
    exact = load_graph(f"zoo:{name}", LoadOptions(batch=2, train=True))
    for opt in ("none", "adam"):
        e, x = training_memory(est, opt).peak_bytes, training_memory(exact, opt).peak_bytes
        assert abs(e / x - 1) <= TOLERANCE, (name, opt, e, x)
