"""HSDP (``--parallel dp_replicate=R,dp_shard=S``) against real FSDP2 on a 2-D device mesh:
four gloo ranks on 127.0.0.1 (2 replica groups × 2 sharding ranks) and, through PyTorch's
fake process group, one rank of 2 × 4. FSDPMemTracker measures steps 1 and 2
(analyzer/measure/parallel.py, Case.replicate).

What HSDP changes for a rank's memory is nothing beyond its shard group's FSDP: FSDP2's
``foreach_reduce`` all-reduces the reduce-scatter output across the replica groups in place,
and that output is the sharded gradient. So the prediction must equal FSDP over S ranks, and
the measurement must match both. Its communication adds that all-reduce over dp_replicate.
"""
from __future__ import annotations

import pytest
from graphcost.analyzer.app.pipeline import run_passes
from graphcost.analyzer.app.request import PassOptions
from graphcost.analyzer.measure.parallel import Case
from graphcost.passes.errors import GraphcostError
from graphcost.passes.parallel.spec import ParallelSpec

from graphcost import analyze
from tests.shared import joint_graph, measured_steps

pytestmark = pytest.mark.every_torch


def _predict(model, shard, replicate):
    spec = ParallelSpec("fsdp", shard, replicate=replicate)
    return run_passes(joint_graph(model), PassOptions(optimizer="adam", include_inputs=False,
                                                      what_if=False, parallel=spec)).parallel


def _case(model, p, replicate):
    return Case(model, "fsdp", 2, (), tuple(u.name for u in p.units if u.name != "(root)"),
                replicate=replicate)


@pytest.fixture(scope="module")
def gloo_2x2():
    preds = {m: _predict(m, 2, 2) for m in ("mlp", "gpt2")}
    return preds, measured_steps([_case(m, p, 2) for m, p in preds.items()], 4)


@pytest.fixture(scope="module")
def fake_2x4():
    p = _predict("mlp", 4, 2)
    return p, measured_steps([_case("mlp", p, 2)], 8, fake=True)


def _holds(p, m, bound):
    predicted = p.first_step_peak_bytes if m.step == 1 else p.per_rank_peak_bytes
    # gloo may still hold one unit's reduce-scattered shard late (tests/test_parallel_reality)
    late = max(u.grad_padded_bytes for u in p.units)
    assert (1 - bound) * predicted <= m.peak <= (1 + bound) * predicted + late, \
        (m.case.model, m.rank, m.step, predicted, m.peak)


@pytest.mark.parametrize("model", ["mlp", "gpt2"])
def test_hsdp_two_by_two_on_gloo(gloo_2x2, model):
    preds, runs = gloo_2x2
    p = preds[model]
    rows = [m for m in runs if m.case.model == model]
    assert len(rows) == 8                                  # 4 ranks × steps 1 and 2
    for m in rows:
        # the mlp to the byte but for the input batch; gpt2 within 5% (#45's acceptance)
        _holds(p, m, 0.001 if model == "mlp" else 0.05)


def test_hsdp_two_by_four_on_the_fake_group(fake_2x4):
    p, runs = fake_2x4
    assert {m.step for m in runs} == {1, 2}
    for m in runs:
        _holds(p, m, 0.001)


def test_a_rank_holds_its_shard_groups_fsdp_and_all_reduces_its_shards():
    hsdp, fsdp = _predict("mlp", 4, 2), _predict("mlp", 4, 1)
    assert hsdp.per_rank_peak_bytes == fsdp.per_rank_peak_bytes
    assert hsdp.reserved_peak_bytes == fsdp.reserved_peak_bytes
    assert (hsdp.world_size, hsdp.global_batch) == (8, 8 * 2)
    assert hsdp.mesh == {"dp_replicate": 2, "dp_shard": 4}
    # each unit's reduce-scatter output (its padded gradients / 4) is all-reduced over the
    # 2 replica groups: 2·(2−1)/2 of it crosses the link
    shards = fsdp.comm.reduce_scatter_bytes // 4
    assert hsdp.comm.all_reduce_bytes == shards
    assert hsdp.comm.by_dim == {"dp_shard": fsdp.comm.wire_bytes, "dp_replicate": shards}
    assert hsdp.comm.wire_bytes == fsdp.comm.wire_bytes + shards
    assert hsdp.comm.collectives == fsdp.comm.collectives + sum(
        1 for u in fsdp.units if u.grad_padded_bytes)


@pytest.mark.parametrize("parallel, said", [
    ({"mesh": "dp_replicate=2,dp_shard=4", "strategy": "zero1"}, "HSDP shards within"),
    ({"mesh": "dp_replicate=auto,dp_shard=4"}, "auto searches dp_shard"),
])
def test_hsdp_refuses_what_it_cannot_be(parallel, said):
    with pytest.raises(GraphcostError, match=said):
        analyze("zoo:mlp", batch=4, train=True, parallel=parallel)


def test_dp_replicate_alone_is_ddp_and_auto_searches_the_shard_group():
    ddp = analyze("zoo:mlp", batch=4, train=True, parallel={"mesh": "dp_replicate=4,dp_shard=1"})
    assert ddp.parallel.strategy == "ddp" and ddp.parallel.world_size == 4
    auto = analyze("zoo:mlp", batch=4, train=True, device="h100-80gb",
                   parallel={"mesh": "dp_replicate=2,dp_shard=auto"}).parallel
    assert auto.mesh == {"dp_replicate": 2, "dp_shard": 1}   # one rank's step fits an H100
