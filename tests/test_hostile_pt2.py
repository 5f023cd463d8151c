""".pt2 programs from elsewhere: exported on a GPU (read as on the CPU, never a C++ abort), a
device outside the grammar (one line, exit 2), bounds on nodes and tensors named when refused,
the rebuild torch's own deserializer would make, at a cost per node near the ONNX path's."""
from __future__ import annotations

import copy
import json
import operator
import subprocess
import sys
import time
from pathlib import Path

import onnx
import pytest
import torch
from graphcost.analyzer.app.api import analyze
from graphcost.analyzer.cli.main import main
from graphcost.analyzer.frontends.torch import pt2
from graphcost.analyzer.frontends.torch.pt2_rebuild import FAST

from tests.hostile_files import pt2_variant
from tests.onnx_builders import model, node

ROOT = Path(__file__).resolve().parent.parent
CLI = "import sys; from graphcost.analyzer.cli.main import main; sys.exit(main(sys.argv[1:]))"


class Mlp(torch.nn.Module):
    """Linear(8, 16) + ReLU + Linear(16, 4), plus a tensor made on the input's device (so the
    program holds a device argument as well as each tensor's device)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(self.a(x).relu()) + torch.ones(4, device=x.device)


class ConvNet(torch.nn.Module):
    """Conv + BatchNorm + ReLU, split in two halves (a node of two outputs: getitem nodes),
    added, max-pooled."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        a, b = self.bn(self.conv(x)).relu().split(2, dim=1)
        return torch.nn.functional.max_pool2d(a + b, 2)


class Relu(torch.nn.Module):
    def forward(self, x):
        return x.relu()


def _save(module, args, path: Path, decomposed: bool = False) -> Path:
    ep = torch.export.export(module.eval(), args)
    torch.export.save(ep.run_decompositions() if decomposed else ep, path)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The programs the tests rewrite, saved once: the MLP, the MLP decomposed to core ATen
    before saving, the conv net, one relu."""
    folder = tmp_path_factory.mktemp("pt2")
    x = (torch.randn(2, 8),)
    return {"mlp": _save(Mlp(), x, folder / "mlp.pt2"),
            "mlp_core": _save(Mlp(), x, folder / "mlp_core.pt2", decomposed=True),
            "conv": _save(ConvNet(), (torch.randn(1, 3, 8, 8),), folder / "conv.pt2"),
            "relu": _save(Relu(), (torch.randn(1, 4),), folder / "relu.pt2")}


def _devices(doc, device, where=("device", "as_device")):
    """Every device object of the program (each tensor's and each device argument) becomes
    ``device``, as a GPU export writes them: {"type": "cuda", "index": 0}."""
    stack, found = [doc], 0
    while stack:
        obj = stack.pop()
        for key, value in obj.items() if isinstance(obj, dict) else enumerate(obj):
            if key in where and isinstance(value, dict) and "type" in value:
                obj[key] = copy.deepcopy(device)
                found += 1
            elif isinstance(value, (dict, list)):
                stack.append(value)
    assert found, "no device in the program"


def _figures(report) -> tuple:
    d = report.to_dict()
    return d["totals"]["params"], d["totals"]["macs"], d["totals"]["flops"], \
        d["memory"]["peak_bytes"]


# ----------------------------------------------------------------------------- devices

def test_pt2_exported_on_a_gpu_is_analyzed_as_on_the_cpu(saved, tmp_path):
    doc = json.loads(pt2.read_program(saved["mlp"]))
    assert '"as_device"' in json.dumps(doc)  # torch.ones(device=...) is a device argument
    cpu = analyze(saved["mlp"])
    # params: 8·16 + 16 + 16·4 + 4 = 212; MACs: 2·8·16 + 2·16·4 = 384
    assert _figures(cpu)[:2] == (212, 384)
    gpu = pt2_variant(saved["mlp"], tmp_path / "gpu.pt2",
                      lambda d: _devices(d, {"type": "cuda", "index": 0}))
    # torch built without CUDA aborted here (SIGABRT, C++ frames on stderr): a subprocess
    p = subprocess.run([sys.executable, "-c", CLI, str(gpu), "--format", "json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert (out["totals"]["params"], out["totals"]["macs"], out["totals"]["flops"],
            out["memory"]["peak_bytes"]) == _figures(cpu)
    assert any("exported on cuda:0" in w for w in out["warnings"])
    assert not any("exported on" in w for w in cpu.to_dict()["warnings"])
    for device in ({"type": "mps", "index": None}, {"type": "xpu", "index": 1}):
        other = pt2_variant(saved["mlp"], tmp_path / f"{device['type']}.pt2",
                            lambda d, dev=device: _devices(d, dev))
        r = analyze(other)
        assert _figures(r) == _figures(cpu)
        name = device["type"] + ("" if device["index"] is None else f":{device['index']}")
        assert any(f"exported on {name}:" in w for w in r.to_dict()["warnings"])


def test_pt2_with_only_its_input_on_a_gpu_is_analyzed(saved, tmp_path):
    """Before: FakeTensorDeviceMismatchError (cuda:0 and cpu in one addmm)."""
    def edit(doc):
        graph = doc["graph_module"]["graph"]
        user = [s["user_input"]["arg"]["as_tensor"]["name"]
                for s in doc["graph_module"]["signature"]["input_specs"] if "user_input" in s]
        graph["tensor_values"][user[0]]["device"] = {"type": "cuda", "index": 0}
    mixed = pt2_variant(saved["mlp"], tmp_path / "mixed.pt2", edit)
    r = analyze(mixed)
    assert _figures(r) == _figures(analyze(saved["mlp"]))
    assert any("exported on cuda:0" in w for w in r.to_dict()["warnings"])


@pytest.mark.parametrize("device", [
    {"type": "cuda\x00", "index": 0}, {"type": "foo", "index": 99999999999},
    {"type": "cuda", "index": 99999999999}, {"type": "cuda", "index": -1},
    {"type": "cuda", "index": True}, {"type": "cuda", "index": 0, "stream": 3},
    {"type": "cuda:0"}, "cuda:0", None])
def test_pt2_device_outside_the_grammar_is_one_line_exit_2(saved, tmp_path, capsys, device):
    bad = tmp_path / "bad.pt2"
    pt2_variant(saved["mlp"], bad, lambda d: _first_meta(d).update(device=device))
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refused: the program holds" in err and "device" in err
    assert "\x00" not in err


def test_pt2_device_argument_outside_the_grammar_is_refused(saved, tmp_path, capsys):
    bad = pt2_variant(saved["mlp"], tmp_path / "arg.pt2", lambda d: _devices(
        d, {"type": "vulkan:0", "index": None}, where=("as_device",)))
    assert main([str(bad)]) == 2
    assert "the device 'vulkan:0'" in capsys.readouterr().err


def _first_meta(doc) -> dict:
    return next(iter(doc["graph_module"]["graph"]["tensor_values"].values()))


# ----------------------------------------------------------------------------- bounds

def _relu_chain(n: int):
    """The one-relu program's JSON made a chain of ``n`` relu nodes (each a copy of the
    exported one, its metadata included), 1×4 floats throughout."""
    def edit(doc):
        graph = doc["graph_module"]["graph"]
        relu = graph["nodes"][0]
        meta = graph["tensor_values"][relu["outputs"][0]["as_tensor"]["name"]]
        prev = relu["inputs"][0]["arg"]["as_tensor"]["name"]
        nodes, tensors = [], {prev: graph["tensor_values"][prev]}
        for i in range(n):
            one, name = copy.deepcopy(relu), f"relu_{i}"
            if "name" in one:  # (a node's own name: torch 2.9+'s schema)
                one["name"] = name
            one["inputs"][0]["arg"]["as_tensor"]["name"] = prev
            one["outputs"][0]["as_tensor"]["name"] = name
            nodes.append(one)
            tensors[name] = meta
            prev = name
        graph.update(nodes=nodes, tensor_values=tensors, outputs=[{"as_tensor": {"name": prev}}])
        doc["graph_module"]["signature"]["output_specs"][0]["user_output"]["arg"] = \
            {"as_tensor": {"name": prev}}
    return edit


def test_pt2_past_the_node_and_tensor_bounds_is_refused_naming_them(saved, tmp_path, capsys,
                                                                   monkeypatch):
    chain = pt2_variant(saved["relu"], tmp_path / "chain.pt2", _relu_chain(60))
    assert analyze(chain).to_dict()["totals"]["flops"] == 60 * 4  # one per element per relu
    monkeypatch.setattr(pt2, "MAX_NODES", 59)
    assert main([str(chain)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has 60 nodes and 61 tensors" in err
    assert "read up to 59 nodes" in err
    monkeypatch.setattr(pt2, "MAX_NODES", 60)
    monkeypatch.setattr(pt2, "MAX_TENSORS", 60)
    assert main([str(chain)]) == 2
    assert "and 60 tensors" in capsys.readouterr().err


def test_pt2_retraced_past_its_bound_is_refused_and_a_core_aten_one_read(saved, capsys,
                                                                        monkeypatch):
    """The MLP as exported holds aten.linear (torch decomposes it, re-tracing the program);
    saved after run_decompositions() it is core ATen, read without a retrace, the same
    figures."""
    monkeypatch.setattr(pt2, "MAX_RETRACED", 3)
    assert main([str(saved["mlp"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "aten.linear.default" in err
    assert "read up to 3 nodes" in err and "ep.run_decompositions()" in err
    core = analyze(saved["mlp_core"])
    monkeypatch.setattr(pt2, "MAX_RETRACED", 20_000)
    assert _figures(core) == _figures(analyze(saved["mlp"]))


def test_pt2_values_are_the_operators_not_the_files(saved, tmp_path, capsys, monkeypatch):
    """A core ATen program is lowered without torch's retrace, which recomputed every value:
    each value is now checked against what its operator makes. The relu's output recorded as
    2×17 where relu of the 2×16 addmm makes 2×16: re-traced (figures as the untouched
    program's), and refused past the retrace's bound, naming the node."""
    def lie(doc):
        graph = doc["graph_module"]["graph"]
        relu = next(n for n in graph["nodes"] if n["target"] == "torch.ops.aten.relu.default")
        meta = graph["tensor_values"][relu["outputs"][0]["as_tensor"]["name"]]
        assert [d["as_int"] for d in meta["sizes"]] == [2, 16]
        meta["sizes"][1]["as_int"] = 17
    liar = pt2_variant(saved["mlp_core"], tmp_path / "liar.pt2", lie)
    assert _figures(analyze(liar)) == _figures(analyze(saved["mlp_core"]))
    monkeypatch.setattr(pt2, "MAX_RETRACED", 3)
    assert main([str(liar)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "records ((2, 17)" in err and "aten.relu.default makes " \
        "((2, 16)" in err and "read up to 3 nodes" in err


# ----------------------------------------------------------------------------- rebuild

def _torch_rebuild(path: Path):
    """The program as torch's own deserializer rebuilds it (torch's _dict_to_dataclass and
    deserialize_graph), weights fake as load_pt2 makes them."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import (
        _SERIALIZE_TO_TORCH_DTYPE,
        ExportedProgramDeserializer,
        _dict_to_dataclass,
    )
    from torch._subclasses.fake_tensor import FakeTensorMode

    doc = json.loads(pt2.read_program(path))
    doc.pop("guards_code", None)
    program = _dict_to_dataclass(schema.ExportedProgram, doc)
    metas = program.graph_module.graph.tensor_values
    state, constants, fake = {}, {}, FakeTensorMode(allow_non_fake_inputs=True)
    for spec in program.graph_module.signature.input_specs:
        value = getattr(spec, spec.type)
        if spec.type in ("parameter", "buffer", "tensor_constant"):
            meta = metas[value.arg.name]
            with fake:
                t = torch.empty([s.as_int for s in meta.sizes],
                                dtype=_SERIALIZE_TO_TORCH_DTYPE[meta.dtype])
            table = constants if spec.type == "tensor_constant" else state
            table[getattr(value, f"{spec.type}_name")] = \
                torch.nn.Parameter(t) if spec.type == "parameter" else t
    return ExportedProgramDeserializer().deserialize(program, state, constants, None)


def _plain(x):
    if isinstance(x, torch.fx.Node):
        return "node", x.name
    if isinstance(x, (list, tuple)):
        return type(x).__name__, tuple(_plain(a) for a in x)
    if isinstance(x, dict):
        return tuple((k, _plain(v)) for k, v in x.items())
    if isinstance(x, torch.Tensor):
        return (type(x).__name__, tuple(x.shape), x.stride(), x.storage_offset(), x.dtype,
                str(x.device), x.requires_grad)
    return x


def _described(ep) -> tuple:
    nodes = [(n.op, n.name, str(n.target), _plain(n.args), _plain(n.kwargs),
              {k: _plain(v) for k, v in n.meta.items()}) for n in ep.graph.nodes]
    return (nodes, str(ep.graph_signature), sorted(ep.state_dict), sorted(ep.constants),
            str(ep.range_constraints), str(ep.module_call_graph), ep.graph_module.meta)


def test_pt2_rebuilt_as_torch_rebuilds_it(saved, tmp_path):
    """Node for node (name, target, arguments, every meta entry, each value's fake tensor),
    the signature and the state: the MLP, the conv net (a split's two outputs), a
    program with a symbolic batch (torch's own path) and one exported on a GPU."""
    from tests.hostile_files import tiny_program

    gpu = pt2_variant(saved["mlp"], tmp_path / "gpu.pt2",
                      lambda d: _devices(d, {"type": "cpu", "index": None}))
    for path in (saved["mlp"], saved["mlp_core"], saved["conv"], gpu,
                 tiny_program(tmp_path / "tiny.pt2")):
        ours = pt2.load_pt2(path)
        assert _described(ours) == _described(_torch_rebuild(path)), path.name
    assert any(n.target is operator.getitem
               for n in pt2.load_pt2(saved["conv"]).graph.nodes)


@pytest.mark.skipif(not FAST, reason="torch's own converter reads the program before 2.13")
def test_pt2_dataclasses_are_torchs(saved, tmp_path):
    from graphcost.analyzer.frontends.torch.pt2_rebuild import to_dataclass
    from torch._export.serde import schema
    from torch._export.serde.serialize import _dict_to_dataclass

    from tests.hostile_files import tiny_program

    for path in (saved["conv"], tiny_program(tmp_path / "tiny.pt2")):
        doc = json.loads(pt2.read_program(path))
        assert to_dataclass(schema.ExportedProgram, doc) == \
            _dict_to_dataclass(schema.ExportedProgram, doc)
    with pytest.raises(ValueError, match="a list where the schema has a dict"):
        to_dataclass(schema.TensorMeta, [])
    with pytest.raises(ValueError, match="unknown kind 'as_shell'"):
        to_dataclass(schema.Argument, {"as_shell": "rm -rf /"})


@pytest.mark.skipif(not FAST, reason="torch's own deserializer before 2.13: linear, slower")
def test_pt2_costs_near_the_onnx_path_per_node(saved, tmp_path):
    """10,000 relu nodes, 1×4 floats, and the same graph as ONNX, in CPU seconds (torch
    imported before either is timed): the .pt2 path took 36× the ONNX one's (30.2 s, 0.85 s),
    now about 3× (1.7 s, 0.54 s; at 100,000 nodes, whole runs: 330 s before, 21.5 s now, 9.2
    s as ONNX)."""
    n = 10_000
    chain = pt2_variant(saved["relu"], tmp_path / "chain.pt2", _relu_chain(n))
    onnx.save(model([node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"relu_{i}")
                     for i in range(n)], [("v0", [1, 4])], [(f"v{n}", [1, 4])]),
              tmp_path / "chain.onnx")
    analyze(saved["relu"])  # the imports, timed by neither

    def cpu_seconds(path):
        start = time.process_time()
        assert analyze(path).to_dict()["totals"]["flops"] == 4 * n
        return time.process_time() - start
    onnx_s, pt2_s = cpu_seconds(tmp_path / "chain.onnx"), cpu_seconds(chain)
    assert pt2_s < 8 * onnx_s, (pt2_s, onnx_s)
