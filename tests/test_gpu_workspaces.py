"""Where a run allocates its GPU library workspaces and its kernels' temporaries
(passes/device/gpu_workspaces.py and the rules' ``workspace``), by hand."""
from __future__ import annotations

import torch
from graphcost.analyzer.app.devices import get_device
from graphcost.passes.device.gpu_workspaces import gpu_workspaces
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

    def spy(graph, device, *args):
        seen["graph"] = graph
        return real(graph, device, *args)
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
    assert ws.transients == {convs[0].index: (8_192 + 16_384,)}
    first_gemm = next(n for n in graph.nodes if n.op in ("aten.addmm.default", "aten.mm.default"))
    assert ws.cublas_nodes == (first_gemm.index,)
    assert ws.cublas_bytes == 32 * 2**20   # sm90: 4,096 · 8 KiB
    # on ROCm the BLAS workspace stays (128 MiB on an MI300X); MIOpen's is not modelled
    rocm = gpu_workspaces(graph, get_device("mi300x"))
    assert rocm.transients == {} and rocm.cublas_bytes == 128 * 2**20


def test_a_run_without_a_matmul_allocates_no_cublas_workspace():
    graph = _graph(nn.Sequential(nn.Conv2d(3, 3, 1)).eval(), torch.randn(1, 3, 8, 8))
    ws = gpu_workspaces(graph, get_device("h100-sxm"))
    assert (ws.cublas_nodes, ws.cublas_bytes, ws.transients) == ((), 0, {})


# --- kernels' temporaries ----------------------------------------------------------------
# The measured sizes below are read off PyTorch 2.11's allocator traces on an H200 (132
# multiprocessors, 2,048 threads each; benchmarks/results/cuda_traces_h200.json.gz): the
# allocations made inside one kernel call, between its outputs and its return.

def test_a_reductions_staging_buffer_as_reduce_cuh_sizes_it():
    from graphcost.passes.costs.cuda_reduce import reduce_buffers

    def h200(shape, dims, broadcast=False):
        return reduce_buffers(shape, dims, 4, 132, 2048, broadcast)
    # A bias's gradient: the sum of a (8,192 tokens × 1,024) bf16 gradient over the tokens.
    # Not on the fastest dim, so 4 outputs per thread (1,024 % 4 == 0) and at most 512/4 = 128
    # threads: blocks of 32 × 4; 1,024/4/32 = 8 blocks of outputs (8 semaphores, 32 B); each
    # thread column sums 8,192/4 = 2,048 rows, ≥ 256, so the rows are split over
    # max(min(⌈132·(2048/128)/8⌉ = 264, ⌈2048/16⌉ = 128), ⌈2048/256⌉ = 8) = 128 blocks:
    # 4 B × 1,024 outputs × 128 × 32 × 4 = 67,108,864 B. The trace: 67,108,864 and 32.
    assert h200((8192, 1024), [0]) == (67_108_864, 32)
    # the decoder's 256- and 768-wide biases: the trace's 16,777,216 + 8 and 50,331,648 + 24
    assert h200((1, 8192, 256), [0, 1]) == (16_777_216, 8)
    assert h200((8192, 768), [0]) == (50_331_648, 24)
    # a Llama's RMSNorm weight over 2 × 2,048 tokens: the trace's 33,554,432 + 32
    assert h200((2, 2048, 1024), [0, 1]) == (33_554_432, 32)
    # the loss, a sum of 2·2,048·32,000 logits: 512-thread blocks over the contiguous input,
    # 256,000 values per thread, max(min(528, 16,000), 1,000) = 1,000 blocks of one float each:
    # the trace's 4,000 + 4
    assert h200((2, 2048, 32000), []) == (4_000, 4)
    # a row reduction (an RMSNorm's mean over 1,024) stays within its blocks
    assert h200((2, 2048, 1024), [2]) == ()
    # the loss's gradient reaching a bias is one value expanded (stride 0): no vector loads,
    # 32 × 16 threads, 256/32 = 8 output blocks, 8,192/16 = 512 rows per thread:
    # max(min(⌈132·4/8⌉ = 66, 32), 2) = 32 blocks, 4 · 256 · 32 · 32 = 1 MiB
    assert h200((1, 8192, 256), [0, 1], broadcast=True) == (1_048_576, 32)


class Head(nn.Module):
    """Two bias-free layers under a sum loss: the loss's gradient reaches the head's matrix
    products as one value expanded."""
    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(64, 64, bias=False), nn.Linear(64, 1000, bias=False)

    def forward(self, x):
        return self.head(self.body(x))


def _joint(model, x, precision="fp32"):
    from graphcost.passes.training import step as module  # (the name the step calls)
    seen = {}
    real = module.gpu_workspaces

    def spy(graph, device, forward_nodes=None):
        seen.update(graph=graph, forward=forward_nodes)
        return real(graph, device, forward_nodes)
    module.gpu_workspaces = spy
    try:
        analyze(model, (x,), device="h100-sxm", train=True, optimizer="none",
                precision=precision, what_if=False)
    finally:
        module.gpu_workspaces = real
    return seen["graph"], seen["forward"]


def test_a_broadcast_operand_is_copied_before_the_matmul_and_each_thread_has_a_workspace():
    # the head's backward: d(input) = grad · W and d(W) = gradᵀ · input, grad the expanded
    # scalar (stride 0), which cuBLAS cannot read: each product first copies it whole,
    # 2·128·1,000 · 4 B = 1,024,000 B (a Llama's two head products under the sum-of-logits
    # loss: the trace's 262,144,000 B twice, bf16 [2, 2048, 32000])
    graph, forward = _joint(Head(), torch.randn(2, 128, 64))
    ws = gpu_workspaces(graph, get_device("h100-sxm"), forward)
    mms = [n.index for n in graph.nodes if n.op == "aten.mm.default"]
    backward = [i for i in mms if i >= forward]
    # the head's two products copy; the body's weight gradient reads a real tensor
    assert len(backward) == 3
    assert [ws.transients.get(i) for i in backward] == [(1_024_000,), (1_024_000,), None]
    # the forward's thread at its first GEMM, autograd's at the backward's first
    assert ws.cublas_nodes == (mms[0], backward[0])


def _attention_backward(kernel: str, q, k, dtype="bfloat16", device="h200"):
    from graphcost.passes.costs.registry import OpView, lookup
    from graphcost.passes.ir import Graph, Node, TensorSpec, Value, ValueKind
    specs = {"g": q, "q": q, "k": k, "v": k}
    values = {n: Value(n, TensorSpec(s, dtype), ValueKind.INPUT) for n, s in specs.items()}
    op = f"aten._scaled_dot_product_{kernel}_attention_backward.default"
    node = Node(0, "bwd", op, ("g", "q", "k", "v"), (), {})
    rule = lookup(op)
    assert rule is not None and rule.workspace is not None
    return rule.workspace(OpView(node, Graph("t", "fx", (node,), values, (), ())),
                          get_device(device))


def test_cudnn_attention_backward_workspace_as_the_traces_show_it():
    # 4 heads of 64 over 8,192 tokens: 4·8,192·65·4 + 256 = 8,519,936 B (the trace's)
    assert _attention_backward("cudnn", (1, 4, 8192, 64), (1, 4, 8192, 64)) == (8_519_936,)
    # 16 query, 8 key/value heads over 2 × 2,048: 2·16·2,048·65·4 + 256 = 17,039,616, + dK
    # and dV for all 16 heads in bf16, 2 · 2·16·2,048·64 · 2 = 16,777,216: 33,816,832 (the
    # trace's)
    assert _attention_backward("cudnn", (2, 16, 2048, 64), (2, 8, 2048, 64)) == (33_816_832,)


def test_flash_and_efficient_attention_backward_temporaries_from_their_source():
    # FlashAttention-2 (an A100's bf16 kernel), 16 query and 8 key/value heads of 64 over
    # 2 × 2,048 tokens (2,048 and 64 already multiples of 128 and 32): row sums 2·16·2,048·4
    # = 262,144 B, the fp32 dQ accumulator 2·2,048·16·64·4 = 16,777,216, dK and dV for all 16
    # heads 2·2,048·16·64·2 = 8,388,608 each — cuDNN's measured 33,816,832 less its 256
    assert _attention_backward("flash", (2, 16, 2048, 64), (2, 8, 2048, 64), device="a100-80gb") \
        == (262_144, 16_777_216, 8_388_608, 8_388_608)
    # a 100-token query rounds to 128 rows, a 72-wide head to 96 columns
    assert _attention_backward("flash", (1, 2, 100, 72), (1, 2, 100, 72), device="a100-80gb") \
        == (2 * 128 * 4, 128 * 2 * 96 * 4)
    # the memory-efficient kernel in fp32, 4 heads of 64 over 8,192 tokens: delta 4·8,192·4 =
    # 131,072 B, its workspace 4 · ⌈8,192/64⌉ · 16,400 = 8,396,800 (64 × 64 tiles of fp32 dQ
    # with a 16-byte lock each)
    assert _attention_backward("efficient", (1, 4, 8192, 64), (1, 4, 8192, 64),
                               dtype="float32") == (131_072, 8_396_800)
