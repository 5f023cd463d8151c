"""AccumulateGrad copies a gradient laid out otherwise than its parameter (PyTorch's gradient
layout contract, analyzer/frontends/torch/accumulate_grad.py): eager holds the backward's
tensor and the copy at once. Against MemTracker on this CPU."""
from __future__ import annotations

import torch
from graphcost.analyzer.measure.reference import measure_training
from torch import nn

from graphcost import analyze


class _Transposed(nn.Module):
    """A table stored (256, 1024) and read transposed: its gradient is made (1024, 256) and
    handed back as a transposed view, which breaks the contract."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(256, 1024))

    def forward(self, x):
        return x * self.table.t()


def test_a_transposed_gradient_is_copied_as_eager_copies_it():
    torch.manual_seed(0)
    model, x = _Transposed(), torch.randn(1024, 256)
    r = analyze(model, (x,), train=True, optimizer="sgd", include_inputs=False,
                what_if=False)
    assert r.nodes[-1].op == "aten.clone.default"  # the copy, after the gradient is made
    # At the copy: the table (262,144 floats, 1,048,576 B), its gradient as the backward
    # makes it (x times the loss's ones, 1,048,576 B), the copy laid out as the table
    # (1,048,576 B) and the loss (4 B): 3,145,732 B. MemTracker holds the loss's gradient
    # too (4 B). Without the copy graphcost said 2,097,160 B (−33%).
    measured, _ = measure_training(model, (x,), "sgd")
    assert r.training.peak_bytes == 3 * 1_048_576 + 4 == measured - 4
    assert r.training.grad_bytes == 1_048_576


def test_a_gradient_laid_out_as_its_parameter_is_not_copied():
    # nn.Linear's weight gradient is made in the weight's layout (the matmul's backward
    # writes it so): nothing to copy
    r = analyze(nn.Linear(64, 32), input_shapes={"input": (8, 64)}, train=True,
                optimizer="sgd", what_if=False)
    assert "aten.clone.default" not in {n.op for n in r.nodes}
