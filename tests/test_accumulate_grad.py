"""AccumulateGrad copies a gradient laid out otherwise than its parameter (PyTorch's gradient
layout contract, analyzer/frontends/torch/accumulate_grad.py): eager holds the backward's
tensor and the copy at once. Against MemTracker on this CPU."""
from __future__ import annotations

import torch
from graphcost.analyzer.measure.reference import measure_training
from torch import nn
from torch.nn import functional as F

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


class _ResizedTable(nn.Module):
    """RADIO's position table: stored (1, 64·64, 32), read as a (1, 32, 64, 64) image (a
    channels-last view), resized to the 8 × 8 patch grid and added to the tokens."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(1, 64 * 64, 32))
        self.proj = nn.Linear(32, 32)

    def forward(self, x):
        pos = self.table.reshape(1, 64, 64, 32).permute(0, 3, 1, 2)
        pos = F.interpolate(pos, size=(8, 8), mode="bilinear", align_corners=False)
        return self.proj(x + pos.flatten(2).permute(0, 2, 1))


def test_a_resized_tables_gradient_is_copied_as_eager_copies_it():
    # The resize's backward gets the tokens' gradient viewed back as (1, 32, 8, 8); eager's
    # view strides its batch dimension 32, which is no channels-last layout to ATen's guess,
    # so the backward writes the table's gradient contiguous (1, 32, 64, 64), and that,
    # permuted back, is not the table's layout: AccumulateGrad copies it. Fake tensors in
    # torch 2.13 and 2.14 stride that batch dimension otherwise (compat.eager_view_strides):
    # without the eager strides no copy was traced, −33%.
    # At the copy: the table (131,072 floats, 524,288 B), its gradient and the copy (as
    # much each), the Linear (1,056 floats, 4,224 B) and its gradients (as much), the loss
    # (4 B): 1,581,316 B; MemTracker holds the loss's gradient too (4 B).
    torch.manual_seed(0)
    model, x = _ResizedTable(), torch.randn(1, 64, 32)
    r = analyze(model, (x,), train=True, optimizer="sgd", include_inputs=False,
                what_if=False)
    measured, _ = measure_training(model, (x,), "sgd")
    assert r.training.peak_bytes == 3 * 524_288 + 2 * 4_224 + 4 == measured - 4


def test_a_gradient_laid_out_as_its_parameter_is_not_copied():
    # nn.Linear's weight gradient is made in the weight's layout (the matmul's backward
    # writes it so): nothing to copy
    r = analyze(nn.Linear(64, 32), input_shapes={"input": (8, 64)}, train=True,
                optimizer="sgd", what_if=False)
    assert "aten.clone.default" not in {n.op for n in r.nodes}


class _Branches(nn.Module):
    """A tensor read by three convolutions (TextNet's and RepVGG's blocks): three gradients
    for it, which the autograd engine sums."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(8, 16, 3, padding=1)
        self.branches = nn.ModuleList(nn.Conv2d(16, 16, k, padding=(k[0] // 2, k[1] // 2))
                                      for k in ((3, 3), (3, 1), (1, 3)))

    def forward(self, x):
        h = self.stem(x)
        return sum(b(h) for b in self.branches)


def test_the_engine_sums_gradients_in_place():
    # Eagerly, the engine adds each branch's gradient for h onto the first one's storage
    # (the final gradient is the first branch's tensor). Under any TorchDispatchMode it adds
    # out of place (ATen's isTensorSubclassLike is true while a mode is on), MemTracker's
    # among them: its figure is one h-sized sum above the step as it runs.
    torch.manual_seed(0)
    model, x = _Branches(), torch.randn(2, 8, 64, 64)
    h = model.stem(x)
    outs = [b(h) for b in model.branches]
    made: list[int] = []
    for o in outs:
        assert o.grad_fn is not None
        o.grad_fn.register_hook(lambda grads, _: made.append(grads[0].data_ptr()))
    summed: list[int] = []
    h.register_hook(lambda g: summed.append(g.data_ptr()))
    sum(o.sum() for o in outs).backward()
    assert summed[0] in made  # in place: the sum is one of the branches' gradients
    # graphcost: both of the engine's sums write into the gradient they add onto (the
    # joint graph's in-place writes: nothing else in this model runs in place)
    from graphcost.analyzer.frontends.torch.capture import export_joint

    trace = export_joint(model, (x,))
    sums = [n for n in trace.gm.graph.nodes if n.name in trace.written]
    assert len(sums) == 2 and all(n.target is torch.ops.aten.add.Tensor for n in sums)


class _ReadTwice(nn.Module):
    """h read by a Linear and by sin: the engine sums h's two gradients."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(512, 512), nn.Linear(512, 512)

    def forward(self, x):
        h = self.a(x).relu()
        return self.b(h) + h.sin()


def test_the_step_with_no_mode_on_sums_in_place_as_graphcost_does():
    # The step measured without a dispatch mode (measure_training_unperturbed: torch.profiler's
    # memory events, read at the end of each outermost ATen op) is graphcost's peak but for
    # the loss's 4 B gradient, as MemTracker's is where no sum runs. At the peak, in b's
    # backward, the engine holds h's gradient from sin (524,288 B) to add the Linear's onto
    # it in place; under MemTracker's mode the add makes a third h-sized tensor, and its
    # figure is that much higher (524,288 B), less 2,048 B (a bias gradient's size) by where
    # each of the two peaks falls
    from graphcost.analyzer.measure.reference import measure_training_unperturbed

    torch.manual_seed(0)
    model, x = _ReadTwice(), torch.randn(256, 512)
    r = analyze(model, (x,), train=True, optimizer="sgd", include_inputs=False,
                what_if=False)
    unperturbed = measure_training_unperturbed(model, (x,), "sgd")
    measured, _ = measure_training(model, (x,), "sgd")
    assert r.training.peak_bytes == unperturbed - 4
    assert measured - unperturbed == 524_288 - 2_048, (measured, unperturbed)
