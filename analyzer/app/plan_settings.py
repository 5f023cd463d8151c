"""What ``graphcost plan`` searches (analyzer/app/plan.py): the settings a plan's spec allows —
every device mesh of the modelled dimensions (passes/parallel/layouts.py), each layout's batch
per data rank and checkpoint plans, a pipeline's schedules."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...passes.errors import GraphcostError, opt
from ...passes.parallel.layouts import (
    context_expert_layouts,
    context_layouts,
    context_sizes,
    data_layouts,
    data_ranks,
    expert_layouts,
    expert_sizes,
    piped,
    pipeline_sizes,
    tensor_sizes,
)
from ...passes.parallel.mesh import Mesh
from ...passes.parallel.schedules import (
    INTERLEAVED_STAGES,
    SCHEDULE_WORDS,
    Schedule,
    check_schedule,
    fits_stages,
    interleaved,
    zero_bubble,
)
from .devices import GPUS_PER_NODE

# the checkpoint plans searched, from the least recompute to the most (analyze's mappings)
CHECKPOINTS: dict[str, dict | None] = {"none": None, "sac": {"sac": True}, "full": {"every": 1}}


@dataclass(frozen=True)
class PlanSpec:
    """What a plan searches: ``gpus`` GPUs of ``node`` a node; the batch per data-parallel
    rank fixed (``batch``) or the step's (``global_batch`` sequences, split over the data
    ranks); the tensor-parallel sizes (None: every one up to a node) and checkpoint plans."""
    gpus: int
    batch: int | None = None
    global_batch: int | None = None
    tp: tuple[int, ...] | None = None
    checkpoints: tuple[str, ...] = tuple(CHECKPOINTS)
    node: int = GPUS_PER_NODE
    pp: tuple[int, ...] | None = None   # pipeline sizes (None: 1, then 2, 4, … as needed)
    ep: tuple[int, ...] | None = None   # expert-parallel sizes (None: 1, and each that fits)
    cp: tuple[int, ...] | None = None   # context-parallel sizes (None: 1, then each as needed)


@dataclass(frozen=True)
class Settings:
    """One setting: a mesh (empty: one GPU), the batch per data-parallel rank, a checkpoint
    plan of ``CHECKPOINTS``, and a pipeline's schedule (1F1B, or one of torchtitan's two
    stages a rank: interleaved 1F1B, interleaved zero bubble, the zero-bubble V)."""
    mesh: Mesh
    batch: int
    checkpoint: str
    schedule: str = Schedule.ONE_F_ONE_B

    @property
    def tp(self) -> int:
        return self.mesh.size("tp") or 1

    @property
    def pp(self) -> int:
        return self.mesh.size("pp") or 1

    @property
    def ep(self) -> int:
        return self.mesh.size("ep") or 1

    @property
    def cp(self) -> int:
        return self.mesh.size("cp") or 1

    @property
    def interleaved(self) -> bool:
        """Two stages a rank (any schedule but 1F1B)."""
        return interleaved(self.schedule)

    @property
    def words(self) -> str:
        # (interleaved 1F1B's said "interleaved" alone, the plan's first schedule of two
        # stages a rank; 1F1B's not at all)
        named = "" if not self.interleaved else ", interleaved" \
            if self.schedule == Schedule.INTERLEAVED else f", {SCHEDULE_WORDS[self.schedule]}"
        return (f"{self.mesh.words or 'one GPU'}{named}, "
                f"batch {self.batch}, checkpoint {self.checkpoint}")

    def analyze_kwargs(self, parallel: Mapping[str, Any]) -> dict:
        """``analyze``'s arguments for this setting (``parallel``: the mesh's options; the
        ring's where it has one)."""
        # one sequence a micro-batch
        stages: dict[str, Any] = {"microbatches": self.batch} if self.pp > 1 else {}
        if self.interleaved:   # (the analysis's default: torchtitan's 2 stages a rank)
            stages["schedule"] = self.schedule
        if self.cp == 1:
            parallel = {k: v for k, v in parallel.items() if k != "cp_rotate"}
        return {"batch": self.batch, "checkpoint": CHECKPOINTS[self.checkpoint],
                "parallel": {"mesh": self.mesh.words, **stages, **parallel}
                if self.mesh.dims else None}


def settings_of(spec: PlanSpec, blocks: int = 0, experts: int = 0,
                seq: int = 0) -> list[Settings]:
    """Every setting ``spec`` allows (pipelines of ``blocks``; expert parallelism of a layer's
    ``experts``; context parallelism of sequences of ``seq``), grouped by rank program
    (tensor-parallel, pipeline, expert- and context-parallel size, batch), each layout's
    checkpoint plans from the least recompute."""
    out = []
    for cp in spec.cp or ():
        if spec.gpus % cp:
            raise GraphcostError(f"{opt('cp', value=cp)}: it must divide the {spec.gpus} GPUs")
    for tp in spec.tp or tensor_sizes(spec.gpus, spec.node):
        if spec.gpus % tp:
            raise GraphcostError(f"{opt('tp', value=tp)}: it must divide the "
                                 f"{spec.gpus} GPUs")
        for pp in spec.pp or (1, *pipeline_sizes(spec.gpus // tp, blocks)):
            if spec.gpus % (tp * pp) == 0:   # (a size asked for that no tp divides: none)
                out.extend(_layouts(spec, tp, pp, blocks, (experts, seq)))
    # (stable: layouts' order)
    return sorted(out, key=lambda s: (s.tp, s.pp, s.ep, s.cp, s.batch))


def _meshes(spec: PlanSpec, tp: int, pp: int, shape: tuple[int, int]) -> list[Mesh]:
    """The meshes of ``tp`` × ``pp`` GPUs' layouts: each data layout of the rest (where
    ``spec`` allows no expert or context parallelism), FSDP with each expert-parallel size
    ``spec`` allows (a pipeline's stages each; beside tp, a stage's dp_shard × tp) and with each
    context-parallel size (without pp; without tp, each ep size carved out of dp_shard × cp
    too) (``shape``: a layer's experts, the sequence)."""
    without = {d: sizes is None or 1 in sizes for d, sizes in (("ep", spec.ep),
                                                                ("cp", spec.cp))}
    out = []
    if all(without.values()):
        out = [m for m in (piped(flat, pp) for flat in data_layouts(spec.gpus // pp, tp,
                                                                     spec.node))
               if m is not None]
    # (sizes asked for are tried as asked, as the analysis would check them)
    data = spec.gpus // pp
    if data > 1 and without["cp"]:   # (each stage's data ranks)
        # (beside tp the ep group is carved out of dp_shard × tp: every GPU of the data's)
        ep = expert_sizes(data, shape[0], spec.node) if spec.ep is None else \
            tuple(e for e in spec.ep if e > 1)
        out += [m for m in (piped(flat, pp) for flat in expert_layouts(data, ep, spec.node,
                                                                       tp)) if m is not None]
    if pp == 1 and spec.gpus > tp:
        cp = context_sizes(spec.gpus // tp, shape[1], spec.node) if spec.cp is None else \
            tuple(c for c in spec.cp if c > 1)
        # (cp beside ep without tp alone: tests/test_expert_parallel.py checks that layout
        # against real steps, not cp × tp × ep)
        ep = expert_sizes(spec.gpus, shape[0], spec.node) if spec.ep is None else \
            tuple(e for e in spec.ep if e > 1)
        out += context_layouts(spec.gpus, cp, tp) if without["ep"] else []
        out += context_expert_layouts(spec.gpus, cp, ep) if tp == 1 else []
    return out


def _layouts(spec: PlanSpec, tp: int, pp: int, blocks: int = 0,
             shape: tuple[int, int] = (0, 0)) -> list[Settings]:
    """The settings of ``tp`` × ``pp`` GPUs' layouts (``_meshes``): each its batch and
    checkpoint plans (a pipeline's batch at least its stages: 1F1B's micro-batches), a
    pipeline's under 1F1B and, where ``blocks`` give two stages a rank and its micro-batches
    come in whole rounds, interleaved."""
    out = []
    for mesh in _meshes(spec, tp, pp, shape):
        ranks = data_ranks(mesh)
        if spec.global_batch is not None:
            if spec.global_batch % ranks:
                continue
            batch = spec.global_batch // ranks
        else:
            batch = spec.batch or 1
        if batch < pp:
            continue
        order = [c for c in CHECKPOINTS if c in spec.checkpoints]
        # (zero bubble without a checkpoint plan: beside one it is not modelled)
        out.extend(Settings(mesh, batch, c, schedule)
                   for schedule in pipeline_schedules(pp, batch, blocks) for c in order
                   if c == "none" or not zero_bubble(schedule))
    return out


def pipeline_schedules(pp: int, micro: int, blocks: int) -> list[str]:
    """A pipeline's schedules the plan tries: 1F1B, and where the blocks split into
    torchtitan's two stages a rank and ``ScheduleInterleaved1F1B`` takes the micro-batches
    (whole rounds of ``pp``), interleaved 1F1B and the two zero-bubble schedules
    (``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``)."""
    if pp == 1:
        return [Schedule.ONE_F_ONE_B]
    try:
        check_schedule(Schedule.INTERLEAVED, micro, pp, INTERLEAVED_STAGES)
    except GraphcostError:
        return [Schedule.ONE_F_ONE_B]
    ok = blocks > 0 and fits_stages(blocks, pp * INTERLEAVED_STAGES)
    woven = [Schedule.INTERLEAVED, Schedule.ZERO_BUBBLE, Schedule.ZBV]
    return [Schedule.ONE_F_ONE_B, *(woven if ok else [])]
