"""The caching-allocator model on hand-made allocation sequences. Every expected number follows
from the rules of c10/cuda/CUDACachingAllocator.cpp by the arithmetic in the comments:
requests round up to 512 B; ≤ 1 MiB is the small pool (2 MiB segments); a large request under
10 MiB gets a 20 MiB segment, from 10 MiB up the request rounded up to 2 MiB; a large block is
split when more than 1 MiB would be left over, a small one when ≥ 512 B would."""
from __future__ import annotations

import time

import pytest
from graphcost.passes.memory.allocator_events import (
    events_from_liveness,
    training_events,
)
from graphcost.passes.memory.caching_allocator import Alloc, Free, replay
from graphcost.passes.memory.liveness import Storage

from graphcost import analyze
from tests.onnx_builders import model, node

MiB = 1 << 20


def test_a_one_byte_tensor_reserves_a_small_segment_and_allocates_512_bytes():
    # 1 B -> round_size 512 B; ≤ 1 MiB: small pool, a new 2 MiB segment
    r = replay([Alloc("a", 1)])
    assert (r.requested_peak, r.allocated_peak, r.reserved_peak) == (1, 512, 2 * MiB)
    assert [(s.pool, s.size) for s in r.segments] == [("small", 2 * MiB)]
    # 513 B -> 1,024 B; the second comes from the first segment's 2 MiB − 512 B remainder
    r = replay([Alloc("a", 1), Alloc("b", 513)])
    assert (r.allocated_peak, r.reserved_peak, r.device_allocs) == (512 + 1024, 2 * MiB, 1)


def test_a_20_mib_segment_serves_several_mid_size_blocks():
    # 5 MiB < 10 MiB: a 20 MiB segment, split 5 | 15 (15 > 1 MiB left); the second 5 MiB takes
    # the 15 (best fit) -> 5 | 5 | 10; the third -> 5 | 5 | 5 | 5; the fourth takes the last 5
    # unsplit (0 left); the fifth finds nothing free: a second 20 MiB segment.
    r = replay([Alloc(i, 5 * MiB) for i in range(4)])
    assert (r.allocated_peak, r.reserved_peak, len(r.segments)) == (20 * MiB, 20 * MiB, 1)
    r = replay([Alloc(i, 5 * MiB) for i in range(5)])
    assert (r.reserved_peak, len(r.segments)) == (40 * MiB, 2)


def test_a_large_block_cannot_reuse_a_freed_smaller_one():
    # 12 MiB ≥ 10 MiB: a 12 MiB segment (rounded to 2 MiB). Freed, it stays cached; 14 MiB does
    # not fit in it: a 14 MiB segment more -> 26 MiB reserved while 14 MiB is allocated.
    r = replay([Alloc("a", 12 * MiB), Free("a"), Alloc("b", 14 * MiB)])
    assert (r.allocated_peak, r.reserved_peak, r.reserved_end) == (14 * MiB, 26 * MiB, 26 * MiB)
    assert [s.size for s in r.segments] == [12 * MiB, 14 * MiB]
    assert r.fragmentation == pytest.approx(26 / 14 - 1, abs=1e-6)
    # 11 MiB rounds up to a 12 MiB segment (kRoundLarge 2 MiB)
    assert replay([Alloc("a", 11 * MiB)]).reserved_peak == 12 * MiB


def test_a_block_freed_on_one_stream_serves_no_other():
    # 12 MiB on stream 0, freed: cached in stream 0's large pool. 12 MiB on stream 1 cannot take
    # it (the pool's set orders by stream first, get_free_block matches the stream): a second
    # 12 MiB segment -> 24 MiB reserved; on stream 0 again it is reused -> still 24 MiB
    r = replay([Alloc("a", 12 * MiB), Free("a"), Alloc("b", 12 * MiB, stream=1), Free("b"),
                Alloc("c", 12 * MiB)])
    assert (r.allocated_peak, r.reserved_peak, r.device_allocs) == (12 * MiB, 24 * MiB, 2)
    # small requests likewise: 1 KiB on streams 0 and 1 -> two 2 MiB segments
    r = replay([Alloc("a", 1024), Alloc("b", 1024, stream=1)])
    assert r.reserved_peak == 4 * MiB
    # expandable segments: one per stream and pool: 5 MiB on each of two streams maps one
    # 20 MiB page each -> 40 MiB
    r = replay([Alloc("a", 5 * MiB), Alloc("b", 5 * MiB, stream=1)], expandable=True)
    assert r.reserved_peak == 40 * MiB


def test_a_cached_block_is_split_only_when_over_1_mib_would_be_left():
    # 6 MiB into the cached 12 MiB block: 6 MiB left > 1 MiB, split; a second 6 MiB takes the rest
    r = replay([Alloc("a", 12 * MiB), Free("a"), Alloc("b", 6 * MiB), Alloc("c", 6 * MiB)])
    assert (r.allocated_peak, r.reserved_peak, r.device_allocs) == (12 * MiB, 12 * MiB, 1)
    # 11.5 MiB into it: 0.5 MiB left ≤ 1 MiB, not split: the whole 12 MiB block is allocated
    # (max_memory_allocated counts block sizes)
    r = replay([Alloc("a", 12 * MiB), Free("a"), Alloc("b", 11 * MiB + MiB // 2)])
    assert (r.allocated_end, r.reserved_end) == (12 * MiB, 12 * MiB)
    # small pool: 1,000 B -> 1,024 B; the 2 MiB segment's remainder (≥ 512 B) serves 2,047
    # more 1,024 B blocks: 2,048 × 1,024 B = 2 MiB, one segment; the 2,049th needs a second
    r = replay([Alloc(i, 1000) for i in range(2048)])
    assert (r.allocated_peak, r.reserved_peak) == (2 * MiB, 2 * MiB)
    assert replay([Alloc(i, 1000) for i in range(2049)]).reserved_peak == 4 * MiB


def test_freed_neighbours_coalesce():
    # one 20 MiB segment as 5 | 5 | 5 | 5 (see above); freeing all four merges them into one
    # 20 MiB block, which an 18 MiB request reuses (split: 2 MiB left > 1 MiB): still 20 MiB
    allocs = [Alloc(i, 5 * MiB) for i in range(4)]
    frees = [Free(i) for i in (0, 2, 1, 3)]
    r = replay([*allocs, *frees, Alloc("big", 18 * MiB)])
    assert (r.reserved_peak, len(r.segments)) == (20 * MiB, 1)
    # blocks 0 and 2 freed are not neighbours: 5 MiB free twice, no 9 MiB block -> new 20 MiB
    r = replay([*allocs, Free(0), Free(2), Alloc("nine", 9 * MiB)])
    assert r.reserved_peak == 40 * MiB
    # 0 and 1 are: a 10 MiB block, which takes 9 MiB (1 MiB left: not split)
    r = replay([*allocs, Free(0), Free(1), Alloc("nine", 9 * MiB)])
    assert (r.reserved_peak, r.allocated_peak) == (20 * MiB, 20 * MiB)


def test_max_split_size_keeps_oversize_blocks_whole():
    mss = 64 * MiB  # PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:64
    big = [Alloc("a", 100 * MiB), Free("a")]   # a cached 100 MiB segment, oversize
    # 30 MiB < 64 never takes an oversize block: a 30 MiB segment more (without the option
    # it is carved out of the 100 MiB one)
    assert replay([*big, Alloc("b", 30 * MiB)], max_split_size=mss).reserved_peak == 130 * MiB
    assert replay([*big, Alloc("b", 30 * MiB)]).reserved_peak == 100 * MiB
    # 90 MiB ≥ 64 takes it, since 100 < 90 + 20 MiB, unsplit: 100 MiB allocated
    r = replay([*big, Alloc("b", 90 * MiB)], max_split_size=mss)
    assert (r.reserved_peak, r.allocated_end) == (100 * MiB, 100 * MiB)
    # 70 MiB does not: 100 ≥ 70 + 20 MiB -> a 70 MiB segment more
    assert replay([*big, Alloc("b", 70 * MiB)], max_split_size=mss).reserved_peak == 170 * MiB
    with pytest.raises(ValueError, match="max_split_size"):
        replay([], max_split_size=8 * MiB)   # PyTorch refuses max_split_size_mb under 20


def test_expandable_segments_grow_by_pages():
    # large pool: pages of 20 MiB. 5 MiB maps one page (split 5 | 15); 30 MiB: the 15 MiB free
    # at the end grows by one page to 35 MiB and is split 30 | 5 -> 40 MiB reserved (without:
    # a 20 MiB and a 30 MiB segment, 50 MiB)
    events = [Alloc("a", 5 * MiB), Alloc("b", 30 * MiB)]
    r = replay(events, expandable=True)
    assert (r.reserved_peak, r.allocated_peak) == (40 * MiB, 35 * MiB)
    assert [(s.pool, s.size, s.expandable) for s in r.segments] == [("large", 40 * MiB, True)]
    assert replay(events).reserved_peak == 50 * MiB
    # the freed 12 MiB merges with the 8 MiB after it: 14 MiB fits, 20 MiB (default: 26)
    r = replay([Alloc("a", 12 * MiB), Free("a"), Alloc("b", 14 * MiB)], expandable=True)
    assert r.reserved_peak == 20 * MiB
    # pages are mapped whole: 21 MiB maps two, 40 MiB (default: one 22 MiB segment)
    assert replay([Alloc("a", 21 * MiB)], expandable=True).reserved_peak == 40 * MiB
    # small pool: pages of 2 MiB; 1 B still allocates 512 B
    r = replay([Alloc("a", 1)], expandable=True)
    assert (r.allocated_peak, r.reserved_peak) == (512, 2 * MiB)
    # 3 × 768 KiB: two fit the first page (0.5 MiB left), the third grows the end by a page:
    # one 4 MiB segment (default: two 2 MiB segments)
    small = [Alloc(i, 768 << 10) for i in range(3)]
    assert [s.size for s in replay(small, expandable=True).segments] == [4 * MiB]
    assert [s.size for s in replay(small).segments] == [2 * MiB, 2 * MiB]


def test_expandable_takes_the_growable_end_block_last():
    # one 20 MiB page: 6 | 6 | 6 | 2 free at the end; free the first two -> 12 free | 6 | 2 free.
    # A 2 MiB request fits both free blocks; the end one counts as 2 MiB plus the unmapped
    # address space, so the 12 MiB one is split (2 | 10). An 11 MiB request then fits neither
    # (10, 2): the end grows by one page -> 40 MiB. (Best fit by size alone would have put the
    # 2 MiB at the end and the 11 MiB into the 12 MiB block: 20 MiB.)
    events = [Alloc(i, 6 * MiB) for i in range(3)] + [Free(0), Free(1)]
    r = replay([*events, Alloc("x", 2 * MiB), Alloc("y", 11 * MiB)], expandable=True)
    assert r.reserved_peak == 40 * MiB


def test_capacity_frees_cached_segments_and_retries_before_running_out():
    # 30 MiB to reserve: a 20 MiB segment cached, a 22 MiB one asked for: 42 > 30, so the cached
    # segment is freed (release_cached_blocks) and the cudaMalloc retried: 22 MiB held after
    events = [Alloc("a", 20 * MiB), Free("a"), Alloc("b", 22 * MiB)]
    r = replay(events, capacity=30 * MiB)
    assert (r.alloc_retries, r.reserved_end, r.reserved_peak, r.oom_event) == \
        (1, 22 * MiB, 22 * MiB, None)
    assert replay(events).reserved_peak == 42 * MiB
    # nothing cached to free: 20 + 12 MiB > 30 MiB is an OutOfMemoryError at event 1
    r = replay([Alloc("a", 20 * MiB), Alloc("b", 12 * MiB), Free("a")], capacity=30 * MiB)
    assert (r.oom_event, r.reserved_end) == (1, 20 * MiB)
    # max_split_size_mb:40: a 30 MiB request frees the cached oversize 70 MiB segment
    # first (release_available_cached_blocks), no retry counted: 70 + 30 > 90 MiB
    r = replay([Alloc("a", 70 * MiB), Free("a"), Alloc("b", 30 * MiB)], capacity=90 * MiB,
               max_split_size=40 * MiB)
    assert (r.alloc_retries, r.reserved_peak, r.reserved_end) == (0, 70 * MiB, 30 * MiB)


def test_events_are_checked_and_empty_tensors_allocate_nothing():
    r = replay([Alloc("e", 0), Free("e")], timeline=True)
    assert (r.reserved_peak, r.reserved_timeline, r.allocated_timeline) == (0, (0, 0), (0, 0))
    with pytest.raises(ValueError, match="twice"):
        replay([Alloc("a", 1), Alloc("a", 1)])
    with pytest.raises(ValueError, match="freed but not allocated"):
        replay([Free("a")])


def test_a_liveness_timeline_replays_with_its_own_peak():
    # x -> Relu a -> Relu b -> Relu c, 1 KiB each (1×256 float32): node 0 allocates a while x is
    # live, then frees x; node 1 puts b into x's freed 1 KiB block; node 2 puts c into a's.
    # Peak 2 KiB requested = allocated (1 KiB is a multiple of 512); one 2 MiB small segment.
    chain = model([node("Relu", ["x"], ["a"]), node("Relu", ["a"], ["b"]),
                   node("Relu", ["b"], ["c"])], [("x", [1, 256])], [("c", [1, 256])])
    live = analyze(chain).memory
    events = events_from_liveness(live)
    assert [type(e).__name__ for e in events[:4]] == ["Alloc", "Alloc", "Free", "Alloc"]
    r = replay(events, timeline=True)
    assert (r.requested_peak, r.allocated_peak, r.reserved_peak) == (2048, 2048, 2 * MiB)
    assert r.requested_peak == live.peak_bytes
    # resident tensors come first and stay: 3 MiB of weights -> a 20 MiB segment besides
    r = replay(events_from_liveness(live, resident=[("w", 3 * MiB)]))
    assert (r.requested_peak, r.reserved_peak) == (3 * MiB + 2048, 22 * MiB)


def test_a_training_step_replays_consistently_with_graphcost_liveness():
    # the joint forward+backward graph's activations and gradients (TrainingMemory.storages)
    training = analyze("zoo:mlp", train=True, what_if=False).training
    storages = training.storages
    r = replay(events_from_liveness(storages))
    # the training timeline is the persistent bytes plus these storages at each node
    persistent = training.param_bytes + training.buffer_bytes + \
        training.optimizer_state_bytes
    assert r.requested_peak == max(training.timeline[:-1]) - persistent
    assert r.requested_peak <= r.allocated_peak <= r.reserved_peak
    # a block is its request rounded up by less than 512 B, unless left unsplit (large pool:
    # up to 1 MiB more)
    assert r.allocated_peak < r.requested_peak + (1 << 20) * len(storages)


def test_replay_is_near_linear():
    # 100k events, 2,000 tensors live at once over both pools (sizes up to 3 MiB): a scan of
    # the free blocks per event would take minutes; bisected free lists, a fraction of a second
    events = []
    for i in range(50_000):
        events.append(Alloc(i, (i * 7919) % (3 * MiB) + 1))
        if i >= 2000:
            events.append(Free(i - 2000))
    start = time.perf_counter()
    r = replay(events)
    assert time.perf_counter() - start < 5.0
    assert r.reserved_peak >= r.allocated_peak >= r.requested_peak > 0


def test_storages_given_directly():
    # two tensors of 1 MiB + 1 B (-> 1 MiB + 512 B, large pool: a 20 MiB segment, split), one
    # after the other: the first dies at node 0, the second is born at node 1 and reuses it
    storages = (Storage("p", MiB + 1, 0, 0), Storage("q", MiB + 1, 1, 1))
    r = replay(events_from_liveness(storages))
    assert (r.allocated_peak, r.reserved_peak, r.device_allocs) == (MiB + 512, 20 * MiB, 1)


def test_the_report_carries_the_reserved_peak_of_an_inference_run():
    # x (3,145,728 fp32 = 12 MiB) -> Relu -> y (12 MiB) -> Relu -> z: x, then y while x is live,
    # each ≥ 10 MiB (kMinLargeAlloc) so each gets its own segment of its size rounded to 2 MiB:
    # 12 + 12 = 24 MiB; z (12 MiB) is allocated while y is live and x is freed: it reuses x's
    # block. Reserved 25,165,824 B against the liveness peak 24 MiB as well.
    m = model([node("Relu", ["x"], ["y"], name="r1"), node("Relu", ["y"], ["z"], name="r2")],
              [("x", [3, 1024, 1024])], [("z", [3, 1024, 1024])])
    r = analyze(m)
    assert r.memory.reserved_peak_bytes == 24 * 2**20
    # a 2-element graph: one 512 B block each, carved out of one 2 MiB small segment (kSmallBuffer)
    tiny = model([node("Relu", ["x"], ["y"], name="r")], [("x", [2])], [("y", [2])])
    assert analyze(tiny).memory.reserved_peak_bytes == 2 * 2**20


def test_two_training_steps_by_hand():
    # One 12 MiB parameter P, activation A (node 0 → 1), gradient G (node 1, kept to the step),
    # Adam: state m, v (12 MiB each) + a 4 B step counter; for-loop temporaries sqrt, denom.
    # Every 12 MiB request (≥ kMinLargeAlloc 10 MiB) gets a segment of its size (2 MiB-rounded)
    # or the lowest free 12 MiB block:
    #   P → s1. Step 1: A → s2, G → s3, A freed; m takes s2, v → s4, the counter a 2 MiB small
    #   segment s5; sqrt → s6, denom → s7, both freed; G freed.
    #   Step 2: A → s3, G → s6, A freed; sqrt → s3, denom → s7; all freed.
    # Reserved: six 12 MiB segments + 2 MiB = 74 MiB.
    storages = [Storage("A", 12 * MiB, 0, 1), Storage("G", 12 * MiB, 1, 1)]
    events = training_events(storages, resident=[("P", 12 * MiB)], grads=frozenset({"G"}),
                             state=[12 * MiB, 12 * MiB, 4], step_sizes=[12 * MiB],
                             foreach=False)
    assert replay(events).reserved_peak == 74 * MiB
    # foreach: the step's temporaries exist together (one per parameter: here one, 12 MiB), so
    # step 1 needs s6 only and step 2 reuses it: 5 × 12 + 2 = 62 MiB
    events = training_events(storages, resident=[("P", 12 * MiB)], grads=frozenset({"G"}),
                             state=[12 * MiB, 12 * MiB, 4], step_sizes=[12 * MiB],
                             foreach=True)
    assert replay(events).reserved_peak == 62 * MiB


def test_a_master_weights_step_allocates_the_fp32_gradient_copies():
    # The foreach case above with an fp32 master copy: the step runs on an fp32 copy F of the
    # gradient (12 MiB), allocated before the step's temporary and freed after it. Step 1:
    # A → s2, G → s3, A freed; m takes s2, v → s4, the counter s5 (2 MiB); F → s6 (no free
    # 12 MiB block), the temporary → s7, both freed; G freed. Step 2: A → s3, G → s6, A
    # freed; F → s3, the temporary → s7. Reserved: six 12 MiB segments + 2 MiB = 74 MiB
    # (62 MiB without F).
    storages = [Storage("A", 12 * MiB, 0, 1), Storage("G", 12 * MiB, 1, 1)]
    events = training_events(storages, resident=[("P", 12 * MiB)], grads=frozenset({"G"}),
                             state=[12 * MiB, 12 * MiB, 4], step_sizes=[12 * MiB],
                             foreach=True, master_grads=[12 * MiB])
    assert replay(events).reserved_peak == 74 * MiB


@pytest.mark.parametrize("precision", ["fp32", "bf16-master", "bf16-true"])
def test_reserved_is_never_below_the_allocated_peak(precision):
    # the allocator reserves every byte it hands out: a master-weights step used to leave its
    # fp32 gradient copies out of the replay (llama_tiny: 12.00 MiB reserved, 12.99 MiB peak)
    r = analyze("zoo:llama_tiny", zoo_exporter="fx", train=True, optimizer="adamw",
                precision=precision, what_if=False)
    assert r.training.reserved_peak_bytes >= r.training.peak_bytes


def test_the_training_report_carries_the_reserved_peak():
    r = analyze("zoo:mlp", train=True, optimizer="adam")
    assert r.training.reserved_peak_bytes >= r.training.peak_bytes
    assert '"reserved_peak_bytes"' in r.to_json()


def test_the_allocator_settings_reach_the_report(tmp_path):
    # --allocator / allocator= take PYTORCH_CUDA_ALLOC_CONF's words. Two Linears over
    # x[1, 1024], fp32: W1 1024×1024 = 4 MiB, W2 5,632×1024 = 22 MiB, and small tensors (the
    # biases, x and the outputs, each ≤ 22 KiB). Default: W1 (a large request under 10 MiB)
    # gets a 20 MiB segment; W2 (22 MiB) does not fit its 16 MiB remainder and takes a
    # segment of its own, rounded to 2 MiB: 22 MiB; the small tensors one 2 MiB segment:
    # 20 + 22 + 2 = 44 MiB. expandable_segments:True: one large segment mapped in 20 MiB
    # pages at its end, 4 + 22 = 26 MiB used -> 2 pages, 40 MiB; the small pool one 2 MiB
    # page: 42 MiB
    import torch

    from graphcost import GraphcostError

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 5632)

        def forward(self, x):
            return self.b(self.a(x))
    x = (torch.randn(1, 1024),)
    default = analyze(Two(), x, device="a100-80gb")
    expandable = analyze(Two(), x, device="a100-80gb", allocator="expandable_segments:True")
    assert default.memory.reserved_peak_bytes == 44 * MiB
    assert expandable.memory.reserved_peak_bytes == 42 * MiB
    assert expandable.allocator == "expandable_segments:True" and default.allocator == ""
    assert "expandable_segments:True" in expandable.roofline.fit.parts[0].source
    with pytest.raises(GraphcostError, match="not modelled"):
        analyze(Two(), x, allocator="roundup_power2_divisions:4")
    with pytest.raises(GraphcostError, match="over 20"):
        analyze(Two(), x, allocator="max_split_size_mb:8")


def test_a_replay_cut_into_phases():
    # phase a: 1 MiB (the small pool: a 2 MiB segment): 2 MiB reserved, 1 MiB handed out;
    # b: 3 MiB (a large request under 10 MiB: a 20 MiB segment, split), freed again: 22 MiB
    # reserved, 4 MiB at most; c: 5 MiB takes the cached 20 MiB block: still 22 MiB, 6 MiB at
    # most. A free continues its phase; the last phase's figure is the reserved peak
    from graphcost.passes.memory.allocator_events import PhaseReserve, replay_by_phase

    events = [Alloc(("a", 0), MiB), Alloc(("b", 0), 3 * MiB), Free(("b", 0)),
              Alloc(("c", 0), 5 * MiB)]
    peak, phases = replay_by_phase(events, lambda ev: ev.id[0])
    assert phases == (PhaseReserve("a", 2 * MiB, MiB), PhaseReserve("b", 22 * MiB, 4 * MiB),
                      PhaseReserve("c", 22 * MiB, 6 * MiB))
    assert peak == 22 * MiB
