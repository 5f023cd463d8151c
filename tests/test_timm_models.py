"""``timm:NAME`` (issue 24): a timm architecture built on meta at its default input size.
timm needs the torchvision built for the installed torch (README, "timm"): without timm, or
with a torchvision that does not import beside this torch, the module skips and says why (the
one line ``timm:NAME`` would print). Parameters equal timm's own module's count; 2·MACs equal
FlopCounterMode's FLOPs on the same module (meta tensors)."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.frontends.torch.optional_imports import (
    torchvision_install,
    torchvision_problem,
)
from torch.utils.flop_counter import FlopCounterMode

from graphcost import GraphcostError, analyze
from tests.cli_runner import run_cli

# (torchvision first: a broken one raises RuntimeError inside timm's import, which
# importorskip would not catch, and the collection would stop)
_problem = torchvision_problem()
if _problem:
    pytest.skip(f"timm needs a torchvision that imports beside this torch: {_problem}",
                allow_module_level=True)
timm = pytest.importorskip("timm", reason="timm, or the torchvision it imports, is not "
                          f"installed: {torchvision_install('timm')}")


@pytest.mark.parametrize("name", ["resnet50", "convnext_tiny", "vit_base_patch16_224"])
def test_params_and_macs_against_timm_and_flop_counter(name):
    r = analyze(f"timm:{name}")
    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False).eval()
    assert r.totals.params == sum(p.numel() for p in model.parameters())
    x = torch.empty(1, *model.pretrained_cfg["input_size"], device="meta")
    with FlopCounterMode(display=False) as counter:
        model(x)
    assert abs(2 * r.totals.macs / counter.get_total_flops() - 1) <= 0.01


def test_the_batch_and_an_input_shape_bind():
    r = analyze("timm:resnet18", batch=4)
    assert r.batch == 4
    small = analyze("timm:resnet18", input_shapes={"x": (1, 3, 112, 112)})
    assert small.totals.macs < analyze("timm:resnet18").totals.macs / 3


def test_an_unknown_name_is_one_line():
    with pytest.raises(GraphcostError, match=r"no timm model 'resnet5O'.*timm:resnet50"):
        analyze("timm:resnet5O")
    done = run_cli("timm:resnet5O")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
