"""Every report ends on its answer (issue 48): the default views of the common commands end on
the line that decides — the peak, the step's peak, one rank's peak, the serving capacity,
whether it fits, the max batch, pass or fail — and a question beyond "what does it cost"
(--train, --device, --parallel, --serve, --max-batch) fits one screen of 80×24, piped at
COLUMNS=80 as a terminal of that size would show it."""
from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import onnx
import pytest
from graphcost.analyzer.app.units import human_bytes

from graphcost import Report, analyze
from tests.cli_runner import run_cli
from tests.onnx_builders import model, node, weight

SIZE = r"[\d,.]+ (?:B|KiB|MiB|GiB|TiB)"
FITS = re.compile(rf"^fits {{8}}(yes|NO): (each rank )?needs ({SIZE}) of ({SIZE}) "
                  rf"\(({SIZE}) (to spare|short)\)$")


def view(*args, env: dict | None = None) -> list[str]:
    done = run_cli(*args, env={"COLUMNS": "80", **(env or {})})
    assert done.returncode in (0, 1), done.stderr   # (check: 1 is over budget)
    return done.stdout.splitlines()


# What the views loaded (traced), by model and load options (repr: they hold mappings): a view
# whose model is loaded as an earlier one's (the same step on the same device under another
# view or parallel plan, the same serving batch with or without a device) runs its passes on
# that load, as shared.py's traces are shared; the IR is immutable
_LOADED: dict[tuple[str, ...], object] = {}


@functools.cache
def shown(*args: str) -> tuple[tuple[str, ...], Report]:
    """``view(*args)`` and the report the command printed it from (what the passes, which
    both faces run, returned to it), each command run once for the module: several tests read
    the same view, and the report's figures are the ones its last line must show."""
    from graphcost.analyzer.app import api

    made: list[Report] = []
    load, run_passes = api.load, api.run_passes

    def loaded(model, options, *rest, serve=None, **kw):
        key = (str(model), repr(options), repr(serve))
        if key not in _LOADED:
            _LOADED[key] = load(model, options, *rest, serve=serve, **kw)
        return _LOADED[key]

    def passes(*a, **kw):
        made.append(run_passes(*a, **kw))
        return made[-1]
    api.load, api.run_passes = loaded, passes
    try:
        lines = tuple(view(*args))
    finally:
        api.load, api.run_passes = load, run_passes
    assert len(made) == 1, len(made)
    return lines, made[0]


def one_screen(lines: Sequence[str]) -> None:
    assert len(lines) <= 24, "\n".join(lines)
    assert max(map(len, lines)) <= 80, [line for line in lines if len(line) > 80]


def last_entry(lines: Sequence[str]) -> tuple[str, str]:
    """The summary's last entry: its label and its text, continuation lines joined."""
    start = max(i for i, line in enumerate(lines) if line[:1].strip())
    text = " ".join(line[12:].strip() for line in lines[start:])
    return lines[start][:11].strip(), text


def labels(lines: Sequence[str]) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith("model "))
    return [line[:11].strip() for line in lines[start:] if line[:1].strip()]


def ends_on_the_fit(lines: Sequence[str], r=None, per_rank: bool = False) -> None:
    """The last line is the whole verdict, the line above it what it adds up."""
    m = FITS.match(lines[-1])
    assert m, lines[-1]
    assert bool(m.group(2)) == per_rank and labels(lines)[-2] == "on device"
    if r is not None:  # the report's own fit, as the figures of one line
        f = r.roofline.fit
        assert (m.group(1) == "yes") == f.fits
        assert (m.group(3), m.group(4), m.group(5)) == (
            human_bytes(f.needs), human_bytes(f.offers), human_bytes(abs(f.margin)))


# --- inference ----------------------------------------------------------------------------------

def test_an_onnx_file_ends_on_its_peak(tmp_path):
    # x[1,8] · W[8,4] → y[1,4]: params 32 floats = 128 B; at the MatMul x (32 B) and y (16 B)
    # are live (the inputs counted): 48 B; the peak 128 + 48 = 176 B
    path = tmp_path / "mm.onnx"
    onnx.save(model([node("MatMul", ["x", "W"], ["y"])], [("x", [1, 8])], [("y", [1, 4])],
                    inits=[weight("W", 8, 4)]), path)
    lines = view(path)
    assert max(map(len, lines)) <= 80
    label, text = last_entry(lines)
    assert (label, text) == ("peak", "176 B (176 B) = parameters + buffers + activation peak")
    # "where is the work" stays: the node table and the op types above the summary
    assert lines[0] == "graphcost: mm.onnx" and "by op type" in lines


def test_a_zoo_model_keeps_its_table_and_ends_on_its_peak():
    lines = view("zoo:resnet50", "--batch", "16")
    assert max(map(len, lines)) <= 80 and "by op type" in lines
    order = labels(lines)
    assert order[0] == "model" and order[-5:] == ["params", "MACs", "FLOPs", "bytes", "peak"]


def test_inference_on_a_device_ends_on_the_fit():
    lines = view("zoo:resnet50", "--batch", "16", "--device", "h100-sxm")
    one_screen(lines)
    assert lines[0] == "graphcost — the heaviest of 175 nodes, every figure: --details"
    order = labels(lines)
    assert order.index("roofline") < order.index("peak") < order.index("on device")
    ends_on_the_fit(lines, analyze("zoo:resnet50", batch=16, device="h100-sxm"))


# --- training -----------------------------------------------------------------------------------

def test_a_training_step_ends_on_its_peak():
    lines, r = shown("zoo:gpt2", "--train")
    one_screen(lines)
    label, text = last_entry(lines)
    assert label == "step peak" and text.startswith(f"{human_bytes(r.training.peak_bytes)} "
                                                    f"({r.training.peak_bytes:,} B) in ")
    assert "by op type" not in lines and "slowest nodes (roofline):" not in lines


def test_training_on_an_h100_ends_on_the_fit():
    lines, r = shown("zoo:gpt2", "--train", "--device", "h100-sxm")
    one_screen(lines)
    order = labels(lines)
    assert order[-3:] == ["step peak", "on device", "fits"]
    ends_on_the_fit(lines, r)


def test_a_7b_step_on_an_h100_is_one_screen():
    lines = view("zoo:llama7b", "--train", "--device", "h100-sxm", "--precision", "bf16-true")
    one_screen(lines)
    assert labels(lines)[-3:] == ["step peak", "on device", "fits"]
    ends_on_the_fit(lines)


def test_a_checkpoint_plan_decides_the_step_peak():
    # the plan lowers the step: the last line is the plan's peak (the one the fit prices),
    # the step's own beside it
    lines, r = shown("zoo:gpt2", "--batch", "8", "--train", "--checkpoint-every", "1")
    ck = r.training.checkpoint
    assert ck.peak_bytes < ck.peak_without_bytes
    label, text = last_entry(lines)
    assert label == "step peak" and text.startswith(
        f"{human_bytes(ck.peak_bytes)} ({ck.peak_bytes:,} B) with the checkpoint plan")
    assert text.endswith(f"without it {human_bytes(ck.peak_without_bytes)})")


@pytest.mark.parametrize("name, extra", [("gpt2", ()), ("llama7b", ("--precision", "bf16-true"))])
def test_fsdp_over_8_ends_on_the_ranks_fit(name, extra):
    # per rank first: no one-device "step peak" line (the rank's line names it), the rank's
    # peak, then what each rank must hold and whether it fits. The 7B in bf16 names its
    # attention's dtype, which took the view to 25 lines before the brief line said
    # "dispatched on" (its attention line wrapped)
    lines, _ = shown(f"zoo:{name}", "--train", "--parallel", "fsdp", "--world-size", "8",
                     "--device", "h100-sxm", *extra)
    one_screen(lines)
    order = labels(lines)
    assert order[-3:] == ["per rank", "on device", "fits"]
    assert "step peak" not in order and "training" not in order and "at peak" not in order
    assert "one device at this batch" in " ".join(lines)
    ends_on_the_fit(lines, per_rank=True)


def test_a_70b_fsdp_by_tp_step_with_full_checkpointing_is_one_screen():
    # torchtitan's 70B layout: 80 checkpointed blocks named in full and the communication of
    # two mesh dimensions took this view to 44 lines; the brief names a few of the segments
    # and the link's bytes by dimension (the volumes and one-device peaks in --details)
    lines, r = shown("zoo:llama3_70b", "--train", "--batch", "1", "--dim", "seq=8192",
                     "--parallel", "dp_shard=8,tp=8", "--checkpoint", "full", "--precision",
                     "bf16-master", "--optimizer", "adamw", "--device", "h100-sxm")
    one_screen(lines)
    assert labels(lines)[-3:] == ["per rank", "on device", "fits"]
    assert any("(80 segments)" in ln for ln in lines)
    assert any("tp " in ln and "dp_shard " in ln for ln in lines)
    assert r.parallel.mesh == {"dp_shard": 8, "tp": 8}


def test_the_8b_fsdp_step_with_its_time_is_one_screen():
    # torchtitan's 8B layout, the docs' first large-model command: the time estimate's two
    # lines took it to 26; the brief gives the link's bytes without the volumes and the
    # traced layers' note without its last clause
    lines, _ = shown("zoo:llama3_8b", "--train", "--batch", "2", "--dim", "seq=8192",
                     "--parallel", "dp_shard=8", "--checkpoint", "sac", "--precision",
                     "bf16-master", "--optimizer", "adamw", "--device", "h100-96gb")
    one_screen(lines)
    assert labels(lines)[-4:] == ["time", "per rank", "on device", "fits"]


def test_max_batch_ends_on_the_batch():
    lines = view("zoo:gpt2", "--train", "--device", "h100-sxm", "--max-batch")
    one_screen(lines)
    label, text = last_entry(lines)
    assert label == "max batch" and re.match(r"[\d,]+ \(needs ", text), text


# --- serving ------------------------------------------------------------------------------------

def test_serving_ends_on_capacity_then_the_fit():
    lines, r = shown("zoo:llama_tiny", "--serve", "--prompt", "64", "--generate", "16",
                     "--device", "a100-80gb")
    one_screen(lines)
    assert labels(lines)[-3:] == ["capacity", "on device", "fits"]
    ends_on_the_fit(lines, r)


def test_serving_without_a_device_ends_on_what_it_reserves():
    lines, _ = shown("zoo:llama_tiny", "--serve", "--prompt", "64", "--generate", "16")
    one_screen(lines)
    assert last_entry(lines)[0] == "reserved"


def test_serving_a_mixture_is_one_screen():
    # the experts' line gives the parameters a token runs; their FLOPs are the phase table's
    # and the rows an expert takes --details' (a 30B mixture's screen was 26 lines)
    lines, r = shown("zoo:hf_mixtral", "--serve", "--prompt", "64", "--generate", "16",
                     "--batch", "2", "--device", "h200")
    one_screen(lines)
    assert r.moe is not None and f"params {r.moe.active_params:,} active per token of " \
        f"{r.moe.total_params:,}" in [line.strip() for line in lines]
    assert labels(lines)[-3:] == ["capacity", "on device", "fits"]


def test_serving_says_nothing_of_the_arena_it_leaves_out():
    # a mixture's prefill (Qwen3-30B-A3B's shape, batch 8 × 2,048) stacks its arena: the
    # serving view, which prices the prefill in its own lines and shows no arena, printed the
    # arena's warning in three of its 24 lines
    from dataclasses import replace

    from graphcost.analyzer.app.pipeline import ARENA_WARNING
    from graphcost.analyzer.render.summary import summary_lines

    serve = {"prompt": 64, "generate": 16}
    r = analyze("zoo:llama_tiny", serve=serve, device="a100-80gb", what_if=False)
    warned = replace(r, warnings=(f"{ARENA_WARNING}stacked", "the other warning"))
    text = "\n".join(summary_lines(warned, width=80))
    assert "the other warning" in text and "arena" not in text
    inference = analyze("zoo:llama_tiny", what_if=False)
    text = "\n".join(summary_lines(replace(inference, warnings=(f"{ARENA_WARNING}stacked",)),
                                  width=80))
    assert "arena: stacked" in text and "arena " in text     # (its line is shown, and said of)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """meta-llama/Llama-3.1-8B's published config.json in a local hub cache, offline (as
    tests/test_hub_models.py writes it)."""
    from tests.test_hub_models import LLAMA_31_8B, _write
    home = tmp_path / "hf"
    _write(home, "meta-llama/Llama-3.1-8B", LLAMA_31_8B)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c  # read at import: point it at this cache too
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(home / "hub"))
    return home


def test_serving_a_hub_model_is_one_screen(hub):
    # the longest model line of the common commands ("meta-llama/Llama-3.1-8B (bfloat16 from
    # config.json) (fx)"): still one screen, still ending on the fit
    lines = view("meta-llama/Llama-3.1-8B", "--serve", "--prompt", "2048", "--generate", "256",
                 "--device", "h100-sxm")
    one_screen(lines)
    assert labels(lines)[-3:] == ["capacity", "on device", "fits"]
    ends_on_the_fit(lines)


# --- check and the whole view -------------------------------------------------------------------

def test_check_ends_on_pass_or_fail():
    # small_cnn at batch 8: 813,802 params (tests/test_html_report.py's arithmetic) ≤ 1M
    lines = view("check", "zoo:small_cnn", "--batch", "8", "--max-params", "1M")
    assert lines[-1] == "all checks passed"
    lines = view("check", "zoo:small_cnn", "--batch", "8", "--max-params", "800K")
    assert lines[-1] == "1 check(s) over budget" and len(lines) <= 24


def test_details_shows_every_table_and_still_ends_on_the_fit():
    brief, _ = shown("zoo:gpt2", "--train", "--device", "h100-sxm")
    every, _ = shown("zoo:gpt2", "--train", "--device", "h100-sxm", "--details")
    assert "by op type" in every and "slowest nodes (roofline):" in every
    assert {"MACs", "activations", "live", "attention"} <= set(labels(every))
    assert every[-1] == brief[-1] and labels(every)[-3:] == labels(brief)[-3:]


# --- the first contact's small ones (issue 48, item 10) -----------------------------------------

def test_the_bare_usage_names_every_kind_of_model():
    from graphcost.analyzer.cli.help import bare_usage
    text = bare_usage(["check"])
    assert "timm:NAME" in text and "config.json or its folder" in text
    assert max(map(len, text.splitlines())) <= 80


@pytest.mark.parametrize("flag, value", [("--input-shape", "ids=2x256,labels=2x256"),
                                         ("--dim", "seq=128,batch=2")])
def test_two_values_in_one_option_say_to_repeat_it(flag, value):
    # `--input-shape ids=2x256,labels=2x256` failed "bad shape" (its shape read as
    # "2x256,labels=2x256"): now the message shows the two options to type
    done = run_cli("zoo:gpt2", flag, value)
    first, second = value.split(",")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert f"repeat the option: {flag} {first} {flag} {second}" in done.stderr


def test_a_zoo_miniature_says_what_it_stands_in_for():
    # issue 48: zoo:gpt2 is a 2-layer, 541,184-parameter model (its ONNX export stores the
    # tied head twice: 669,184), unlabelled it read as GPT-2 (124M)
    out = "\n".join(shown("zoo:gpt2", "--train")[0])
    assert "stand-in    a tiny GPT-2 decoder (zoo), not GPT-2 small (124M parameters)" in out
    assert "stand-in" not in run_cli("zoo:mlp", env={"COLUMNS": "80"}).stdout
