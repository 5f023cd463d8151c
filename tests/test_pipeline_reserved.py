"""A pipeline stage's rank replayed through the CUDA caching allocator's rules
(passes/parallel/pipeline_reserved.py): its tensors in the order the schedule runs its
forwards and backwards, by hand on a toy stage, and on traced stages against the
allocated peaks that MemTracker measured (tests/test_pipeline_parallel.py)."""
from __future__ import annotations

import pytest
from graphcost.passes.memory import caching_allocator
from graphcost.passes.memory.caching_allocator import replay
from graphcost.passes.memory.liveness import Storage
from graphcost.passes.parallel import pipeline_reserved
from graphcost.passes.parallel.pipeline_reserved import (
    StageTrace,
    rank_events,
    rank_reserved,
)
from graphcost.passes.parallel.schedules import events

from graphcost import analyze

MiB = 2 ** 20
U = 12 * MiB   # (≥ 10 MiB: each its own segment of exactly its size, reused only whole)


def _toy(first: bool, last: bool) -> StageTrace:
    """A stage of four nodes, two forward: ``a`` saved for the backward, ``out`` the output
    (the traced step's sum reads it at node 1), ``t`` a backward temporary, ``g`` the
    gradient — each 12 MiB; one parameter, SGD with momentum's two state tensors (as a
    shape: no step temporaries)."""
    storages = (Storage("a", U, 0, 2), Storage("out", U, 1, 1), Storage("t", U, 2, 3),
                Storage("g", U, 3, 4))
    return StageTrace(storages, 2, 4, frozenset({"g"}), (U,), (U, U), (), False, (),
                      0 if first else U, 1, U)


def test_a_first_stage_of_1f1b_holds_what_the_schedule_keeps_by_hand():
    # Stage 0 of 2, 1F1B over 4 micro-batches: F0 F1 B0 F2 B1 F3 B2 B3. In 12 MiB blocks:
    # the parameter 1; F0 adds a0 and out0 (kept for its backward: 3), F1 a1, out1 (5); B0
    # the received gradient (6), t (7), frees a0 (6), makes g — the first backward: kept (7)
    # — frees t (6), then out0 and the received gradient (4: p, a1, out1, g); F2 (6); B1 as
    # B0 but its new g is added in and gone: 6 + grad in + t = 8, the most of step 1. The
    # optimizer's state (2) is created in the cached blocks (p, g live: 2 of 8). Step 2 holds
    # the state all through: 8 + 2 = 10 blocks at its B1, two segments more. 10 × 12 MiB.
    order = [(0, op, j) for op, j in events("1f1b", 0, 2, 4)]
    r = replay(rank_events([_toy(True, False)], [False], order, 4))
    assert r.requested_peak == 10 * U
    assert r.reserved_peak == 10 * U
    # GPipe: every forward first, 4 micro-batches' a and out in flight (1 + 8), then B0's
    # grad in and t (11) — 11 in step 1, 13 in step 2 with the state
    order = [(0, op, j) for op, j in events("gpipe", 0, 2, 4)]
    assert replay(rank_events([_toy(True, False)], [False], order, 4)).reserved_peak == 13 * U


def test_a_last_stage_keeps_every_output_to_the_steps_end_by_hand():
    # Stage 1 of 2 (last), 1F1B: F0 B0 F1 B1 … Each F receives its input (1), makes a and out;
    # out (the logits) stays to the step's end (output_chunks), the input to its backward.
    # At B3: p, g, out0..out2 kept, in3, a3, out3, t = 9 blocks in step 1 (no gradient
    # received: the loss is its own). Then the outputs concatenated, 4 blocks' worth (48 MiB)
    # beside the 4 outputs and p, g: 10 blocks; step 2 holds the state (2) too: 12.
    order = [(0, op, j) for op, j in events("1f1b", 1, 2, 4)]
    r = replay(rank_events([_toy(False, True)], [True], order, 4))
    assert r.requested_peak == 12 * U
    # Reserved: step 1 maps 9 segments of 12 MiB (B3) and one of 48 MiB (the merge); the
    # state takes two cached 12 MiB blocks. Step 2's B3 needs 11: the two more are cut from
    # the cached 48 MiB segment (no free 12 MiB block is left), so its merge finds no 48 MiB
    # block free and maps another: 9 × 12 + 2 × 48 MiB = 17 blocks' worth, 5 over the peak.
    assert r.reserved_peak == 9 * U + 2 * 4 * U


def test_a_long_stage_takes_its_short_programs_reserved_ratio(monkeypatch):
    # The longer short program's rank reserves 120 MiB for 100 MiB of tensors; the long
    # stage, grown from it, peaks at 150 MiB: 150 × 1.2 = 180 MiB.
    monkeypatch.setattr(pipeline_reserved, "replay", lambda *_a, **_k: type(
        "R", (), {"reserved_peak": 120 * MiB, "requested_peak": 100 * MiB}))
    assert rank_reserved([_toy(True, False)], [False], [], 4, 150 * MiB, True) == 180 * MiB


def test_a_replay_below_the_ranks_peak_fails_loudly():
    order = [(0, op, j) for op, j in events("1f1b", 0, 2, 4)]
    with pytest.raises(caching_allocator.ReplayBelowPeak, match="pipeline stage"):
        rank_reserved([_toy(True, False)], [False], order, 4, 11 * U)


def _tiny(mesh: str, schedule: str, precision: str = "fp32", checkpoint=None):
    return analyze("zoo:llama_tiny", batch=8, train=True, optimizer="adam", what_if=False,
                   precision=precision, checkpoint=checkpoint,
                   parallel={"mesh": mesh, "microbatches": 4, "schedule": schedule}).pipeline


@pytest.mark.parametrize("mesh, schedule, precision, checkpoint", [
    ("pp=2", "1f1b", "fp32", None),
    ("pp=2", "gpipe", "bf16-master", None),
    ("pp=2,tp=2", "1f1b", "fp32", None),
    ("pp=2", "1f1b", "fp32", {"every": 1})])
def test_every_stages_replay_holds_the_step_memtracker_measured(monkeypatch, mesh, schedule,
                                                                precision, checkpoint):
    """The tensors the replay allocates are the step graphcost counts — the 1F1B rows of
    tests/test_pipeline_parallel.py hold MemTracker's within 5% — to 1%, and each stage's
    rank reserves at least its peak."""
    seen = []

    def recorded(events, **kw):
        seen.append(r := replay(events, **kw))
        return r
    monkeypatch.setattr(pipeline_reserved, "replay", recorded)
    p = _tiny(mesh, schedule, precision, checkpoint)
    assert len(seen) == 2   # (one replay a rank: no stage is long)
    for s, r in zip(p.per_stage, seen, strict=True):
        assert s.reserved_bytes is not None and s.reserved_bytes >= s.peak_bytes
        assert r.requested_peak == pytest.approx(s.peak_bytes, rel=0.01), s.stage
    assert p.peak.reserved_bytes == max(s.reserved_bytes for s in p.per_stage)


def test_a_long_stages_extrapolated_reserved_bytes_against_its_whole_replay(monkeypatch):
    """llama_tiny grown to 8 blocks on pp 2 (4 blocks a stage: read off 2- and 3-block
    programs) against the same stages traced whole: the allocated peaks equal (the long-stage
    test of tests/test_pipeline_parallel.py), the reserved bytes extrapolated within 15% of
    the whole stages' replay (here +11.7% on stage 1: 51.5 MB against 46.1 MB, where 20 MiB
    segments decide it; on Llama 3.1 8B over pp 4, 8 blocks a stage, bf16-master, full
    checkpoints, seq 8,192: −7.8% to +7.0%, benchmarks/results/pipeline_reserved.md)."""
    from dataclasses import replace

    import torch
    from graphcost.analyzer.app import pipeline_stages
    from graphcost.models_zoo import llama

    def run():
        return analyze(llama.Llama(replace(llama.TINY, n_layer=8)),
                       input_shapes={"input_ids": (8, 64)},
                       input_dtypes={"input_ids": torch.int64}, batch=8, train=True,
                       optimizer="adam", what_if=False,
                       parallel={"mesh": "pp=2", "microbatches": 4}).pipeline
    short = run()
    monkeypatch.setattr(pipeline_stages, "SHORT", 5)   # (every stage traced whole)
    whole = run()
    for s, w in zip(short.per_stage, whole.per_stage, strict=True):
        assert s.reserved_extrapolated and not w.reserved_extrapolated
        assert s.peak_bytes == w.peak_bytes
        assert s.reserved_bytes is not None and w.reserved_bytes is not None
        assert s.reserved_bytes >= s.peak_bytes
        assert abs(s.reserved_bytes / w.reserved_bytes - 1) <= 0.15, (s.stage, s.reserved_bytes,
                                                                     w.reserved_bytes)
