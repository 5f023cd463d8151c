"""What no output reads is costed as eager runs it (analyzer/frontends/torch/dead_ends.py):
torch.export's decompositions would drop it, eager computes it and holds it as long as the
forward's Python does; in a training step it takes no part in the backward, and a parameter
the loss does not reach gets no gradient (exported_run.py)."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.app.request import LoadOptions
from graphcost.analyzer.load.loading import load_graph
from graphcost.analyzer.measure.reference import measure_inference, measure_training
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphcost import analyze


class _Unread(nn.Module):
    """A projection computed, kept in a local and never returned (FLAVA's text-to-multimodal
    projection), then a read of the input's view that returns nothing new."""

    def __init__(self):
        super().__init__()
        self.kept, self.unread = nn.Linear(64, 64), nn.Linear(64, 256)

    def forward(self, x):
        unread = torch.relu(self.unread(x))  # noqa: F841  (held until the forward returns)
        x.view(-1)  # a view: nothing computed, nothing kept
        return self.kept(x)


def test_an_unread_result_is_computed_and_held_as_eager_holds_it():
    # x 8×64: the unread projection 8·64·256 = 131,072 MACs, the returned one 8·64·64 = 32,768
    # → 2·MACs 327,680, FlopCounterMode's count of the eager forward. Memory (fp32): the
    # unread projection's 8·256·4 = 8,192 B output, its ReLU's 8,192 B (the output freed at
    # once, the ReLU held by the local), then the returned 2,048 B: peak 8,192 + 8,192 (while
    # the ReLU runs) = 16,384 B, MemTracker's over the real forward
    model, x = _Unread().eval(), torch.randn(8, 64)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    r = analyze(model, (x,), include_inputs=False)
    assert 2 * r.totals.macs == counter.get_total_flops() == 327_680
    assert r.memory.peak_bytes == measure_inference(model, (x,))[0] == 16_384
    assert [n.op for n in r.nodes].count("aten.relu.default") == 1
    graph = load_graph(model, LoadOptions(), (x,))
    assert len(graph.outputs) == 1  # the model's own: the unread result is no output


def test_the_program_given_is_left_as_it_was():
    # the dead ends are outputs only while the program is decomposed
    model, x = _Unread().eval(), torch.randn(8, 64)
    ep = torch.export.export(model, (x,))
    before = (str(ep.graph), list(ep.graph_signature.output_specs),
              ep.module_call_graph[0].signature.out_spec)
    analyze(ep)
    assert (str(ep.graph), list(ep.graph_signature.output_specs),
            ep.module_call_graph[0].signature.out_spec) == before


def test_a_program_the_extra_outputs_trip_is_decomposed_as_torch_leaves_it(monkeypatch):
    # keeping the dead ends fails (here: on entry): the analysis goes on without them, the
    # returned projection's 8·64·64 = 32,768 MACs only
    from contextlib import contextmanager

    from graphcost.analyzer.frontends.torch import dead_ends

    @contextmanager
    def trips(ep):
        raise RuntimeError("extra outputs refused")
        yield

    monkeypatch.setattr(dead_ends, "dead_ends_as_outputs", trips)
    r = analyze(_Unread().eval(), (torch.randn(8, 64),))
    assert r.totals.macs == 32_768


class _UnreadProjection(_Unread):
    """_Unread without the view: MemTracker counts a view's storage as new memory when the
    tensor it views (the input) was made before it started tracking."""

    def forward(self, x):
        unread = torch.relu(self.unread(x))  # noqa: F841
        return self.kept(x)


class _Unused(nn.Module):
    """A head the step never calls (a pooler, a second task's head)."""

    def __init__(self):
        super().__init__()
        self.kept, self.unused = nn.Linear(64, 64), nn.Linear(64, 256)

    def forward(self, x):
        return self.kept(x)


class _NoGradient(nn.Module):
    """Layers whose results reach the output along no path a gradient takes: one under
    torch.no_grad() (LayoutLMv3's relative position tables), one only shaping a zeros_like
    (MRA's attention on CPU), one detached."""

    def __init__(self):
        super().__init__()
        self.kept, self.table, self.shape, self.cut = (nn.Linear(64, 64) for _ in range(4))

    def forward(self, x):
        with torch.no_grad():
            bias = self.table(x)
        return self.kept(x) + bias + torch.zeros_like(self.shape(x)) + self.cut(x).detach()


def test_a_parameter_no_gradient_reaches_gets_none():
    # eager: only kept.weight and kept.bias get a .grad (4,160 · 4 = 16,640 B); the other
    # three layers' 49,920 B of parameters get none, hence no optimizer state
    m, x = _NoGradient(), torch.randn(8, 64)
    m(x).sum().backward()
    assert [n for n, p in m.named_parameters() if p.grad is not None] == \
        ["kept.weight", "kept.bias"]
    m.zero_grad(set_to_none=True)
    measured, _ = measure_training(m, (x,), "adamw")
    r = analyze(m, (x,), train=True, optimizer="adamw", include_inputs=False)
    assert r.training.grad_bytes == 16_640
    assert r.training.optimizer_state_bytes == 2 * 16_640 + 2 * 4  # exp_avg, exp_avg_sq, steps
    # (MemTracker counts 4 B more over Adam's step, as it does for a lone Linear)
    assert 0 <= measured - r.training.peak_bytes <= 4


@pytest.mark.parametrize("model", [_UnreadProjection, _Unused])
def test_a_training_step_trains_what_the_loss_reaches(model):
    # AOTAutograd refused a parameter that gets no gradient; eager leaves its .grad None and
    # SGD skips it. Parameters (64·64+64 + 64·256+256)·4 = 83,200 B; only the kept layer's
    # gradient, 4,160·4 = 16,640 B; the loss and its gradient 8 B: peak 99,848 B, MemTracker's
    # over the real step (the unread projection's 8,192 B output and ReLU are freed before the
    # gradient exists)
    m, x = model(), torch.randn(8, 64)
    measured, _ = measure_training(m, (x,), "sgd")
    r = analyze(m, (x,), train=True, optimizer="sgd", include_inputs=False)
    assert r.training.peak_bytes == measured == 83_200 + 16_640 + 8
    assert r.totals.params == 4_160 + 16_640


def test_a_training_step_computes_what_no_output_reads():
    # forward: the unread projection 8·64·256 = 131,072 MACs and the returned 8·64·64 =
    # 32,768; backward: the kept weight's gradient 8·64·64 = 32,768 (x needs none, the unread
    # result is not in the loss) → 2·196,608 = 393,216, FlopCounterMode's over the eager step
    m, x = _UnreadProjection(), torch.randn(8, 64)
    counter = FlopCounterMode(display=False)
    with counter:
        m(x).sum().backward()
    r = analyze(m, (x,), train=True, include_inputs=False)
    assert 2 * r.totals.macs == counter.get_total_flops() == 393_216
