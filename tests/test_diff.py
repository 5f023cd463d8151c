"""``graphcost diff``: two real models side by side, checked against hand arithmetic."""
from __future__ import annotations

import json
import os
import shutil

import onnx
import pytest
from graphcost.analyzer.app import diff as diff_mod
from graphcost.analyzer.app.diff import diff_reports

from graphcost import analyze
from tests.cli_runner import run_cli
from tests.onnx_builders import model, node, weight

GRAPHCOST = shutil.which("graphcost")
needs_cli = pytest.mark.skipif(GRAPHCOST is None, reason="graphcost is not installed")
ENV = dict(os.environ, COLUMNS="200")  # conftest has set GRAPHCOST_CACHE in os.environ


def run(*args, rc=None):
    p = run_cli("diff", *args, env={"COLUMNS": "200"})  # in this process: tests/cli_runner
    if rc is not None:
        assert p.returncode == rc, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p


def _convs(width: int, sigmoid: bool, prefix: str = ""):
    """x[1,3,8,8] → Conv(3→width,k3,pad1) [→ Sigmoid] → Relu → Conv(width→16,k3,pad1)."""
    pads = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    nodes = [node("Conv", ["x", "W1", "B1"], ["c1"], name=prefix + "conv1", **pads)]
    act_in = "c1"
    if sigmoid:
        nodes.append(node("Sigmoid", ["c1"], ["s"], name=prefix + "sig"))
        act_in = "s"
    nodes += [node("Relu", [act_in], ["r"], name=prefix + "relu"),
              node("Conv", ["r", "W2", "B2"], ["y"], name=prefix + "conv2", **pads)]
    return model(nodes, [("x", [1, 3, 8, 8])], [("y", [1, 16, 8, 8])],
                 inits=[weight("W1", width, 3, 3, 3), weight("B1", width),
                        weight("W2", 16, width, 3, 3), weight("B2", 16)])


@pytest.fixture
def pair(tmp_path):
    old, new = tmp_path / "v1.onnx", tmp_path / "v2.onnx"
    onnx.save(_convs(16, sigmoid=False), old)
    onnx.save(_convs(32, sigmoid=True), new)
    return old, new


# Hand arithmetic for the pair (float32, 8×8 = 64 positions):
#   params v1: conv1 16·3·9 + 16 = 448, conv2 16·16·9 + 16 = 2,320 → 2,768
#   params v2: conv1 32·3·9 + 32 = 896, conv2 16·32·9 + 16 = 4,624 → 5,520; Δ = +2,752
#   MACs v1: 16·64·27 = 27,648 + 16·64·144 = 147,456 → 175,104
#   MACs v2: 32·64·27 = 55,296 + 16·64·288 = 294,912 → 350,208; Δ = +175,104
#   Sigmoid (added): 3 FLOPs per element · 32·64 = 6,144 FLOPs
#   peak v1 (dataflow, first max): at relu #1, c1 16·64·4 = 4,096 B + r 4,096 B = 8,192 B
#     (conv1: x 768 + c1 4,096 = 4,864; conv2: r + y = 8,192, a tie, not first)
#   peak v2: at sig #1, c1 32·64·4 = 8,192 B + s 8,192 B = 16,384 B; Δ = +8,192 B
#     → live only in new: s (8,192); only in old: r (4,096); resized: c1 4,096 → 8,192
def test_widen_and_add_node(pair):
    d = diff_reports(analyze(str(pair[0])), analyze(str(pair[1])))
    assert d.matching == "name"
    params = d.total("params")
    assert (params.old, params.new, params.delta) == (2_768, 5_520, 2_752)
    assert params.pct == pytest.approx(100 * 2_752 / 2_768)
    assert (d.total("macs").old, d.total("macs").delta) == (175_104, 175_104)
    assert (d.total("nodes").old, d.total("nodes").new) == (3, 4)

    added = d.by_status("added")
    assert [(n.name, n.op, n.new.flops) for n in added] == [("sig", "Sigmoid", 6_144)]
    assert d.by_status("removed") == ()
    changed = {n.name: n for n in d.by_status("changed")}
    assert set(changed) == {"conv1", "relu", "conv2"}  # all three widened in or out
    assert {c.name: c.delta for c in changed["conv1"].changes()}["params"] == 896 - 448
    assert changed["relu"].old.output_shapes == ("1×16×8×8",)
    assert changed["relu"].new.output_shapes == ("1×32×8×8",)

    p = d.peak
    assert (p.peak.old, p.peak.new, p.peak.delta) == (8_192, 16_384, 8_192)
    assert (p.old_node, p.new_node) == ("relu", "sig")
    assert p.only_new == (("s", 8_192),)
    assert p.only_old == (("r", 4_096),)
    assert p.resized == (("c1", 4_096, 8_192),)
    # Sigmoid: 0 → 1 node, 6,144 FLOPs; Relu count unchanged but its FLOPs double
    ops = {o.op: o for o in d.op_types}
    assert (ops["Sigmoid"].count.old, ops["Sigmoid"].count.new) == (0, 1)
    assert ops["Sigmoid"].flops.pct is None  # from zero: no percentage
    assert ops["Relu"].flops.delta == 32 * 64 - 16 * 64


def test_renamed_nodes_fall_back_to_sequence(tmp_path):
    # Every name differs: only the op sequence can pair Conv, Relu, Conv; Sigmoid is new.
    a = analyze(_convs(16, sigmoid=False))
    b = analyze(_convs(32, sigmoid=True, prefix="v2_"))
    d = diff_reports(a, b)
    assert d.matching == "name+sequence"
    assert (d.matched_by_name, d.matched_otherwise) == (0, 3)
    assert [n.new.name for n in d.by_status("added")] == ["v2_sig"]
    assert d.by_status("removed") == ()
    pairs = {n.old.name: n.new.name for n in d.by_status("changed")}
    assert pairs == {"conv1": "v2_conv1", "relu": "v2_relu", "conv2": "v2_conv2"}
    assert any("matched by aligning the two op sequences" in note for note in d.notes)
    # the linear fallback for huge graphs pairs the k-th node of each op instead
    old_limit = diff_mod.SEQUENCE_LIMIT
    diff_mod.SEQUENCE_LIMIT = 1
    try:
        d2 = diff_reports(a, b)
    finally:
        diff_mod.SEQUENCE_LIMIT = old_limit
    assert d2.matching == "name+op-order"
    assert [n.new.name for n in d2.by_status("added")] == ["v2_sig"]


def test_a_few_renames_stay_added_and_removed():
    # Most names match, so no fallback: a renamed Relu is one removed and one added node.
    a = analyze(_convs(16, sigmoid=False))
    m = _convs(16, sigmoid=False)
    m.graph.node[1].name = "act"
    d = diff_reports(a, analyze(m))
    assert d.matching == "name"
    assert [n.name for n in d.by_status("added")] == ["act"]
    assert [n.name for n in d.by_status("removed")] == ["relu"]
    assert d.total("params").delta == 0 and d.total("macs").delta == 0


@needs_cli
def test_cli_self_diff_is_all_zero(pair):
    r = json.loads(run(pair[0], pair[0], "--format", "json", rc=0).stdout)
    assert all(t["delta"] == 0 for t in r["totals"].values())
    assert r["totals"]["params"]["old"] == 2_768
    assert r["nodes"] == [] and r["modules"] == [] and r["op_types"] == []
    assert r["node_counts"] == {"changed": 0, "added": 0, "removed": 0, "unchanged": 3}
    assert r["peak"]["only_new"] == r["peak"]["only_old"] == r["peak"]["resized"] == []
    assert "no differences" in run(pair[0], pair[0], rc=0).stdout


@needs_cli
def test_cli_json_keys_and_determinism(pair):
    out = run(*pair, "--format", "json", rc=0).stdout
    assert out == run(*pair, "--format", "json", rc=0).stdout
    r = json.loads(out)
    assert r["schema_version"] == 3 and r["kind"] == "diff"
    assert set(r) == {"schema_version", "kind", "old", "new", "matching", "totals",
                      "node_counts", "peak", "op_types", "modules", "nodes", "notes", "fit",
                      "time", "serving"}
    # no device asked: no fit, no time; the peak budgets check is the inference run's,
    # parameters beside the activations: 2,768 · 4 + 8,192 = 19,264 B; 5,520 · 4 + 16,384
    # = 38,464 B
    assert r["fit"] is None and r["time"] is None
    assert (r["totals"]["peak_bytes"]["old"], r["totals"]["peak_bytes"]["new"]) == \
        (19_264, 38_464)
    assert r["matching"] == {"method": "name", "by_name": 3, "otherwise": 0}
    assert r["totals"]["params"] == {"name": "params", "old": 2_768, "new": 5_520,
                                     "delta": 2_752, "pct": round(100 * 2_752 / 2_768, 3)}
    assert r["node_counts"] == {"changed": 3, "added": 1, "removed": 0, "unchanged": 0}
    added = [n for n in r["nodes"] if n["status"] == "added"]
    assert [(n["name"], n["old_name"], n["new_index"]) for n in added] == [("sig", None, 1)]
    assert r["peak"]["only_new"] == [{"name": "s", "bytes": 8_192}]
    assert r["peak"]["resized"] == [{"name": "c1", "old": 4_096, "new": 8_192, "delta": 4_096}]


@needs_cli
def test_cli_table_and_markdown(pair, tmp_path):
    p = run(*pair, "--details", rc=0)
    for text in ("2,768", "5,520", "+2,752", "+99.4%", "added nodes (1 of 1)", "Sigmoid",
                 "only in new: s 8.00 KiB", "c1 4.00 KiB → 8.00 KiB", "at relu (#1) → sig (#1)"):
        assert text in p.stdout, text
    assert p.stderr == ""
    # the lists above, the totals and why the peak moved last
    out = p.stdout
    assert out.index("added nodes") < out.index("totals") < out.index("activation peak 8")
    assert out.rstrip().splitlines()[-1].endswith("c1 4.00 KiB → 8.00 KiB")
    # by default the answer alone: the totals that changed, where the peak is, no list
    brief = run(*pair, rc=0).stdout
    assert "added nodes" not in brief and "only in new" not in brief
    assert "the modules, nodes and op types that changed: --details" in brief
    assert "unchanged: buffers" in brief
    assert brief.rstrip().splitlines()[-1].startswith("activation peak 8.00 KiB → 16.00 KiB")
    out = tmp_path / "diff.md"
    assert run(*pair, "--format", "markdown", "-o", out, rc=0).stdout == ""
    md = out.read_text()
    assert md.startswith("# graphcost diff:")
    assert "| params | 2,768 | 5,520 | +2,752 | +99.4% |" in md  # 2,752/2,768 = 99.42%
    assert "## Added nodes (1 of 1)" in md


@needs_cli
def test_cli_resnet18_to_resnet50():
    # torchvision's published counts: ResNet-50 25,557,032 − ResNet-18 11,689,512 params
    r = json.loads(run("zoo:resnet18", "zoo:resnet50", "--batch", 1, "--format", "json",
                       rc=0).stdout)
    assert r["totals"]["params"]["delta"] == 25_557_032 - 11_689_512 == 13_867_520
    # torchvision's GFLOPS tables (MACs): 1.81 G and 4.09 G
    assert round(r["totals"]["macs"]["old"] / 1e9, 2) == 1.81
    assert round(r["totals"]["macs"]["new"] / 1e9, 2) == 4.09
    # ResNet-50 has bottleneck blocks: conv3/bn3 appear only in the new model
    added = {n["name"] for n in r["nodes"] if n["status"] == "added"}
    assert "/layer1/layer1.0/conv3/Conv" in added
    assert r["matching"]["method"] == "name"


@needs_cli
def test_cli_bad_input(pair, tmp_path):
    p = run(tmp_path / "missing.onnx", pair[1], rc=2)
    assert p.stderr.count("\n") == 1 and "missing.onnx" in p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert run(pair[0], rc=2).stderr.count("\n") == 1  # only one model
    before = pair[1].read_bytes()
    p = run(*pair, "-o", pair[1], rc=2)  # -o naming an input model is refused
    assert "never writes its input" in p.stderr
    assert pair[1].read_bytes() == before


def test_a_training_diff_ends_on_the_time_and_the_fit_of_each_analysis():
    # two decoders' training steps for one GPU: the diff's fit and time are each analysis's
    # own (the same needs, offers and seconds), and its face, one screen at 80 columns,
    # ends on them: the answer to "does my change still fit, and how much slower is it"
    import io

    from graphcost.analyzer.cli.output import console_for
    from graphcost.analyzer.render.diff import render_table

    asked = dict(train=True, batch=2, device="h100-sxm", precision="bf16-mixed",
                 tokens=10**9, price=2.0)
    a, b = analyze("zoo:llama_tiny", **asked), analyze("zoo:gpt2", **asked)
    d = diff_reports(a, b)
    assert d.fit is not None and d.time is not None
    assert (d.fit.needs.old, d.fit.needs.new) == (a.roofline.fit.needs, b.roofline.fit.needs)
    assert d.fit.offers == a.roofline.fit.offers == b.roofline.fit.offers
    assert (d.time.old_seconds, d.time.new_seconds) == (a.time.seconds, b.time.seconds)
    # a run of --tokens at each pace, and its cost at --price (it was accepted, then unsaid)
    assert d.time.gpu_hours == (a.time.gpu_hours, b.time.gpu_hours)
    assert d.time.cost == (a.time.cost, b.time.cost)
    assert d.total("peak_bytes").new == b.peak_bytes
    assert d.total("reserved_peak_bytes").old == a.peak.reserved_bytes
    out = io.StringIO()
    render_table(d, console_for(out, 80), None, 80, "--details")
    lines = out.getvalue().rstrip().splitlines()
    assert len(lines) <= 23 and max(map(len, lines)) <= 80, lines
    assert lines[-3].startswith("time ≈ ") and "per step" in lines[-3], lines
    assert "estimates ± " in lines[-3]
    assert lines[-2].startswith("run of 1.00G tokens: ") and "GPU-hours; $" in lines[-2]
    assert lines[-1].startswith("fits on h100-sxm: yes → yes, needs "), lines


def test_a_serving_diff_ends_on_each_reviews_cache_capacity_time_and_fit():
    # two transformers decoders served on an H100: the diff's serving figures are each
    # direct --serve analysis's own, and its face ends on them (one screen at 80 columns)
    import io

    from graphcost.analyzer.cli.output import console_for
    from graphcost.analyzer.render.diff import render_table

    asked = dict(batch=4, device="h100-sxm", serve={"prompt": 64, "generate": 16})
    a, b = analyze("zoo:hf_llama", **asked), analyze("zoo:hf_qwen2", **asked)
    d = diff_reports(a, b)
    s, sa, sb = d.serving, a.serving, b.serving
    assert s is not None and sa is not None and sb is not None
    assert sa.time is not None and sb.time is not None
    assert s.tokens == 80
    assert (s.kv_bytes_per_token.old, s.kv_bytes_per_token.new) == \
        (sa.kv_bytes_per_token, sb.kv_bytes_per_token)
    assert (s.weight_bytes.old, s.weight_bytes.new) == (sa.weight_bytes, sb.weight_bytes)
    assert s.max_concurrent_sequences is not None
    assert (s.max_concurrent_sequences.old, s.max_concurrent_sequences.new) == \
        (sa.max_concurrent_sequences, sb.max_concurrent_sequences)
    assert s.ttft == (sa.time.ttft_seconds, sb.time.ttft_seconds)
    assert s.tpot == (sa.time.tpot_seconds, sb.time.tpot_seconds)
    assert d.fit is not None and sa.fit is not None and d.fit.needs.old == sa.fit.needs
    out = io.StringIO()
    render_table(d, console_for(out, 80), None, 80, "--details")
    lines = out.getvalue().rstrip().splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= 80, lines
    assert lines[-4].startswith("KV cache ") and "per token a sequence; weights " in lines[-4]
    assert lines[-3].startswith("h100-sxm holds ≈ ") and "sequences of 80 tokens" in lines[-3]
    assert lines[-2].startswith("TTFT ≈ ") and "TPOT ≈ " in lines[-2], lines
    assert lines[-1].startswith("fits on h100-sxm: yes → yes, needs "), lines
    # and the command line takes the serving options
    p = run("zoo:hf_llama", "zoo:hf_qwen2", "--serve", "--prompt", "64", "--generate", "16",
            "--batch", "4", "--format", "json", rc=0)
    assert json.loads(p.stdout)["serving"]["kv_bytes_per_token"]["old"] == sa.kv_bytes_per_token


def test_serving_times_carry_both_bands_where_they_differ():
    """A serving diff's TTFT/TPOT are estimates with their bands: one band said once where
    both reviews have it, both where they differ (the line said no band at all there)."""
    from graphcost.analyzer.app.diff import Change
    from graphcost.analyzer.app.diff_answer import ServingDiff
    from graphcost.analyzer.render.diff import _serving_lines

    def served(bands):
        return ServingDiff(2048, Change("weight_bytes", 1 << 30, 1 << 30),
                           Change("kv_bytes_per_token", 1 << 17, 1 << 16),
                           Change("kv_cache_bytes", 1 << 30, 1 << 29), None, None,
                           (0.05, 0.04), (0.01, 0.008), bands)
    assert _serving_lines(served((0.16, 0.16)), None)[-1].endswith("estimates ± 16% each")
    assert _serving_lines(served((0.16, 0.32)), None)[-1].endswith("estimates ± 16% → ± 32%")
