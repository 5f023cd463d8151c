"""Checkpoint plans on the joint graph, against torch.utils.checkpoint measured by MemTracker."""
from __future__ import annotations

import warnings

import pytest
from graphcost.analyzer.app.units import parse_size
from graphcost.passes.training.checkpoint import CheckpointSpec
from torch.utils.checkpoint import checkpoint

from graphcost import GraphcostError, analyze
from tests.shared import measured_step_peak, train_report

warnings.filterwarnings("ignore", category=FutureWarning)


def checkpoint_segments(segments: list[list[str]]):
    """A ``prepare`` for measured_step_peak: torch.utils.checkpoint around each segment (a run
    of consecutive blocks, checkpointed as one)."""
    def prepare(model):
        for group in segments:
            mods = [model.get_submodule(p) for p in group]
            forwards = [m.forward for m in mods]

            def run(*a, forwards=forwards):
                x = forwards[0](*a)
                for f in forwards[1:]:
                    x = f(x, *a[1:])
                return x

            mods[0].forward = lambda *a, run=run: checkpoint(run, *a, use_reentrant=False)
            for m in mods[1:]:
                m.forward = lambda x, *rest: x
    return prepare


# Each plan and each optimizer on resnet18 (a real step at 224×224: ~1.3 s a measurement), every
# plan under both optimizers on the transformers
CASES = [("resnet18", {"every": 1}, "none"), ("resnet18", {"sqrt": True}, "adam")] + \
    [(name, {"every": 1}, opt) for name in ("gpt2", "bert", "llama_tiny")
     for opt in ("none", "adam")]


@pytest.mark.parametrize("name,plan,optimizer", CASES,
                         ids=[f"{n}-{next(iter(p))}-{o}" for n, p, o in CASES])
def test_checkpointed_peak_vs_memtracker(name, plan, optimizer):
    # the shared joint trace (tests/shared.py) at full size: checkpointing lowers the peak only
    # where activations outweigh Adam's state; inputs left out as MemTracker leaves them out
    r = train_report(name, optimizer, small=False, checkpoint=plan, what_if=False)
    c = r.training.checkpoint
    assert c.peak_without_bytes == r.training.peak_bytes
    assert c.peak_bytes < c.peak_without_bytes and c.recompute_flops > 0
    measured = measured_step_peak(name, optimizer,
                                  checkpoint_segments([s.split("+") for s in c.segments]),
                                  small=False)
    assert abs(c.peak_bytes / measured - 1) <= 0.10, (c.peak_bytes, measured)


def test_plans_and_blocks():
    # (on the full-size trace the MemTracker cases above read: plans are of the module tree,
    # whatever the image size)
    def plan(**checkpoint):
        return train_report("resnet18", "adam", small=False, checkpoint=checkpoint,
                            what_if=False).training

    every = plan(every=2).checkpoint
    assert every.segments == ("layer1.0+layer1.1", "layer2.0+layer2.1", "layer3.0+layer3.1",
                              "layer4.0+layer4.1")
    # 8 blocks → √8 ≈ 3 segments of ⌈8/3⌉ = 3 blocks
    sqrt = plan(sqrt=True).checkpoint
    assert len(sqrt.segments) == 3
    named = plan(names=["layer1"])
    assert named.checkpoint.segments == ("layer1",)
    # recompute = the checkpointed forward once more: less than the forward of the whole model
    assert 0 < named.checkpoint.recompute_pct < 34


def test_auto_plan_fits_budget_with_least_recompute():
    def step(**checkpoint):  # (small=False: the trace the MemTracker cases made; gpt2 has
        # no smaller test size)
        return train_report("gpt2", "adam", small=False, checkpoint=checkpoint or None,
                            what_if=False).training

    plain = step()
    one = step(names=["h.0"]).checkpoint
    # a budget that one checkpointed block meets: auto picks one block, not both
    auto = step(budget=one.peak_bytes).checkpoint
    assert len(auto.segments) == 1 and auto.peak_bytes <= one.peak_bytes
    assert auto.peak_without_bytes == plain.peak_bytes
    roomy = step(budget=plain.peak_bytes).checkpoint
    assert roomy.segments == () and roomy.recompute_flops == 0
    floor = plain.param_bytes + plain.optimizer_state_bytes + plain.grad_bytes
    with pytest.raises(GraphcostError, match=f"alone take {floor:,} B"):
        step(budget=floor - 1)


def test_unknown_segment_lists_close_matches():
    with pytest.raises(GraphcostError, match="close matches: .*h.0"):
        train_report("gpt2", "adam", small=False, checkpoint=CheckpointSpec(names=("h.O",)))


@pytest.mark.parametrize("text,value", [("4GB", 4 * 10**9), ("4GiB", 4 * 2**30),
                                        ("4e9", 4 * 10**9), ("512MiB", 512 * 2**20),
                                        ("1.5G", 15 * 10**8)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["four", "4XB", "-1GB", ""])
def test_bad_sizes(text):
    with pytest.raises(GraphcostError, match="expected a size|positive"):
        parse_size(text)


@pytest.mark.every_torch
def test_a_checkpointed_block_recomputes_what_a_view_outside_it_looks_at():
    # math attention (a T4: no flash, no efficient kernel in bf16) saves its softmax for
    # backward through a view: torch 2.13 traces that detach outside every module, 2.14 an
    # alias inside the attention. torch.utils.checkpoint recomputes the block's softmax
    # either way, and so does the plan: one forward lifetime (to the block's end) and one
    # recomputed, not held from the forward to its backward. Before views stopped counting
    # as readers, the plan on 2.13 held a layer's scores more at its peak (batch 4 × 4 heads
    # × 2,048² × 4 B = 268 MB: 1.107 GB against 2.14's 0.838 GB at 4 × 2,048 tokens)
    r = analyze("zoo:llama_tiny", train=True, optimizer="adamw", precision="bf16-master",
                what_if=False, device="t4", dims={"seq": 256}, batch=2,
                checkpoint={"every": 1})
    assert r.attention[0].kernel.value == "math"
    storages = {s.name: s for s in r.training.checkpoint.checkpointed.storages}
    for name in ("_safe_softmax", "_safe_softmax_1"):       # (the two layers' scores)
        first, again = storages[name], storages[name + "@recompute"]
        assert first.nbytes == again.nbytes == 2 * 4 * 256 * 256 * 4   # batch × heads × s², fp32
        assert first.death < again.birth


def test_the_first_step_said_under_a_plan_is_the_checkpointed_steps():
    # the report's "first step" line is the step that runs: under a checkpoint plan the
    # checkpointed one (it said the plain step's, 1.07 GiB against the plan's 799 MiB steady
    # state, for zoo:llama_tiny on a T4 at 4 × 2,048 tokens); the plan's first step lacks only
    # Adam's state (created inside step(), after the peak in backward)
    from graphcost.analyzer.app.units import human_bytes
    from graphcost.analyzer.render.explain import first_step

    r = analyze("zoo:llama_tiny", train=True, optimizer="adam", what_if=False, batch=2,
                dims={"seq": 256}, checkpoint={"every": 1})
    t = r.training
    plan = t.checkpoint.checkpointed
    assert plan.first_step_peak_bytes < t.first_step_peak_bytes
    assert plan.peak_bytes - plan.first_step_peak_bytes == plan.optimizer_state_bytes
    said = first_step(r)
    assert said is not None and said.startswith(
        f"first step {human_bytes(plan.first_step_peak_bytes)} ")


def test_a_report_under_every_block_checkpointed_shows_that_step_once(capsys, monkeypatch):
    # with --checkpoint full the face holds what the checkpointed step holds at its peak, and
    # no what-if of checkpointing every block (it repeated the plan asked, line for line)
    from graphcost.analyzer.app.units import human_bytes
    from graphcost.analyzer.cli.main import main

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["zoo:llama_tiny", "--train", "--checkpoint", "full", "--batch", "2",
                 "--dim", "seq=256"]) == 0
    out = capsys.readouterr().out
    r = analyze("zoo:llama_tiny", train=True, batch=2, dims={"seq": 256},
                checkpoint={"every": 1})
    assert "checkpoint_every_block" not in r.training.what_if
    assert "inplace_activations" in r.training.what_if       # (the other savers stay)
    held = r.training.checkpoint.checkpointed.breakdown_at_peak["activations"]
    assert held < r.training.breakdown_at_peak["activations"]
    assert f"activations {human_bytes(held)}" in out and "checkpoint every" not in out


def test_the_html_report_shows_the_checkpointed_step_as_the_text_does():
    # the HTML page's "step peak" and "At the peak" are the step that runs under a plan, as
    # the text report's (its first-step note already was: the two figures side by side
    # must be of one step)
    from graphcost.analyzer.render.html import html_report

    r = analyze("zoo:llama_tiny", train=True, optimizer="adam", what_if=False, batch=2,
                dims={"seq": 256}, checkpoint={"every": 1})
    plan, plain = r.training.checkpoint.checkpointed, r.training
    assert plan.peak_bytes < plain.peak_bytes
    page = html_report(r)
    assert f"({plan.peak_bytes:,} B) in " in page and f"({plain.peak_bytes:,} B) in " not in page
    held = plan.breakdown_at_peak["activations"]
    assert f"({held:,} B)" in page
