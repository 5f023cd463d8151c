"""Where a run allocates its GPU library workspaces (passes/gpu_workspaces.py), by hand."""
from __future__ import annotations

import torch
from graphcost.analyzer.app.devices import get_device
from graphcost.passes.gpu_workspaces import gpu_workspaces
from torch import nn

from graphcost import analyze


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv3 = nn.Conv2d(4, 8, 3, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 1)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8 * 16 * 16, 10)

    def forward(self, x):
        return self.fc(self.depthwise(self.conv1(self.conv3(x))).flatten(1))


def _graph(model, x):
    from graphcost.analyzer.app import pipeline
    seen = {}
    real = pipeline.gpu_workspaces

    def spy(graph, device):
        seen["graph"] = graph
        return real(graph, device)
    pipeline.gpu_workspaces = spy
    try:
        analyze(model, (x,), device="h100-sxm")
    finally:
        pipeline.gpu_workspaces = real
    return seen["graph"]


def test_a_3x3_convolution_takes_its_input_and_output_the_first_matmul_the_cublas_workspace():
    graph = _graph(Net().eval(), torch.randn(2, 4, 16, 16))
    ws = gpu_workspaces(graph, get_device("h100-sxm"))
    convs = [n for n in graph.nodes if "convolution" in n.op]
    # the 3×3: input 2·4·16·16 · 4 B = 8,192 + output 2·8·16·16 · 4 B = 16,384; the 1×1 and
    # the depthwise (groups 8) none
    assert ws.transients == {convs[0].index: 8_192 + 16_384}
    first_gemm = next(n for n in graph.nodes if n.op in ("aten.addmm.default", "aten.mm.default"))
    assert ws.cublas_node == first_gemm.index
    assert ws.cublas_bytes == 32 * 2**20   # sm90: 4,096 · 8 KiB
    # on ROCm the BLAS workspace stays (128 MiB on an MI300X); MIOpen's is not modelled
    rocm = gpu_workspaces(graph, get_device("mi300x"))
    assert rocm.transients == {} and rocm.cublas_bytes == 128 * 2**20


def test_a_run_without_a_matmul_allocates_no_cublas_workspace():
    graph = _graph(nn.Sequential(nn.Conv2d(3, 3, 1)).eval(), torch.randn(1, 3, 8, 8))
    ws = gpu_workspaces(graph, get_device("h100-sxm"))
    assert (ws.cublas_node, ws.cublas_bytes, ws.transients) == (-1, 0, {})
