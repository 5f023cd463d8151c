"""A pipeline-parallel analysis (``--parallel pp=N``, beside ``dp_shard``/``dp_replicate``
and ``tp``): the whole model traced at the micro-batch for the report's counts, then each
distinct stage program traced (cut to its blocks, then rewritten into its tensor-parallel
rank's program) and laid out by the schedule (passes/parallel/pipeline.py) into the
report's ``pipeline`` section — under fully_shard, each stage's rank holds its shards."""
from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Mapping, Sequence

from ...passes.choices import Loss
from ...passes.device.gpu_engine import datasheet_engine, pipeline_band
from ...passes.device.time_estimate import TimeEstimate
from ...passes.errors import GraphcostError, opt
from ...passes.ir import Graph
from ...passes.parallel.comm import CommVolume, summed
from ...passes.parallel.context import with_context_parallel
from ...passes.parallel.experts import with_expert_parallel
from ...passes.parallel.mesh import mesh_of
from ...passes.parallel.pipeline import (
    Shards,
    StageStep,
    pipeline_memory,
    stage_step,
)
from ...passes.parallel.pipeline_comm import stage_comm
from ...passes.parallel.schedules import (
    Schedule,
    check_schedule,
    fits_stages,
    rank_stages,
    stage_layers,
    zero_bubble,
)
from ...passes.parallel.spec import ParallelSpec
from ...passes.parallel.step_time import RankStep, pipeline_step_time
from ...passes.parallel.tensor import with_tensor_parallel
from ...passes.parallel.zero_bubble import split_backward
from ...passes.training.precision import master_weights
from ..load.loading import load, resolve_model
from ..load.options import LoadOptions
from ..load.progress import Progress
from ..load.rank_program import (
    check_tracer_split,
    expert_count,
    first_microbatch,
    interleaved_orders,
    pipeline_blocks,
    split_by_tracer,
    tied_table,
)
from ..load.resolve import Resolved
from .devices import node_links
from .pipeline import (
    NO_COMM,
    NO_PARALLEL_TIME,
    PassMemo,
    gpu_profile,
    refit,
    run_passes,
    step_work,
    with_run,
)
from .pipeline_checks import SHARDING, check_pipeline
from .report import Report
from .request import Request

TIED_STAGES = ("the LM head is tied to the token embedding: the first and the last stage "
               "each hold a copy and its gradient, and all-reduce the two gradients after the "
               "last backward, as Megatron-LM shares them (counted: comm 'tied'; torchtitan "
               "refuses tying beside pipeline parallelism)")


# (measured: analyzer/measure/pipeline.py's GPT-2 beside fully_shard, torch 2.13)
MASTER_SPLIT = ("PyTorch's pipeline tracer asserts each parameter's dtype "
                "in the stage it exports (fp32), and fully_shard's MixedPrecisionPolicy hands "
                "it bf16: the real step fails ('Tensor dtype mismatch'). Stages the tracer "
                "splits train in fp32 or bf16-true beside fully_shard")


class StageTraces:
    """The programs a pipeline's analysis traces (the whole model at the micro-batch, each
    short stage program), kept for the next analysis of the same model — a plan's candidates
    (analyzer/app/settings_analyses.py) — each with the passes' layout-free results."""

    def __init__(self, model, example_inputs: Sequence[Any] | None = None,
                 progress: Progress | None = None) -> None:
        self.model, self.example_inputs, self.progress = model, example_inputs, progress
        self.graphs: list[tuple[LoadOptions, Graph, PassMemo]] = []
        # (blocks, experts a layer, the elements of the table the head shares with the
        # token embedding: 0, not tied)
        self.shape: tuple[int, int, int, bool] | None = None
        self.resolved: Resolved | None = None   # (the model the shape was read off)

    def graph(self, options: LoadOptions) -> tuple[Graph, PassMemo]:
        """The program ``options`` load, traced on its first ask."""
        found = next((g for g in self.graphs if g[0] == options), None)
        if found is None:
            graph = load(self.model, options, self.example_inputs, self.progress).graph
            found = (options, graph, PassMemo())
            self.graphs.append(found)
        return found[1], found[2]

    def n_blocks(self, options: LoadOptions) -> int:
        """The blocks a pipeline of the model divides (the model resolved once)."""
        return self._shape(options)[0]

    def n_experts(self, options: LoadOptions) -> int:
        """The experts each MoE layer holds stacked, as expert parallelism splits them (0:
        none; the model resolved once)."""
        return self._shape(options)[1]

    def tied(self, options: LoadOptions) -> int:
        """The elements of the table the model's head shares with its token embedding (0:
        not tied; resolved once)."""
        return self._shape(options)[2]

    def split_by_tracer(self, options: LoadOptions) -> bool:
        """Whether PyTorch's pipeline tracer splits the model (frontends/torch/
        pipeline_split.py), not graphcost's cut by name (resolved once)."""
        return self._shape(options)[3]

    def check_split(self, options: LoadOptions, stages: int) -> None:
        """Refused (GraphcostError): a pipeline of ``stages`` PyTorch's tracer splits with a
        skip connection over a stage, which its pipelining cannot run backward through."""
        self._shape(options)
        assert self.resolved is not None   # (_shape resolved it)
        check_tracer_split(self.resolved, stages)

    def _shape(self, options: LoadOptions) -> tuple[int, int, int, bool]:
        if self.shape is None:
            r = self.resolved = resolve_model(self.model, options, self.example_inputs)
            self.shape = (pipeline_blocks(r), expert_count(r), tied_table(r),
                          split_by_tracer(r))
        return self.shape


@dataclass(frozen=True)
class _Stage:
    """One distinct stage program's rank: its micro-batch step, kernels and the collectives
    each micro-batch runs."""
    step: StageStep
    time: TimeEstimate | None
    # one micro-batch's of each mesh dimension, apart: tensor, expert and context parallel
    per_micro: tuple[CommVolume, ...]
    # a zero-bubble schedule's: the share of the micro-batch's FLOPs its W runs
    weight_share: float = 0.0


def _shapes_batch(load: LoadOptions) -> int | None:
    """The batch input shapes give without a batch of their own: their first dimension (as
    ``input_shapes`` binds it: analyzer/load/resolve.py)."""
    first = next((s for s in load.input_shapes.values() if len(s)), None)
    return int(first[0]) if first is not None else None


def run_pipeline(model, request: Request, spec: ParallelSpec,
                 example_inputs: Sequence[Any] | None = None,
                 progress: Progress | None = None,
                 traces: StageTraces | None = None) -> Report:
    """The report of ``request`` with ``spec``'s pipeline stages (``traces``: programs traced
    by an earlier analysis of the model)."""
    if example_inputs is not None:   # (the batch is theirs: each trace gets the first chunk)
        batch, micro, example_inputs = first_microbatch(example_inputs, spec.microbatches)
    else:   # (first_microbatch checks its own)
        batch = request.load.batch or _shapes_batch(request.load) or 1
        micro = spec.microbatches or batch
        if batch % micro:
            raise GraphcostError(f"{opt('parallel.microbatches', value=micro)}: the batch "
                                 f"({batch}) must divide into that many micro-batches")
        if spec.microbatches is None and spec.schedule == Schedule.ONE_F_ONE_B and \
                batch < spec.pp:   # (it said "--microbatches 1", which nobody had given)
            raise GraphcostError(f"{opt('batch', value=batch)}: a pipeline runs one sequence "
                                 f"a micro-batch unless {opt('parallel.microbatches')} says "
                                 "otherwise, and 1F1B needs at least as many micro-batches "
                                 f"as stages ({spec.pp}): a batch of {spec.pp} or more")
    v = spec.stages_per_rank
    check_schedule(spec.schedule, micro, spec.pp, v)   # (before any trace)
    check_pipeline(request, spec)
    at_micro = request.load if example_inputs is not None \
        else replace(request.load, batch=batch // micro)
    passes = replace(request.passes, parallel=None, profile=None, one_device_replay=False)
    traces = traces or StageTraces(model, example_inputs, progress)
    if traces.split_by_tracer(at_micro):   # (where the real step of such a split fails)
        if spec.strategy in SHARDING and master_weights(request.passes.precision):
            raise GraphcostError(f"{opt('precision', value=request.passes.precision)}: "
                                 + MASTER_SPLIT)
        traces.check_split(at_micro, spec.pp * v)
    whole, memo = traces.graph(at_micro)
    report = run_passes(whole, passes, memo=memo)
    priced = request.passes.profile is None or gpu_profile(request.passes)
    if not priced:   # (a CPU profile: no collectives, no GPU's links)
        report = replace(report, warnings=(*report.warnings, NO_PARALLEL_TIME))
    report = replace(report, time=None)   # (one micro-batch's kernels are not the step)
    if traces.tied(at_micro):
        report = replace(report, warnings=(*report.warnings, TIED_STAGES))
    stages = _stages(traces, at_micro, request, spec, traces.n_blocks(at_micro), progress)
    mesh = {"pp": spec.pp, **{k: n for k, n in mesh_of(
        spec.strategy, spec.world_size, spec.replicate, spec.tp, spec.ep, spec.cp).dims
        if n and n > 1}}
    memory = pipeline_memory([(st.step, layers) for st, layers in stages], spec.schedule,
                             micro, batch // micro,
                             interleaved_orders(spec.pp, v, micro, spec.schedule)
                             if v > 1 else None,
                             request.passes.allocator)
    comms = _comms(stages, mesh, micro, _tied_grad_bytes(traces.tied(at_micro), mesh, spec,
                                                         request))
    comm = summed([comms[i] for i in rank_stages(spec.schedule, memory.worst_stage,
                                                 spec.pp, v)])   # (the worst rank's stages)
    report = replace(report, pipeline=replace(memory, mesh=mesh, comm=comm))
    clocks = [st.time for st, _ in stages]
    if all(clocks) and priced:
        report = replace(report, time=with_run(_pipeline_time(
            report, stages, comms, mesh, spec, micro, request), request.passes))
    return refit(report, request.passes)   # the worst stage decides it


def _stages(traces: StageTraces, at_micro, request: Request, spec: ParallelSpec,
            n_layers: int, progress) -> list[tuple[_Stage, tuple[int, int]]]:
    """Every stage's rank with its blocks; each distinct stage program traced once — a stage
    of more than ``SHORT`` blocks as two short ones (``_per_block``)."""
    sharded, p = spec.strategy in SHARDING, spec.pp * spec.stages_per_rank
    shards = Shards(spec.world_size or 1, 2 if master_weights(request.passes.precision)
                    else 1, spec.ep, spec.tp) if sharded else None
    # (a GPU's profile prices each stage's kernels; its sends and the data dimension's
    # collectives go on the datasheet's links, as a parallel rank's do: pipeline.py)
    profile = request.passes.profile if gpu_profile(request.passes) else None
    stage_passes = replace(request.passes, parallel=None, profile=profile, what_if=False,
                           include_inputs=False, one_device_replay=False)

    def traced(i: int, blocks: int | None) -> _Stage:
        first, last = i == 0, i == p - 1
        where = (i, p)
        canonical = (0 if first else 2 if last else 1, 3)
        if blocks is not None and fits_stages(n_layers, 3) and \
                len(stage_layers(n_layers, *canonical)) >= blocks:
            # a short program is the same whatever the pipeline it is cut from: one cut of
            # three stages names it, for every layout a plan analyzes
            where = canonical
        if progress:
            progress(f"tracing pipeline stage {i + 1} of {p}"
                     + (f" ({blocks} of its blocks)" if blocks else ""))
        # (each stage program's own loss: the last stage's is the schedule's cross-entropy,
        # another's output stands for the gradient it receives: _check_step)
        graph, memo = traces.graph(replace(at_micro, pipeline_stage=where,
                                           stage_blocks=blocks, loss=Loss.AUTO))
        # (a stage of no block — an interleaved split's last, the norm and the head — has
        # nothing to checkpoint: torchtitan wraps each block it holds)
        own = stage_passes if stage_layers(n_layers, i, p) else \
            replace(stage_passes, checkpoint=None)
        split = None
        if zero_bubble(spec.schedule):   # (its backward as I, then W)
            graph, split = split_backward(graph, first)
            memo = None
        stage = run_passes(graph, own, memo=memo)
        assert stage.training is not None  # (a training request)
        plan = stage.training.checkpoint
        recomputed = plan.recomputed if plan else frozenset()
        per_micro = tuple(c for c in (
            with_tensor_parallel(NO_COMM, graph, spec.tp, recomputed),
            with_expert_parallel(NO_COMM, graph, spec.ep, recomputed),
            with_context_parallel(NO_COMM, graph, spec.cp, recomputed)) if c.by_dim)
        return _Stage(stage_step(graph, stage.training.run, first, last, shards,
                                 request.passes.device, split), stage.time, per_micro,
                      _share(stage, split))

    done: dict[tuple, _Stage] = {}
    out = []
    for i in range(p):
        blocks = stage_layers(n_layers, i, p)
        key = (i == 0, i == p - 1, len(blocks))
        if key not in done:
            n = len(blocks)
            done[key] = traced(i, None) if n <= SHORT else \
                _long(traced(i, SHORT - 1), traced(i, SHORT), n - SHORT)
        out.append((done[key], (blocks.start, blocks.stop)))
    return out


# A stage of more blocks than this is traced with SHORT − 1 and SHORT of them: every figure
# of its step (bytes held and made, peaks, kernels' seconds, collectives) grows by the same
# amount with each block of a repeated stack, as the repeated-layer trace's does
# (frontends/torch/repeat_layers.py); tests/test_pipeline_parallel.py checks it against the
# whole stage's trace.
SHORT = 3


def _long(a: _Stage, b: _Stage, more: int) -> _Stage:
    """The stage of ``more`` blocks more than ``b`` (one more than ``a``): its figures grown
    per block; the allocator's replay reads ``b``'s trace (passes/parallel/
    pipeline_reserved.py: its reserved-to-allocated ratio applied to the grown peak)."""
    grown = _per_block(a, b, more)
    return replace(grown, step=replace(grown.step, trace=b.step.trace, more=more,
                                       split=b.step.split))


def _share(stage: Report, split: int | None) -> float:
    """The share of the traced step's FLOPs in nodes ``split`` on (a zero-bubble W's)."""
    if split is None:
        return 0.0
    total = sum(n.flops * n.repeat for n in stage.nodes)
    return sum(n.flops * n.repeat for n in stage.nodes if n.index >= split) / total \
        if total else 0.0


def _per_block(a, b, more: int):
    """``b`` (a dataclass of one stage's figures with one block more than ``a``) with
    ``more`` blocks more: each number grown by its difference, ``b − a``, per block (a
    constant stays; mappings, tuples and nested dataclasses item by item)."""
    if is_dataclass(b) and not isinstance(b, type):
        return replace(b, **{f.name: _per_block(getattr(a, f.name), getattr(b, f.name), more)
                             for f in fields(b)})
    if isinstance(b, Mapping):
        return {k: _per_block(a.get(k, 0), v, more) for k, v in b.items()}
    if isinstance(b, tuple) and isinstance(a, tuple) and len(a) == len(b):
        return tuple(_per_block(x, y, more) for x, y in zip(a, b))
    if isinstance(b, bool) or not isinstance(b, (int, float)) or \
            not isinstance(a, (int, float)):
        return b
    return b + more * (b - a)


def _comms(stages: list, mesh: dict, micro: int, tied: int) -> list[CommVolume]:
    """Each stage's collectives a step, in pipeline order; ``tied``: the bytes of the tied
    table's gradient the end stages' ranks all-reduce (0: none)."""
    return [stage_comm(st.step, st.per_micro, mesh, micro, i == 0, i == len(stages) - 1,
                       tied) for i, (st, _) in enumerate(stages)]


def _tied_grad_bytes(elements: int, mesh: Mapping[str, int], spec: ParallelSpec,
                     request: Request) -> int:
    """The bytes of the tied table's gradient a rank of the first and the last stage
    all-reduce with its twin (Megatron-LM's embedding group): its vocabulary-parallel slice
    under tp, the shard fully_shard reduced to (fp32 under a master recipe's reduce dtype,
    else the parameters' dtype: bf16 when the recipe casts the module)."""
    if not elements or spec.pp < 2:
        return 0
    shards = mesh.get("dp_shard", 1) * mesh.get("cp", 1) if spec.strategy in SHARDING else 1
    size = 4 if master_weights(request.passes.precision) or request.load.cast is None else 2
    return -(-elements // (spec.tp * shards)) * size


def _pipeline_time(report: Report, stages: list, comms: list[CommVolume], mesh: dict,
                   spec: ParallelSpec, micro: int, request: Request) -> TimeEstimate:
    """The step's time from each distinct stage's for one micro-batch: ``report`` is the
    whole model (its tensor-parallel rank) at the micro-batch (its FLOPs, ``micro`` of them
    a step, over ``spec.pp`` GPUs of a data rank's pipeline)."""
    o = request.passes
    assert o.device is not None
    seq = report.dims.get("seq")
    flops, recompute, peak = step_work(report, o.device)
    batch = request.load.batch or 1
    data = (spec.world_size or 1) * spec.replicate
    world = data * spec.tp * spec.pp
    # (a context-parallel group shares its sequences)
    rank = RankStep(NO_COMM, mesh, spec.strategy,
                    batch * data // spec.cp * seq if seq else None, world,
                    flops * micro // spec.pp, recompute * micro // spec.pp, peak)
    links = node_links(o.device, spec.interconnect, spec.gpus_per_node)
    gathered = [st.step.all_gather / (st.step.all_gather + st.step.reduce_scatter)
                if st.step.all_gather else 0.0 for st, _ in stages]
    t = pipeline_step_time([st.time for st, _ in stages], micro, rank, comms, links,
                           spec.async_tp, spec.world_size or 1, gathered, spec.stages_per_rank,
                           [st.weight_share for st, _ in stages], spec.schedule)
    # a pipeline's band: the published pipelines', at least its kernels' (a GPU profile's
    # or the datasheet's)
    engine = o.profile.engines["torch"] if o.profile is not None else \
        datasheet_engine(o.device, compiled=o.compiled)
    band, runs = pipeline_band(engine)
    return replace(t, band=max(t.band or 0.0, band), runs=runs)
