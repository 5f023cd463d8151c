"""A new user's first commands (issue 26, "First contact"): a bare ``graphcost``, a mistyped
zoo, dim or option name, a weights file where a model goes, an output that cannot be written,
``check`` with no budget. Each answer is one line (or the short usage), exit 2, and says what
to type instead; each test failed on the behaviour before."""
from __future__ import annotations

import importlib
import os
import pickle
import shlex
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from graphcost.passes.errors import GraphcostError, did_you_mean

from tests.cli_runner import run
from tests.onnx_builders import model, node

ROOT = Path(__file__).resolve().parent.parent


def one_line_error(p, *needles) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphcost: error: "), p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture
def no_analysis(monkeypatch):
    """An analysis started is a failure: what the test checks must fail before it (it ran
    to the end first, then failed on the output file)."""
    from graphcost.analyzer.app import api, by_batch

    def refuse(*_a, **_k):
        raise AssertionError("the analysis ran")
    monkeypatch.setattr(api, "analyze", refuse)
    monkeypatch.setattr(api, "run_request", refuse)
    monkeypatch.setattr(by_batch, "analyze_by_batch", refuse)
    monkeypatch.setattr(by_batch, "max_batch_search", refuse)


@pytest.fixture
def seq_model(tmp_path):
    m = model([node("Relu", ["x"], ["y"])], [("x", ["batch", "seq", 8])],
              [("y", ["batch", "seq", 8])])
    path = tmp_path / "seq.onnx"
    onnx.save(m, path)
    return path


# --- a bare `graphcost` -------------------------------------------------------------------

def test_bare_graphcost_prints_usage_with_three_examples_and_exits_2():
    # the real command (console(), python -m graphcost): it said only "the following
    # arguments are required: model"
    p = subprocess.run([sys.executable, "-m", "graphcost"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert p.returncode == 2 and p.stdout == "", p
    assert "required" not in p.stderr
    lines = p.stderr.splitlines()
    assert lines[0] == "usage: graphcost MODEL [options]"
    examples = [line.split("  ")[1] for line in lines if line.startswith("  graphcost ")]
    assert len(examples) == 3
    assert any(".onnx" in e and "--batch" in e for e in examples)
    assert any("zoo:" in e and "--train" in e and "--device" in e for e in examples)
    assert "graphcost devices" in examples
    assert all(len(line) <= 80 for line in lines), lines  # an 80-column terminal


def test_the_usage_examples_are_commands_graphcost_accepts():
    from graphcost.analyzer.app.devices import get_device
    from graphcost.analyzer.cli.help import EXAMPLES
    from graphcost.analyzer.cli.main import SUBCOMMANDS, build_parser

    from graphcost import models_zoo

    for cmd, _ in EXAMPLES:
        argv = shlex.split(cmd)[1:]
        if argv[0] in SUBCOMMANDS:
            importlib.import_module(SUBCOMMANDS[argv[0]][0]).build_parser().parse_args(argv[1:])
            continue
        args = build_parser().parse_args(argv)
        if args.device:
            get_device(args.device)
        if args.model.startswith("zoo:"):
            assert args.model[4:] in models_zoo.names()
    assert run("devices").returncode == 0


# --- did you mean -------------------------------------------------------------------------

def test_did_you_mean_ignores_case_and_offers_only_the_closest():
    names = ["resnet18", "resnet50", "gpt2", "hf_gpt2"]
    assert did_you_mean("ResNet50", names, "zoo:{}") == " (did you mean zoo:resnet50?)"
    assert did_you_mean("gpt", names) == " (did you mean gpt2?)"
    assert did_you_mean("sequence", ["batch", "seq"]) == " (did you mean seq?)"
    assert did_you_mean("xyz", names) == "" and did_you_mean("x", []) == ""


def test_unknown_zoo_name_suggests_the_closest():
    line = one_line_error(run("zoo:resnet51"), "no zoo model 'resnet51'",
                          "did you mean zoo:resnet50", "known (in any case): ")
    assert "resnet50" in line.split("known")[1]  # the list still follows
    one_line_error(run("zoo:ResNet-5O"), "did you mean zoo:resnet50")


def test_a_zoo_name_in_another_case_names_the_model():
    # a zoo name can mean nothing else (the zoo's names are lower-case): it is the model, and
    # the report says its name as the zoo spells it
    import json
    p = run("zoo:MLP", "--format", "json", check_rc=0)
    assert json.loads(p.stdout)["model"] == "zoo:mlp"


def test_unknown_dim_of_an_onnx_model_suggests_the_closest(seq_model):
    one_line_error(run(seq_model, "--dim", "seqq=4"), "--dim seqq: no symbolic dim named 'seqq'",
                   "(did you mean seq?)", "symbolic dims: batch, seq")
    # an ONNX graph's dim names are case-sensitive (`N` and `n` may both be there): a
    # wrong case is suggested, not bound
    one_line_error(run(seq_model, "--dim", "SEQ=4"), "(did you mean seq?)")


def test_unknown_dim_of_a_zoo_torch_model_suggests_the_closest():
    # resnet18's sizes are height and width; the message said "its dims: batch only"
    one_line_error(run("zoo:resnet18", "--fx", "--dim", "heigth=64"),
                   "--dim heigth: zoo:resnet18 has no dim 'heigth'", "(did you mean height?)",
                   "its dims: height, width")


@pytest.mark.parametrize("argv, wrong, meant", [
    (["m.onnx", "--bach", "3"], "--bach", "--batch"),
    (["m.onnx", "--Format=json"], "--Format", "--format"),
    (["--fomat", "json", "m.onnx"], "--fomat", "--format"),
    (["check", "m.onnx", "--max-parms", "5M"], "--max-parms", "--max-params"),
    (["diff", "a.onnx", "b.onnx", "--tpo", "3"], "--tpo", "--top"),
])
def test_unknown_option_suggests_the_closest(argv, wrong, meant):
    # it said "unrecognized arguments: --bach 3"
    one_line_error(run(*argv), f"unknown option {wrong} (did you mean {meant}?)",
                   "--help lists every option")


def test_unknown_option_without_a_close_one_and_a_stray_word():
    line = one_line_error(run("m.onnx", "--zzzz"), "unknown option --zzzz; graphcost --help")
    assert "did you mean" not in line
    one_line_error(run("m.onnx", "stray"), "unrecognized arguments: stray")
    assert run("m.onnx", "--bat", "2").returncode == 2  # an abbreviation still parses: it
    # fails on the missing file, not on the option


# --- weights files ------------------------------------------------------------------------

class _Marker:
    """Unpickling this creates a file: the test's evidence that the file was unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("suffix", [".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".PT"])
def test_weights_file_says_what_graphcost_takes_and_is_never_opened(tmp_path, monkeypatch,
                                                                    suffix):
    from graphcost.analyzer.frontends.onnx import frontend as onnx_frontend

    marker = tmp_path / "unpickled"
    path = tmp_path / f"model{suffix}"
    path.write_bytes(pickle.dumps({"w": _Marker(marker)}))
    (tmp_path / "out.json").write_text("{}")  # an existing -o: the overwrite check reads
    # the input's external data references, which it must not look for here

    def opened(*_a, **_k):
        raise AssertionError("the weights file was read as ONNX")
    monkeypatch.setattr(onnx_frontend, "load_model", opened)
    for extra in ([], ["-o", str(tmp_path / "out.json")]):
        # it said "not a readable ONNX model (DecodeError…)"
        line = one_line_error(run(path, *extra), f"{path}: ", "weights file",
                              "no graph", ".onnx file", ".pt2 from torch.export.save",
                              "file.py:Class", "zoo:NAME")
        assert "ONNX model" not in line and "Decode" not in line
    from graphcost import analyze
    with pytest.raises(GraphcostError, match="no graph to cost"):
        analyze(str(path))
    assert not marker.exists()


# --- output paths -------------------------------------------------------------------------

@pytest.mark.parametrize("argv, flag", [
    (["zoo:mlp", "--html", "{d}/nodir/x.html"], "--html"),
    (["zoo:mlp", "--format", "json", "-o", "{d}/nodir/x.json"], "-o"),
    (["zoo:mlp", "--train", "--plot", "{d}/nodir/x.svg"], "--plot"),
    (["zoo:mlp", "--max-batch", "--device", "t4", "-o", "{d}/nodir/x.txt"], "-o"),
    (["check", "zoo:mlp", "--max-params", "5M", "-o", "{d}/nodir/c.txt"], "-o"),
    (["diff", "zoo:mlp", "zoo:mlp", "-o", "{d}/nodir/d.txt"], "-o"),
])
def test_missing_output_folder_fails_before_the_analysis(tmp_path, no_analysis, argv, flag):
    # --html nodir/x.html failed only after the whole analysis
    argv = [a.format(d=tmp_path) for a in argv]
    one_line_error(run(*argv), f"{flag} {tmp_path}/nodir/",
                   f"the folder {tmp_path}/nodir does not exist")
    assert not (tmp_path / "nodir").exists()


def test_unwritable_output_places_fail_before_the_analysis(tmp_path, no_analysis):
    (tmp_path / "afile").write_text("")
    one_line_error(run("zoo:mlp", "--html", tmp_path / "afile" / "x.html"),
                   f"the folder {tmp_path}/afile is not a directory")
    one_line_error(run("zoo:mlp", "-o", tmp_path), f"-o {tmp_path}: is a directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: nothing to refuse
            pytest.skip("this user can write into a read-only folder")
        one_line_error(run("zoo:mlp", "--html", locked / "x.html"),
                       f"the folder {locked} is not writable")
    finally:
        locked.chmod(0o700)


def test_writing_over_the_input_is_still_refused(seq_model, no_analysis):
    one_line_error(run(seq_model, "-o", seq_model), "is the input model")


# --- check without thresholds -------------------------------------------------------------

def test_check_without_thresholds_exits_2_and_lists_them(no_analysis):
    from graphcost.analyzer.cli.check import build_parser
    # it said "all checks passed" (the default coverage check alone)
    line = one_line_error(run("check", "zoo:mlp"), "no thresholds given")
    flags = [a.option_strings[0] for a in build_parser()._actions
             if a.dest.startswith(("max_", "min_"))]
    # (--max-ttft and --max-tpot, a serving review's, are two of them: 11 before)
    assert len(flags) == 13 and all(f in line for f in flags), line


def test_check_with_only_coverage_or_only_a_device_still_checks():
    p = run("check", "zoo:mlp", "--min-coverage", "100", check_rc=0)
    assert "PASS  coverage" in p.stdout
    p = run("check", "zoo:mlp", "--device", "t4", check_rc=0)
    assert "PASS  fits t4" in p.stdout and "PASS  coverage" in p.stdout
