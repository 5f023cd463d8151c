"""`graphcost file.py:Class` and zoo models traced with --fx, through the installed command."""
from __future__ import annotations

import json
import textwrap

import pytest

from tests.cli_runner import run
from tests.test_bad_input import assert_one_line_error

NET = textwrap.dedent('''
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8, 10)

        def forward(self, x):
            y = self.conv(x).relu().mean((2, 3))
            return self.fc(y)

    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            if x.sum() > 0:          # control flow on tensor values: cannot be traced
                return self.fc(x)
            return x

    class NeedsArgs(nn.Module):
        def __init__(self, width):
            super().__init__()
''')


@pytest.fixture
def netfile(tmp_path):
    p = tmp_path / "net.py"
    p.write_text(NET)
    return p


def test_file_class_entry(netfile):
    r = json.loads(run(f"{netfile}:Net", "--input-shape", "x=2x3x16x16", "--format", "json",
                       check_rc=0).stdout)
    # params: conv 8·(3·9 + 1) = 224; fc 8·10 + 10 = 90 → 314
    assert r["totals"]["params"] == 314
    # MACs: conv 2·8·16·16·27 = 110,592; fc 2·10·8 = 160
    assert r["totals"]["macs"] == 110_592 + 160
    assert r["source"] == "fx" and r["model"] == "Net"
    assert r["memory"]["lifetimes"] == "eager"
    assert {m["path"] for m in r["modules"]} >= {"", "conv", "fc"}
    # --batch replaces axis 0 of the given shape (a retrace)
    r4 = json.loads(run(f"{netfile}:Net", "--input-shape", "x=2x3x16x16", "--batch", "4",
                        "--format", "json", check_rc=0).stdout)
    assert r4["totals"]["macs"] == 2 * r["totals"]["macs"]


def test_depth_tree(netfile):
    out = run(f"{netfile}:Net", "--input-shape", "x=1x3x8x8", "--depth", "1", check_rc=0).stdout
    assert "modules to depth 1" in out and "Conv2d" in out and "Linear" in out


def test_no_such_class(netfile):
    assert_one_line_error(run(f"{netfile}:Nope", "--input-shape", "x=1x3x8x8"),
                          "no class 'Nope'", "DataDependent, NeedsArgs, Net")


def test_untraceable_forward(netfile):
    assert_one_line_error(run(f"{netfile}:DataDependent", "--input-shape", "x=2x4"),
                          "torch.export could not trace")


def test_wrong_rank(netfile):
    assert_one_line_error(run(f"{netfile}:Net", "--input-shape", "x=3x16x16x1x1"),
                          "could not trace")


def test_missing_shape_and_args(netfile):
    assert_one_line_error(run(f"{netfile}:Net"), "--input-shape")
    assert_one_line_error(run(f"{netfile}:NeedsArgs", "--input-shape", "x=1x4"),
                          "no arguments failed")
    assert_one_line_error(run(f"{netfile}:Net", "--input-shape", "y=1x3x8x8"),
                          "no argument 'y'")


def test_zoo_fx_and_meta_only():
    r = json.loads(run("zoo:resnet18", "--fx", "--format", "json", check_rc=0).stdout)
    assert r["totals"]["params"] == 11_689_512 and r["source"] == "fx"


def test_train_and_checkpoint_cli(netfile, tmp_path):
    r = json.loads(run(f"{netfile}:Net", "--input-shape", "x=2x3x16x16", "--train",
                       "--optimizer", "momentum", "--format", "json", check_rc=0).stdout)
    t = r["training"]
    # params 314 fp32 = 1,256 B; momentum state 1× params
    assert t["param_bytes"] == 1_256 and t["optimizer_state_bytes"] == 1_256
    assert t["grad_bytes"] == 1_256
    assert t["phases"][-1] == "optimizer" and len(t["timeline"]) == len(t["phases"])
    out = run("zoo:resnet18", "--train", "--batch", "2", "--checkpoint", "layer1,layer2",
              check_rc=0).stdout
    assert "checkpoint  names: layer1, layer2" in out and "recompute" in out


def test_train_bad_input(netfile, tmp_path):
    assert_one_line_error(run("zoo:gpt2", "--train", "--checkpoint", "auto", "--budget", "four"),
                          "expected a size")
    assert_one_line_error(run("zoo:gpt2", "--train", "--checkpoint", "auto"), "needs --budget")
    assert_one_line_error(run("zoo:gpt2", "--train", "--checkpoint", "auto", "--budget", "1MB"),
                          "no checkpoint plan can fit", "alone take")
    assert_one_line_error(run("zoo:gpt2", "--train", "--checkpoint", "h.9"), "no module")
    assert_one_line_error(run("zoo:gpt2", "--checkpoint", "h.0"), "--train")
    import onnx

    from tests.onnx_builders import model, node
    path = tmp_path / "m.onnx"
    onnx.save(model([node("Relu", ["x"], ["y"])], [("x", [1, 4])], [("y", [1, 4])]), path)
    # an inference-only ONNX graph trains on an estimated backward, and says so
    p = run(path, "--train")
    assert p.returncode == 0 and "ESTIMATE" in p.stdout, p.stderr


def test_output_never_overwrites_the_users_file(netfile):
    before = netfile.read_text()
    assert_one_line_error(run(f"{netfile}:Net", "--input-shape", "x=1x3x8x8", "-o", netfile),
                          "never writes its input")
    assert netfile.read_text() == before


def test_saved_exported_program(tmp_path, monkeypatch):
    """graphcost program.pt2 reads the program's JSON only: no weight is unpickled."""
    import pickle

    import torch
    from torch import nn

    from graphcost import analyze
    # parameters and BatchNorm buffers (num_batches_tracked an int64) all archived:
    # conv 3·8·9 + 8 = 224, BatchNorm 2·8 = 16, linear 8·6·6·10 + 10 = 2,890 → 3,130
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(288, 10)).eval()
    ep = torch.export.export(model, (torch.randn(2, 3, 8, 8),), strict=False)
    path = tmp_path / "cnn.pt2"
    torch.export.save(ep, path)

    def refuse(*a, **k):
        raise AssertionError("graphcost unpickled something")

    with monkeypatch.context() as m:
        m.setattr(pickle, "load", refuse)
        m.setattr(pickle, "loads", refuse)
        m.setattr(pickle, "Unpickler", refuse)
        r = analyze(path)
    assert r.totals.params == 3_130 and r.batch == 2
    assert r.totals.macs == analyze(ep).totals.macs
    out = json.loads(run(path, "--format", "json", check_rc=0).stdout)
    assert out["totals"]["params"] == 3_130 and out["model"] == "cnn.pt2"
    assert_one_line_error(run(path, "--train"), "not a training step")
    bad = tmp_path / "bad.pt2"
    bad.write_text("not a zip")
    assert_one_line_error(run(bad), "not a torch.export archive")


def test_plot_timeline(tmp_path):
    import xml.etree.ElementTree as ET
    svg = tmp_path / "tl.svg"
    run("zoo:gpt2", "--train", "--checkpoint-every", "1", "--plot", svg, "--max-rows", "0",
        check_rc=0)
    root = ET.parse(svg).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 2          # plain and checkpointed curves
    labels = [t.text for t in root.findall(f"{ns}text")]
    assert {"forward", "backward", "step"} <= set(labels)
    assert any(t and t.startswith("plain peak") for t in labels)
    assert_one_line_error(run("zoo:gpt2", "--plot", svg), "add --train")
    assert_one_line_error(run("zoo:gpt2", "--train", "--plot", tmp_path / "x.jpg"), ".svg or .png")


def test_checkpoint_full_is_every_block_as_torchtitan_names_it():
    # torchtitan's activation_checkpoint.mode = "full": each repeated block one checkpoint
    full = run("zoo:gpt2", "--train", "--checkpoint", "full", "--format", "json", check_rc=0)
    every = run("zoo:gpt2", "--train", "--checkpoint-every", "1", "--format", "json",
                check_rc=0)
    assert json.loads(full.stdout)["training"] == json.loads(every.stdout)["training"]


@pytest.mark.same_on_every_torch  # (the option's parsing: the trace is every test's)
def test_checkpoint_none_is_no_plan_as_torchtitan_and_the_plans_table_name_it():
    # mode = "none" in torchtitan, "none" in a plan's ckpt column: a user types it back
    none = run("zoo:gpt2", "--train", "--checkpoint", "none", "--format", "json", check_rc=0)
    plain = run("zoo:gpt2", "--train", "--format", "json", check_rc=0)
    training = json.loads(none.stdout)["training"]
    assert training["checkpoint"] is None and training == json.loads(plain.stdout)["training"]
