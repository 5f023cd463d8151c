"""One peak shape (passes/memory/peak.py): every section that has a peak gives it as a ``Peak``,
the report's ``peak`` is the one the device fit judges, and the fit is that peak's — the
same answer the four branches of the fit gave before the shape existed (each case below
spells its branch's old call out)."""
from __future__ import annotations

import json

import pytest
from graphcost.analyzer.app.devices import get_device
from graphcost.passes.device.fits import fit

from graphcost import analyze

MLP_PARAMS = 4 * (256 * 512 + 512 + 512 * 256 + 256) + (256 * 10 + 10)   # models_zoo/mlp.py


@pytest.fixture(scope="module")
def inference():
    return analyze("zoo:mlp", device="h100")


def _json_peaks(report, section: str) -> tuple[dict, dict]:
    body = json.loads(report.to_json())
    return body["peak"], body[section]["peak"]


def test_inference_peak_by_hand(inference):
    r = inference
    # zoo:mlp: four blocks of Linear(256→512) + Linear(512→256), each with its bias, and a
    # Linear(256→10) head: 4 × (131,072 + 512 + 131,072 + 256) + 2,570 = 1,054,218 fp32
    # parameters, 4 B each
    assert MLP_PARAMS == 1_054_218
    p = r.peak
    assert p.by_category["params"] == 4 * MLP_PARAMS == 4_216_872
    assert p.by_category["buffers"] == 0
    # batch 1, dataflow lifetimes (ONNX): the first ReLU holds its input and output, 512 fp32
    # each: 2 × 512 × 4 = 4,096 B (the 256-wide tensors around it are smaller)
    assert p.by_category["activations"] == 2 * 512 * 4
    assert p.allocated_bytes == 4_216_872 + 4_096
    assert (p.phase, p.threads, p.world_size) == ("inference", 1, 1)


def test_inference_peak_is_the_memory_sections(inference):
    r, m = inference, inference.memory
    assert r.peak == m.peak
    assert r.peak.allocated_bytes == r.peak_bytes
    assert r.peak.reserved_bytes == m.reserved_peak_bytes is not None
    assert r.peak.node == m.peak_node
    # the old branch: the report's peak on the inference replay, workspaces in it
    assert r.roofline.fit == fit(get_device("h100"), r.peak_bytes,
                                 reserved_bytes=m.reserved_peak_bytes, workspaces_replayed=True)
    top, section = _json_peaks(r, "memory")
    assert top == section and top["allocated_bytes"] == r.peak_bytes


def test_training_peak_is_the_steps():
    r = analyze("zoo:mlp", train=True, device="a100-80gb")
    t = r.training
    assert r.peak == t.peak
    assert (r.peak.allocated_bytes, r.peak.reserved_bytes) == (t.peak_bytes,
                                                               t.reserved_peak_bytes)
    assert r.peak.reserved_bytes is not None
    assert (r.peak.phase, r.peak.node) == (t.peak_phase, t.peak_node)
    assert r.peak.by_category == t.breakdown_at_peak
    assert r.peak.threads == 2     # the backward runs on autograd's own thread
    assert r.roofline.fit == fit(get_device("a100-80gb"), t.peak_bytes,
                                 reserved_bytes=t.reserved_peak_bytes, threads=2,
                                 workspaces_replayed=True)
    top, section = _json_peaks(r, "training")
    assert top == section


def test_a_checkpoint_plans_peak_is_the_checkpointed_step_replayed(monkeypatch):
    # batch 2,048: the activations, not the optimizer step, make the peak, so the plan moves it
    from graphcost.passes.memory import allocator_events
    seen = []

    def recorded(events, **kw):
        seen.append(r := replay(events, **kw))
        return r
    replay = allocator_events.replay
    monkeypatch.setattr(allocator_events, "replay", recorded)
    r = analyze("zoo:mlp", batch=2048, train=True, checkpoint={"every": 1},
                device="a100-80gb")
    c = r.training.checkpoint
    assert c is not None and c.peak_bytes < c.peak_without_bytes
    p = r.peak
    assert p == r.training.peak
    assert (p.allocated_bytes, p.reserved_bytes, p.phase) == \
        (c.peak_bytes, c.reserved_peak_bytes, c.peak_phase)
    # the step that runs is replayed (the plain step beside it is not), with two cuBLAS
    # workspaces on an A100 (sm80: 4,096·2 + 16·8 KiB = 8,519,680 B each) and its kernels'
    # temporaries; without a GPU's, its tensors are the plan's peak to the byte
    assert len(seen) == 1 and seen[0].requested_peak >= c.peak_bytes + 2 * 8_519_680
    assert c.reserved_peak_bytes >= seen[0].requested_peak
    assert r.training.reserved_peak_bytes is None
    analyze("zoo:mlp", batch=2048, train=True, checkpoint={"every": 1})
    assert seen[1].requested_peak == c.peak_bytes
    # the plain step stays the report's peak_bytes; the fit judges the plan, on its replay
    assert r.peak_bytes == r.training.peak_bytes != p.allocated_bytes
    f = r.roofline.fit
    assert f == fit(get_device("a100-80gb"), c.peak_bytes, reserved_bytes=c.reserved_peak_bytes,
                    threads=2, workspaces_replayed=True)
    assert f.parts[0].bytes == c.reserved_peak_bytes


def test_an_fsdp_ranks_peak_is_the_ranks():
    r = analyze("zoo:mlp", train=True, parallel={"strategy": "fsdp", "world_size": 8},
                device="h100")
    q = r.parallel
    p = r.peak
    assert p == q.peak
    assert (p.allocated_bytes, p.reserved_bytes) == (q.per_rank_peak_bytes,
                                                     q.reserved_peak_bytes)
    assert (p.phase, p.node, p.threads, p.world_size) == (q.peak_phase, q.peak_node, 2, 8)
    # the rank's categories, gradients in the peak's word
    assert p.by_category["gradients"] == q.breakdown_at_peak["grads"]
    assert sum(p.by_category.values()) == sum(q.breakdown_at_peak.values())
    assert r.roofline.fit == fit(get_device("h100"), q.per_rank_peak_bytes,
                                 reserved_bytes=q.reserved_peak_bytes, threads=2, world=8,
                                 workspaces_replayed=True)
    top, section = _json_peaks(r, "parallel")
    assert top == section


def test_a_serving_batchs_peak_is_weights_cache_and_the_larger_working_peak():
    r = analyze("zoo:gpt2", serve={"prompt": 64, "generate": 32}, device="h100")
    s = r.serving
    p = r.peak
    assert p == s.peak
    work = max(s.prefill.peak_bytes, s.decode.peak_bytes)
    assert p.by_category == {"weights": s.weight_bytes, "kv_cache": s.kv_cache_bytes,
                             "activations": work}
    assert p.allocated_bytes == s.weight_bytes + s.kv_cache_bytes + work
    assert p.reserved_bytes == s.reserved_peak_bytes
    assert p.phase == ("prefill" if s.prefill.peak_bytes > s.decode.peak_bytes else "decode")
    # the serving section's own fit is the report's, and is the peak's
    assert s.fit is not None and r.roofline.fit == s.fit == p.fit(get_device("h100"))
    assert s.fit == fit(get_device("h100"), p.allocated_bytes,
                        reserved_bytes=s.reserved_peak_bytes, workspaces_replayed=True)
    top, section = _json_peaks(r, "serving")
    assert top == section
