"""Runs the passes over one IR graph and assembles the Report from their results. No I/O."""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from ...passes.choices import Strategy
from ...passes.costs import CostReport, count_costs
from ...passes.device.fits import Fit
from ...passes.device.gpu_engine import (
    context_parallel_band,
    datasheet_band,
    datasheet_engine,
)
from ...passes.device.gpu_workspaces import gpu_workspaces
from ...passes.device.profile import EngineProfile
from ...passes.device.roofline import flops_by_dtype, roofline
from ...passes.device.time_estimate import TimeEstimate, estimate_time, with_recompute
from ...passes.errors import GraphcostError, opt
from ...passes.graph.attention_dispatch import attention_uses
from ...passes.graph.modules import aggregate_modules
from ...passes.graph.moe import find_moe
from ...passes.graph.params import ParamReport, count_params
from ...passes.graph.receptive_field import cnn_fields
from ...passes.graph.shapes import check_shapes
from ...passes.ir import Graph, ValueKind
from ...passes.magnitude import magnitude_warnings
from ...passes.memory.allocator_events import inference_reserved
from ...passes.memory.arena import plan_arena
from ...passes.memory.bounds import size_bounds
from ...passes.memory.liveness import analyze_liveness
from ...passes.parallel.comm import CommVolume
from ...passes.parallel.step import parallel_step
from ...passes.parallel.step_time import RankStep, rank_step_time, utilisation
from ...passes.serving.analysis import ServingTrace, serving_review
from ...passes.training.memory import forward_set
from ...passes.training.optimizer import trainable_params
from ...passes.training.precision import cast_floats, master_weights
from ...passes.training.step import plain_step, training_step
from .devices import node_links
from .report import NodeRow, Report, Totals
from .request import PassOptions


class PassMemo:
    """What ``run_passes`` computed over one graph on one device that a parallel layout does
    not change (the counts, the single-rank training step of each checkpoint plan, the
    roofline's per-node times), kept for the next layout's analysis: a plan
    (analyzer/app/plan.py) analyzes many layouts of one traced rank program, each figure
    what ``run_passes`` alone gives (the passes are pure)."""

    def __init__(self) -> None:
        self._results: dict = {}

    def get(self, key: tuple, make):
        """``make()``'s result, computed on the first ``get`` of ``key``."""
        if key not in self._results:
            self._results[key] = make()
        return self._results[key]


def run_passes(graph: Graph, options: PassOptions = PassOptions(),
               serving: ServingTrace | None = None, memo: PassMemo | None = None) -> Report:
    """The passes ``options`` asks for (analyzer/app/request.py). ``lifetimes``: "dataflow" (a
    graph runtime frees each tensor after its last use) or "eager" (PyTorch eager: module
    arguments stay referenced until the call returns; default for an inference graph traced
    from PyTorch). ``optimizer`` (a joint forward+backward graph) adds the training step
    (passes.training.step.training_step: ``checkpoint``, ``precision``, ``optimizer_impl``,
    ``what_if``), ``parallel`` one rank's share; ``device`` the roofline and the fit, with
    ``overhead``; ``serving`` (the prefill this graph is, at the dtypes asked, and the decode
    step) the serving review. ``memo`` (one per graph, device and serving trace) keeps what
    the layout does not change for the next call."""
    o = options
    memo = PassMemo() if memo is None else memo
    graph, costs, report = memo.get(("rank",) + _rank_key(o),
                                    lambda: _one_rank(graph, o, serving, memo))
    training, device, overhead = report.training, o.device, o.overhead
    if o.parallel is not None and training is not None:
        # (the kernels' workspaces depend on the graph and device alone: one for its layouts)
        workspaces = None if device is None else memo.get(
            ("workspaces", *_graph_key(o)),
            lambda: gpu_workspaces(graph, device, len(forward_set(graph))))
        report = replace(report, parallel=parallel_step(
            graph, training, o.parallel, device, overhead, master_weights(o.precision),
            o.allocator, workspaces))
    report = _with_time(report, graph, costs, o, training)
    if device is None:
        return report
    fit = _fit(report, device, overhead, o.allocator)
    line = memo.get(("roofline", *_graph_key(o), o.tf32), lambda: roofline(
        graph, costs.nodes, device, tf32=o.tf32, tensor_bytes=report.peak_bytes, fit=fit))
    return replace(report, roofline=replace(line, tensor_bytes=report.peak_bytes, fit=fit))


def _graph_key(o: PassOptions) -> tuple:
    """The options the graph's own passes read (``_graph_passes``): not the training step's,
    the layout or the time (one device per memo, so its name)."""
    return (o.include_inputs, o.inplace, o.lifetimes, o.optimizer is None, o.precision,
            o.device and o.device.name, o.overhead, o.allocator, o.serve_link,
            o.what_if)   # (the serving review's what-ifs)


def _rank_key(o: PassOptions) -> tuple:
    """The options the single-rank analysis reads (``_one_rank``)."""
    return (*_graph_key(o), o.optimizer, o.checkpoint, o.what_if, o.optimizer_impl,
            _one_device_replay(o))


def _one_device_replay(o: PassOptions) -> bool:
    """The training step replayed as one device runs it: not where a layout's ranks are
    replayed instead (their reserved peak decides the fit)."""
    return o.one_device_replay and o.parallel is None


def _one_rank(graph: Graph, o: PassOptions, serving: ServingTrace | None,
              memo: PassMemo) -> tuple[Graph, CostReport, Report]:
    """The precision's graph, its costs, and its report on one rank with its training step:
    no layout, time or roofline yet."""
    graph, costs, report = memo.get(("graph",) + _graph_key(o),
                                    lambda: _graph_passes(graph, o, serving))
    if o.optimizer is None:
        return graph, costs, report
    optimizer = o.optimizer
    # (the step without a plan: one for the graph's checkpoint plans, which a plan's layouts
    # and an analysis's what-ifs each compare with)
    plain = memo.get(("plain", *_graph_key(o), optimizer, o.optimizer_impl),
                     lambda: plain_step(graph, optimizer, o.precision, o.include_inputs,
                                        o.optimizer_impl))
    training = training_step(
        graph, optimizer, [nc.cost.flops for nc in costs.nodes], precision=o.precision,
        checkpoint=o.checkpoint, what_if=o.what_if, include_inputs=o.include_inputs,
        impl=o.optimizer_impl, allocator=o.allocator, device=o.device,
        replay=_one_device_replay(o), overhead=o.overhead, plain=plain)
    return graph, costs, replace(report, training=training)


def _graph_passes(graph: Graph, o: PassOptions, serving: ServingTrace | None,
                  ) -> tuple[Graph, CostReport, Report]:
    """The precision's graph, its costs, and its report without a training step."""
    optimizer, precision, device, overhead = o.optimizer, o.precision, o.device, o.overhead
    include_inputs = o.include_inputs
    graph = cast_floats(graph, precision)
    lifetimes = o.lifetimes or ("eager" if graph.source == "fx" and optimizer is None
                              else "dataflow")
    if lifetimes not in ("eager", "dataflow"):
        raise GraphcostError(f"lifetimes must be 'eager' or 'dataflow', not {lifetimes!r}")
    costs, params = count_costs(graph), count_params(graph)
    memory = analyze_liveness(graph, include_inputs=include_inputs, inplace=o.inplace,
                              eager=lifetimes == "eager",
                              resident={"params": params.param_bytes,
                                        "buffers": params.buffer_bytes})
    # A static arena is an inference runtime's plan; a training step runs on PyTorch's
    # caching allocator (and greedy-by-size over a joint graph's long lifetimes is slow).
    arena = plan_arena(memory.storages) if optimizer is None else None
    if arena is not None:
        reserved, phases = inference_reserved(graph, memory, o.allocator,
                                              gpu_workspaces(graph, device) if device else None)
        memory = replace(memory, arena_bytes=arena.arena_bytes, reserved_peak_bytes=reserved,
                         reserved_by_phase=phases)
    if o.lifetimes == "dataflow":  # asked for: a step without Python's references either
        graph = replace(graph, eager_refs=MappingProxyType({}),
                        eager_inplace=MappingProxyType({}))
    report = Report(
        model=graph.name, source=graph.source, batch=graph.batch, dims=dict(graph.dims),
        totals=_totals(graph, costs, params), by_op_type=costs.by_op_type, coverage=costs.coverage,
        memory=memory, warnings=_warnings(graph, memory, arena, costs), training=None,
        roofline=None,
        traced_layers=graph.traced_layers, attention=attention_uses(graph.attention),
        allocator=o.allocator.words, parallel=None,
        moe=find_moe(graph, costs, params.params),
        bounds=size_bounds(graph, include_inputs=include_inputs, eager=lifetimes == "eager"),
        receptive_field=() if optimizer else cnn_fields(graph),
        modules=tuple(aggregate_modules(graph, costs, params)),
        nodes=_node_rows(graph, costs, params), shape_issues=tuple(check_shapes(graph)),
        serving=serving and serving_review(serving, device, overhead, o.allocator,
                                           o.serve_link and o.serve_link.bandwidth,
                                           o.what_if, _calibrated(o)))
    return graph, costs, report


NO_PARALLEL_TIME = ("no time estimate for this parallel rank: a calibrated profile prices "
                    "one process's kernels, not the collectives between GPUs (a GPU's "
                    "datasheet estimate does: a GPU device without a profile; a GPU's own "
                    "profile does beside fully_shard, DDP, tp, cp, ep and pipeline ranks)")


def gpu_profile(o: PassOptions) -> bool:
    """The request's profile was measured on a GPU (graphcost calibrate --device): a
    parallel rank's kernels are priced with it and its collectives on the GPU's links."""
    return o.profile is not None and o.profile.gpu is not None


def _with_time(report: Report, graph: Graph, costs: CostReport, o: PassOptions,
               training) -> Report:
    """The report with its time estimate: a device profile's, else a GPU device's datasheet
    estimate (passes/device/gpu_engine.py), a parallel rank's with its collectives on the
    clock (none for a CPU profile's parallel rank: a warning says why)."""
    if o.profile is None and not (o.device is not None and o.device.is_gpu
                                  and graph.source != "onnx"):
        return report   # (a datasheet estimate is eager PyTorch's: not ONNX Runtime's)
    if report.serving is not None:   # (its two steps are priced in its own section)
        return report
    if o.parallel is not None and o.profile is not None and not gpu_profile(o):
        return replace(report, warnings=(*report.warnings, NO_PARALLEL_TIME))
    estimate = _time(graph, costs, o, training, report)
    if o.parallel is None or report.parallel is None:   # (its throughput beside)
        estimate = replace(estimate, **utilisation(estimate.seconds, rank_step(report, o)))
    else:
        assert o.device is not None
        links = node_links(o.device, o.parallel.interconnect, o.parallel.gpus_per_node)
        estimate = rank_step_time(estimate, rank_step(report, o), links)
    return replace(report, time=with_run(estimate, o))


def with_run(estimate: TimeEstimate, o: PassOptions) -> TimeEstimate:
    """The estimate with the training run the request prices (``run_tokens`` at ``price``):
    a run needs the step's tokens/s."""
    if o.run_tokens is None:
        return estimate
    if estimate.tokens_per_second is None:
        raise GraphcostError(f"{opt('tokens')} needs tokens/s per GPU: a model with a seq "
                             "dimension (its tokens a step)")
    return replace(estimate, run_tokens=o.run_tokens, price=o.price)


NO_COMM = CommVolume(0, 0, 0, 0, 0, None, None, None)


def step_work(report: Report, device) -> tuple[int, int, float | None]:
    """A report's step for the clock: its FLOPs, its checkpoint plan's recompute FLOPs, and
    ``device``'s dense rate of the dtype most of its FLOPs run in (None: no device) — not
    fp8's: float8 linears' MFU is against the bf16 rate, as torchtitan reports it."""
    by_dtype = {k: v for k, v in report.totals.flops_by_dtype.items() if k != "fp8"}
    dtype = max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else "fp32"
    plan = report.training.checkpoint if report.training is not None else None
    return (report.totals.flops, plan.recompute_flops if plan is not None else 0,
            device.peak(dtype) if device is not None else None)


def rank_step(report: Report, o: PassOptions) -> RankStep:
    """What the clock needs of this rank (one GPU's run without a strategy)."""
    p = report.parallel
    seq = report.dims.get("seq")
    work = step_work(report, o.device)
    if p is None:
        return RankStep(NO_COMM, {}, "", report.batch * seq if seq else None, 1, *work)
    return RankStep(p.comm, p.mesh, p.strategy, p.global_batch * seq if seq else None,
                    p.world_size, *work, o.parallel is not None and o.parallel.async_tp)


def engine_of(o: PassOptions, source: str) -> tuple[str, str, EngineProfile]:
    """(profile name, engine name, engine) pricing a graph from ``source``: the request's
    profile's engine for the graph's runtime (ONNX Runtime an ONNX file, eager PyTorch a
    traced one), else eager PyTorch (or torch.compile's kernels) at the GPU's datasheet
    rates."""
    name = "onnxruntime" if source == "onnx" else "torch"
    if o.profile is None:
        assert o.device is not None
        return o.device.name, name, datasheet_engine(o.device, compiled=o.compiled)
    engine = o.profile.engines.get(name)
    if engine is None:
        raise GraphcostError(f"{opt('device_profile')} {o.profile.name!r} holds no {name} "
                             f"measurements, which a {source} graph is priced with")
    return o.profile.name, name, engine


def _calibrated(o: PassOptions) -> tuple[str, EngineProfile] | None:
    """The request's profile (its name, its eager PyTorch engine) where it holds one: a
    serving review's eager steps are priced with it."""
    engine = o.profile.engines.get("torch") if o.profile is not None else None
    return None if engine is None or o.profile is None else (o.profile.name, engine)


def _optimizer_bytes(graph: Graph, o: PassOptions, report: Report) -> list[int]:
    """The sizes of the tensors the optimizer steps on this rank: fp32 master weights under a
    mixed-precision recipe, a shard of each under ZeRO and FSDP."""
    if not o.optimizer:
        return []
    master = master_weights(o.precision)
    sizes = [(graph.values[p].spec.numel or 0) * 4 if master
             else graph.values[p].spec.nbytes or 0 for p in trainable_params(graph)]
    p = report.parallel
    shards = p.mesh.get("dp_shard", 1) if p is not None and p.strategy != Strategy.DDP else 1
    return [size // shards for size in sizes]


def _time(graph: Graph, costs: CostReport, o: PassOptions, training,
          report: Report) -> TimeEstimate:
    """The time estimate of the graph's kernels (and a training step's optimizer and
    recompute)."""
    profile, name, engine = engine_of(o, graph.source)
    estimate = estimate_time(graph, costs.nodes, engine, profile=profile,
                             engine_name="torch.compile" if o.compiled else name, optimizer=o.optimizer,
                             param_bytes=_optimizer_bytes(graph, o, report),
                             forward=forward_set(graph) if o.optimizer else None,
                             basis="profile" if o.profile else "datasheet",
                             compiled=o.compiled)
    if o.parallel is not None and o.parallel.cp > 1:
        band, runs = context_parallel_band(engine)
        estimate = replace(estimate, band=band, runs=runs)
    elif o.profile is None or o.parallel is not None:
        # (a GPU profile's parallel rank: its collectives are the datasheet's links', which
        # published runs checked; the band is at least theirs)
        estimate = replace(estimate, band=datasheet_band(engine))
    plan = training.checkpoint if training is not None else None
    if plan is None or not plan.recompute_flops:
        return estimate
    step_flops = sum(nc.cost.flops for nc in costs.nodes)
    return with_recompute(estimate, plan.recompute_flops, step_flops)


def refit(report: Report, o: PassOptions) -> Report:
    """``report`` with its fit judged again (a section that decides it was added after the
    passes: a pipeline's worst stage)."""
    if report.roofline is None or o.device is None:
        return report
    return replace(report, roofline=replace(report.roofline,
                                            fit=_fit(report, o.device, o.overhead, o.allocator)))


def _fit(report: Report, device, overhead, allocator) -> Fit:
    """The report's one fits answer: its peak's (Report.peak: the serving batch's, one rank's,
    the training step's or the inference run's) on the device."""
    return report.peak.fit(device, overhead=overhead, allocator=allocator.words)


def _totals(graph: Graph, costs: CostReport, params: ParamReport) -> Totals:
    t = costs.totals
    return Totals(params=params.params, param_bytes=params.param_bytes, buffers=params.buffers,
                  buffer_bytes=params.buffer_bytes, macs=t.macs, flops=t.flops,
                  bytes_read=t.bytes_read, bytes_written=t.bytes_written,
                  quant_meta=params.quant_meta, quant_meta_bytes=params.quant_meta_bytes,
                  param_bytes_by_dtype=dict(params.param_bytes_by_dtype),
                  flops_by_dtype=flops_by_dtype(graph, costs.nodes))


# a warning's opening words, for the views that leave the arena out (a serving review's)
ARENA_WARNING = "arena: "


def _warnings(graph: Graph, memory, arena, costs: CostReport) -> tuple[str, ...]:
    out = list(graph.warnings)
    out.extend(magnitude_warnings(graph, costs.nodes))  # counts over 2^64: labelled
    if arena is not None and arena.stacked:
        out.append(f"{ARENA_WARNING}{arena.stacked} of the tensors live at once in such "
                   "numbers that greedy-by-size planning would be quadratic; they are stacked, "
                   "so the arena is an upper bound of the greedy plan")
    if memory.unknown:
        out.append(f"{len(memory.unknown)} activation(s) of unknown size count as 0 bytes in "
                   f"memory (first: {memory.unknown[0]!r})")
    return tuple(out)


def _node_rows(graph: Graph, costs: CostReport, params: ParamReport) -> tuple[NodeRow, ...]:
    values = graph.values
    text: dict = {}  # spec -> its shape string (specs repeat; formatting each is not free)
    data_kinds = (ValueKind.ACTIVATION, ValueKind.INPUT)

    def shape_text(spec) -> str:
        t = text.get(spec)
        if t is None:
            t = text[spec] = spec.shape_str()
        return t

    rows = []
    for node, nc in zip(graph.nodes, costs.nodes):
        ins = tuple(shape_text(values[n].spec) for n in node.inputs
                    if n and n in values and values[n].kind in data_kinds)
        outs = [values[n].spec for n in node.outputs if n]
        c = nc.cost
        rows.append(NodeRow(
            index=node.index, name=node.name, op=node.op, scope=node.scope, input_shapes=ins,
            output_shapes=tuple(shape_text(s) for s in outs),
            params=params.per_node.get(node.index, 0), output_bytes=sum(s.nbytes or 0 for s in outs),
            macs=c.macs, flops=c.flops, bytes_read=c.bytes_read, bytes_written=c.bytes_written,
            status=nc.status, repeat=node.repeat, bound=nc.bound or None))
    return tuple(rows)
