"""Graph order and control-flow bodies, for onnx_validate.py's walk: Kahn's topological
sort (a cycle named with networkx), and the counts a Scan / Loop / If node and its bodies must
agree on. Apart from the walk because neither reads attributes or values: they check how
nodes and bodies fit together.
"""
from __future__ import annotations

import heapq

import onnx

from ....passes.errors import GraphcostError


def invalid(where: str, rule: str) -> GraphcostError:
    return GraphcostError(f"invalid graph: {where}: {rule}")


def node_label(node: onnx.NodeProto, index: int, scope: str) -> str:
    return f"{scope}node {node.name!r} ({node.op_type})" if node.name else \
        f"{scope}node #{index} ({node.op_type})"


def toposort(g: onnx.GraphProto, defined: dict[str, int], sub_reads: dict[int, set[str]],
              scope: str) -> list[int]:
    """Kahn's algorithm taking the smallest file index first (the file's order wherever it
    is already valid), O(n log n); a cycle is named with networkx.find_cycle."""
    nodes = g.node
    n = len(nodes)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for i, node in enumerate(nodes):
        for v in {*node.input, *sub_reads.get(i, ())}:
            p = defined.get(v, -1) if v else -1
            if p >= 0:
                succ[p].append(i)
                indeg[i] += 1
    ready = [i for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < n:
        import networkx as nx
        dg = nx.DiGraph((i, j) for i in range(n) if indeg[i] > 0 for j in succ[i]
                        if indeg[j] > 0)
        cycle = [a for a, _ in nx.find_cycle(dg)]
        path = " -> ".join(node_label(nodes[a], a, "") for a in [*cycle, cycle[0]])
        raise invalid(f"{scope}cycle", path)
    return order


def check_control_flow(node: onnx.NodeProto, label: str, version: int) -> None:
    attrs = {a.name: a for a in node.attribute}
    n_in = len(node.input)
    n_out = len(node.output)
    if node.op_type == "If":
        for branch in ("then_branch", "else_branch"):
            body = attrs[branch].g
            if len(body.output) != n_out:
                raise invalid(label, f"{branch} has {len(body.output)} outputs, the node "
                                     f"{n_out}")
        return
    if node.op_type == "Loop":
        body = attrs["body"].g
        n_state = n_in - 2
        if len(body.input) != 2 + n_state:
            raise invalid(label, f"the body takes {len(body.input)} inputs; a Loop with "
                                 f"{n_state} loop-carried values needs {2 + n_state}")
        if len(body.output) != 1 + n_out or n_out < n_state:
            raise invalid(label, f"the body gives {len(body.output)} outputs; a Loop with "
                                 f"{n_state} loop-carried values and {n_out} outputs needs "
                                 f"{1 + n_out}")
        return
    # Scan
    n_scan = attrs["num_scan_inputs"].i
    first = 1 if version < 9 else 0  # opset 8: the first input is sequence_lens
    n_state = n_in - first - n_scan
    if n_scan < 1 or n_state < 0:
        raise invalid(label, f"num_scan_inputs={n_scan} must be between 1 and the number of "
                             f"inputs ({n_in - first})")
    body = attrs["body"].g
    if len(body.input) != n_state + n_scan:
        raise invalid(label, f"the body takes {len(body.input)} inputs, the node passes "
                             f"{n_state} state + {n_scan} scan inputs")
    n_scan_out = n_out - n_state
    if n_scan_out < 0 or len(body.output) != n_out:
        raise invalid(label, f"the body gives {len(body.output)} outputs, the node has {n_out} "
                             f"({n_state} state)")
    for key, count in (("scan_input_axes", n_scan), ("scan_input_directions", n_scan),
                       ("scan_output_axes", n_scan_out), ("scan_output_directions", n_scan_out)):
        if key in attrs:
            values = list(attrs[key].ints)
            if len(values) != count:
                raise invalid(label, f"{key} has {len(values)} entries, {count} expected")
            if key.endswith("directions") and any(v not in (0, 1) for v in values):
                raise invalid(label, f"{key} must be 0 (forward) or 1 (reverse), got {values}")
            if key.endswith("axes") and any(abs(v) > 2 ** 31 for v in values):
                raise invalid(label, f"{key} out of range: {values}")
