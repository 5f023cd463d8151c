"""Counts beyond what any device holds or does: labelled, never reported as fact.

A valid file can ask for absurd work: 30 nested loops of 2^63 − 1 trips each (a 571-digit MAC
count), a Tile to 2^81 elements (3.9e25 bytes). The figures are exact arithmetic on what the
file says, but no device has 2^64 bytes or runs 2^64 operations of one node in a lifetime
(2^64 FLOPs is five hours of a 1 EFLOP/s machine), so each node past LIMIT gets a warning that
names it and why (the trip counts of its enclosing bodies, or the size of its tensors), and
``--strict`` fails on them (analyzer/cli/main.py).
"""
from __future__ import annotations

from typing import Sequence

from .ir import Graph

LIMIT = 2 ** 64
LISTED = 3  # nodes named in full; the rest are counted


def beyond(*counts: int) -> bool:
    return any(c > LIMIT for c in counts)


def figure(n: int) -> str:
    """A count too big to read in full: 2^81 exactly, else its order of magnitude."""
    if n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return f"{n:.3g}" if n < 10 ** 300 else f"a {len(str(n))}-digit number"


def magnitude_warnings(graph: Graph, node_costs: Sequence) -> tuple[str, ...]:
    """One warning per node whose MACs, FLOPs, bytes read or written, or output bytes are
    over 2^64 (the first LISTED, then how many more)."""
    found = []
    for node, nc in zip(graph.nodes, node_costs):
        c = nc.cost
        out = [(name, graph.values[name].spec) for name in node.outputs
               if name and name in graph.values]
        big = [(name, spec) for name, spec in out if beyond(spec.nbytes or 0)]
        if not (big or beyond(c.macs, c.flops, c.bytes_read, c.bytes_written)):
            continue
        if big:
            name, spec = big[0]
            assert spec.numel is not None and spec.nbytes is not None  # known: it is big
            why = (f"its output {name!r} has {figure(spec.numel)} elements "
                   f"({figure(spec.nbytes)} bytes)")
        elif node.repeat > 1:
            why = (f"it runs {figure(node.repeat)} times (the trip counts of the bodies it "
                   "is in, multiplied)")
        else:
            why = "the sizes of its tensors"
        worst = max(c.macs, c.flops, c.bytes_read, c.bytes_written, *(s.nbytes or 0
                                                                     for _, s in big))
        found.append(f"node {node.name!r} ({node.op}): its counts reach {figure(worst)}, "
                     f"beyond what any device holds or runs (over 2^64): {why}")
    if len(found) > LISTED:
        found = found[:LISTED] + [f"{len(found) - LISTED} more node(s) with counts over 2^64"]
    return tuple(found)
