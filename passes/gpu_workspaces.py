"""What a run allocates on a CUDA GPU beyond its tensors, through the same caching allocator:
the library workspaces, placed on the run's clock so the allocator replay sees them where
PyTorch allocates them.

- **cuBLAS**: a handle's workspace is allocated by the first GEMM its thread runs and kept
  (CublasHandlePool.cpp; passes/fits.py has the sizes). Allocated there, not before the run:
  in ResNet-50 the one matrix product is the classifier at the end, when the cache is full of
  freed activation blocks, and the 32 MiB workspace splits one of them — the next batch's
  196 MiB activation then needs a segment of its own (PyTorch 2.11, H200: 1,233,125,376 B
  reserved; the workspace counted before the run reserved 1,021,313,024 B, −17%).
- **cuDNN convolutions**: a transient around each call, by the op's rule
  (``Rule.workspace``; an estimate, see ``cudnn_conv_workspace``).

On ROCm the rocBLAS/hipBLASLt workspace follows the same rule; MIOpen's convolution
workspaces are not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .costs.registry import OpView, ShapeUnknown, lookup
from .fits import cublas_workspace_bytes
from .ir import Graph

if TYPE_CHECKING:
    from .roofline import DeviceRates


@dataclass(frozen=True)
class GpuWorkspaces:
    """``cublas_node``: the index of the first cuBLAS GEMM (-1: none), where a workspace of
    ``cublas_bytes`` is allocated and kept; ``transients``: node index -> bytes allocated
    after the node's outputs and freed at the node."""
    cublas_node: int
    cublas_bytes: int
    transients: dict[int, int]


def gpu_workspaces(graph: Graph, device: "DeviceRates") -> GpuWorkspaces:
    """The workspaces an inference run of ``graph`` allocates on ``device``."""
    first, transients = -1, {}
    for node in graph.nodes:
        rule = lookup(node.op)
        if rule is None:
            continue
        if rule.cublas and first < 0:
            first = node.index
        if rule.workspace is not None and not device.rocm:
            try:
                size = rule.workspace(OpView(node, graph, rule))
            except ShapeUnknown:
                size = 0
            if size > 0:
                transients[node.index] = size
    return GpuWorkspaces(first, cublas_workspace_bytes(device) if first >= 0 else 0,
                         transients)
