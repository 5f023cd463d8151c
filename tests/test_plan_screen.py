"""A plan's screen (analyzer/app/plan_screen.py): a layout whose rank runs a program already
analyzed (the same trace and checkpoint plan, its data ranks split otherwise: HSDP beside
FSDP) is scaled from that analysis, and left unanalyzed where its scaled tensors prove it
over the device. Checked against the analysis of the screened settings alone."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from graphcost.analyzer.app.devices import get_device
from graphcost.analyzer.app.plan import plan_training
from graphcost.analyzer.app.plan_settings import PlanSpec
from graphcost.analyzer.render.plan import plan_json, plan_lines

from graphcost import analyze

GiB = 1 << 30
# Llama 3.1 8B at 2,048 tokens on 16 GPUs, full checkpointing: FSDP over the 16 and HSDP of
# two shard groups of 8 (a node each). On an H100 FSDP needs 24.09 GiB and HSDP 31.54 GiB (its
# parameter, gradient and AdamW shards twice FSDP's: 16 B a parameter / 8 against / 16). A
# device that offers 25 GiB fits the one; HSDP's tensors alone (24.25 GiB, with the runtime's
# 1.30 GiB share: NCCL's 0.63 and the CUDA context's 0.68) do not
BASE = dict(train=True, dims={"seq": 2048}, precision="bf16-master", optimizer="adamw",
            what_if=False)
H100 = get_device("h100")
SMALL = replace(H100, memory=25 * GiB, usable_memory=25 * GiB)
SPEC = dict(gpus=16, batch=1, tp=(1,), cp=(1,), pp=(1,), checkpoints=("none", "full"))


@pytest.fixture(scope="module")
def screened_plan():
    return plan_training("zoo:llama3_8b", PlanSpec(**SPEC), {**BASE, "device": SMALL})


def test_a_layout_over_the_device_by_its_scaled_tensors_is_not_analyzed(screened_plan):
    fsdp, hsdp = (c for c in screened_plan.candidates if c.settings.checkpoint == "full")
    assert fsdp.status == "fits" and not fsdp.screened
    assert fsdp.settings.mesh.words == "dp_shard=16"
    assert hsdp.status == "over" and hsdp.settings.mesh.words == "dp_replicate=2,dp_shard=8"
    assert hsdp.screened == "dp_shard=16, batch 1, checkpoint full"
    assert screened_plan.screened[0] == 1
    direct = analyze("zoo:llama3_8b", **BASE, device=SMALL,
                     **hsdp.settings.analyze_kwargs({}))
    assert direct.roofline is not None and direct.time is not None and hsdp.time is not None
    # the screen's tensors and time are the analysis's (the sharded state scaled: its peak
    # stays at the optimizer step; the collectives on the clock as the analysis puts them)
    assert hsdp.allocated_bytes == pytest.approx(direct.peak_bytes, rel=1e-4)
    assert hsdp.time.seconds == pytest.approx(direct.time.seconds, rel=1e-6)
    # what it needs at least (its tensors and the runtime's share) is a bound of the analysis's
    # figure and over the device; the needs it shows (the anchor's reserved bytes grown by its
    # tensors' growth) are below the analysis's: the larger shards find fewer cached blocks
    fit = direct.roofline.fit
    assert not fit.fits
    assert hsdp.offers_bytes < hsdp.needs_at_least <= fit.needs
    assert hsdp.needs_bytes is not None and hsdp.needs_bytes <= fit.needs
    # HSDP without checkpointing holds more still: pruned, needing at least what the screen
    # proved of full checkpointing (its bound, not its estimate)
    none = next(c for c in screened_plan.candidates if c.settings.checkpoint == "none"
                and c.settings.mesh == hsdp.settings.mesh)
    assert none.status == "pruned" and none.needs_at_least == hsdp.needs_at_least
    assert none.detail.endswith("does not fit (screened)")
    # the JSON says which candidate is an estimate, and scaled from what
    body = json.loads(plan_json(screened_plan, lambda c: ""))
    assert [c["screened"] for c in body["candidates"] if c["screened"]] == [hsdp.screened]
    assert body["schema_version"] == 5


def test_the_plans_table_shows_analyses_only(screened_plan):
    """The screened layout's figures are estimates: it ranks after the analyzed candidates
    over the device, and the table leaves it out; the best is the direct analysis."""
    lines = plan_lines(screened_plan, lambda c: "graphcost …")
    assert any(line.endswith("(1 screened)") for line in lines)
    assert not any("dp_replicate=2,dp_shard=8" in line for line in lines)
    best = screened_plan.best
    assert best is not None and best.settings.mesh.words == "dp_shard=16"
    direct = analyze("zoo:llama3_8b", **BASE, device=SMALL, **best.settings.analyze_kwargs({}))
    assert direct.roofline is not None and direct.time is not None and best.time is not None
    assert best.needs_bytes == direct.roofline.fit.needs
    assert best.time.seconds == direct.time.seconds


def test_only_fully_sharded_layouts_are_screened():
    # DDP (no dp_shard: a mesh's size is 1 there) holds whole parameters and DDP's buckets, no
    # gathered units: not a scaling of FSDP's rank; pipelines, expert and context
    # parallelism run other programs
    from graphcost.analyzer.app.plan_screen import program_of
    from graphcost.analyzer.app.plan_settings import Settings
    from graphcost.passes.parallel.mesh import parse_mesh

    def key(mesh: str):
        return program_of(Settings(parse_mesh(mesh), 2, "full"))

    assert key("dp_shard=16") == key("dp_replicate=2,dp_shard=8") == key("dp_shard=16,tp=1")
    assert key("dp_shard=8,tp=2") not in (None, key("dp_shard=16"))
    for mesh in ("dp_replicate=16", "dp_replicate=8,tp=2", "pp=2,dp_shard=8",
                 "dp_shard=8,cp=2", "dp_shard=8,ep=2"):
        assert key(mesh) is None, mesh


def test_a_ddp_layout_whose_whole_state_is_over_the_device_is_not_analyzed():
    # Under bf16-mixed (autocast: fp32 weights) DDP is searched beside FSDP. Its rank holds
    # whole what FSDP's holds a shard of at the optimizer step: Llama 3.1 8B's 8,030,261,248
    # parameters × (4 B weight + 4 B gradient + 8 B AdamW) = 119.6 GiB, with the runtime's
    # 1.30 GiB (NCCL's 32 channels × 12 MiB + 256 MiB NVLS, the CUDA context's 692.8 MiB:
    # passes/device/fits.py's published figures) over an H100's 79.2: screened with that
    # bound, no estimate
    base = {**BASE, "precision": "bf16-mixed", "device": "h100"}
    plan = plan_training("zoo:llama3_8b", PlanSpec(**{**SPEC, "checkpoints": ("full",)}), base)
    ddp = next(c for c in plan.candidates if c.settings.mesh.words == "dp_replicate=16")
    assert ddp.status == "over" and ddp.screened == "dp_shard=16, batch 1, checkpoint full"
    assert ddp.needs_bytes is None and ddp.time is None
    assert ddp.needs_at_least == pytest.approx(8_030_261_248 * 16 + 1.30 * GiB, rel=0.01)
    direct = analyze("zoo:llama3_8b", **base, **ddp.settings.analyze_kwargs({}))
    assert direct.roofline is not None
    assert ddp.offers_bytes < ddp.needs_at_least <= direct.roofline.fit.needs
