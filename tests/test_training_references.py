"""A training step's forward holds what eager holds: the model's Python references (a list of
chunks, a local past its last use), the buffers it fills in place, autocast's cached half
weights — carried from the export onto the joint graph (exported_run.ExportedRun.python_facts).
Each step against MemTracker's second step on this CPU, and against hand arithmetic."""
from __future__ import annotations

import torch
from graphcost.analyzer.measure.reference import measure_training
from torch import nn

from graphcost import analyze

B, WIDE = 32, 4096
U = B * WIDE * 4  # one (32, 4096) fp32 activation: 524,288 B
# Linear(64, 4096) + Linear(4096, 64): 266,240 + 262,208 parameters, fp32
PARAMS = (64 * WIDE + WIDE + WIDE * 64 + 64) * 4  # 2,113,792 B
OUT = B * 64 * 4  # the second Linear's output: 8,192 B


class Listed(nn.Module):
    """Four scaled copies kept in a list until the forward returns (a multiply by a number
    saves nothing for the backward: the dataflow would free each at its last use)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, WIDE), nn.Linear(WIDE, 64)

    def forward(self, x):
        h = self.a(x)
        scaled = [h * k for k in range(1, 5)]
        total = scaled[0] + scaled[1] + scaled[2] + scaled[3]
        return self.b(torch.relu(total))


class Gated(nn.Module):
    """A gate filled in place a quarter at a time (functionalized, each fill is a new whole
    tensor in the joint graph; eager writes the one buffer)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, WIDE), nn.Linear(WIDE, 64)

    def forward(self, x):
        h = self.a(x)
        gate = torch.zeros_like(h)
        for i in range(4):
            gate[:, i * 1024:(i + 1) * 1024] = i + 1
        scaled = [h * k for k in range(1, 4)]
        total = scaled[0] + scaled[1] + scaled[2]
        return self.b(torch.relu(total) * gate)


class Normed(nn.Module):
    """A LayerNorm before a Linear, run under autocast (bf16-mixed)."""

    def __init__(self):
        super().__init__()
        self.n, self.a, self.b = nn.LayerNorm(64), nn.Linear(64, WIDE), nn.Linear(WIDE, 64)

    def forward(self, x):
        h = self.a(self.n(x * 3))
        scaled = [h * k for k in range(1, 5)]
        total = scaled[0] + scaled[1] + scaled[2] + scaled[3]
        return self.b(torch.relu(total))


def _both(model, x, autocast=None, precision="fp32"):
    torch.manual_seed(0)
    measured, _ = measure_training(model, (x,), "sgd", autocast=autocast)
    r = analyze(model, (x,), train=True, optimizer="sgd", include_inputs=False,
                precision=precision)
    assert r.training.peak_phase == "forward"
    return r.training.peak_bytes, measured


def test_a_list_of_chunks_is_held_to_the_return():
    # At the second Linear: h, the four scaled copies, their sum and its relu (7 U; the
    # partial sums are gone), and the Linear's output.
    torch.manual_seed(0)
    model, x = Listed(), torch.randn(B, 64)
    got, measured = _both(model, x)
    assert got == measured == PARAMS + 7 * U + OUT == 5_792_000
    # asked for, the dataflow's lifetimes: each copy freed at its last use, the forward stays
    # under the backward's peak — the second Linear's weight gradient (2 U), the relu's and
    # two copies' gradients and their sum (4 U), the bias gradient (256 B), the loss (4 B)
    dataflow = analyze(model, (x,), train=True, optimizer="sgd", include_inputs=False,
                       lifetimes="dataflow").training
    assert (dataflow.peak_phase, dataflow.peak_bytes) == ("backward", PARAMS + 6 * U + 260)


def test_a_buffer_filled_in_place_is_one_tensor():
    # h, the gate (one tensor however many fills), three scaled copies, their sum, its relu
    # and relu * gate: 8 U, and the output. With each fill a tensor of its own, the first
    # held by the variable and the last by the product: 9 U (6,840,576 B, +8.3%).
    torch.manual_seed(0)
    got, measured = _both(Gated(), torch.randn(B, 64))
    assert got == measured == PARAMS + 8 * U + OUT == 6_316_288


def test_autocast_holds_its_half_weights_and_saves_the_half_activations():
    # Batch 256, bf16-mixed. Held at the second Linear: x * 3 (fp32, LayerNorm's saved input:
    # 65,536) and the LayerNorm's mean and rstd (2 × 1,024); the LayerNorm's output only as
    # its bf16 copy (32,768: the Linear saves that, not the fp32 tensor, 65,536, which the
    # fp32 export saves and a reference taken there would hold: +57,344 B); autocast's cache
    # of half weights and biases to the end of the forward (524,288 × 2 + 8,192 + 128, the
    # first bias unread by any backward); h, the four scaled copies, their sum and its relu
    # in bf16 (7 × 2,097,152), the output (32,768). Parameters 528,576 × 4.
    got, measured = _both(Normed(), torch.randn(256, 64), autocast=torch.bfloat16,
                          precision="bf16-mixed")
    held = 65_536 + 2 * 1_024 + 32_768 + 2 * 524_288 + 8_192 + 128 + 7 * 2_097_152 + 32_768
    assert got == measured == 528_576 * 4 + held == 17_984_384
