"""The autocast recipes (``bf16-mixed``, ``16-mixed``: Lightning's, the HF Trainer's
``bf16=True``, accelerate's ``mixed_precision="bf16"``) against PyTorch running them: the
forward under ``torch.autocast("cpu", torch.bfloat16)``, the backward and AdamW's step
outside it, MemTracker over the second step (analyzer/measure/reference.py). Weights,
gradients and optimizer state stay fp32; the ops on autocast's list save half tensors."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.measure.reference import measure_training
from torch import nn

from graphcost import GraphcostError, analyze
from tests.test_step_as_run import Decoder


def mlp():
    return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                         nn.Linear(2048, 10))


def cnn():  # two conv-BatchNorm-ReLU blocks
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())


CASES = {"mlp": (mlp, (64, 512)), "cnn": (cnn, (16, 3, 64, 64)), "decoder": (Decoder, (1, 256, 256))}


@pytest.mark.parametrize("optimizer", ["none", "adamw"])
@pytest.mark.parametrize("name", list(CASES))
def test_autocast_step_vs_memtracker(name, optimizer):
    build, shape = CASES[name]
    torch.manual_seed(0)
    model, x = build(), torch.randn(*shape)
    measured, _ = measure_training(model, (x,), optimizer, autocast=torch.bfloat16)
    r = analyze(model, (x,), train=True, optimizer=optimizer, precision="bf16-mixed",
                what_if=False)
    t = r.training
    n = sum(p.numel() for p in model.parameters())
    # fp32 weights and gradients, no master copy (issue 22: the MLP measured 117.8 MB with
    # AdamW, where the master-weights recipe said 128.4 MB)
    assert (t.param_bytes, t.grad_bytes, t.breakdown_at_peak["master_weights"]) == (4 * n, 4 * n, 0)
    assert abs(t.peak_bytes / measured - 1) <= 0.05, (t.peak_bytes, measured)


def test_the_linear_layers_run_in_bf16_and_save_bf16():
    r = analyze(mlp(), (torch.randn(64, 512),), train=True, optimizer="none",
                precision="bf16-mixed", what_if=False)
    mm = [n for n in r.nodes if n.op == "aten.addmm.default"]
    # each forward Linear's output is bf16: 64 × 2048 × 2 B
    assert mm and mm[0].output_bytes == 64 * 2048 * 2


def test_a_gpu_target_follows_autocasts_cuda_lists():
    # CUDA's autocast runs layer_norm in fp32 (AT_FORALL_FP32); the CPU's list leaves it to
    # its input's dtype, which a Linear before it made bf16
    def layer_norm_dtypes(device):
        with torch.device("meta"):
            model = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 64))
        r = analyze(model, (torch.empty(8, 64, device="meta"),), train=True, optimizer="none",
                    precision="bf16-mixed", device=device, what_if=False)
        return {n.output_bytes for n in r.nodes
                if n.op == "aten.native_layer_norm.default"}
    assert layer_norm_dtypes(None) == {8 * 64 * 2 + 8 * 4 * 2}   # bf16 out, fp32 mean, rstd
    assert layer_norm_dtypes("h100") == {8 * 64 * 4 + 8 * 4 * 2}  # fp32 out


def test_an_onnx_graph_has_no_autocast(tmp_path):
    # an ONNX file's training step is an estimate over its ops: no autocast to trace
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(mlp(), (torch.randn(2, 512),), str(path), dynamo=False)
    with pytest.raises(GraphcostError, match="autocast"):
        analyze(str(path), train=True, precision="bf16-mixed")
