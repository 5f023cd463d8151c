"""Per-stage memory of real pipeline-parallel training on this CPU (``torch.distributed.
pipelining`` on gloo ranks, 127.0.0.1): what graphcost's per-stage predictions (passes/
parallel/pipeline.py) are checked against.

Each rank builds the zoo model with seeded weights, cuts its stage as graphcost does
(frontends/torch/pipeline_stages.py; a model not cut by name, GPT-2, split by PyTorch's tracer
and built as its users build it, ``pipe.build_stage``: pipeline_split.py), and applies what torchtitan applies on its mesh
(``pp``, ``dp_shard``, ``tp``, outer to inner): the tensor-parallel plan (analyzer/measure/
tensor_plan.py, DTensor's own styles), then ``fully_shard`` on each block and on the stage
with ``reshard_after_forward=False`` (torchtitan's default beside a pipeline; a master
recipe's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``); it wraps the stage in
``PipelineStage`` and runs ``ScheduleGPipe`` or ``Schedule1F1B`` with torchtitan's loss (fp32
cross-entropy) and Adam, steps 1 to 4. Under ``ScheduleInterleaved1F1B`` a rank runs several
stages (rank ``r`` the stages ``r``, ``r + p``, …), each wrapped so, one Adam over them all.

MemTracker cannot watch a pipelined step (its module hooks meet the schedule's
``autograd.grad`` and raise), and fully_shard allocates its gathered parameters by resizing
storages, which no dispatch mode sees; so the count is the CPU allocator's own, as the
profiler records it (``profile_memory=True``: every allocation and free with its address):
from the parameters, buffers and optimizer state alive at the step's start, each block the
step allocates is added and dropped when it is freed. What the library allocated in an
earlier step and keeps (its receive buffers) is not counted.

The profiler records the frees of the threads it profiles only: a block whose last reference
a gloo work object drops, on gloo's thread, after the program let it go (the ring's buffers,
when that thread runs late on a busy machine), has no free; it is counted freed when its
address is given out again, so such a step's peak can be a collective's buffer or two higher
than a step where gloo let go first — hence the lower of steps 2 to 4.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass

from ...passes.parallel.schedules import rank_stages
from .case_meshes import shard_with_cp
from .parallel import free_port, start_ranks


@dataclass(frozen=True)
class PipelineRun:
    """A real pipelined step: the model, schedule and mesh."""
    model: str
    schedule: str               # gpipe | 1f1b | interleaved-1f1b | interleaved-zb | zbv
    stages: int                 # the pipeline's ranks
    batch: int                  # sequences a data rank's step takes
    microbatches: int
    dp_shard: int = 1           # fully_shard over this many ranks (1: not wrapped)
    tp: int = 1
    master: bool = False        # bf16 parameters over fp32 shards (MixedPrecisionPolicy)
    checkpoint: bool = False    # every block checkpointed (torchtitan's full AC)
    stages_per_rank: int = 1    # interleaved-1f1b's
    layers: int = 0             # llama_tiny's blocks instead of its 2 (0: the zoo's)
    # expert parallel over this many of each stage's dp_shard ranks (expert_plan.py:
    # torchtitan's dispatcher), each experts module fully_shard over the rest (efsdp)
    ep: int = 1
    # context parallel over this many ranks of each stage (context_plan.py: PyTorch's ring
    # attention in a transformers model), each its head-tail shard of every sequence; fully_shard
    # over dp_shard × cp
    cp: int = 1
    overrides: tuple = ()       # ((name, value), …) for the zoo model's builder
    seq: int = 0                # the sequence (0: the zoo's)

    @property
    def world(self) -> int:
        return self.stages * self.dp_shard * self.cp * self.tp


STEPS = 4


def allocated_peak(prof) -> int:
    """The most bytes a profiled region had allocated at once beyond what it started with:
    each allocation counted until it is freed (frees of older blocks are not counted). Not
    counted: what gloo allocates inside its own collectives (under a ``gloo:`` event, on
    its thread — its all-gather's flat buffer beside the output, which NCCL does not make
    and FSDPMemTracker does not see)."""
    events = []

    def walk(node, inside_gloo: bool = False) -> None:
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation":
            if not inside_gloo:
                events.append((node.start_time_ns, fields.ptr, fields.alloc_size))
            return
        inside_gloo = inside_gloo or node.name.startswith("gloo:")
        for child in node.children:
            walk(child, inside_gloo)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    live = peak = 0
    made: dict[int, int] = {}
    for _, ptr, size in sorted(events):
        if size > 0:
            live += size - made.get(ptr, 0)   # (a block at a live address: freed unseen)
            made[ptr] = size
        elif ptr in made:
            live -= made.pop(ptr)
        peak = max(peak, live)
    return peak


def measure_pipeline(run: PipelineRun) -> dict[int, list[list[int]]]:
    """Each stage's ranks' peak bytes in steps 1 to ``STEPS``: {stage: [[peak, …], …]} (the
    stage's ranks in their order)."""
    with tempfile.TemporaryDirectory() as out:
        start_ranks(_worker, (json.dumps(asdict(run)), free_port(), out), run.world)
        result: dict[int, list[list[int]]] = {}
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name)) as fh:
                row = json.load(fh)
            result.setdefault(row["stage"], []).append(row["peaks"])
    return result


def _worker(rank: int, payload: str, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    run = PipelineRun(**json.loads(payload))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=run.world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (run.stages, run.dp_shard, run.cp, run.tp),
                            mesh_dim_names=("pp", "dp_shard", "cp", "tp"))
    try:
        stage, modules, step = _stages(run, mesh)
        module = torch.nn.ModuleList(modules)
        opt = torch.optim.Adam(module.parameters(), foreach=False)
        peaks = [_step(module, opt, step) for _ in range(STEPS)]
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank:03d}.json"), "w") as fh:
        json.dump({"stage": stage, "peaks": peaks}, fh)


def model(run: PipelineRun):
    """The zoo model the run trains, seeded (``layers``: llama_tiny with that many blocks)."""
    from dataclasses import replace

    import torch

    from ... import models_zoo
    from ...models_zoo import llama
    if run.overrides:
        torch.manual_seed(0)
        return models_zoo.get(run.model).build(**dict(run.overrides)).train()
    if not run.layers:
        return models_zoo.build_model(run.model, eval=False)
    torch.manual_seed(0)
    return llama.Llama(replace(llama.TINY, n_layer=run.layers))


def _stages(run: PipelineRun, mesh):
    """(the rank's first stage, its stages' modules, a callable running one schedule step)."""
    import contextlib

    import torch
    from torch.distributed.pipelining import PipelineStage

    from ..frontends.torch.pipeline_stages import named_blocks, pipeline_stage
    from .tensor_plan import apply_tensor_parallel, loss_context

    rank, v = mesh["pp"].get_local_rank(), run.stages_per_rank
    total = run.stages * v
    whole = model(run)
    ids = _ids(run, whole, mesh)
    data = _data_mesh(mesh, run) if run.dp_shard * run.cp > 1 else None
    context, stages, modules = contextlib.nullcontext, [], []
    split = not named_blocks(whole)   # (PyTorch's tracer splits it: pipeline_split.py)
    if split:
        stages = _split_stages(run, whole, ids, mesh, data)
        modules = [stage.submod for stage in stages]
    for index in [] if split else rank_stages(run.schedule, rank, run.stages,
                                               run.stages_per_rank):
        module = pipeline_stage(whole, index, total)
        if run.checkpoint:
            _checkpointed(module)
        if run.tp > 1:
            apply_tensor_parallel(module, mesh["tp"])
            if index > 0 and hasattr(module, "positions"):   # (a sequence shard comes in)
                setattr(module, "positions", ids.shape[1])
            if index == total - 1:
                context = lambda m=module: loss_context(m, run.tp)  # noqa: E731
        experts = _expert_ranks(module, run, mesh["tp"].get_group() if run.tp > 1 else None)
        if data is not None:
            _fully_shard(module, data, run.master, experts)
        modules.append(module)
        stages.append(PipelineStage(module, index, total, torch.device("cpu"),
                                    group=mesh["pp"].get_group()))
    schedule = _schedule(run, stages)

    def step() -> None:
        with context():
            if rank == 0 and run.schedule == "zbv":   # (the V's first and last stages)
                schedule.step(ids, target=ids, losses=[])
            elif rank == 0:
                schedule.step(ids)
            elif rank == run.stages - 1:
                schedule.step(target=ids, losses=[])
            else:
                schedule.step()
    return rank, modules, step


def _ids(run: PipelineRun, whole, mesh):
    """The step's token ids (seeded); under cp, the rank's shard of each sequence, the ring
    put in place of SDPA first."""
    import torch

    from ... import models_zoo
    shape = tuple(next(iter(models_zoo.input_shapes(run.model, run.batch).values())))
    shape = (shape[0], run.seq) if run.seq else shape
    ids = torch.randint(0, 100, shape, generator=torch.Generator().manual_seed(1))
    if run.cp == 1:
        return ids
    from .context_plan import apply_context_parallel, sequence_shard
    apply_context_parallel(whole, mesh["cp"])
    return sequence_shard(ids, mesh["cp"].get_local_rank(), run.cp)


def _split_stages(run: PipelineRun, whole, ids, mesh, data) -> list:
    """The rank's stages of a model PyTorch's tracer splits (rank ``r`` the stages ``r``,
    ``r + p``, …), built as its users build them (``pipe.build_stage``), fully_shard on what
    is left of the model's blocks in each."""
    import torch

    from ..frontends.torch.pipeline_split import block_list, stage_pipe
    assert (run.tp, run.cp, run.ep) == (1, 1, 1), run
    rank, total = mesh["pp"].get_local_rank(), run.stages * run.stages_per_rank
    pipe = stage_pipe(whole, ids[:run.batch // run.microbatches], total)
    out = []
    for index in rank_stages(run.schedule, rank, run.stages, run.stages_per_rank):
        if data is not None:
            gm = pipe.get_stage_module(index)
            _fully_shard(gm, data, run.master, ([], None),
                         list(gm.get_submodule("model." + block_list(whole)[0]).children()))
        out.append(pipe.build_stage(index, torch.device("cpu"), mesh["pp"].get_group()))
    return out


def _schedule(run: PipelineRun, stages: list):
    from torch.distributed.pipelining import (
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
        ScheduleInterleavedZeroBubble,
        ScheduleZBVZeroBubble,
    )
    if run.schedule == "interleaved-zb":
        return ScheduleInterleavedZeroBubble(stages, run.microbatches, loss_fn=_loss)
    if run.schedule == "zbv":
        return ScheduleZBVZeroBubble(stages, run.microbatches, loss_fn=_loss)
    if run.stages_per_rank > 1:
        return ScheduleInterleaved1F1B(stages, run.microbatches, loss_fn=_loss)
    kind = ScheduleGPipe if run.schedule == "gpipe" else Schedule1F1B
    return kind(stages[0], run.microbatches, loss_fn=_loss)


def _blocks(module):
    """The stage's blocks: its ``layers`` list."""
    return next(m for n, m in module.named_modules() if n.rsplit(".", 1)[-1] == "layers")


def _checkpointed(module) -> None:
    """torchtitan's full activation checkpointing: each block wrapped by PyTorch's
    ``checkpoint_wrapper`` (non-reentrant), before the other parallelisms."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper,
    )
    layers = _blocks(module)
    for i, block in enumerate(layers):
        layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def _data_mesh(mesh, run: PipelineRun):
    """The mesh fully_shard shards a stage over: dp_shard, or with cp dp_shard × cp
    (torchtitan's)."""
    return mesh["dp_shard"] if run.cp == 1 else shard_with_cp(mesh)


def _expert_ranks(module, run: PipelineRun, tp_group=None) -> tuple[list, object]:
    """Expert parallelism on a stage (expert_plan.py; beside ``tp_group``'s tensor
    parallelism, on each tp rank's share of the tokens): its new experts modules and the
    efsdp mesh they shard on — torchtitan's sparse mesh (pp, efsdp, ep), ep the innermost
    ranks of each stage's dp_shard × tp ones (none without ep)."""
    if run.ep == 1:
        return [], None
    from torch.distributed.device_mesh import init_device_mesh

    from .expert_plan import apply_expert_parallel
    efsdp = run.dp_shard * run.tp // run.ep
    sparse = init_device_mesh("cpu", (run.stages, efsdp, run.ep),
                              mesh_dim_names=("pp", "efsdp", "ep"))
    return apply_expert_parallel(module, sparse["ep"].get_group(), tp_group), sparse["efsdp"]


def _fully_shard(module, mesh, master: bool, experts: tuple[list, object],
                 blocks=None) -> None:
    """torchtitan's fully_shard beside a pipeline: each experts module (over efsdp), each
    block, then the stage, gathered parameters kept through the step."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw: dict = {"mesh": mesh, "reshard_after_forward": False}
    if master:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    modules, efsdp = experts
    for m in modules:
        fully_shard(m, **{**kw, "mesh": efsdp})
    for block in _blocks(module) if blocks is None else blocks:
        fully_shard(block, **kw)
    fully_shard(module, **kw)


def _step(module, opt, step) -> int:
    """One profiled step's peak: what the step starts with (the parameters' local tensors,
    buffers and optimizer state) and the most it allocated beyond."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.profiler import ProfilerActivity, profile

    opt.zero_grad(set_to_none=True)
    held = {}
    for t in (*module.parameters(), *module.buffers(),
              *(v for s in opt.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))):
        storage = (t._local_tensor if isinstance(t, DTensor) else t).untyped_storage()
        held[storage.data_ptr()] = storage.nbytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
        opt.step()
    return sum(held.values()) + allocated_peak(prof)


def _loss(pred, labels):
    """torchtitan's cross_entropy_loss: the logits upcast to fp32."""
    import torch.nn.functional as F
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
