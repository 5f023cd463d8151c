"""Memory/FLOPs against the batch and --max-batch: the search against brute force on a
piecewise-affine memory curve, and a hand-computed model through the installed command."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from graphcost.analyzer.app.api import analyze
from graphcost.analyzer.app.batch_scaling import max_batch
from graphcost.analyzer.app.request import LoadOptions, PassOptions, build_request
from graphcost.analyzer.cli.main import main

from tests.onnx_builders import model, node, weight


def _fake(required, capacity, calls):
    def at(b):
        calls.append(b)
        return SimpleNamespace(roofline=SimpleNamespace(
            fit=SimpleNamespace(needs=required(b), offers=capacity), device="x"),
                               totals=SimpleNamespace(flops=10 * b), training=None)
    return at


@pytest.mark.parametrize("capacity", [50, 999, 1000, 12_345, 10**7])
@pytest.mark.parametrize("required", [
    lambda b: 100 + 10 * b,                              # affine
    lambda b: 100 + 10 * b if b < 40 else 20 * b - 300,  # the peak moves: steeper past b=40
    lambda b: 100 + 10 * b + (b // 7) * 3,               # a staircase (allocator rounding)
])
def test_search_matches_brute_force(required, capacity):
    calls = []
    result = max_batch(_fake(required, capacity, calls))
    expected = max((b for b in range(1, 10**6) if required(b) <= capacity), default=0)
    assert result.batch == expected
    if expected:
        assert required(result.batch) <= capacity < required(result.batch + 1)
    assert len(set(calls)) <= 25  # a bracket search, not a scan


def _matmul_model(tmp_path):
    # x[batch,1024] · W[1024,1024] -> y[batch,1024], fp32
    m = model([node("MatMul", ["x", "W"], ["y"], name="mm")], [("x", ["batch", 1024])],
              [("y", ["batch", 1024])], inits=[weight("W", 1024, 1024)])
    path = tmp_path / "mm.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def test_max_batch_of_a_hand_computed_model(tmp_path, capsys):
    path = _matmul_model(tmp_path)
    # required(b) = W 4,194,304 B + (x + y) 2 · 4,096 · b B (no overhead)
    # memory = 100 MB = 100,000,000 B -> b = floor((100e6 − 4,194,304) / 8,192) = 11,695
    assert main([str(path), "--max-batch", "--device-spec",
                 "flops=1T,bandwidth=1G,memory=100MB", "--overhead", "none",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["max_batch"] == (100_000_000 - 4_194_304) // 8_192 == 11_695
    assert doc["fit"]["memory_per_sample_bytes"] == 8_192
    assert doc["fit"]["memory_fixed_bytes"] == 4_194_304
    assert doc["fit"]["flops_per_sample"] == 2 * 1024 * 1024  # 2·MACs per sample
    assert doc["required_bytes"] == 4_194_304 + 8_192 * 11_695
    # with the default overhead (passes/device/fits.py): the allocator's reserved bytes + the CUDA
    # context (726,466,560 B) ≤ 1 GiB. Reserved: W (4 MiB, between 1 and 10 MiB) gets a
    # 20 MiB segment; x and y (4,096·b B each, over 10 MiB) one segment each, rounded up to
    # 2 MiB; the matmul's cuBLAS workspace (8,519,680 B off sm90, allocated after y) fits in
    # what W left of its segment. Room for x and y: 2^30 − 726,466,560 − 20 MiB =
    # 326,303,744 B, 163,151,872 B each = 77 whole 2 MiB units = 161,480,704 B -> b ≤
    # 161,480,704 / 4,096 = 39,424 (39,425 needs a 78th unit each)
    assert main([str(path), "--max-batch", "--device-spec",
                 "flops=1T,bandwidth=1G,memory=1GiB"]) == 0
    out = capsys.readouterr().out
    assert "max batch   39,424" in out and "memory(b) =" in out


def test_max_batch_answer_holds_on_a_real_model():
    # the bracket is confirmed by independent analyses on either side of the answer
    from graphcost.analyzer.app.batch_scaling import max_batch as search
    result = search(lambda b: analyze("zoo:small_cnn", batch=b, device="t4"))
    assert analyze("zoo:small_cnn", batch=result.batch, device="t4").roofline.fit.fits
    assert not analyze("zoo:small_cnn", batch=result.batch + 1, device="t4").roofline.fit.fits
    # the search fits a line to what the run needs at two batches; the allocator's segments
    # make that a staircase at small batches, so the line is only a guide (its error is
    # reported) and the answer is the analyses' on either side of it, a bounded number
    assert result.analyses <= 20


def test_the_api_finds_the_batch_the_command_line_finds(capsys):
    # find_max_batch is --max-batch from Python: the same search and confirmation (the step at
    # the answer fits the device, one more sample does not), its errors in the API's words
    from graphcost.analyzer.app.by_batch import find_max_batch

    from graphcost import GraphcostError
    result = find_max_batch("zoo:mlp", train=True, device="t4")
    assert main(["zoo:mlp", "--train", "--max-batch", "--device", "t4", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_batch"] == result.batch > 0
    fits = [analyze("zoo:mlp", batch=b, train=True, device="t4", what_if=False).roofline.fit.fits
            for b in (result.batch, result.batch + 1)]
    assert fits == [True, False]
    with pytest.raises(GraphcostError, match=r"max_batch searches the batch: leave out batch$"):
        find_max_batch("zoo:mlp", batch=4, device="t4")


def test_max_batch_bad_input(tmp_path, capsys):
    assert main(["zoo:small_cnn", "--max-batch"]) == 2
    assert "needs --device" in capsys.readouterr().err
    assert main(["zoo:small_cnn", "--max-batch", "--batch", "4", "--device", "t4"]) == 2
    assert "leave out --batch" in capsys.readouterr().err


def test_a_traced_graph_rebound_to_another_batch_equals_its_trace():
    # one trace at the marker batch and its re-run at batch 2 give every dim's line in the
    # batch; batch 5 re-bound from them must be the batch-5 trace exactly (sizes, costs, the
    # training step's peak)
    from graphcost.analyzer.app.by_batch import analyze_by_batch
    from graphcost.analyzer.app.pipeline import run_passes
    from graphcost.analyzer.load.loading import load_graph
    at = analyze_by_batch("zoo:gpt2", build_request(train=True, optimizer="adam", what_if=False))
    assert at.rebound
    real = run_passes(load_graph("zoo:gpt2", LoadOptions(batch=5, train=True)), PassOptions(optimizer="adam", what_if=False))
    got = at(5)
    assert got.batch == 5
    assert (got.totals.flops, got.totals.bytes_read, got.training.peak_bytes) == \
        (real.totals.flops, real.totals.bytes_read, real.training.peak_bytes)
    assert [n.output_shapes for n in got.nodes] == [n.output_shapes for n in real.nodes]
    # an ONNX model has no trace to save: it is lowered at each batch
    assert not analyze_by_batch("zoo:mnist_net", build_request()).rebound


def test_rebound_batches_take_the_arguments_analyze_takes():
    # --max-batch --train --device a10 [--parallel fsdp]: the re-bound graphs get the
    # optimizer implementation the device runs (foreach on a GPU) and the checked
    # data-parallel spec, exactly as analyze() at that batch does
    from graphcost.analyzer.app.by_batch import analyze_by_batch
    kw = dict(train=True, device="a10", parallel={"strategy": "fsdp", "world_size": 2})
    at = analyze_by_batch("zoo:mlp", build_request(**kw))
    assert at.rebound
    got, real = at(5), analyze("zoo:mlp", batch=5, **kw)
    assert got.training.optimizer_impl == real.training.optimizer_impl == "foreach"
    assert got.parallel.per_rank_peak_bytes == real.parallel.per_rank_peak_bytes
    assert got.peak_bytes == real.peak_bytes


def test_an_answer_at_the_search_limit_says_it_is_a_lower_bound():
    # required(b) = 100 + 10·b B on 10^7 B fits up to b = 999,990; a search limited to 1,000
    # stops there with 1,001 still fitting: "at least 1,000", never "1,001 would need"
    from graphcost.analyzer.render.batch import max_batch_lines
    result = max_batch(_fake(lambda b: 100 + 10 * b, 10**7, []), limit=1_000)
    assert (result.batch, result.at_limit) == (1_000, True)
    assert result.next_required_bytes == 100 + 10 * 1_001 <= 10**7
    text = "\n".join(max_batch_lines("m", result, 80))
    assert "at least 1,000, the search's limit" in text and "which fits too" in text
    assert not max_batch(_fake(lambda b: 100 + 10 * b, 12_345, [])).at_limit


class _PerSample(__import__("torch").nn.Module):
    """Python that loops over the samples: one Linear(256, 256) call per row, then a stack."""

    def __init__(self):
        import torch
        super().__init__()
        self.fc = torch.nn.Linear(256, 256)

    def forward(self, x):
        import torch
        return torch.stack([self.fc(row) for row in x])


def test_a_graph_that_grows_with_the_batch_gets_an_estimate():
    # Each trace of this model grows with the batch (a detector's post-processing is such a
    # loop: 6 s to trace at batch 2, 94 s at 64), so --max-batch extrapolates from b = 1…8.
    # By hand: weights (256·256 + 256)·4 = 263,168 B; at the stack, the input (the caller
    # holds it), the b rows' outputs and the stacked output are live, 3 · 1,024 B per
    # sample. On 300,000 B: b ≤ (300,000 − 263,168) / 3,072 = 11.99 -> 11
    from graphcost.analyzer.app.batch_scaling import estimate_max_batch
    from graphcost.analyzer.app.by_batch import analyze_by_batch
    from graphcost.analyzer.app.devices import parse_device_spec, parse_overhead
    from graphcost.analyzer.render.batch import max_batch_lines
    kw = dict(input_shapes={"x": (1, 256)}, what_if=False, overhead=parse_overhead("none"),
              device=parse_device_spec("flops=1T,bandwidth=1G,memory=300000B"))
    at = analyze_by_batch(_PerSample(), build_request(**kw))
    assert not at.rebound and at.grows[1] > at.grows[0]
    result = estimate_max_batch(at, at.grows)
    assert result.fit.memory.fixed == 263_168 and result.fit.memory.per_sample == 3_072
    assert result.batch == (300_000 - 263_168) // 3_072 == 11
    # the estimate against real traces on both sides of it
    assert analyze(_PerSample(), batch=11, **kw).roofline.fit.needs <= 300_000 < \
        analyze(_PerSample(), batch=12, **kw).roofline.fit.needs
    text = "\n".join(max_batch_lines("m", result, 80))
    assert "≈ 11 (ESTIMATED" in text and "grows with the batch" in text


def test_max_batch_under_a_checkpoint_plan_fits_the_plan(capsys):
    # --checkpoint-every 1 with --max-batch: the batch is searched for the step as the plan
    # runs it (its peak plus the overhead), not for the plain step beside it; a fresh
    # analysis at the answer and one above says fits / does not, and the plan buys batch
    from graphcost.analyzer.app.devices import get_device
    from graphcost.passes.device.fits import fit
    args = ["zoo:gpt2", "--train", "--max-batch", "--device", "a10", "--format", "json"]
    assert main(args + ["--checkpoint-every", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoint"] == "every"
    b = doc["max_batch"]
    a10 = get_device("a10")

    def planned(batch):  # the plan's step replayed through the allocator + runtime
        r = analyze("zoo:gpt2", batch=batch, train=True, device=a10,
                    checkpoint={"every": 1}, what_if=False)
        return r, r.roofline.fit
    at_b, plan_b = planned(b)
    assert plan_b.needs == doc["required_bytes"] <= plan_b.offers < planned(b + 1)[1].needs
    # the plan buys batch: at b the plain step beside it does not fit, even on its tensors'
    # peak alone (the allocator's replay only adds), so without the plan the answer is below b
    assert not fit(a10, at_b.training.peak_bytes, threads=2).fits
    # a budget is a target of its own: refused, one line
    assert main(args + ["--checkpoint", "auto", "--budget", "1GiB"]) == 2
    assert "search the batch under a fixed plan" in capsys.readouterr().err


def test_max_batch_headline_fits_80_columns():
    # one rank under a strategy and a checkpoint plan: the headline was one 120-column line
    from dataclasses import replace as with_

    from graphcost.analyzer.render.batch import max_batch_lines
    result = with_(max_batch(_fake(lambda b: 100 + 10 * b, 12_345, [])),
                   parallel="fsdp over 4 ranks", checkpoint="every", train=True)
    lines = max_batch_lines("zoo:gpt2", result, 80)
    assert all(len(line) <= 80 for line in lines), lines
    head = " ".join(line.strip() for line in lines[:3])
    assert "under its checkpoint plan (every), one rank under fsdp over 4 ranks" in head
    assert "(12.06 KiB)," in head  # 12,345 B, kept with its unit
