"""Two Reports side by side (``graphcost diff``): pure comparison, no I/O.

Nodes are matched by name (the k-th node called N in the old model with the k-th called N in
the new one). When names differ wholesale (a re-export renames everything: fewer than half of
the smaller model's nodes match by name), the still-unmatched nodes are aligned in execution
order by their op sequence (difflib.SequenceMatcher); above SEQUENCE_LIMIT nodes that
quadratic alignment is too slow and the k-th unmatched node of each op is paired instead.
``ReportDiff.matching`` says which was used, so a reader knows how far to trust the pairs.
"""
from __future__ import annotations

import difflib
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from ...passes.graph.modules import ModuleCost
from .diff_answer import (
    Change,
    FitDiff,
    ServingDiff,
    TimeDiff,
    fits_of,
    serving_of,
    times_of,
)
from .report import NodeRow, Report

# 2 (2026-12-04): peak_bytes, reserved_peak_bytes, fit, time; 3 (2026-12-05): serving
DIFF_SCHEMA_VERSION = 3
SEQUENCE_LIMIT = 5000  # unmatched nodes per side; SequenceMatcher takes ~1 s at 5,000


_NODE_NUMBERS = ("params", "macs", "flops", "bytes_read", "bytes_written")
_MODULE_NUMBERS = ("nodes", "params", "macs", "flops", "output_bytes")


@dataclass(frozen=True)
class NodeDiff:
    status: str              # changed | added | removed
    old: NodeRow | None
    new: NodeRow | None
    matched_by: str = ""     # name | sequence | op-order ("" for added/removed)

    @property
    def row(self) -> NodeRow:
        """The new row, else the old one (a diff has one or both)."""
        row = self.new or self.old
        assert row is not None
        return row

    @property
    def name(self) -> str:
        return self.row.name

    @property
    def op(self) -> str:
        return self.row.op

    def changes(self) -> tuple[Change, ...]:
        o, n = self.old, self.new
        return tuple(Change(f, getattr(o, f) if o else 0, getattr(n, f) if n else 0)
                     for f in _NODE_NUMBERS)

    def to_dict(self) -> dict[str, Any]:
        o, n = self.old, self.new
        return {"status": self.status, "name": self.name, "op": self.op,
                "old_name": o.name if o else None, "new_name": n.name if n else None,
                "old_op": o.op if o else None, "new_op": n.op if n else None,
                "old_index": o.index if o else None, "new_index": n.index if n else None,
                "matched_by": self.matched_by or None,
                "old_shapes": _shapes(o), "new_shapes": _shapes(n),
                **{c.name: c.to_dict() for c in self.changes()}}


def _shapes(n: NodeRow | None) -> dict[str, list[str]] | None:
    return {"in": list(n.input_shapes), "out": list(n.output_shapes)} if n else None


@dataclass(frozen=True)
class ModuleDiff:
    status: str              # changed | added | removed
    path: str
    old: ModuleCost | None
    new: ModuleCost | None

    def changes(self) -> tuple[Change, ...]:
        o, n = self.old, self.new
        return tuple(Change(f, getattr(o, f) if o else 0, getattr(n, f) if n else 0)
                     for f in _MODULE_NUMBERS)

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "path": self.path,
                **{c.name: c.to_dict() for c in self.changes()}}


@dataclass(frozen=True)
class OpTypeDiff:
    op: str
    count: Change
    macs: Change
    flops: Change

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "count": self.count.to_dict(), "macs": self.macs.to_dict(),
                "flops": self.flops.to_dict()}


@dataclass(frozen=True)
class PeakDiff:
    """Why the activation peak moved: the tensors live at each model's peak, compared by name."""
    peak: Change
    old_node: str | None
    new_node: str | None
    old_node_index: int
    new_node_index: int
    only_new: tuple[tuple[str, int], ...]             # (tensor, bytes), largest first
    only_old: tuple[tuple[str, int], ...]
    resized: tuple[tuple[str, int, int], ...]         # (tensor, old bytes, new bytes)
    unchanged_bytes: int                               # same tensor, same size, in both

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak.to_dict(),
                "old_node": self.old_node, "new_node": self.new_node,
                "old_node_index": self.old_node_index, "new_node_index": self.new_node_index,
                "only_new": [{"name": n, "bytes": b} for n, b in self.only_new],
                "only_old": [{"name": n, "bytes": b} for n, b in self.only_old],
                "resized": [{"name": n, "old": o, "new": b, "delta": b - o}
                            for n, o, b in self.resized],
                "unchanged_bytes": self.unchanged_bytes}


@dataclass(frozen=True)
class ReportDiff:
    old_model: str
    new_model: str
    old_source: str
    new_source: str
    matching: str                   # name | name+sequence | name+op-order
    matched_by_name: int
    matched_otherwise: int
    totals: tuple[Change, ...]
    op_types: tuple[OpTypeDiff, ...]          # only ops whose count/MACs/FLOPs changed
    modules: tuple[ModuleDiff, ...]           # only changed, added, removed
    nodes: tuple[NodeDiff, ...]               # only changed, added, removed
    unchanged_nodes: int
    peak: PeakDiff
    notes: tuple[str, ...] = ()
    fit: FitDiff | None = None      # both analyzed for the same device
    time: TimeDiff | None = None    # both with a time estimate
    serving: ServingDiff | None = None   # both served (--serve)

    def by_status(self, status: str) -> tuple[NodeDiff, ...]:
        return tuple(n for n in self.nodes if n.status == status)

    def total(self, name: str) -> Change:
        return next(c for c in self.totals if c.name == name)

    @property
    def identical(self) -> bool:
        return not self.nodes and not self.modules and all(c.delta == 0 for c in self.totals)

    def to_dict(self) -> dict[str, Any]:
        counts = Counter(n.status for n in self.nodes)
        return {"schema_version": DIFF_SCHEMA_VERSION, "kind": "diff",
                "old": {"model": self.old_model, "source": self.old_source},
                "new": {"model": self.new_model, "source": self.new_source},
                "matching": {"method": self.matching, "by_name": self.matched_by_name,
                             "otherwise": self.matched_otherwise},
                "totals": {c.name: c.to_dict() for c in self.totals},
                "node_counts": {"changed": counts["changed"], "added": counts["added"],
                                "removed": counts["removed"],
                                "unchanged": self.unchanged_nodes},
                "peak": self.peak.to_dict(),
                "op_types": [o.to_dict() for o in self.op_types],
                "modules": [m.to_dict() for m in self.modules],
                "nodes": [n.to_dict() for n in self.nodes],
                "fit": None if self.fit is None else self.fit.to_dict(),
                "time": None if self.time is None else self.time.to_dict(),
                "serving": None if self.serving is None else self.serving.to_dict(),
                "notes": list(self.notes)}


def _totals(a: Report, b: Report) -> tuple[Change, ...]:
    ta, tb = a.totals, b.totals
    rows = [Change(f, getattr(ta, f), getattr(tb, f))
            for f in ("params", "param_bytes", "buffers", "macs", "flops", "bytes_read",
                      "bytes_written")]
    rows += [Change("nodes", len(a.nodes), len(b.nodes)),
             Change("activation_peak_bytes", a.memory.peak_bytes, b.memory.peak_bytes)]
    if a.memory.arena_bytes is not None and b.memory.arena_bytes is not None:
        rows.append(Change("arena_bytes", a.memory.arena_bytes, b.memory.arena_bytes))
    if a.training is not None and b.training is not None:
        rows.append(Change("training_peak_bytes", a.training.peak_bytes, b.training.peak_bytes))
    # what budgets check (one rank's under a layout, the worst stage's under a pipeline), and
    # the allocator's reserved bytes for it where both runs were replayed
    rows.append(Change("peak_bytes", a.peak_bytes, b.peak_bytes))
    ra, rb = a.peak.reserved_bytes, b.peak.reserved_bytes
    if ra is not None and rb is not None:
        rows.append(Change("reserved_peak_bytes", ra, rb))
    return tuple(rows)


def _keyed(rows) -> dict[tuple[str, int], NodeRow]:
    """Node name + occurrence number, so a repeated name still pairs one to one."""
    seen: Counter = Counter()
    out = {}
    for r in rows:
        out[(r.name, seen[r.name])] = r
        seen[r.name] += 1
    return out


def match_nodes(a: tuple[NodeRow, ...], b: tuple[NodeRow, ...]):
    """[(old, new, how)] for matched pairs, the unmatched old and new rows, and the method."""
    ka, kb = _keyed(a), _keyed(b)
    pairs = [(ka[k], kb[k], "name") for k in ka if k in kb]
    left = [ka[k] for k in ka if k not in kb]
    right = [kb[k] for k in kb if k not in ka]
    method = "name"
    if left and right and 2 * len(pairs) < min(len(a), len(b)):
        if max(len(left), len(right)) <= SEQUENCE_LIMIT:
            method = "sequence"
            sm = difflib.SequenceMatcher(None, [r.op for r in left], [r.op for r in right],
                                         autojunk=False)  # autojunk would drop common ops
            hits = [(left[blk.a + i], right[blk.b + i])
                    for blk in sm.get_matching_blocks() for i in range(blk.size)]
        else:
            method = "op-order"
            queues = defaultdict(list)
            for r in right:
                queues[r.op].append(r)
            for q in queues.values():
                q.reverse()
            hits = [(r, queues[r.op].pop()) for r in left if queues[r.op]]
        pairs += [(o, n, method) for o, n in hits]
        used_old = {id(o) for o, _ in hits}
        used_new = {id(n) for _, n in hits}
        left = [r for r in left if id(r) not in used_old]
        right = [r for r in right if id(r) not in used_new]
        method = "name+" + method
    return pairs, left, right, method


def _node_changed(o: NodeRow, n: NodeRow) -> bool:
    return (o.op != n.op or o.input_shapes != n.input_shapes
            or o.output_shapes != n.output_shapes
            or any(getattr(o, f) != getattr(n, f) for f in _NODE_NUMBERS))


def _modules(a: Report, b: Report) -> tuple[ModuleDiff, ...]:
    ma = {m.path: m for m in a.modules}
    mb = {m.path: m for m in b.modules}
    out = []
    for path, n in mb.items():
        o = ma.get(path)
        if o is None:
            out.append(ModuleDiff("added", path, None, n))
        elif any(getattr(o, f) != getattr(n, f) for f in _MODULE_NUMBERS):
            out.append(ModuleDiff("changed", path, o, n))
    out += [ModuleDiff("removed", p, o, None) for p, o in ma.items() if p not in mb]
    return tuple(out)


def _op_types(a: Report, b: Report) -> tuple[OpTypeDiff, ...]:
    oa, ob = a.by_op_type, b.by_op_type
    out = []
    for op in sorted(set(oa) | set(ob)):
        x, y = oa.get(op), ob.get(op)
        row = OpTypeDiff(op, *(Change(f, getattr(x, f) if x else 0, getattr(y, f) if y else 0)
                               for f in ("count", "macs", "flops")))
        if any(c.delta for c in (row.count, row.macs, row.flops)):
            out.append(row)
    return tuple(out)


def _peak(a: Report, b: Report) -> PeakDiff:
    ma, mb = a.memory, b.memory
    la = {t.name: t.bytes for t in ma.live_at_peak}
    lb = {t.name: t.bytes for t in mb.live_at_peak}

    def largest(items):
        return tuple(sorted(items, key=lambda t: (-t[1], t[0])))

    resized = sorted(((k, la[k], lb[k]) for k in la.keys() & lb.keys() if la[k] != lb[k]),
                     key=lambda t: (-abs(t[2] - t[1]), t[0]))
    return PeakDiff(
        Change("activation_peak_bytes", ma.peak_bytes, mb.peak_bytes),
        ma.peak_node, mb.peak_node, ma.peak_node_index, mb.peak_node_index,
        only_new=largest((k, v) for k, v in lb.items() if k not in la),
        only_old=largest((k, v) for k, v in la.items() if k not in lb),
        resized=tuple(resized),
        unchanged_bytes=sum(v for k, v in la.items() if lb.get(k) == v))


def diff_reports(a: Report, b: Report) -> ReportDiff:
    """What changed from ``a`` (old) to ``b`` (new)."""
    pairs, removed, added, method = match_nodes(a.nodes, b.nodes)
    rows = [NodeDiff("changed", o, n, how) for o, n, how in pairs if _node_changed(o, n)]
    rows += [NodeDiff("added", None, n) for n in added]
    rows += [NodeDiff("removed", o, None) for o in removed]
    # new-model order first (removed nodes by their old position, after)
    rows.sort(key=lambda d: (d.new is None, d.row.index))
    notes = []
    if method != "name":
        other = sum(1 for *_, how in pairs if how != "name")
        how = ("aligning the two op sequences" if method == "name+sequence" else
               "op order (the k-th unmatched node of each op; too many nodes to align)")
        notes.append(f"node names differ wholesale: {other} nodes matched by {how}, "
                     "not by name; check the pairs")
    if a.memory.lifetimes != b.memory.lifetimes:
        notes.append(f"lifetimes differ ({a.memory.lifetimes} vs {b.memory.lifetimes}): part "
                     "of the peak change comes from the memory model, not the graph")
    if (a.batch, a.dims) != (b.batch, b.dims):
        notes.append(f"bindings differ: batch {a.batch} {a.dims} vs batch {b.batch} {b.dims}")
    if (a.training is None) != (b.training is None):
        notes.append("only one model has a training analysis: training peak not compared")
    if a.pipeline is not None or b.pipeline is not None:   # (as the main face says it)
        notes.append("pipeline stages: FLOPs, bytes and the activation and training peaks are "
                     "the whole model's at one micro-batch; the peak and the fit the largest "
                     "stage's rank's")
    for tag, r in (("old", a), ("new", b)):
        c = r.coverage
        if c.unsupported or c.unknown_shape:
            notes.append(f"{tag} model: {c.nodes - c.covered} nodes not costed; their "
                         "deltas count them as 0")
    return ReportDiff(
        a.model, b.model, a.source, b.source, method,
        matched_by_name=sum(1 for *_, how in pairs if how == "name"),
        matched_otherwise=sum(1 for *_, how in pairs if how != "name"),
        totals=_totals(a, b), op_types=_op_types(a, b), modules=_modules(a, b),
        nodes=tuple(rows), unchanged_nodes=len(pairs) - sum(r.status == "changed" for r in rows),
        peak=_peak(a, b), notes=tuple(notes), fit=fits_of(a, b), time=times_of(a, b),
        serving=serving_of(a, b))
