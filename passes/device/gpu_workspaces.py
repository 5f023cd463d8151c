"""What a run allocates on a CUDA GPU beyond its tensors, through the same caching allocator:
the library workspaces and kernel temporaries, placed on the run's clock so the allocator
replay sees them where PyTorch allocates them.

- **cuBLAS**: a handle's workspace is allocated by the first GEMM its thread runs and kept
  (CublasHandlePool.cpp; passes/device/fits.py has the sizes). Allocated there, not before the run:
  in ResNet-50 the one matrix product is the classifier at the end, when the cache is full of
  freed activation blocks, and the 32 MiB workspace splits one of them — the next batch's
  196 MiB activation then needs a segment of its own (PyTorch 2.11, H200: 1,233,125,376 B
  reserved; the workspace counted before the run reserved 1,021,313,024 B, −17%). A
  training step has two: the forward's thread at its first GEMM, autograd's at the
  backward's first (where the recorded training traces allocate them).
- **Around a kernel**, by the op's rule (``Rule.workspace``: sizes allocated after the op's
  outputs, freed before it returns): a reduction's staging buffer (exact), a broadcast GEMM
  operand's copy (exact), the attention backward's temporaries (cuDNN's read off traces,
  FlashAttention-2's and the memory-efficient kernel's from their source) and cuDNN's
  convolution workspaces (an estimate, inference only: a training step's convolutions were
  measured to reserve less with them than without, ResNet-50 SGD on an H200 -9.6% against
  -8.5%).

On ROCm the rocBLAS/hipBLASLt workspace follows the same rule; each kernel's function says
what it models there (MIOpen's convolution workspaces and ROCm's reductions: nothing).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..costs.registry import OpView, ShapeUnknown, lookup
from ..ir import Graph
from .fits import cublas_workspace_bytes

if TYPE_CHECKING:
    from ..device_rates import DeviceRates


@dataclass(frozen=True)
class GpuWorkspaces:
    """``cublas_nodes``: where each matmul thread's first cuBLAS GEMM runs (node indices:
    the forward's thread and, in a training step, autograd's), each allocating a workspace of
    ``cublas_bytes`` there, kept; ``transients``: node index -> the sizes allocated after the
    node's outputs and freed at the node."""
    cublas_nodes: tuple[int, ...]
    cublas_bytes: int
    transients: dict[int, tuple[int, ...]]


def gpu_workspaces(graph: Graph, device: "DeviceRates", forward_nodes: int | None = None
                   ) -> GpuWorkspaces:
    """The workspaces a run of ``graph`` allocates on ``device``: an inference run, or with
    ``forward_nodes`` (the joint graph's forward is its first ``forward_nodes`` nodes) a
    training step, whose backward runs on autograd's own thread with its own workspace."""
    training = forward_nodes is not None
    starts = (0, forward_nodes) if training else (0,)
    gemms: dict[int, int] = {}   # thread -> its first GEMM
    transients: dict[int, tuple[int, ...]] = {}
    for node in graph.nodes:
        rule = lookup(node.op)
        if rule is None:
            continue
        thread = sum(node.index >= s for s in starts) - 1
        if rule.cublas:
            gemms.setdefault(thread, node.index)
        if rule.workspace is None or (training and not rule.workspace_in_training):
            continue
        try:
            sizes = tuple(b for b in rule.workspace(OpView(node, graph, rule), device) if b > 0)
        except ShapeUnknown:
            sizes = ()
        if sizes:
            transients[node.index] = sizes
    nodes = tuple(gemms[t] for t in sorted(gemms))
    return GpuWorkspaces(nodes, cublas_workspace_bytes(device) if nodes else 0, transients)
