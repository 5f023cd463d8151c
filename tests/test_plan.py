"""``graphcost plan``: the layouts it searches, its best candidate against the direct analysis
of its settings, pruning that never drops a faster setting, the answer when nothing fits,
and its face (one screen, the command to run last)."""
from __future__ import annotations

import importlib.util
import json
import shlex

import pytest
from graphcost.analyzer.app.plan import EXPERTS_BESIDE, EXPERTS_TP, plan_training
from graphcost.analyzer.app.plan_settings import (
    PlanSpec,
    Settings,
    pipeline_schedules,
    settings_of,
)
from graphcost.analyzer.cli.main import main
from graphcost.passes.errors import GraphcostError
from graphcost.passes.parallel.layouts import (
    context_sizes,
    data_layouts,
    expert_sizes,
    tensor_sizes,
)

from graphcost import analyze

# a small Llama (zoo:llama_tiny: 4 heads, 2 KV heads) on 4 H100s in bf16 with fp32 master
# weights: the search holds FSDP 4, FSDP 2 × TP 2 and their checkpoint plans (DDP and tp 4
# alone keep the weights unsharded, which master weights are not modelled for)
TINY = dict(train=True, optimizer="adamw", precision="bf16-master", dims={"seq": 512},
            device="h100", what_if=False)


def assert_is_direct(c, direct) -> None:
    """Candidate ``c``'s figures are ``direct``'s, the analysis of its settings alone."""
    assert direct.roofline is not None and direct.time is not None and c.time is not None
    assert c.needs_bytes == direct.roofline.fit.needs
    assert c.allocated_bytes == direct.peak_bytes
    assert c.time.seconds == direct.time.seconds


def llama3_8b_args(mesh: dict, batch: int, checkpoint: str, schedule: str = "1f1b"):
    """torchtitan's arguments for Llama 3.1 8B at 8,192 tokens, bf16-master and AdamW."""
    from graphcost.analyzer.cli.engine_args import torchtitan_args
    return torchtitan_args("zoo:llama3_8b", mesh, batch, checkpoint,
                           {"precision": "bf16-master", "optimizer": "adamw",
                            "dims": {"seq": 8192}}, schedule)


def test_the_meshes_of_64_gpus_are_torchtitans_layouts():
    # tp 1, 2, 4, 8: within a node of 8, and dividing 64
    assert tensor_sizes(64, 8) == (1, 2, 4, 8)
    assert tensor_sizes(12, 8) == (1, 2, 4)   # (8 does not divide 12)
    # 32 data ranks beside tp 2: FSDP over all, HSDP with a node's 4 data ranks a shard group
    # (4 × tp 2 = 8 GPUs), replicated 8 times, and DDP
    assert [m.words for m in data_layouts(64, 2, 8)] == [
        "dp_shard=32,tp=2", "dp_replicate=8,dp_shard=4,tp=2", "dp_replicate=32,tp=2"]
    # tp 8 fills the node: no HSDP shard group beside it
    assert [m.words for m in data_layouts(64, 8, 8)] == ["dp_shard=8,tp=8",
                                                          "dp_replicate=8,tp=8"]
    assert [m.words for m in data_layouts(8, 8, 8)] == ["tp=8"]
    assert [m.words for m in data_layouts(1, 1, 8)] == [""]   # one GPU: no mesh


@pytest.fixture(scope="module")
def tiny_plan():
    return plan_training("zoo:llama_tiny", PlanSpec(4, batch=4), TINY)


def test_the_best_candidate_is_the_direct_analysis_of_its_settings(tiny_plan):
    best = tiny_plan.best
    assert best is not None and best.status == "fits"
    direct = analyze("zoo:llama_tiny", **TINY, **best.settings.analyze_kwargs({}))
    assert_is_direct(best, direct)
    assert direct.time is not None and best.time is not None
    assert best.time.tokens_per_second == direct.time.tokens_per_second
    # every fitting candidate fits, ranked by throughput; DDP is not searched under master
    # weights (FSDP2's MixedPrecisionPolicy holds them)
    fitting = tiny_plan.fitting
    assert all(c.needs_bytes <= c.offers_bytes for c in fitting)
    rates = [c.samples_per_second for c in fitting]
    assert rates == sorted(rates, reverse=True) and len(fitting) == 4   # (none, full: 2 each)
    assert {c.settings.mesh.words for c in tiny_plan.candidates} == {
        "dp_shard=4", "dp_shard=2,tp=2", "pp=2,dp_shard=2", "dp_shard=2,cp=2",
        "dp_shard=1,cp=4", "dp_shard=1,cp=2,tp=2"}
    # a pipeline is analyzed only where no layout of its tp size without one fits, context
    # parallelism only where no layout without it fits
    piped = [c for c in tiny_plan.candidates if c.settings.pp > 1]
    assert piped and all(c.status == "pruned" and "without pipeline stages fits" in c.detail
                         for c in piped)
    ringed = [c for c in tiny_plan.candidates if c.settings.cp > 1]
    assert ringed and all(c.status == "pruned" and "without context parallelism fits" in
                          c.detail for c in ringed)
    assert tiny_plan.not_searched[0] == "DDP, tp alone (bf16-master's master weights are " \
                                        "FSDP2's)"


def test_what_the_plan_prunes_is_what_it_assumes(tiny_plan):
    """Per layout the plan analyzes full checkpointing first (it holds the least: when it
    does not fit, nothing does), then from none up until one fits (the next only adds
    recompute). Here full and none fit, so sac is not analyzed. Analyzed directly, it holds
    between the two and is slower than none."""
    pruned = [c for c in tiny_plan.candidates if c.status == "pruned" and c.settings.pp == 1
              and c.settings.cp == 1]
    assert {c.settings.checkpoint for c in pruned} == {"sac"} and len(pruned) == 2
    for c in pruned:
        mesh = c.settings.mesh
        done = {f.settings.checkpoint: f for f in tiny_plan.fitting if f.settings.mesh == mesh}
        assert set(done) == {"none", "full"}
        direct = analyze("zoo:llama_tiny", **TINY, **c.settings.analyze_kwargs({}))
        assert direct.time is not None and direct.roofline is not None
        assert direct.time.seconds > done["none"].time.seconds
        assert done["full"].needs_bytes <= direct.roofline.fit.needs <= done["none"].needs_bytes
        # the bounds the pruned candidate carries (the JSON's …_at_least) are these
        assert c.seconds_at_least == done["none"].time.seconds
        assert c.needs_at_least == done["full"].needs_bytes


def test_a_pipeline_candidate_is_the_direct_analysis_of_its_settings():
    """Pipeline sizes asked for (``--pp 1,2``): analyzed although layouts without stages fit
    (the search alone prunes them then); llama_tiny's two blocks in two stages beside
    fully_shard over the other two GPUs, one sequence a micro-batch, under 1F1B and under
    interleaved 1F1B: each schedule's fastest is what analyzing its settings alone gives, and
    torchtitan's line names it."""
    plan = plan_training("zoo:llama_tiny", PlanSpec(4, batch=4, pp=(1, 2)), TINY)
    piped = [c for c in plan.candidates if c.settings.pp == 2]
    assert piped and not any("without pipeline stages fits" in c.detail for c in piped)
    best = next(c for c in plan.fitting if c.settings.pp == 2 and not c.settings.interleaved)
    assert best.settings.mesh.words == "pp=2,dp_shard=2"
    kwargs = best.settings.analyze_kwargs({})
    assert kwargs["parallel"] == {"mesh": "pp=2,dp_shard=2", "microbatches": 4}
    direct = analyze("zoo:llama_tiny", **TINY, **kwargs)
    assert direct.pipeline is not None and direct.time is not None and best.time is not None
    assert best.allocated_bytes == direct.peak_bytes == direct.pipeline.peak_bytes
    assert best.needs_bytes == direct.roofline.fit.needs
    assert best.time.seconds == direct.time.seconds
    assert best.samples == 4 * 2   # (each of the 2 data ranks' pipelines takes 4)
    args = llama3_8b_args({"pp": 2, "dp_shard": 2}, 4, "full")
    assert args is not None
    assert args[args.index("--parallelism.pipeline-parallel-degree") + 1] == "2"
    assert args[args.index("--parallelism.pipeline-parallel-microbatch-size") + 1] == "1"
    # interleaved 1F1B too: 2 blocks (and the embedding and head, a block each) in 4 stages,
    # two a rank; 4 micro-batches are 2 whole rounds of the 2 ranks
    woven = next(c for c in plan.fitting if c.settings.schedule == "interleaved-1f1b")
    assert woven.settings.words == "pp=2,dp_shard=2, interleaved, batch 4, checkpoint none"
    kwargs = woven.settings.analyze_kwargs({})
    assert kwargs["parallel"] == {"mesh": "pp=2,dp_shard=2", "microbatches": 4,
                                  "schedule": "interleaved-1f1b"}
    direct = analyze("zoo:llama_tiny", **TINY, **kwargs)
    assert direct.pipeline is not None and direct.time is not None and woven.time is not None
    assert direct.pipeline.stages_per_rank == 2
    assert woven.allocated_bytes == direct.peak_bytes and woven.needs_bytes == \
        direct.roofline.fit.needs
    assert woven.time.seconds == direct.time.seconds
    # the plan prunes an interleaved layout whose 1F1B twin does not fit: it holds more
    assert woven.allocated_bytes >= best.allocated_bytes and woven.time.seconds < \
        best.time.seconds   # (and it is there for its shorter bubble)
    args = llama3_8b_args({"pp": 2, "dp_shard": 2}, 4, "none", woven.settings.schedule)
    assert args is not None
    assert args[args.index("--parallelism.pipeline-parallel-schedule") + 1] == "Interleaved1F1B"
    # and the two zero-bubble schedules, without a checkpoint plan (beside one: not modelled);
    # the interleaved one the fastest pipeline here: W fills part of the bubble. The V is
    # slower on this model: its rank 1 runs both blocks (stages 1 and 2), rank 0 none.
    zb = [c for c in plan.candidates if c.settings.schedule in ("interleaved-zb", "zbv")]
    assert sorted((c.settings.schedule, c.settings.checkpoint, c.status) for c in zb) == [
        ("interleaved-zb", "none", "fits"), ("zbv", "none", "fits")]
    fastest = next(c for c in plan.fitting if c.settings.pp == 2)
    assert fastest.settings.words == \
        "pp=2,dp_shard=2, interleaved zero bubble, batch 4, checkpoint none"
    kwargs = fastest.settings.analyze_kwargs({})
    direct = analyze("zoo:llama_tiny", **TINY, **kwargs)
    assert kwargs["parallel"]["schedule"] == "interleaved-zb" and fastest.time is not None
    assert direct.time is not None and fastest.time.seconds == direct.time.seconds
    assert fastest.needs_bytes == direct.roofline.fit.needs


def test_the_interleaved_schedule_is_tried_where_torch_and_torchtitan_run_it():
    # pp, micro-batches, blocks: 2 ranks × 2 stages need 4 shares of 2 blocks + the embedding
    # and the head (torchtitan's split; 1 block leaves one stage empty); micro-batches in whole
    # rounds of the ranks (ScheduleInterleaved1F1B: 5 on 2 ranks are 2 rounds and a half)
    both = ["1f1b", "interleaved-1f1b", "interleaved-zb", "zbv"]
    assert pipeline_schedules(1, 4, 32) == ["1f1b"]        # (no pipeline: the one entry)
    assert pipeline_schedules(2, 4, 2) == both
    assert pipeline_schedules(2, 4, 1) == ["1f1b"]
    assert pipeline_schedules(2, 5, 32) == ["1f1b"]
    assert pipeline_schedules(8, 32, 126) == both           # (405B's 126 blocks on 16 stages)


def test_zero_bubble_is_pruned_where_interleaved_1f1b_does_not_fit_without_checkpointing():
    """Zero bubble's W keeps each waiting micro-batch's retained graph: on gloo ranks its rank
    of the last stage held 23% (interleaved) and 15% (the V) more than interleaved 1F1B's
    (21,774,488 and 20,464,812 B against 17,723,544: tests/test_pipeline_parallel.py) and its
    rank 0 5-6% less, so the pruning is a heuristic with no bound; interleaved 1F1B's is
    pruned where 1F1B fits under no checkpoint plan, needing at least its twin's."""
    from graphcost.analyzer.app.plan import _twin_over
    from graphcost.analyzer.app.plan_candidates import Candidate
    from graphcost.passes.parallel.mesh import parse_mesh

    mesh = parse_mesh("pp=2,dp_shard=2")
    zb = [Settings(mesh, 4, "none", "interleaved-zb")]
    over = Candidate(Settings(mesh, 4, "none", "interleaved-1f1b"), "over", needs_bytes=10)
    full = Candidate(Settings(mesh, 4, "full", "interleaved-1f1b"), "fits", needs_bytes=5)
    pruned = _twin_over(zb, [over, full])
    assert [c.status for c in pruned] == ["pruned"] and pruned[0].needs_at_least is None
    assert "zero bubble holds more in flight than interleaved 1F1B" in pruned[0].detail
    assert _twin_over(zb, [Candidate(over.settings, "fits")]) == []
    woven = [Settings(mesh, 4, "none", "interleaved-1f1b")]
    one = Candidate(Settings(mesh, 4, "none"), "over", needs_bytes=7)
    assert _twin_over(woven, [one])[0].needs_at_least == 7
    assert _twin_over(woven, [one, Candidate(Settings(mesh, 4, "full"), "fits")]) == []


def test_the_face_is_one_screen_ending_on_the_command(tiny_plan):
    from graphcost.analyzer.render.plan import plan_lines

    lines = plan_lines(tiny_plan, lambda c: f"graphcost … {c.settings.mesh.words}")
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert lines[-5] == "best: dp_shard=4, batch 4, checkpoint none"
    assert lines[-1] == "run: graphcost … dp_shard=4"


def test_a_candidate_that_fits_flushing_the_cache_is_marked_so(tiny_plan):
    """A candidate whose ranks fit only with the allocator emptying its cache (tests/
    test_fits.py: the replay held to the device) fits, and the face says on what."""
    from dataclasses import replace

    from graphcost.analyzer.render.plan import plan_json, plan_lines

    best, *rest = tiny_plan.candidates
    flushing = replace(tiny_plan, candidates=(replace(best, flushes=2), *rest))
    lines = plan_lines(flushing, lambda c: "graphcost …")
    assert lines[-5] == "best: dp_shard=4, batch 4, checkpoint none"
    row = next(line for line in lines if line.startswith(" 1  "))
    assert " GiB~ " in row and \
        "~: fits with PyTorch's allocator emptying its cache (cudaMalloc retries)" in lines
    assert lines[-3].endswith("per GPU (reserved + runtime, 2 cache flushes)")
    assert all(len(line) <= 80 for line in lines)
    assert json.loads(plan_json(flushing, lambda c: ""))["candidates"][0]["flushes"] == 2
    assert "~" not in "\n".join(plan_lines(tiny_plan, lambda c: "graphcost …"))


def test_as_fast_the_one_that_flushes_less_then_needs_less_goes_first(tiny_plan):
    # the 70B on 64 H100s at tp 2: SAC and full checkpointing both 7.05 s a step (the
    # exposed collectives hide either's recompute); SAC needs 77.7 GiB flushing the cache,
    # full 36.8 GiB: full first
    from dataclasses import replace

    from graphcost.analyzer.app.plan import rank_of

    best = tiny_plan.candidates[0]
    assert best.needs_bytes is not None
    more = replace(best, needs_bytes=best.needs_bytes + 1)
    flushing = replace(best, needs_bytes=best.needs_bytes - 1, flushes=1)
    assert sorted([flushing, more, best], key=rank_of) == [best, more, flushing]


def test_the_command_line_prints_the_command_that_gives_the_same_figures(capsys):
    argv = ["plan", "zoo:llama_tiny", "--gpus", "4", "--device", "h100", "--dim", "seq=512",
            "--batch", "4", "--format", "json"]
    assert main(argv) == 0
    planned = json.loads(capsys.readouterr().out)["candidates"]
    assert {c["status"] for c in planned} == {"fits", "pruned"}
    best = planned[0]
    assert best["command"] == ("graphcost zoo:llama_tiny --train --parallel dp_shard=4 "
                               "--batch 4 --precision bf16-master --optimizer adamw "
                               "--dim seq=512 --device h100")
    # the printed command, run, gives the plan's figures
    assert main(shlex.split(best["command"])[1:] + ["--format", "json"]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert best["time"]["seconds"] == direct["time"]["seconds"]
    assert best["allocated_bytes"] == direct["peak_bytes"]
    assert best["needs_bytes"] == direct["roofline"]["fit"]["needs"]


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                    reason="float8 linears are torchao's (the float8 extra)")
def test_float8_is_fixed_for_every_candidate_and_tensor_parallelism_left_out(capsys):
    # --float8 fixes the recipe: the header says it, the best's command carries it (torchtitan
    # sets float8 in its Python config: no torchtitan line), and layouts with tp are left out
    # before any is analyzed (torchao's float8 tensor-parallel styles are tensorwise's)
    argv = ["plan", "zoo:llama_tiny", "--gpus", "2", "--device", "h100-sxm", "--batch", "2",
            "--dim", "seq=64", "--float8", "rowwise", "--checkpoint", "none"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "· bf16-master · float8 rowwise · adamw" in out and "torchtitan:" not in out
    assert out.rstrip().splitlines()[-1].endswith("--float8 rowwise --device h100-sxm")
    assert main([*argv, "--precision", "bf16-mixed", "--tp", "2"]) == 2
    assert "torchao's float8 tensor-parallel styles are the tensorwise recipe's" in \
        capsys.readouterr().err
    # FSDP2's float8 all-gather (tensorwise) is fixed for every candidate too: the best's
    # command carries it, and its figures are that command's
    gathered = [*argv[:-3], "tensorwise", "--checkpoint", "none", "--float8-all-gather"]
    assert main([*gathered, "--format", "json"]) == 0
    best = json.loads(capsys.readouterr().out)["candidates"][0]
    assert best["status"] == "fits" and best["command"].endswith(
        "--float8 tensorwise --float8-all-gather --device h100-sxm")
    direct = analyze("zoo:llama_tiny", train=True, batch=2, dims={"seq": 64},
                     precision="bf16-master", optimizer="adamw", float8="tensorwise",
                     device="h100-sxm", what_if=False,
                     parallel={"mesh": "dp_shard=2", "float8_all_gather": True})
    assert direct.roofline is not None and direct.roofline.fit is not None
    assert "gathered in float8" in direct.model
    assert best["needs_bytes"] == direct.roofline.fit.needs


def test_nothing_fits_names_the_gpus_that_would(capsys, monkeypatch):
    """96 sequences of 2,048 tokens on one T4 (16 GiB, its datasheet's) do not fit even with
    every block checkpointed; split over 2 GPUs (48 each) they do. Both figures are the
    direct analyses' of those settings."""
    from graphcost.analyzer.app.units import human_bytes

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", "zoo:llama_tiny", "--gpus", "1", "--device", "t4", "--dim",
                 "seq=2048", "--global-batch", "96", "--checkpoint", "full"]) == 0
    lines = capsys.readouterr().out.splitlines()
    kwargs = {**TINY, "device": "t4", "dims": {"seq": 2048}, "checkpoint": {"every": 1}}
    alone = analyze("zoo:llama_tiny", **kwargs, batch=96).roofline.fit
    two = analyze("zoo:llama_tiny", **kwargs, batch=48,
                  parallel={"mesh": "dp_shard=2"}).roofline.fit
    assert not alone.fits and alone.offers == 16 * 2**30 and two.fits
    assert lines[-3] == (f"nothing fits 1 × t4: the least needs {human_bytes(alone.needs)} "
                         "of 16.00 GiB")
    assert lines[-1] == "it fits on 2 GPUs: dp_shard=2, batch 48, checkpoint full"


def test_a_pruned_candidate_carries_the_bound_that_pruned_it(capsys):
    """Every candidate in the JSON has figures or bounds: 96 sequences of 2,048 on one T4 do
    not fit with every block checkpointed, so no plan that holds more is analyzed; each says
    it needs at least full's bytes, and analyzed directly it does."""
    assert main(["plan", "zoo:llama_tiny", "--gpus", "1", "--device", "t4", "--dim",
                 "seq=2048", "--global-batch", "96", "--format", "json"]) == 0
    planned = {c["checkpoint"]: c for c in json.loads(capsys.readouterr().out)["candidates"]}
    full = planned.pop("full")
    assert full["status"] == "over" and full["needs_at_least_bytes"] is None
    assert {c["status"] for c in planned.values()} == {"pruned"}
    none = analyze("zoo:llama_tiny", **{**TINY, "device": "t4", "dims": {"seq": 2048}}, batch=96)
    assert none.roofline.fit.needs >= planned["none"]["needs_at_least_bytes"] == \
        full["needs_bytes"] > full["offers_bytes"]


def test_a_mixture_of_experts_is_searched_with_expert_parallelism():
    """zoo:hf_mixtral (2 layers of 4 experts, top-2) on 4 GPUs without tensor parallelism:
    FSDP alone and with ep 2 and 4 carved out of its ranks (each dividing the 4 experts and
    the 4 ranks), each its own traced rank program (and a pipeline of its 2 blocks, alone and
    with ep 2 over each stage's 2 data ranks, pruned: FSDP fits; no context parallelism:
    ``--cp 1``); the fastest expert-parallel candidate is what analyzing its settings alone
    gives."""
    moe = dict(TINY, dims={"seq": 128})
    searched = settings_of(PlanSpec(4, batch=2, tp=(1,), cp=(1,)), 2, 4)
    assert {s.mesh.words for s in searched} == {   # (DDP: left out under master weights)
        "dp_shard=4", "dp_replicate=4", "dp_shard=4,ep=2", "dp_shard=4,ep=4",
        "pp=2,dp_shard=2", "pp=2,dp_shard=2,ep=2"}
    # nodes of 2 GPUs: HSDP too (a shard group a node), with ep within a node beside it
    # (the experts replicated across the nodes: torchtitan's sparse mesh dp_replicate × efsdp)
    nodes = settings_of(PlanSpec(4, batch=2, tp=(1,), cp=(1,), node=2), 2, 4)
    assert {s.mesh.words for s in nodes} >= {"dp_replicate=2,dp_shard=2",
                                             "dp_replicate=2,dp_shard=2,ep=2"}
    assert "dp_replicate=2,dp_shard=2,ep=4" not in {s.mesh.words for s in nodes}
    # analyzed with the sizes fixed (--ep 1,2: ep 4 left out, one trace fewer)
    plan = plan_training("zoo:hf_mixtral", PlanSpec(4, batch=2, tp=(1,), cp=(1,), ep=(1, 2),
                                                    checkpoints=("none",)), moe)
    assert {c.settings.mesh.words for c in plan.candidates} == {
        "dp_shard=4", "dp_shard=4,ep=2", "pp=2,dp_shard=2", "pp=2,dp_shard=2,ep=2"}
    assert EXPERTS_BESIDE in plan.not_searched
    best = next(c for c in plan.fitting if c.settings.ep > 1)
    direct = analyze("zoo:hf_mixtral", **moe, **best.settings.analyze_kwargs({}))
    assert direct.parallel is not None and direct.parallel.mesh.get("ep") == best.settings.ep
    assert_is_direct(best, direct)
    assert best.samples == 2 * 4   # (ep is carved out of the 4 data ranks: 4 batches of 2)
    # tp sizes not asked for are left out without ep, said so (each leaves the experts whole
    # on every rank, or is refused for them), rather than analyzed one by one
    plan = plan_training("zoo:hf_mixtral", PlanSpec(4, batch=2, cp=(1,), ep=(1,),
                                                    checkpoints=("none",)), moe)
    assert {c.settings.tp for c in plan.candidates} == {1}
    assert not any(c.status == "refused" for c in plan.candidates)
    assert EXPERTS_TP in plan.not_searched
    # beside ep, tp is searched: the ep group carved out of dp_shard × tp (torchtitan's), its
    # candidate the direct analysis of its settings (tests/test_expert_parallel.py checks the
    # layout against a real step)
    searched = settings_of(PlanSpec(4, batch=2, tp=(2,), cp=(1,), ep=(2, 4)), 2, 4)
    assert {s.mesh.words for s in searched} == {"dp_shard=2,tp=2,ep=2", "dp_shard=2,tp=2,ep=4"}
    # over nodes of 4 GPUs (8 in all) beside HSDP too: a node's dp_shard 2 × tp 2 ranks carve
    # the ep group (ep 4 of a node's 4 GPUs; ep 8 would span both nodes: not tried)
    nodes = settings_of(PlanSpec(8, batch=2, tp=(2,), cp=(1,), ep=(2, 4, 8), node=4), 2, 4)
    assert {s.mesh.words for s in nodes} >= {"dp_replicate=2,dp_shard=2,tp=2,ep=2",
                                             "dp_replicate=2,dp_shard=2,tp=2,ep=4"}
    assert not any(s.mesh.words.startswith("dp_replicate") and s.ep == 8 for s in nodes)
    # and a pipeline's stages each so (tests/test_pipeline_parallel.py checks the layout
    # against real steps); a stage's dp_shard of 1 is no fully_shard (DDP: refused), not tried
    piped = {s.mesh.words for s in settings_of(PlanSpec(8, batch=2, tp=(2,), cp=(1,),
                                                        ep=(2,)), 2, 4)}
    assert "pp=2,dp_shard=2,tp=2,ep=2" in piped
    assert not any("dp_shard=1" in words for words in piped)
    plan = plan_training("zoo:hf_mixtral", PlanSpec(4, batch=2, tp=(1, 2), cp=(1,), ep=(2,),
                                                    checkpoints=("none",)), moe)
    both = next(c for c in plan.candidates if c.settings.mesh.words == "dp_shard=2,tp=2,ep=2")
    assert both.status == "fits"
    assert_is_direct(both, analyze("zoo:hf_mixtral", **moe, **both.settings.analyze_kwargs({})))
    assert both.samples == 2 * 2   # (2 data ranks of batch 2: the tp pairs share theirs)
    plan = plan_training("zoo:hf_mixtral", PlanSpec(8, batch=2, tp=(2,), cp=(1,), ep=(2,),
                                                    node=4, checkpoints=("none",)), moe)
    hsdp = next(c for c in plan.candidates
                if c.settings.mesh.words == "dp_replicate=2,dp_shard=2,tp=2,ep=2")
    assert hsdp.status == "fits"
    assert_is_direct(hsdp, analyze("zoo:hf_mixtral", **moe, **hsdp.settings.analyze_kwargs({})))


def test_expert_parallelism_is_searched_beside_context_parallelism():
    """A mixture of experts over sequences: ep carved out of the dp_shard × cp ranks
    (torchtitan's; tests/test_expert_parallel.py checks ``dp_shard=2,cp=2,ep=2`` against a
    real step on 4 gloo ranks), without tp (cp × tp × ep is not checked: left out, said so).
    The candidate is what analyzing its settings alone gives."""
    from graphcost.models_zoo import hf

    # 4 GPUs, 4 experts, 128 tokens: cp 2 and 4 (each dividing the GPUs, 2·cp the tokens)
    # beside ep 2 and 4 (dividing the GPUs and the experts), and each alone
    searched = {s.mesh.words for s in settings_of(PlanSpec(4, batch=2, tp=(1,)), 2, 4, 128)}
    assert {"dp_shard=2,cp=2,ep=2", "dp_shard=2,cp=2,ep=4", "dp_shard=1,cp=4,ep=2",
            "dp_shard=1,cp=4,ep=4", "dp_shard=2,cp=2", "dp_shard=4,ep=2"} <= searched
    # beside tp, no ring carries ep
    both = settings_of(PlanSpec(8, batch=2, tp=(2,)), 2, 4, 128)
    assert not any(s.cp > 1 and s.ep > 1 for s in both)
    assert any(s.cp > 1 for s in both) and any(s.ep > 1 for s in both)
    # both sizes asked for: that layout alone, analyzed (the zoo's Mixtral with SDPA, which
    # context parallelism rings)
    base = dict(TINY, dims=None, input_shapes={"input_ids": (2, 128)},
                input_dtypes={"input_ids": "int64"})
    model = hf.mixtral(attn="sdpa")
    plan = plan_training(model, PlanSpec(4, batch=2, tp=(1,), cp=(2,), ep=(2,),
                                         checkpoints=("none",)), base)
    ring = plan.candidates[0]
    assert [c.settings.mesh.words for c in plan.candidates] == ["dp_shard=2,cp=2,ep=2"]
    assert ring.status == "fits"
    assert_is_direct(ring, analyze(model, **base, **ring.settings.analyze_kwargs({})))
    assert ring.samples == 2 * 2   # (2 data ranks of batch 2: each ring shares its sequences)


def test_context_parallel_sizes_asked_for_are_analyzed_and_are_their_direct_analysis():
    """``--cp 1,2 --cp-rotate alltoall`` on 4 GPUs: FSDP over all 4 with whole sequences,
    and over 2 × cp 2 with each sequence split in two, its ring passing keys and values on
    (analyzed although FSDP fits: asked for); its candidate is what analyzing its settings
    alone gives, and torchtitan's line names the degree and the rotate method."""
    rotate = {"cp_rotate": "alltoall"}
    plan = plan_training("zoo:llama_tiny", PlanSpec(4, batch=2, tp=(1,), cp=(1, 2),
                                                    checkpoints=("none",)),
                         {**TINY, "parallel": rotate})
    ring = next(c for c in plan.candidates if c.settings.cp == 2)
    assert ring.status == "fits" and ring.settings.mesh.words == "dp_shard=2,cp=2"
    assert_is_direct(ring, analyze("zoo:llama_tiny", **TINY,
                                   **ring.settings.analyze_kwargs(rotate)))
    assert ring.samples == 2 * 2   # (2 data ranks of batch 2: the cp ranks share theirs)
    # (the layout without a ring analyzed without the ring's option)
    assert all(c.error is None for c in plan.candidates)
    args = llama3_8b_args({"dp_shard": 2, "cp": 2}, 2, "none")
    assert args is not None
    assert args[args.index("--parallelism.context-parallel-degree") + 1] == "2"
    assert "--parallelism.context-parallel-rotate-method" not in args   # (its default)
    from graphcost.analyzer.cli.engine_args import torchtitan_args
    args = torchtitan_args("zoo:llama3_8b", {"dp_shard": 2, "cp": 2}, 2, "none",
                           {"precision": "bf16-master", "optimizer": "adamw",
                            "dims": {"seq": 8192}, "parallel": rotate})
    assert args is not None
    assert args[args.index("--parallelism.context-parallel-rotate-method") + 1] == "alltoall"
    assert args[args.index("--parallelism.data-parallel-shard-degree") + 1] == "2"
    # the sizes it tries by itself: 2, 4, … up to a node, dividing the GPUs and 2·cp the
    # sequence
    assert context_sizes(64, 8192, 8) == (2, 4, 8)
    assert context_sizes(8, 12, 8) == (2,)        # (12 tokens: 4 chunks, not 8)
    assert context_sizes(8, 0, 8) == ()           # (no sequence)


def test_the_expert_parallel_sizes_divide_the_ranks_and_the_experts():
    # 2, 4, … up to a node of 8, dividing the sharding ranks and a layer's experts
    assert expert_sizes(64, 8, 8) == (2, 4, 8)
    assert expert_sizes(8, 4, 8) == (2, 4)       # (4 experts: 8 would leave ranks none)
    assert expert_sizes(12, 8, 8) == (2, 4)      # (8 does not divide 12 ranks)
    assert expert_sizes(8, 6, 8) == (2,)         # (4 does not divide 6 experts)
    assert expert_sizes(8, 0, 8) == ()           # (a dense model)
    assert expert_sizes(64, 64, 8) == (2, 4, 8)  # (within a node)


@pytest.mark.parametrize("argv, message", [
    (["--gpus", "4"], "a plan ranks by a GPU's time estimate: add a GPU --device"),
    (["--gpus", "4", "--device", "h100", "--world-size", "4"],
     "--world-size goes with --parallel"),
    (["--gpus", "4", "--device", "h100", "--parallel", "dp_shard=4"],
     "--parallel: a plan searches the layout"),
    (["--gpus", "4", "--device", "h100", "--checkpoint", "sqrt"],
     "--checkpoint sqrt: a plan tries none, sac, full"),
    (["--gpus", "4", "--device", "h100", "--tp", "3"], "--tp 3: it must divide the 4 GPUs"),
    # every setting refused: the analysis's own error (tp 4 cannot split 2 KV heads)
    (["--gpus", "4", "--device", "h100", "--tp", "4", "--precision", "bf16-mixed",
      "--checkpoint", "none"],
     "--parallel tp=4: layers.0.self_attn.k_proj's key/value head count (2) does not "
     "divide into 4 ranks"),
    (["--gpus", "4", "--device", "h100", "--tp", "4"],
     "--precision bf16-master: its master weights are modelled as FSDP2's, and every layout"),
    (["--gpus", "4", "--device", "h100", "--dim", "seq=512", "--global-tokens", "3000"],
     "--global-tokens 3000: 3,000 tokens is not a whole number of 512-token sequences "
     "(≈ 5.9); 3,072 is 6"),
    (["--gpus", "4", "--device", "h100", "--global-tokens", "4096"],
     "--global-tokens counts sequences of --dim seq=N: give it"),
    (["--gpus", "4", "--device", "h100", "--global-batch", "3", "--tp", "1"],
     "--global-batch 3: no layout of 4 GPUs splits it evenly"),
    (["--gpus", "4", "--device", "h100", "--ep", "2", "--checkpoint", "none"],
     "--parallel ep=2: expert parallelism splits a mixture of experts' stacked expert"),
    (["--gpus", "4", "--device", "h100", "--ep", "x"], "--ep x: whole numbers"),
    (["--gpus", "4", "--device", "h100", "--cp", "3"], "--cp 3: it must divide the 4 GPUs"),
])
def test_bad_plans_get_one_line(argv, message, capsys):
    assert main(["plan", "zoo:llama_tiny", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"graphcost: error: {message}") and err.count("\n") == 1


def test_a_pipelines_advice_weighs_its_other_schedules():
    """On a pipeline (pp=2, 1F1B) --advise tries the schedules a user can switch to but
    GPipe: interleaved 1F1B and the two zero-bubble ones, each two stages a rank (torchtitan's
    default; the V's only size); a rank count asked for an interleaved schedule is dropped
    where the switch would refuse it. Llama 3 8B on pp=4 × dp_shard=2 at 16 × 2,048 on an
    H100 (bf16-master): zbv +16% throughput for 7.55 GiB more, interleaved-zb +14% for 4.60."""
    from graphcost.analyzer.app.advise import changes
    from graphcost.analyzer.cli.wording import cli_text

    kwargs = {**TINY, "batch": 8, "parallel": {"mesh": "pp=2", "microbatches": 4}}
    tried = {cli_text(w): c for w, c in changes(kwargs)}
    assert [w for w in tried if "schedule" in w] == [
        "--pp-schedule interleaved-1f1b", "--pp-schedule interleaved-zb", "--pp-schedule zbv"]
    assert "--pp-schedule 1f1b" in {cli_text(w) for w, _ in changes(
        {**kwargs, "parallel": {"mesh": "pp=2", "schedule": "zbv"}})}
    interleaved = {"mesh": "pp=2", "schedule": "interleaved-1f1b", "stages_per_rank": 3}
    assert [c["parallel"] for w, c in changes({**kwargs, "parallel": interleaved})
            if "schedule" in cli_text(w)] == [
        {"mesh": "pp=2", "schedule": "1f1b"},
        {"mesh": "pp=2", "schedule": "interleaved-zb", "stages_per_rank": 3},
        {"mesh": "pp=2", "schedule": "zbv"}]
    p = analyze("zoo:llama_tiny", **{**kwargs, **tried["--pp-schedule zbv"]}).pipeline
    assert p is not None and (p.schedule, p.stages_per_rank) == ("zbv", 2)


def test_advice_is_the_changes_analyzed_directly(capsys):
    """--advise on FSDP 4 with selective checkpointing: a change it weighs is the direct
    analysis with that one change (checked on one of each path: the same trace, a new one, the
    first one again after it), and a fitting step's advice leads with the fastest."""
    from graphcost.analyzer.app.advise import advise, outcome

    kwargs = {**TINY, "batch": 4, "checkpoint": {"sac": True},
              "parallel": {"mesh": "dp_shard=4"}}
    advice = advise("zoo:llama_tiny", kwargs)
    from graphcost.analyzer.cli.wording import cli_text

    words = [cli_text(c.words) for c in advice.tried]
    assert words == ["no checkpointing", "--checkpoint full", "--parallel dp_shard=2,tp=2",
                     "--allocator expandable_segments:True", "--compile", "--batch 2",
                     "--optimizer-impl forloop"]
    for c in advice.tried[1:4]:
        assert c.outcome == outcome(analyze("zoo:llama_tiny", **{**kwargs, **c.kwargs}))
    best = advice.best[0].outcome
    assert best is not None and advice.now.fits
    assert best.samples_per_second == max(c.outcome.samples_per_second for c in advice.tried
                                          if c.outcome and c.outcome.fits)
    assert main(["zoo:llama_tiny", "--train", "--parallel", "dp_shard=4", "--batch", "4",
                 "--checkpoint", "sac", "--precision", "bf16-master", "--optimizer", "adamw",
                 "--dim", "seq=512", "--device", "h100", "--advise"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 24 and lines[0].startswith("advise: zoo:llama_tiny")
    assert lines[5] == f"  {cli_text(advice.best[0].words)}"
    assert all(len(line) <= 80 for line in lines)
    assert lines[2].endswith(" tokens/s per GPU (estimate ± 16%)")


def test_an_onnx_file_has_no_time_to_rank_by(capsys):
    from graphcost.models_zoo.export import cached_export

    assert main(["plan", str(cached_export("mnist_net")), "--gpus", "2", "--device", "h100",
                 "--checkpoint", "none"]) == 2
    assert capsys.readouterr().err == (
        "graphcost: error: a plan ranks settings by the time estimate, which a GPU's "
        "datasheet gives a traced PyTorch model, not an ONNX file's estimated training step\n")


def test_a_search_collects_less_and_puts_the_collector_back():
    import gc

    from graphcost.analyzer.app.settings_analyses import collecting_less
    before = gc.get_threshold()

    @collecting_less
    def search():
        assert gc.get_threshold()[0] > 700   # (fewer collections than Python's default)
        raise GraphcostError("refused")

    try:
        gc.set_threshold(700, 10, 10)
        with pytest.raises(GraphcostError):
            search()
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)
