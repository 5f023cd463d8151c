"""What differs between the supported torch releases (2.8 to 2.14), checked on whichever one
is installed: `.ci/run` runs this file, with every torch-facing test, on the pinned 2.13 and
on the oldest and the newest release of the range. A failure names the torch it ran on."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from graphcost.analyzer.frontends.torch.compat import TORCH_VERSION
from graphcost.analyzer.frontends.torch.frontend import unreachable_rules
from torch import nn

from graphcost import GraphcostError, analyze

ON = f"on torch {torch.__version__}"

# Registered aten rules that a torch release's decompositions remove before any graph reaches
# the registry, with the first release that does so. On those releases the op is costed
# through what it decomposes into (a norm: its pow, sum and sqrt); on the others, by its rule.
DECOMPOSED_SINCE = {
    "aten.linalg_vector_norm.default": (2, 14),
}


def test_unreachable_rules_are_the_known_ones_for_this_torch():
    expected = sorted(n for n, since in DECOMPOSED_SINCE.items() if TORCH_VERSION >= since)
    assert unreachable_rules() == expected, \
        f"{ON}: registered aten rules this torch decomposes away changed"


def test_vector_norm_costs_the_same_whole_or_decomposed():
    # ‖x‖₂ over the last dim of a 4×8 input: 8 squares + 7 adds + 1 sqrt per row ≈ 2 FLOPs an
    # element whichever way this torch lowers it; no op may be left without a cost
    class Norm(nn.Module):
        def forward(self, x):
            return torch.linalg.vector_norm(x, dim=-1)

    r = analyze(Norm(), input_shapes={"x": (4, 8)})
    assert r.coverage.percent == 100.0, (ON, r.coverage.unsupported)
    assert 4 * 8 <= r.totals.flops <= 4 * 8 * 3, (ON, r.totals.flops)


def test_a_fake_view_is_strided_as_eager():
    # (1, 64, 16) strided (1664, 1, 64), viewed as (1, 64, 4, 4): eager strides the size-one
    # dimension 64 (ATen's computeStride); torch 2.13's and 2.14's fake tensors 1664, unless
    # the trace runs in compat.eager_view_strides
    from graphcost.analyzer.frontends.torch.compat import eager_view_strides
    from torch._subclasses.fake_tensor import FakeTensorMode

    eager = torch.empty_strided((1, 64, 16), (1664, 1, 64)).view(1, 64, 4, 4).stride()
    with eager_view_strides(), FakeTensorMode():
        fake = torch.empty_strided((1, 64, 16), (1664, 1, 64)).view(1, 64, 4, 4).stride()
    assert fake == eager == (64, 1, 256, 64), ON


def test_a_plain_module_analyzes():
    # Linear(4, 4): 4·4 + 4 = 20 params; batch 2: 2·4·4 = 32 MACs (the failing call)
    r = analyze(nn.Linear(4, 4), input_shapes={"input": (2, 4)})
    assert (r.totals.params, r.totals.macs) == (20, 32), ON


def test_errors_from_the_api_are_graphcost_errors():
    try:
        analyze(nn.Linear(4, 4), input_shapes={"input": (2, 5)})  # 5 features into Linear(4)
    except GraphcostError:
        return
    raise AssertionError(f"{ON}: a shape mismatch was not refused")


def test_version_names_every_library():
    out = subprocess.run([sys.executable, "-m", "graphcost", "--version"], capture_output=True,
                         text=True, check=True, env={"COLUMNS": "200", "PATH": ""}).stdout
    line = " ".join(out.split())
    assert line.startswith("graphcost ") and f"torch {torch.__version__.split('+')[0]}" in line, (ON, out)
    for lib in ("onnx", "onnxruntime", "transformers", "Python"):
        assert f"{lib} " in line, (ON, lib, out)


def test_a_bug_reaches_the_api_caller_as_a_graphcost_error(monkeypatch):
    # whatever a torch release breaks inside graphcost, the API raises its one exception type,
    # with the cause chained (the command line still says "internal error" and exits 70)
    import graphcost.analyzer.app.api as api

    def broken(*a, **k):
        raise KeyError("a key this torch renamed")
    monkeypatch.setattr(api, "run_request", broken)
    try:
        analyze(nn.Linear(4, 4), input_shapes={"input": (2, 4)})
    except GraphcostError as exc:
        assert "internal error (KeyError" in str(exc) and isinstance(exc.__cause__, KeyError)
    else:
        raise AssertionError(f"{ON}: no error")


def test_a_dtype_cast_check_stands_in_the_module_it_guards():
    # torch 2.8's decompositions put an aten._assert_tensor_metadata before the add that
    # reads a weight cast to its own dtype (Gemma's and Llama's RMSNorm: weight.float()) with
    # the placeholder module path "_empty_nn_module_stack_from_metadata_hook": it must
    # neither be a module of the report's tree nor cut the norm's nodes in two runs (a stack
    # of such blocks could then not be repeated)
    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8))

        def forward(self, x):
            out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
            return (out * (1.0 + self.weight.float())).type_as(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm = nn.Linear(8, 8), Norm()

        def forward(self, x):
            return self.norm(self.fc(x)) + x

    r = analyze(Net(), input_shapes={"x": (4, 8)})
    assert [m.path for m in r.modules] == ["", "fc", "norm"], ON
    scopes = [n.scope for n in r.nodes]
    normed = [i for i, s in enumerate(scopes) if s == "norm"]
    assert normed == list(range(normed[0], normed[-1] + 1)), (ON, scopes)


_EXPORT_AFTER_TRAINING = """
import torch, torch.nn.functional as F
from graphcost import analyze
from graphcost.models_zoo.export import export_onnx

class Up(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return F.interpolate(self.conv(x), scale_factor=2, mode="bilinear")

analyze(Up(), input_shapes={"x": (1, 3, 8, 8)}, train=True, optimizer="sgd")
export_onnx("small_cnn", "%s", dynamo=True)
"""


def test_torch_exports_as_before_after_a_training_analysis(tmp_path):
    # graphcost takes the upsampling ops' Python kernels out while it traces
    # (frontend.kept_whole); torch.export caches which ops it may keep whole the first time
    # it decomposes, which in a fresh process is inside that trace. On torch 2.8 a later
    # dynamo ONNX export in the same process then failed ("This should be a custom op";
    # tests/test_zoo_models.py failed after tests/test_resizing.py in one CI worker).
    pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript")
    out = tmp_path / "small_cnn.onnx"
    done = subprocess.run([sys.executable, "-c", _EXPORT_AFTER_TRAINING % out],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and out.stat().st_size > 0, (ON, done.stderr[-2000:])
