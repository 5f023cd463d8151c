"""A forward that checks its values are finite (RT-DETR's, D-FINE's and Mask2Former's ``if not
torch.isfinite(h).all(): clamp``, I-BERT's ``assert x.isnan().sum() == 0``) is traced as a step
whose values are finite (analyzer/frontends/torch/finite_checks.py), and says so; any other
branch on a tensor's value is still refused in one line. Before, torch.export refused all of
them ("Could not guard on data-dependent expression Eq(u0, 1)")."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.measure.reference import measure_training
from graphcost.passes.errors import GraphcostError
from torch import nn

from graphcost import analyze
from tests.shared import step_flops


class _Guarded(nn.Module):
    """Two Linear(64, 64); between them the checks of RT-DETR's encoder layer (training only)
    and of I-BERT's quantizer (always)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x):
        h = self.fc1(x)
        if self.training and not torch.isfinite(h).all():
            h = torch.clamp(h, min=-1e4, max=1e4)
        assert h.isnan().sum() == 0 and not torch.isinf(h).any(), "NaN or inf"
        return self.fc2(h)


def test_a_finiteness_check_trains_as_a_finite_step():
    # x (32, 64): each Linear's forward is 2·32·64·64 = 262,144 FLOPs; the backward adds fc2's
    # input and weight gradients and fc1's weight gradient (x needs none): 5 × 262,144 =
    # 1,310,720, FlopCounterMode's count; the clamp (not taken) adds nothing
    torch.manual_seed(0)
    model, x = _Guarded(), torch.randn(32, 64)
    r = analyze(model, (x,), train=True, optimizer="sgd", include_inputs=False)
    model.train()
    assert 2 * r.totals.macs == step_flops(model, (x,)) == 5 * 2 * 32 * 64 * 64
    assert not any("clamp" in n.op for n in r.nodes)
    measured, _ = measure_training(model, (x,), "sgd")
    assert abs(r.training.peak_bytes / measured - 1) <= 0.01, (r.training.peak_bytes, measured)
    said = [w for w in r.warnings if "values are finite" in w]
    # the two lines of the model that read a check, named for the user
    line = _Guarded.forward.__code__.co_firstlineno
    assert len(said) == 1 and f"test_finite_checks.py:{line + 2}" in said[0] \
        and f"test_finite_checks.py:{line + 4}" in said[0], said


def test_a_finiteness_check_in_an_inference():
    # eval mode: only the assert reads a value; 2·32·64·64 FLOPs in each Linear
    model, x = _Guarded().eval(), torch.randn(32, 64)
    r = analyze(model, (x,))
    assert 2 * r.totals.macs == 2 * 2 * 32 * 64 * 64
    assert any("values are finite" in w for w in r.warnings), r.warnings


class _Branches(nn.Module):
    """A branch on what the data says (not on finiteness): no answer is assumed."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        if (h > 0).any():
            h = h * 2
        return h


@pytest.mark.parametrize("train", [False, True])
def test_any_other_value_branch_is_still_refused(train):
    with pytest.raises(GraphcostError) as err:
        analyze(_Branches(), input_shapes={"x": (4, 8)}, train=train)
    assert "value read from a tensor" in str(err.value) and "\n" not in str(err.value)
