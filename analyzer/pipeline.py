"""Runs the passes over one IR graph and assembles the Report. No I/O, no printing."""
from __future__ import annotations

from graphcost.analyzer.errors import GraphcostError
from graphcost.analyzer.ir import Graph, ValueKind
from graphcost.analyzer.report import (Checkpoint, Coverage, LiveTensor, Memory, ModuleRow, NodeRow,
                             NodeTime, OpTypeRow, ReceptiveField, Report, Roofline, Totals,
                             Training)
from graphcost.passes.arena import plan_arena
from graphcost.passes.costs import count_costs
from graphcost.passes.liveness import analyze_liveness
from graphcost.passes.modules import aggregate_modules
from graphcost.passes.moe import find_moe
from graphcost.passes.training import plan_checkpoints, training_memory, what_ifs
from graphcost.passes.params import count_params
from graphcost.passes.receptive_field import is_cnn, receptive_fields
from graphcost.passes.precision import cast_floats
from graphcost.passes.shapes import check_shapes


def run_passes(graph: Graph, *, include_inputs: bool = True, inplace: bool = False,
               lifetimes: str | None = None, optimizer: str | None = None,
               checkpoint: dict | None = None, precision: str = "fp32",
               device=None, tf32: bool = False, overhead=None,
               savers: bool = True) -> Report:
    """``lifetimes``: "dataflow" (a graph runtime frees each tensor after its last use) or
    "eager" (PyTorch eager: module arguments stay referenced until the call returns). Default:
    eager for graphs traced from PyTorch, dataflow for ONNX. ``optimizer`` (for a joint
    forward+backward graph) adds the training-step memory; ``checkpoint`` (names / every /
    sqrt / budget, as passes.training.plan_checkpoints takes them) a checkpoint plan;
    ``precision`` fp16-mixed / bf16-mixed re-types the graph's floating tensors first (every
    pass then sees half-precision tensors) and gives the optimizer fp32 master weights.
    ``device`` (analyzer.devices.Device) adds the roofline time and whether the memory fits,
    with ``overhead`` (analyzer.devices.Overhead, default documented there). ``savers=False``
    skips the training what-ifs (each re-runs the training passes)."""
    mixed = precision != "fp32"
    graph = cast_floats(graph, precision)
    if lifetimes is None:
        # eager references matter in an eager forward; a joint graph's memory is dataflow
        lifetimes = "eager" if graph.source == "fx" and optimizer is None else "dataflow"
    if lifetimes not in ("eager", "dataflow"):
        raise GraphcostError(f"lifetimes must be 'eager' or 'dataflow', not {lifetimes!r}")
    costs = count_costs(graph)
    params = count_params(graph)
    live = analyze_liveness(graph, include_inputs=include_inputs, inplace=inplace,
                            eager=lifetimes == "eager")
    # A static arena is an inference runtime's plan. A training step's joint graph keeps
    # thousands of tensors alive together, where greedy-by-size is quadratic (minutes at 25k
    # nodes), and PyTorch trains with its caching allocator anyway: not planned there.
    arena = plan_arena(live.storages) if optimizer is None else None
    shape_issues = check_shapes(graph)

    values = graph.values
    rows = []
    text: dict = {}  # spec -> its shape string (specs repeat; formatting each is not free)
    data_kinds = (ValueKind.ACTIVATION, ValueKind.INPUT)

    def shape_text(spec) -> str:
        t = text.get(spec)
        if t is None:
            t = text[spec] = spec.shape_str()
        return t

    for node, nc in zip(graph.nodes, costs.nodes):
        in_shapes = []
        for name in node.inputs:
            v = values.get(name) if name else None
            if v is not None and v.kind in data_kinds:
                in_shapes.append(shape_text(v.spec))
        out_shapes = []
        out_bytes = 0
        for name in node.outputs:
            if name:
                spec = values[name].spec
                out_shapes.append(shape_text(spec))
                out_bytes += spec.nbytes or 0
        c = nc.cost
        rows.append(NodeRow(node.index, node.name, node.op, node.scope, tuple(in_shapes),
                            tuple(out_shapes), params.per_node.get(node.index, 0), out_bytes,
                            c.macs, c.flops, c.bytes_read, c.bytes_written, nc.status,
                            node.repeat))

    peak_i = live.peak_node
    live_at_peak = tuple(LiveTensor(s.name, s.nbytes) for s in live.live_at(peak_i)) \
        if peak_i >= 0 else ()
    memory = Memory(include_inputs, lifetimes, live.naive_sum_bytes, live.peak_bytes,
                    graph.nodes[peak_i].name if peak_i >= 0 else None, peak_i,
                    live_at_peak, arena.arena_bytes if arena else None, live.timeline)
    t = costs.totals
    totals = Totals(params.params, params.param_bytes, params.buffers, params.buffer_bytes,
                    t.macs, t.flops, t.bytes_read, t.bytes_written)
    by_op = tuple(OpTypeRow(op, cnt, c.macs, c.flops, c.bytes_read, c.bytes_written)
                  for op, (cnt, c) in costs.by_op_type.items())
    coverage = Coverage(len(graph.nodes), costs.covered, dict(costs.unsupported),
                        dict(costs.unknown_shape))
    warnings = list(graph.warnings)
    if live.unknown:
        warnings.append(f"{len(live.unknown)} activation(s) of unknown size count as 0 bytes "
                        f"in memory (first: {live.unknown[0]!r})")
    types = graph.module_types
    modules = tuple(ModuleRow(m.path, types.get(m.path, ""), m.depth, m.nodes, m.params, m.macs,
                              m.flops, m.output_bytes)
                    for m in aggregate_modules(graph, costs, params))
    training = None
    if optimizer is not None:
        t = training_memory(graph, optimizer, master_weights=mixed)
        node_flops = [nc.cost.flops for nc in costs.nodes]
        ckpt = None
        if checkpoint:
            plan = plan_checkpoints(graph, optimizer, node_flops, master_weights=mixed,
                                    **checkpoint)
            ckpt = Checkpoint(plan.mode, plan.segments, plan.plain.peak_bytes,
                              plan.checkpointed.peak_bytes, plan.recompute_flops,
                              100.0 * plan.recompute_flops / max(1, costs.totals.flops),
                              plan.budget, plan.checkpointed.timeline)
        savers = what_ifs(graph, optimizer, node_flops, precision, cast_floats) if savers \
            else {}
        training = Training(t.optimizer, t.param_bytes, t.buffer_bytes, t.grad_bytes,
                            t.optimizer_state_bytes, t.step_temp_bytes, t.peak_bytes,
                            t.peak_phase, t.peak_node, t.breakdown, t.timeline, t.phases, ckpt,
                            savers)
    roof = None
    if device is not None:
        tensors = training.peak_bytes if training is not None else \
            totals.param_bytes + totals.buffer_bytes + memory.peak_bytes
        roof = _roofline(graph, costs, device, tf32, overhead, tensors)
    fields = ()
    if optimizer is None:  # (a joint graph's backward has no such chain)
        found = receptive_fields(graph)
        if is_cnn(graph, found):
            fields = tuple(ReceptiveField(i, f.rf, f.jump, f.start)
                           for i, f in sorted(found.items()))
    return Report(graph.name, graph.source, graph.batch, dict(graph.dims), totals, by_op,
                  coverage, memory, tuple(rows), tuple(warnings), tuple(shape_issues), modules,
                  training, roof, fields, find_moe(graph, costs, params.params))


def _roofline(graph: Graph, costs, device, tf32: bool, overhead, tensor_bytes: int) -> Roofline:
    from graphcost.analyzer.devices import Overhead
    from graphcost.passes.roofline import roofline

    overhead = overhead or Overhead()
    r = roofline(graph, costs.nodes, device, tf32=tf32)
    times = tuple(NodeTime(t.index, t.seconds, t.intensity, t.bound, t.dtype) for t in r.nodes)
    top = tuple(t.index for t in sorted(times, key=lambda t: (-t.seconds, t.index))[:10]
                if t.seconds > 0)
    return Roofline(device.name, device.label, dict(device.peak_flops), device.bandwidth,
                    device.memory, tf32, r.total_seconds, r.compute_seconds, r.memory_seconds,
                    times, top, tensor_bytes, overhead.context_bytes,
                    overhead.allocator_fraction, overhead.required(tensor_bytes), r.fallbacks)
