"""Per-rank predictions against real data-parallel training on this CPU: two processes on gloo
(127.0.0.1) and one with PyTorch's fake process group for fully_shard at 8 ranks, measured by
FSDPMemTracker / MemTracker (analyzer/measure/parallel.py), steps 1 and 2 (Adam's state
exists from step 2). One spawn per world size serves every case, the precision recipes'
too (spawning is slow).

The zoo mlp's peaks and items must match to the byte but for a few (the input batch's 2 KiB).
gpt2's are within 10%: they were −6% while its eager CPU step kept float dropout noise that
the joint graph, like a GPU, kept as 1-byte masks (modelled for this CPU since 2026-11-26,
passes/graph/cpu_dropout.py: now within 1%), and the bound stays loose for a rank that holds a
unit's buffers late.
"""
from __future__ import annotations

import pytest
from graphcost.analyzer.app.pipeline import run_passes
from graphcost.analyzer.app.request import PassOptions, build_request
from graphcost.analyzer.load.loading import load_graph
from graphcost.analyzer.measure.parallel import Case, measure_parallel
from graphcost.analyzer.measure.tracker_items import items
from graphcost.passes.parallel.spec import ParallelSpec

from tests.shared import joint_graph, measured_steps

# every case on every torch of the range (conftest.py): the fixtures measure them all at once
pytestmark = pytest.mark.every_torch

GLOO = [("mlp", "ddp"), ("mlp", "zero1"), ("mlp", "zero2"), ("mlp", "fsdp"), ("gpt2", "ddp"),
        ("gpt2", "fsdp")]
FAKE = [("mlp", "fsdp"), ("mlp", "zero2"), ("gpt2", "fsdp")]
RECIPES = [("mlp", "ddp", "bf16-mixed"), ("mlp", "fsdp", "bf16-mixed"),
           ("mlp", "fsdp", "bf16-true"), ("mlp", "fsdp", "bf16-master"),
           ("mlp", "zero2", "bf16-master"), ("gpt2", "fsdp", "bf16-master")]


def _predict(model, strategy, world):
    return run_passes(joint_graph(model), PassOptions(optimizer="adam", include_inputs=False, what_if=False, parallel=ParallelSpec(strategy, world))).parallel


# one trace per distinct load options (bf16-true and bf16-master both trace the module cast
# to bf16; the strategy is a pass option): the six recipes are traced three times, not six
_RECIPE_TRACES: dict = {}


def _predict_recipe(model, strategy, precision):
    # analyze()'s request and what run_request does with it, the trace shared
    request = build_request(batch=2, train=True, optimizer="adam", include_inputs=False,
                            what_if=False, precision=precision,
                            parallel={"strategy": strategy, "world_size": 2})
    key = model, repr(request.load)  # (LoadOptions holds mappings: not hashable)
    if key not in _RECIPE_TRACES:
        _RECIPE_TRACES[key] = load_graph(f"zoo:{model}", request.load)
    return run_passes(_RECIPE_TRACES[key], request.passes).parallel


def _case(model, strategy, p, precision="fp32"):
    return Case(model, strategy, 2, (), tuple(u.name for u in p.units if u.name != "(root)"),
                precision=precision)


@pytest.fixture(scope="module")
def gloo():
    # one spawn of two gloo ranks runs the strategies in fp32 and the precision recipes
    # (each spawn costs two processes importing torch and joining the group)
    preds = {(m, s, "fp32"): _predict(m, s, 2) for m, s in GLOO}
    preds |= {c: _predict_recipe(*c) for c in RECIPES}
    return preds, measure_parallel([_case(m, s, p, r) for (m, s, r), p in preds.items()], 2)


@pytest.fixture(scope="module")
def fake():
    preds = {(m, s, "fp32"): _predict(m, s, 8) for m, s in FAKE}
    # (8 ranks of a fake group in one process: recorded, tests/shared.py; the gloo ranks
    # above stay live on every torch, the harness's own check)
    return preds, measured_steps([_case(m, s, p) for (m, s, _), p in preds.items()], 8,
                                 fake=True)


def _measured(runs, key):
    return [m for m in runs[1] if (m.case.model, m.case.strategy, m.case.precision) == key]


def _rows(runs, model, strategy):
    p = runs[0][model, strategy, "fp32"]
    for m in _measured(runs, (model, strategy, "fp32")):
        yield p, m, p.first_step_peak_bytes if m.step == 1 else p.per_rank_peak_bytes


@pytest.mark.parametrize("model, strategy", GLOO)
def test_gloo_two_ranks(gloo, model, strategy):
    rows = list(_rows(gloo, model, strategy))
    assert len(rows) == 4                                   # 2 ranks × steps 1 and 2
    for p, m, predicted in rows:
        # gloo completes a collective on its own thread: on a loaded machine fully_shard may
        # still hold one unit's reduce-scattered gradient shard when the next unit's buffers
        # are allocated (seen once in a full suite: rank 1, step 2, +521,732 B; the shard is
        # 525,824 B; zero2 step 1 under pytest-xdist: +24,020 B), or the whole reduce-scatter
        # input of one unit into the optimizer step (seen once in seven full suites: rank 0,
        # step 1, +1,050,624 B as 'Temp'; the input is 1,051,648 B). The fake process group
        # below has no such thread and stays exact.
        late = max(u.grad_padded_bytes for u in p.units) \
            if strategy in ("fsdp", "zero2", "zero3") else 0
        if model == "mlp":
            assert 0.999 * predicted <= m.peak <= 1.001 * predicted + late, \
                (m.rank, m.step, predicted, m.peak)
        else:
            assert abs(predicted / m.peak - 1) <= 0.10, (m.rank, m.step, predicted, m.peak)


@pytest.mark.parametrize("model, strategy", FAKE)
def test_fake_process_group_eight_ranks(fake, model, strategy):
    for p, m, predicted in _rows(fake, model, strategy):
        assert abs(predicted / m.peak - 1) <= (0.001 if model == "mlp" else 0.10), \
            (m.step, predicted, m.peak)


@pytest.mark.parametrize("strategy", ["fsdp", "ddp", "zero1"])
def test_mlp_items_match(gloo, strategy):
    # each item of the breakdown at the peak (steady state), predicted against measured:
    # parameters, gradients, optimizer state and step, DDP buckets / FSDP's gathered units,
    # all-gather and reduce-scatter buffers, autograd's temporaries; activations differ by
    # the 2 KiB input batch the measurement holds, and on a loaded machine by another 2 KiB
    # activation (2 × 256 float32) and the 4-byte loss: which of them are live at the peak
    # moment depends on when gloo's thread frees a buffer (seen under pytest-xdist: +4,100 B).
    # Every structural item (a unit's parameters, a shard, a bucket) is ≥ 512 KiB. Under
    # fully_shard, gloo's thread may still hold one unit's reduce-scattered gradient shard
    # at the peak (test_gloo_two_ranks above; seen once in .ci/run's torch 2.14.1 run:
    # gradients +525,824 B, the shard): measured gradients may exceed by that one shard.
    for p, m, _ in _rows(gloo, "mlp", strategy):
        if m.step != 2:
            continue
        late = max(u.grad_padded_bytes for u in p.units) // p.world_size \
            if strategy == "fsdp" else 0  # one shard: 1,051,648 / 2 = 525,824 B
        for name, (pred, meas) in items(p.detail_at_peak, m.categories).items():
            slack = late if name == "grads" else 0
            assert -8192 <= meas - pred <= 8192 + slack, (name, pred, meas)


def test_mlp_zero2_forward_peak(fake):
    # zero2 keeps every unit gathered through forward: the peak is the last block's copy-out,
    # with the previous block's all-gather buffer still held (both measured). FSDPMemTracker
    # counts the unit being copied out as activations, graphcost as gathered parameters:
    # compared together. Measured with the fake process group (8 ranks): on gloo its own
    # thread frees all-gather buffers at moments that vary from run to run, and the tracker's
    # peak is then an equal total with one to three blocks' buffers fewer live (seen in CI
    # and in loops of this file: the peak itself is held to 0.1% by test_gloo_two_ranks)
    steady = [(p, m) for p, m, _ in _rows(fake, "mlp", "zero2") if m.step == 2]
    assert steady  # the fake group measured the steady step
    for p, m in steady:
        got = items(p.detail_at_peak, m.categories)
        assert p.peak_phase == "forward" and "copy-out" in p.peak_event
        assert got["comm"][0] + got["activations"][0] == got["comm"][1] + got["activations"][1]


@pytest.mark.parametrize("model, strategy, precision", RECIPES)
def test_precision_recipes_on_two_ranks(gloo, model, strategy, precision):
    # the recipes as PyTorch runs them data-parallel (analyzer/measure/parallel.py): the
    # forward under CPU autocast (bf16-mixed), the module cast to bf16 (bf16-true), and
    # fully_shard's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) for the master
    # recipe — fp32 shards, sharded gradients, reduce-scatter inputs and Adam state, bf16
    # gathers, and each unit's gradients cast to fp32 for a moment at its reduce-scatter
    # copy-in (without those casts the mlp's fsdp step was 4.98% under: 10,021,550 B
    # predicted, 10,546,864 B measured; now 10,545,326 B). mlp to 0.1%; gpt2 within 10%
    # (+0.65% / +0.46% on 2026-11-26: see the module docstring). Above, both may
    # also hold one unit's reduce-scatter input late, as in test_gloo_two_ranks (gpt2 in CI on
    # torch 2.14.1: rank 1, step 1, 'Reduce Scatter' 793,088 B = two units' 396,544 B inputs,
    # peak 5,552,388 B against 4,841,840 B predicted)
    p = gloo[0][model, strategy, precision]
    rows = _measured(gloo, (model, strategy, precision))
    assert len(rows) == 4                                   # 2 ranks × steps 1 and 2
    # a late input held with a few KiB of gloo's own temporaries beside it (the mlp's fsdp
    # bf16-master, rank 0, step 1, in a full suite on 2026-12-07: 10,020,032 B measured,
    # 8,959,128 predicted, 'Temp' 1,061,928 B = the late 1,051,648 and 10,280 more)
    late = max(u.grad_padded_bytes for u in p.units) * 2 + 16_384 if p.units else 0
    for m in rows:
        predicted = p.first_step_peak_bytes if m.step == 1 else p.per_rank_peak_bytes
        if model == "mlp":
            assert 0.999 * predicted <= m.peak <= 1.001 * predicted + late, \
                (m.rank, m.step, predicted, m.peak)
        else:
            assert 0.90 * predicted <= m.peak <= 1.10 * predicted + late, \
                (m.rank, m.step, predicted, m.peak)


def test_master_weights_with_a_replicating_strategy_is_refused():
    from graphcost import GraphcostError, analyze
    with pytest.raises(GraphcostError, match="MixedPrecisionPolicy"):
        analyze("zoo:mlp", train=True, precision="bf16-master",
                parallel={"strategy": "ddp", "world_size": 2})
