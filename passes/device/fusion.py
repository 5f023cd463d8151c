"""What ``torch.compile`` (Inductor) launches for a graph, for the time estimate
(time_estimate.py): the matmuls, attention and convolutions stay library kernels (cuBLAS,
cuDNN, FlashAttention: Inductor calls them as "extern kernels"); every run of consecutive
pointwise and reduction nodes between them becomes one generated kernel, which reads what its
run takes from outside once and writes only what is used after it — a saved activation, a
value the next library kernel reads, an output. What stays inside (an RMSNorm's fp32 square,
a SiLU's sigmoid) never reaches memory.

Left out: Inductor's own choices beyond consecutive runs (fusing across a view into a later
reduction, or a pointwise epilogue into a Triton matmul under max-autotune), the recompute
its partitioner adds to the backward, and the activation memory fusion saves (the memory
passes count the eager step's tensors).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..costs import OK, lookup
from ..costs.collectives import COLLECTIVES
from ..costs.registry import OpView, kernel_class
from ..ir import Graph


@dataclass(frozen=True)
class FusedKernel:
    """One generated kernel: the nodes it runs (indices, in order) and what it moves a call;
    a run of views alone launches nothing (``launches`` False)."""
    nodes: tuple[int, ...]
    bytes_moved: int
    repeat: int
    launches: bool = True


def _fusible(graph: Graph, node, nc) -> bool:
    """Pointwise or reduction work Inductor generates code for (not a library kernel, not a
    collective, not a node nothing could price)."""
    if nc.status != OK or node.op in COLLECTIVES or nc.cost.macs:
        return False
    rule = lookup(node.op)
    return rule is not None and kernel_class(rule, OpView(node, graph, rule), 0) is None


def fused_kernels(graph: Graph, node_costs) -> list[FusedKernel]:
    """The generated kernels of ``graph`` (node costs aligned with its nodes): each run of
    consecutive fusible nodes repeated alike is one."""
    last_use: dict[str, int] = {}   # (a run is consecutive nodes: used after it = used later)
    for node in graph.nodes:
        for name in node.inputs:
            if name:
                last_use[name] = node.index
    outputs = set(graph.outputs)
    runs: list[list] = []
    for node, nc in zip(graph.nodes, node_costs):
        if not _fusible(graph, node, nc):
            runs.append([])
        elif runs and runs[-1] and runs[-1][-1][0].repeat == node.repeat:
            runs[-1].append((node, nc))
        else:
            runs.append([(node, nc)])
    return [_kernel(graph, run, last_use, outputs) for run in runs if run]


def _moves(nc) -> bool:
    return bool(nc.cost.bytes_read or nc.cost.bytes_written)


def _kernel(graph: Graph, run, last_use: dict[str, int], outputs) -> FusedKernel:
    """The kernel a run makes: what its working nodes read from outside it and what they make
    that is used after it (through its views: a view's output is its input's storage)."""
    source: dict[str, str] = {}   # a view's output -> the value it aliases
    for node, nc in run:
        first: str = node.inputs[0] if node.inputs else ""
        if not _moves(nc) and first:
            for name in node.outputs:
                if name:
                    source[name] = source.get(first) or first
    working = [node for node, nc in run if _moves(nc)]
    if not working:
        return FusedKernel(tuple(node.index for node, _ in run), 0, 1, launches=False)
    end = run[-1][0].index
    made = {name for node in working for name in node.outputs if name}
    read: set[str] = {source.get(name) or name for node in working for name in node.inputs
                      if name}
    used_after = {name for node, _ in run for name in node.outputs
                  if name and (name in outputs or last_use.get(name, -1) > end)}
    written: set[str] = {source.get(name) or name for name in used_after} & made
    moved = sum(graph.values[v].spec.nbytes or 0 for v in (read - made) | written
                if v in graph.values)
    return FusedKernel(tuple(node.index for node, _ in run), moved, max(1, run[0][0].repeat))
