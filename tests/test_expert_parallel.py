"""Expert parallelism (``--parallel dp_shard=D,ep=E``): a transformers Mixtral's rank traced with
its experts rewritten into the rank's slice and torchtitan's all-to-all token exchange
(analyzer/frontends/torch/expert_parallel.py), against real steps on two gloo ranks running
torchtitan's dispatcher around the same model (analyzer/measure/expert_plan.py), measured by
FSDPMemTracker, and against hand arithmetic.

The model: zoo hf_mixtral grown to 8 experts of 256 (d 64, 2 layers, top-2, vocab 512), batch
2 × 128 tokens a rank, trained with its own cross-entropy and Adam. A rank's tokens route to
the experts as its router says, so the two ranks differ (here graphcost's figure is −3.9% and
+4.3% of theirs in step 1, −2.3% and +3.6% in step 2: rank 0 receives more rows); graphcost
traces balanced routing, the estimate between them.
"""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.measure.parallel import Case
from graphcost.models_zoo import hf
from graphcost.passes.errors import GraphcostError
from graphcost.passes.parallel.mesh import parse_mesh

from graphcost import analyze
from tests.shared import (
    EXPERTS_WHOLE,
    assert_ranks_within,
    measured_steps,
    read_in_range,
    recorded_peaks,
)

GROWN = (("num_local_experts", 8), ("intermediate_size", 256))
BATCH, SEQ, D = 2, 128, 64
RECIPES = ("fp32", "bf16-master")


def _model():
    torch.manual_seed(0)
    return hf.mixtral(**dict(GROWN))


def _predict(mesh: str, precision: str = "fp32"):
    ids = torch.randint(0, 512, (BATCH, SEQ))
    return analyze(_model(), example_inputs=(ids,), train=True, optimizer="adam",
                   include_inputs=False, precision=precision,
                   parallel={"mesh": mesh}).parallel


@pytest.fixture(scope="module")
def predicted():
    return {r: _predict("dp_shard=2,ep=2", r) for r in RECIPES}


# beside context parallelism: SDPA (the ring's), as many key/value heads as query heads (the
# measured ring's), top-4 routing, 2 × 256 tokens a ring
RING = (("attn", "sdpa"), ("num_key_value_heads", 4), *GROWN, ("num_experts_per_tok", 4))
RING_SEQ = 256


@pytest.fixture(scope="module")
def measured(request):
    # (one spawn: the ep cases and, the same 2 ranks as a ring, cp beside ep)
    units = ("model.layers.0", "model.layers.1")
    cases = [Case("hf_mixtral", "fsdp", BATCH, (("input_ids", (BATCH, SEQ)),), units,
                  precision=r, ep=2, overrides=GROWN) for r in read_in_range(request, RECIPES)]
    cases += [Case("hf_mixtral", "fsdp", BATCH, (("input_ids", (BATCH, RING_SEQ)),), units,
                   precision=r, ep=2, cp=2, overrides=RING) for r in read_in_range(request, RECIPES)]
    cases += [Case("hf_gpt_oss", "fsdp", BATCH, (("input_ids", (BATCH, SEQ)),), units,
                   ep=2, overrides=GROWN)]
    cases += [Case("hf_deepseek_v3", "fsdp", BATCH, (("input_ids", (BATCH, SEQ)),), units,
                   precision=r, ep=2, overrides=DEEPSEEK) for r in read_in_range(request, RECIPES)]
    return measured_steps(cases, 2)


# hf.deepseek_v3 grown as Mixtral is: 8 routed experts of 128 beside its shared expert
DEEPSEEK = (("n_routed_experts", 8), ("moe_intermediate_size", 128))


def _ring_predict(mesh: str, precision: str = "fp32"):
    torch.manual_seed(0)
    model = hf.mixtral(**dict(RING))
    ids = torch.randint(0, 512, (BATCH, RING_SEQ))
    return analyze(model, example_inputs=(ids,), train=True, optimizer="adam",
                   include_inputs=False, precision=precision,
                   parallel={"mesh": mesh}).parallel


@pytest.mark.parametrize("precision", RECIPES)
def test_each_rank_within_5_percent_of_a_real_expert_parallel_step(predicted, measured,
                                                                   precision):
    p = predicted[precision]
    rows = [m for m in measured if m.case.precision == precision and m.case.cp == 1
            and m.case.model == "hf_mixtral"]
    assert len(rows) == 4                                   # 2 ranks × steps 1 and 2
    # step 2 (Adam's state exists) is the acceptance's; step 1 sits at −3.9% on rank 0,
    # where gloo's thread freeing a buffer late lifts a real peak by up to a unit's
    # reduce-scatter input (test_parallel_reality.py; seen in a full suite beside two pip
    # installs: rank 0, step 1, 12,734,312 B measured, −6.0%): 1 point more room there, and
    # a measured peak may exceed by that one buffer
    late = max(u.grad_padded_bytes for u in p.units)
    assert_ranks_within(p, [(m.step, m.rank, m.peak) for m in rows], step1=0.06, late=late)


def test_the_experts_are_units_of_their_own_and_the_exchange_is_counted(predicted):
    p = predicted["fp32"]
    experts = [u for u in p.units if u.ep == 2]
    assert [u.name for u in experts] == ["model.layers.0.mlp.experts",
                                         "model.layers.1.mlp.experts"]
    # a rank's 4 of 8 experts, whole (efsdp = dp_shard / ep = 1): gate_up (512 × 64) and down
    # (64 × 256) each, fp32
    assert all(u.shard_bytes == 4 * (512 * 64 + 64 * 256) * 4 == 786_432 for u in experts)
    # each layer exchanges tokens · top-k = 2 · 128 · 2 = 512 rows of 64 fp32 twice forward
    # and twice backward: 8 all-to-alls of 131,072 B; half of each stays on the rank
    assert p.comm.all_to_all_bytes == 8 * 512 * D * 4 == 1_048_576
    assert p.comm.by_dim["ep"] == 524_288 and p.comm.calls_by_dim["ep"] == 8
    assert "efsdp" not in p.comm.by_dim or p.comm.by_dim["efsdp"] == 0   # one rank: no wire
    assert p.world_size == 2 and p.global_batch == 2 * BATCH


def test_gpt_oss_experts_each_rank_within_5_percent(measured):
    """gpt-oss holds its experts in another layout of transformers' experts interface
    (grouped_experts.py): transposed, gate and up columns interleaved, a bias per expert
    for each projection, its own clamped SwiGLU (``dp_shard=2,ep=2`` was an internal error:
    the rank's rewrite read Mixtral's ``act_fn``). hf.gpt_oss grown to 8 experts of 256,
    fp32, the same real step as Mixtral's (torchtitan's dispatcher, gloo). Its random router
    splits the rows unevenly, and more so after step 1's update: measured (2026-12-07, torch
    2.13) steps 1 / 2, rank 0 15,900,792 / 19,333,036 B, rank 1 14,398,584 / 17,125,036;
    graphcost's balanced routing 15,149,684 / 18,699,880 — the ranks' mean to 4 B in step 1
    (15,149,688), +2.6% of it in step 2 (its rows moved towards rank 0's experts: rank 1's
    peak rose by less than Adam's state, 3,550,048 B here), each rank within 10%."""
    torch.manual_seed(0)
    ids = torch.randint(0, 512, (BATCH, SEQ))
    p = analyze(hf.gpt_oss(**dict(GROWN)), example_inputs=(ids,), train=True,
                optimizer="adam", include_inputs=False,
                parallel={"mesh": "dp_shard=2,ep=2"}).parallel
    rows = [m for m in measured if m.case.model == "hf_gpt_oss"]
    assert len(rows) == 4                                   # 2 ranks × steps 1 and 2
    assert_ranks_within(p, [(m.step, m.rank, m.peak) for m in rows], step1=0.1, step2=0.1)
    for step, mine in ((1, p.first_step_peak_bytes), (2, p.per_rank_peak_bytes)):
        mean = sum(m.peak for m in rows if m.step == step) / 2
        assert abs(mine / mean - 1) <= 0.03, (step, mine, mean)
    # a rank's 4 of 8 experts, whole (efsdp 1): gate_up (64 × 512) and its bias (512), down
    # (256 × 64) and its bias (64), fp32
    experts = [u for u in p.units if u.ep == 2]
    assert len(experts) == 2 and all(
        u.shard_bytes == 4 * (64 * 512 + 512 + 256 * 64 + 64) * 4 == 795_648 for u in experts)
    # the exchange as Mixtral's: 2 · 128 tokens · top-2 = 512 rows of 64 fp32, 8 all-to-alls
    assert p.comm.all_to_all_bytes == 8 * 512 * D * 4


@pytest.mark.parametrize("precision", RECIPES)
def test_shared_experts_and_latent_attention_within_5_percent(measured, precision):
    """DeepSeek-V3's layout under expert parallelism: its shared expert a dense MLP every rank
    runs on its own tokens (sharded by fully_shard as the block is: torchtitan's), beside the
    routed experts' slice and exchange; its multi-head latent attention and sigmoid routing
    with a correction bias traced as transformers runs them. hf.deepseek_v3 grown to 8
    routed experts of 128 (layer 1; layer 0 dense), the same real step as Mixtral's: each
    rank within 5% in steps 1 and 2 (measured 2026-12-07, torch 2.13, fp32: rank 0
    8,601,464 / 10,022,240 B, rank 1 8,582,968 / 9,860,400; graphcost 8,596,312 /
    9,947,728)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 512, (BATCH, SEQ))
    p = analyze(hf.deepseek_v3(**dict(DEEPSEEK)), example_inputs=(ids,), train=True,
                optimizer="adam", include_inputs=False, precision=precision,
                parallel={"mesh": "dp_shard=2,ep=2"}).parallel
    rows = [m for m in measured if m.case.model == "hf_deepseek_v3"
            and m.case.precision == precision]
    assert len(rows) == 4                                   # 2 ranks × steps 1 and 2
    assert_ranks_within(p, [(m.step, m.rank, m.peak) for m in rows], step1=0.05)
    # layer 1's 4 of 8 routed experts a rank, whole (efsdp 1): gate_up (256 × 64) and down
    # (64 × 128); the shared expert is the block's, not an ep unit
    experts = [u for u in p.units if u.ep == 2]
    size = 4 if precision == "fp32" else 2
    assert [u.name for u in experts] == ["model.layers.1.mlp.experts"]
    assert experts[0].shard_bytes == 4 * (256 * 64 + 64 * 128) * size
    # one MoE layer's exchange: 2 · 128 tokens · top-2 = 512 rows of 64, twice forward and
    # twice backward
    assert p.comm.all_to_all_bytes == 4 * 512 * D * size


@pytest.mark.same_on_every_torch
def test_the_report_counts_the_ranks_slice_of_the_experts_as_the_ranks():
    """The rank's program holds its slice of the experts: its parameters are said to be an ep
    rank's (a 30B mixture at ep 8 was shown as a 5B model), and its program alone beside the
    peak is not one device's whole model."""
    from graphcost.analyzer.render.summary import summary_lines

    ids = torch.randint(0, 512, (BATCH, SEQ))
    r = analyze(_model(), example_inputs=(ids,), train=True, optimizer="adam",
                include_inputs=False, parallel={"mesh": "dp_shard=2,ep=2"}, what_if=False)
    text = "\n".join(summary_lines(r, width=200))
    # hf.mixtral grown (test_the_experts_are_units_…): a layer's 8 experts hold 8 · (512 · 64
    # + 64 · 256) = 393,216 parameters, of which a rank holds 4: 196,608 fewer a layer, 2
    # layers
    whole = sum(p.numel() for p in _model().parameters())
    assert r.totals.params == whole - 2 * 196_608
    assert f"{r.totals.params:,} (" in text and " on each ep rank" in text, text
    assert "its program alone" in text and "one device at this batch" not in text, text


def test_experts_shard_over_the_ranks_that_hold_the_same_slice():
    # dp_shard 4, ep 2: efsdp 2 — a rank's 4 experts of a layer sharded over 2 ranks
    p = _predict("dp_shard=4,ep=2")
    experts = [u for u in p.units if u.ep == 2]
    assert all(u.shard_bytes == 786_432 // 2 for u in experts)
    dense = next(u for u in p.units if u.name == "model.layers.0")
    assert dense.shard_bytes == dense.padded_bytes // 4
    # FSDP's all-gathers and reduce-scatters of the experts run over efsdp: (2 − 1)/2 of the
    # gathered (twice: forward and backward's regather) and reduced bytes
    assert p.comm.by_dim["efsdp"] == (2 * 2 * 786_432 + 2 * 786_432) // 2 == 2_359_296
    assert p.world_size == 4
    # each rank within 5% of the same step on 4 gloo ranks (FSDPMemTracker, recorded by
    # benchmarks/accuracy_ranks.py: ranks 0 and 2 route more rows to themselves):
    # step 1 −4.2% / +4.6%, step 2 −2.7% / +4.3%. Before FSDP2's backward prefetch order was
    # read as its post-forward order (an experts unit nested in its block ends its forward
    # first: fsdp.py), graphcost held the experts' gathered buffer through the block's
    # backward too, +6.7% over ranks 1 and 3
    assert_ranks_within(p, recorded_peaks("ep", "dp_shard=4,ep=2"))


@pytest.mark.parametrize("precision", RECIPES)
def test_beside_context_parallelism_each_rank_within_5_percent(measured, precision):
    """``dp_shard=1,cp=2,ep=2``: the two ranks a ring and an ep group (torchtitan carves ep out
    of dp_shard × cp), each its head-tail shard of both sequences, its 4 experts whole
    (efsdp 1). Measured (2026-12-05, torch 2.13), steps 1 / 2: fp32 rank 0 16,847,408 /
    20,809,324 B, rank 1 16,588,704 / 19,608,180 against graphcost's 16,783,588 /
    20,327,992 (−2.3% and +3.7% at step 2): ring position 0, the larger of the ring, and
    balanced routing (rank 1's experts receive fewer rows). With top-2 routing of the ep
    test's model the ranks' routing is further apart: +7.3% over rank 1 at step 2 (each
    effect measured alone: the ring's later chunk −2.8%, test_context_parallel.py; routing
    +3.6%, above)."""
    p = _ring_predict("dp_shard=1,cp=2,ep=2", precision)
    rows = [m for m in measured if m.case.precision == precision and m.case.cp == 2]
    assert len(rows) == 4                                   # 2 ranks × steps 1 and 2
    assert_ranks_within(p, [(m.step, m.rank, m.peak) for m in rows])
    # the comm: the ring's all-gathers and passes (cp) beside the experts' all-to-alls (ep):
    # a rank's 2 × 128 tokens · top-4 = 1,024 rows of 64 — 4 bytes, 2 in bf16-master's
    # compute — 8 all-to-alls (2 layers, there and back, forward and backward), half of
    # each crossing
    size = 4 if precision == "fp32" else 2
    assert p.comm.by_dim["ep"] == 8 * 1024 * D * size // 2
    assert p.comm.calls_by_dim["ep"] == 8 and p.comm.by_dim["cp"] > 0
    assert p.world_size == 2 and p.global_batch == BATCH     # one batch, split over the ring


def test_beside_context_and_data_sharding_each_rank_within_5_percent():
    """``dp_shard=2,cp=2,ep=2`` on 4 gloo ranks (benchmarks/accuracy_ranks.py ``cp_ep``):
    each ep group a ring of 2, the experts sharded over efsdp = 2 · 2 / 2 = 2. Measured step
    2: 18,151,084 B on ranks 0 and 2, 16,949,940 on 1 and 3, against graphcost's 17,669,752
    (−2.7%, +4.2%)."""
    p = _ring_predict("dp_shard=2,cp=2,ep=2")
    experts = [u for u in p.units if u.ep == 2]
    # a rank's 4 of 8 experts (gate_up 512 × 64 and down 64 × 256, fp32), halved by efsdp
    assert experts and all(u.shard_bytes == 4 * (512 * 64 + 64 * 256) * 4 // 2 == 393_216
                           for u in experts)
    assert_ranks_within(p, recorded_peaks("cp_ep", "dp_shard=2,cp=2,ep=2"))


@pytest.mark.parametrize("precision", RECIPES)
def test_beside_hsdp_each_rank_within_5_percent(precision):
    """``dp_replicate=2,dp_shard=2,ep=2`` on 4 gloo ranks (benchmarks/accuracy_ranks.py
    ``ep_hsdp``): the dense units on the 2 × 2 mesh, the experts on torchtitan's sparse mesh
    dp_replicate × efsdp (2 × 1): a rank holds what it holds under dp_shard=2,ep=2 — FSDP2
    all-reduces each gradient shard across the replicas in place. Measured fp32 step 2:
    15,839,820 / 14,946,140 B (ranks 0, 2 / 1, 3) against 15,478,328 (−2.3%, +3.6%)."""
    p = _predict("dp_replicate=2,dp_shard=2,ep=2", precision)
    assert p.per_rank_peak_bytes == _predict("dp_shard=2,ep=2", precision).per_rank_peak_bytes
    assert_ranks_within(p, recorded_peaks("ep_hsdp", "dp_replicate=2,dp_shard=2,ep=2",
                                          precision))
    # the replicas' all-reduce: each unit's gradient shard — an experts unit's 4 experts
    # whole (efsdp 1), a dense unit's half — 2 · (2 − 1)/2 of it on the wire; reduced in
    # fp32 in both recipes (bf16-master's units hold bf16 parameters: twice their bytes)
    master = 2 if precision == "bf16-master" else 1
    # (the experts' part: 2 layers' 4 experts, 786,432 B of fp32 gradients each, whole)
    assert master * sum(u.grad_padded_bytes for u in p.units if u.ep == 2) == 2 * 786_432
    shards = master * sum(u.grad_padded_bytes // (1 if u.ep == 2 else 2) for u in p.units)
    assert p.comm.by_dim["dp_replicate"] == shards
    assert p.comm.all_reduce_bytes == shards
    assert p.world_size == 4 and p.global_batch == 4 * BATCH


# beside tensor parallelism: dp_shard 2 × tp 2 = 4 ranks, each ep group of 2 a tp group's
# ranks (torchtitan carves ep out of dp_shard × cp × tp, tp innermost): transformers' plan
# shards the attention, each tp rank dispatches its half of the tokens
TP_MESH = "dp_shard=2,tp=2,ep=2"


@pytest.fixture(scope="module")
def beside_tp(request):
    units = ("model.layers.0", "model.layers.1")
    cases = [Case("hf_mixtral", "fsdp", BATCH, (("input_ids", (BATCH, SEQ)),), units,
                  precision=r, ep=2, tp=2, overrides=GROWN) for r in read_in_range(request, RECIPES)]
    return measured_steps(cases, 4)


# (the dispatcher's torch paths run on every torch in the tests above; this adds DTensor's
# plan for the attention and the tp all-reduces: 4 ranks, 40 s a range run)
@pytest.mark.same_on_every_torch
@pytest.mark.parametrize("precision", RECIPES)
def test_beside_tensor_parallelism_each_rank_within_5_percent(beside_tp, precision):
    """``dp_shard=2,tp=2,ep=2`` on 4 gloo ranks: the experts' dispatch runs on each tp rank's
    half of the (batch · seq) rows its MoE block takes (torchtitan's MoE sharding without
    sequence parallelism: expert_plan.py), the result all-reduced over the tp pair; a rank's 4
    of 8 experts sharded over efsdp = 2 · 2 / 2 = 2. Measured (2026-12-07, torch 2.13), steps
    1 / 2: fp32 ranks 0 and 2 7,506,728 / 9,234,756 B, 1 and 3 7,157,928 / 8,890,316 against
    graphcost's 7,336,680 / 9,095,228 (−1.5%, +2.3% at step 2: the ep pair's routing,
    balanced in graphcost's); bf16-master step 2 7,490,716 and 7,335,652 against 7,434,908
    (−0.75%, +1.35%)."""
    p = _predict(TP_MESH, precision)
    rows = [m for m in beside_tp if m.case.precision == precision]
    assert len(rows) == 8                                   # 4 ranks × steps 1 and 2
    assert_ranks_within(p, [(m.step, m.rank, m.peak) for m in rows])
    experts = [u for u in p.units if u.ep == 2]
    assert len(experts) == 2 and all(u.shard_bytes == 786_432 // 2 for u in experts
                                     if precision == "fp32")
    # a rank's half of the 2 · 128 tokens, top-2: 256 rows of 64 (4 bytes; 2 in
    # bf16-master's compute), 8 all-to-alls, half of each crossing: half of ep alone's
    size = 4 if precision == "fp32" else 2
    assert p.comm.by_dim["ep"] == 8 * 256 * D * size // 2
    assert p.world_size == 4 and p.global_batch == 2 * BATCH


@pytest.mark.skipif(not EXPERTS_WHOLE, reason="this transformers' plan shards a mixture of "
                    "experts' experts in a style not modelled (moe_tp_experts, 5.24): "
                    "the same step without ep is refused")
def test_beside_tensor_parallelism_the_experts_result_is_all_reduced():
    # each layer all-reduces its zero-padded (256, 64) result forward, and backward the
    # gradient of its input rows and of their top-2 routing scores, each rank's part: (256 ×
    # 64 + 256 × 64 + 256 × 2) fp32 a layer, 2 layers, beside what the attention's plan
    # all-reduces (the same step without ep); a ring of 2 sends each all-reduce's bytes once
    with_ep, without = _predict(TP_MESH), _predict("dp_shard=2,tp=2")
    moe = 2 * (256 * 64 + 256 * 64 + 256 * 2) * 4
    assert with_ep.comm.by_dim["tp"] - without.comm.by_dim["tp"] == moe == 266_240


@pytest.mark.parametrize("text, said", [
    ("dp_shard=8,ep=4", 8),                          # not 32: ep is no factor of the world
    ("ep=2", r"must divide dp_shard × cp × tp \(1\)"),
    ("dp_shard=6,ep=4", r"must divide dp_shard × cp × tp \(6\)"),
    ("dp_shard=3,cp=2,ep=4", r"must divide dp_shard × cp × tp \(6\)"),
    ("dp_shard=1,cp=2,ep=2", 2),                     # (the ep group a ring's ranks)
    ("dp_replicate=2,dp_shard=4,ep=4", 8),
    ("dp_shard=4,tp=2,ep=2", 8),                     # (torchtitan's efsdp × ep: of 4 × 2)
    ("dp_shard=1,tp=4,ep=4", 4),                     # (every ep rank a tp rank)
    ("dp_shard=3,tp=2,ep=4", r"must divide dp_shard × cp × tp \(6\)"),
    ("pp=2,dp_shard=2,tp=2,ep=2", 8),                # (each stage's dp_shard × tp ranks)
    ("pp=2,dp_shard=4,ep=2", 8),                     # (each stage's data ranks)
    ("dp_shard=auto,ep=2", "auto is not searched beside ep"),
])
def test_the_ep_group_is_carved_out_of_dp_shard_cp_and_tp(text, said):
    if isinstance(said, int):
        assert parse_mesh(text).world_size == said
        return
    with pytest.raises(GraphcostError, match=said):
        parse_mesh(text)


def test_a_model_without_stacked_experts_or_with_too_few_is_refused_by_name():
    ids = torch.randint(0, 512, (BATCH, 16))
    with pytest.raises(GraphcostError, match="this model has none"):
        analyze(hf.llama(), example_inputs=(ids,), train=True,
                parallel={"mesh": "dp_shard=2,ep=2"})
    with pytest.raises(GraphcostError, match="8 experts, which do not divide into 16 ranks"):
        analyze(_model(), example_inputs=(ids,), train=True,
                parallel={"mesh": "dp_shard=16,ep=16"})
    with pytest.raises(GraphcostError, match="beside fully_shard"):
        analyze(_model(), example_inputs=(ids,), train=True,
                parallel={"mesh": "dp_shard=2,ep=2", "strategy": "zero1"})
