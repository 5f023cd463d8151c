"""Pipeline parallelism (``--parallel pp=P``, ``microbatches``, ``schedule``) against real
``torch.distributed.pipelining`` steps: two gloo ranks (127.0.0.1), the zoo Llama and
transformers' Llama (2 blocks, one a stage) cut as graphcost cuts them, 4 micro-batches of 2 sequences, GPipe and 1F1B, Adam,
torchtitan's fp32 cross-entropy, every stage's peak in step 2 (analyzer/measure/pipeline.py).

What the runs showed when this landed (2026-12-02, torch 2.13):

=========  =====  ===========  ===========  =======
schedule   stage  predicted    measured     error
=========  =====  ===========  ===========  =======
GPipe      0      10,087,548   10,091,624   −0.04%
GPipe      1      15,144,588   14,883,468   +1.75%
1F1B       0       8,259,700    8,460,392   −2.37%
1F1B       1      10,116,212   10,118,784   −0.03%
=========  =====  ===========  ===========  =======

transformers' Llama (cut as a TransformersStage: ``inputs_embeds`` after the first stage,
identity norm and head before the last): GPipe −0.09% and +1.80%, 1F1B −2.63% and −0.05%.

GPipe's last stage holds all four micro-batches' logits (2 × 64 × 1,000 fp32 = 512,000 B
each) to the end of the step, as ``schedule.step()`` returns them: 2 MB its 1F1B twin does not
hold at its peak, where one micro-batch is in flight instead of four.
"""
from __future__ import annotations

import pytest
from graphcost.analyzer.measure.pipeline import measure_pipeline
from graphcost.passes.errors import GraphcostError

from graphcost import analyze

SCHEDULES = ("gpipe", "1f1b")


def _predict(schedule, model="llama_tiny"):
    return analyze(f"zoo:{model}", batch=8, train=True, optimizer="adam", what_if=False,
                   parallel={"mesh": "pp=2", "microbatches": 4, "schedule": schedule}).pipeline


@pytest.fixture(scope="module", params=[(m, s) for m in ("llama_tiny", "hf_llama")
                                        for s in SCHEDULES])
def run(request):
    model, schedule = request.param
    return schedule, _predict(schedule, model), measure_pipeline(model, schedule, 2, 8, 4)


def test_every_stage_within_five_percent_of_the_real_step(run):
    schedule, p, measured = run
    assert [s.stage for s in p.per_stage] == [0, 1]
    for s in p.per_stage:
        step2 = measured[s.stage][1]
        assert abs(s.peak_bytes / step2 - 1) <= 0.05, (schedule, s.stage, s.peak_bytes, step2)


def test_the_schedules_hold_what_their_orders_keep_in_flight():
    gpipe, one = _predict("gpipe"), _predict("1f1b")
    # GPipe: every stage holds all 4 micro-batches; 1F1B: stage i at most p − i = 2, 1
    for s in (*gpipe.per_stage, *one.per_stage):   # the parts sum to the stage's peak
        assert sum(s.breakdown_at_peak.values()) == s.peak_bytes
        assert min(s.breakdown_at_peak.values()) >= 0
    assert [s.in_flight for s in gpipe.per_stage] == [4, 4]
    assert [s.in_flight for s in one.per_stage] == [2, 1]
    assert gpipe.peak_bytes > one.peak_bytes and one.worst_stage == 1
    last = one.per_stage[1]
    assert last.output_bytes == 2 * 64 * 1000 * 4           # a micro-batch's fp32 logits
    assert [s.layers for s in one.per_stage] == [(0, 1), (1, 2)]
    assert one.bubble == pytest.approx(1 / 5)               # (p − 1) / (m + p − 1)
    assert (one.micro_batch, one.per_rank_batch) == (2, 8)


def test_the_worst_stage_decides_the_fit():
    r = analyze("zoo:llama_tiny", batch=8, train=True, optimizer="adam", what_if=False,
                device="h100-sxm", parallel={"mesh": "pp=2", "microbatches": 4})
    p = r.pipeline
    assert r.peak.allocated_bytes == r.peak_bytes == p.peak_bytes
    # the fit's first part is the worst stage's tensors, with the allocator's allowance (no
    # replay for a stage), not the whole model's step at one micro-batch
    assert p.peak_bytes <= r.roofline.fit.parts[0].bytes <= 1.2 * p.peak_bytes


@pytest.mark.parametrize("parallel, said", [
    ({"mesh": "pp=2", "microbatches": 3}, "must divide into that many micro-batches"),
    ({"mesh": "pp=2", "microbatches": 1}, "1F1B needs at least"),
    ({"mesh": "pp=2", "schedule": "zb"}, "known: gpipe, 1f1b"),
    ({"mesh": "pp=2,dp_shard=2"}, "pp alone is"),
    ({"mesh": "pp=3"}, "2 blocks cannot fill 3 stages"),
    ({"mesh": "dp_shard=2", "microbatches": 2}, "go with pipeline stages"),
])
def test_what_a_pipeline_cannot_be_is_refused_by_name(parallel, said):
    with pytest.raises(GraphcostError, match=said):
        analyze("zoo:llama_tiny", batch=8, train=True, parallel=parallel)


def test_a_model_that_is_not_a_decoder_is_refused():
    with pytest.raises(GraphcostError, match="torchtitan-style decoders"):
        analyze("zoo:hf_bert", batch=8, train=True, parallel={"mesh": "pp=2"})
