"""``graphcost plan``: the fastest training setting that fits N GPUs.

The settings searched (analyzer/app/plan_settings.py): every device mesh of the modelled
dimensions (passes/parallel/layouts.py: FSDP, HSDP, DDP beside each tensor-parallel size,
pipelines of 2, 4, … stages beside FSDP and HSDP, 1F1B with one sequence a micro-batch,
torchtitan's defaults, and interleaved 1F1B of two stages a rank where the blocks and
micro-batches allow; for a mixture of experts, FSDP with each expert-parallel size that
divides its experts), the checkpoint plans of ``CHECKPOINTS`` and the batch per data-parallel
rank (fixed by ``--batch``, or by the step's
global batch). Each is analyzed as ``analyze`` would with its settings — the same trace and
passes, the figures equal — with the work that does not change between them done once: one
trace per tensor-parallel rank program and batch, and the passes' layout-free results shared
across its layouts (analyzer/app/pipeline.py ``PassMemo``). A setting whose every rank fits
the device (reserved + the runtime's share: the report's fit) is ranked by the time
estimate's throughput; under one layout, a checkpoint plan that recomputes more than one that
fits is never faster (the estimate only adds its recompute), and when the plan that
recomputes most (full) does not fit, neither does one that holds more: neither is analyzed
(pruned, with why). A pipeline's layouts of a tensor-parallel size are analyzed only where
none of that size without stages fits (a pipeline adds its bubble to the step: a heuristic,
said in each pruned candidate).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import groupby
from typing import Any, Callable, Mapping

from ...passes.choices import Strategy
from ...passes.device.time_estimate import TimeEstimate
from ...passes.errors import GraphcostError, opt
from ...passes.parallel.layouts import data_ranks
from ...passes.parallel.mesh import Mesh, strategy_of
from ...passes.parallel.schedules import Schedule, zero_bubble
from ...passes.training.precision import master_weights
from ..load.progress import Progress
from .plan_candidates import Candidate, candidate, rank_of
from .plan_screen import ScreeningAnalyses
from .plan_settings import CHECKPOINTS, PlanSpec, Settings, settings_of
from .request import build_request
from .settings_analyses import SettingsAnalyses, collecting_less


@dataclass(frozen=True)
class Plan:
    """The candidates, the fitting ones first by throughput, then those over the device by
    what they need, then the pruned and refused; ``suggestion``: when none fits, the
    smallest change found that makes one fit."""
    model: str
    device: str
    spec: PlanSpec
    candidates: tuple[Candidate, ...]
    suggestion: str | None = None
    base: Mapping[str, Any] = field(default_factory=dict)
    not_searched: tuple[str, ...] = ()   # what the search leaves out, and why
    # the candidates screened (analyzer/app/plan_screen.py) and the seconds their screen took
    screened: tuple[int, float] = (0, 0.0)

    @property
    def best(self) -> Candidate | None:
        first = self.candidates[0] if self.candidates else None
        return first if first is not None and first.status == "fits" else None

    @property
    def fitting(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "fits"]


@collecting_less
def plan_training(model, spec: PlanSpec, base: Mapping[str, Any],
                  progress: Progress | None = None) -> Plan:
    """The plan of ``model``'s training step: ``base`` holds ``analyze``'s other arguments
    (a training request on a GPU device); ``parallel`` in it, the mesh's options
    (interconnect, async_tp)."""
    base = dict(base)
    extra = dict(base.pop("parallel", None) or {})
    device = _check(spec, base, extra)
    analyses = SettingsAnalyses(model, progress)
    blocks, experts = _shape(analyses, base) if spec.gpus > 1 else (0, 0)
    settings = settings_of(spec, blocks, experts, int(dict(base.get("dims") or {})
                                                      .get("seq", 0)))
    left_out = [PIPELINES] if spec.gpus > 1 and not blocks else []
    if experts:
        left_out.append(EXPERTS_BESIDE)
        if spec.tp is None:   # (sizes asked for are analyzed, and refused by name)
            settings = [s for s in settings if s.tp == 1 or s.ep > 1]
            left_out.append(EXPERTS_TP)
    settings = _searchable(settings, base, left_out)
    if extra.get("float8_all_gather"):
        settings = _gathering(settings, left_out)
    if not settings and spec.pp:
        raise GraphcostError(f"{opt('pp', value=','.join(map(str, spec.pp)))}: no layout of "
                             f"{spec.gpus} GPUs has those pipeline sizes (tp × pp must divide "
                             "them, each data rank's batch at least the stages)")
    if not settings:
        raise GraphcostError(f"{opt('global_batch', value=spec.global_batch)}: no layout of "
                             f"{spec.gpus} GPUs splits it evenly over its data ranks")
    evaluate = ScreeningAnalyses(analyses, base, extra, progress, len(settings))
    done = _evaluate(evaluate, settings, prune=(not spec.pp, not spec.cp))
    errors = [c.error for c in done if c.error is not None]
    if len(errors) == len(done):
        raise errors[0]
    if all(c.time is None for c in done if c.status in ("fits", "over")):
        raise GraphcostError("a plan ranks settings by the time estimate, which a GPU's "
                             "datasheet gives a traced PyTorch model, not an ONNX file's "
                             "estimated training step")
    ranked = tuple(sorted(done, key=rank_of))
    plan = Plan(str(model), device, spec, ranked, base=base, not_searched=tuple(left_out),
                screened=(evaluate.screened, evaluate.screen_seconds))
    if plan.best is None:
        plan = replace(plan, suggestion=_suggestion(model, plan, extra, progress))
    return plan


PIPELINES = ("pipelines (a pipeline splits a model at its list of blocks and takes the "
             "cross-entropy of its logits; this one has no blocks or no LM head)")
FLOAT8_TP = "tp (torchao's float8 tensor-parallel styles are the tensorwise recipe's)"


def _searchable(settings: list[Settings], base: Mapping[str, Any],
                left_out: list[str]) -> list[Settings]:
    """The settings graphcost can analyze under ``base``'s recipe, what it leaves out said in
    ``left_out``: master weights (bf16-master) only where FSDP shards them, float8 linears
    only without tensor parallelism."""
    if master_weights(str(base.get("precision", "fp32"))):
        kept = [s for s in settings if not _replicated(s.mesh)]
        if settings and not kept:
            raise GraphcostError(f"{opt('precision', value=base['precision'])}: its master "
                                 "weights are modelled as FSDP2's, and every layout searched "
                                 "keeps the weights unsharded (DDP or tensor parallel alone): "
                                 f"a smaller {opt('tp')}, or {opt('precision')} bf16-mixed")
        if len(kept) < len(settings):
            left_out.insert(0, MASTER_SHARDED.format(base["precision"]))
        settings = kept
    if base.get("float8") not in (None, "tensorwise"):
        kept = [s for s in settings if s.tp == 1]
        if settings and not kept:
            raise GraphcostError(f"{opt('float8', value=base['float8'])}: torchao's float8 "
                                 "tensor-parallel styles are the tensorwise recipe's, and "
                                 f"every layout searched has tp: {opt('tp')} 1")
        if len(kept) < len(settings):
            left_out.insert(0, FLOAT8_TP)
        settings = kept
    return settings


def _gathering(settings: list[Settings], left_out: list[str]) -> list[Settings]:
    """The settings FSDP2's float8 all-gather applies to: a mesh that shards the weights
    (dp_shard), without pipeline stages (not modelled beside them)."""
    kept = [s for s in settings if s.mesh.dims and not _replicated(s.mesh) and s.pp == 1]
    if not kept:
        raise GraphcostError(f"{opt('parallel.float8_all_gather')}: FSDP2 gathers weights in "
                             "float8, and no layout searched shards them without pipeline "
                             "stages (more than one GPU, a dp_shard dimension)")
    if len(kept) < len(settings):
        left_out.insert(0, "DDP, tp alone and pipelines (the float8 all-gather is "
                           "FSDP2's, beside pipeline stages not modelled)")
    return kept


# (master weights are modelled as FSDP2's MixedPrecisionPolicy: passes/parallel/step.py)
MASTER_SHARDED = "DDP, tp alone ({}'s master weights are FSDP2's)"


# (analyzed when --parallel names it, not searched)
EXPERTS_BESIDE = "expert parallelism beside cp and tp at once"
# (transformers' plan leaves a mixture of experts whole on every tp rank, or shards it in a
# style graphcost refuses: frontends/torch/transformers_tp_plan.py; expert parallelism shards it)
EXPERTS_TP = ("tp without ep (tensor parallelism leaves a mixture of experts whole on every "
              "rank, or is refused for it: ep shards the experts)")


def _shape(analyses: SettingsAnalyses, base: Mapping[str, Any]) -> tuple[int, int]:
    """The blocks a pipeline of the model divides (0: none it can cut) and the experts a
    layer holds for expert parallelism to split (0: none)."""
    load = build_request(**base).load
    try:
        return analyses.stages.n_blocks(load), analyses.stages.n_experts(load)
    except GraphcostError:
        return 0, 0


def _replicated(mesh: Mesh) -> bool:
    """A mesh whose weights no data dimension shards (DDP, or tensor parallel alone)."""
    return bool(mesh.dims) and strategy_of(mesh) == Strategy.DDP


def _check(spec: PlanSpec, base: Mapping[str, Any], extra: Mapping[str, Any]) -> str:
    """``spec`` and the analysis's arguments checked; the device's name."""
    if not base.get("train"):
        raise GraphcostError(f"a plan searches training layouts: add {opt('train')}")
    from .api_checks import device_of
    rates = device_of(base.get("device"))
    if rates is None or not rates.is_gpu or base.get("device_profile") is not None:
        raise GraphcostError(f"a plan ranks by a GPU's time estimate: add a GPU "
                             f"{opt('device')} (without {opt('device_profile')})")
    if base.get("checkpoint") is not None:
        raise GraphcostError(f"{opt('checkpoint')}: a plan fixes it by its name (none, sac, "
                             "full)")
    if spec.gpus < 1 or spec.node < 1:
        raise GraphcostError(f"{opt('gpus', value=spec.gpus)}: a whole number ≥ 1")
    if spec.batch is not None and spec.global_batch is not None:
        raise GraphcostError(f"use either {opt('batch')} (each data rank's) or "
                             f"{opt('global_batch')} (the step's)")
    unknown = sorted(set(spec.checkpoints) - set(CHECKPOINTS))
    if unknown or not spec.checkpoints:
        raise GraphcostError(f"{opt('checkpoint', value=','.join(unknown))}: a plan's "
                             f"checkpoint plans are {', '.join(CHECKPOINTS)}")
    bad = sorted(set(extra) - {"interconnect", "async_tp", "gpus_per_node",
                               "float8_all_gather", "cp_rotate"})
    if bad:
        raise GraphcostError(f"{opt('parallel.' + bad[0])}: a plan searches the layout")
    return rates.name


def _evaluate(analyzed: ScreeningAnalyses, settings: list[Settings],
              prune: tuple[bool, bool] = (True, True)) -> list[Candidate]:
    """Each setting's candidate, layout by layout (``_layout``), analyzed — sharing traces
    and passes with the others' (analyzer/app/settings_analyses.py) — or screened from its
    program's analysis (analyzer/app/plan_screen.py); with ``prune`` (for
    pipeline and context-parallel sizes not asked for), a pipeline's or a context-parallel
    one's only where no layout of its tensor-parallel size without one fits; an interleaved pipeline's only where its
    1F1B twin (analyzed before it) fits."""
    out: list[Candidate] = []
    for _, group in groupby(settings, key=lambda s: (s.mesh, s.batch, s.schedule)):
        group = list(group)
        why = _pruned(group[0], out, prune)
        if why:
            out.extend(Candidate(s, "pruned", why) for s in group)
            continue
        pruned = _twin_over(group, out) if group[0].interleaved else []
        out.extend(pruned or _layout(group, analyzed))
    return out


def _twin_over(group: list[Settings], done: list[Candidate]) -> list[Candidate]:
    """A layout of two stages a rank pruned where its twin (the same mesh and batch, analyzed
    before it) does not fit: interleaved 1F1B, where 1F1B fits under no checkpoint plan; a
    zero-bubble schedule, where interleaved 1F1B does not without one (their W keeps each
    waiting micro-batch's retained graph: on gloo ranks the rank of the last stage held 23%
    more under interleaved zero bubble, 15% under the V, rank 0 5-6% less:
    tests/test_pipeline_parallel.py). Both heuristics; [] where analyzed."""
    first = group[0]
    want = Schedule.INTERLEAVED if zero_bubble(first.schedule) else Schedule.ONE_F_ONE_B
    twins = [c for c in done if c.settings.mesh == first.mesh and c.settings.batch ==
             first.batch and c.settings.schedule == want]
    if want == Schedule.INTERLEAVED:
        twins = [c for c in twins if c.settings.checkpoint == "none"]
    if any(c.status == "fits" for c in twins):
        return []
    why = ("over the memory: " + ("zero bubble holds more in flight than interleaved 1F1B, "
                                  "which does not fit this layout without a checkpoint plan"
                                  if want == Schedule.INTERLEAVED else
                                  "interleaved 1F1B holds more micro-batches in flight than "
                                  "1F1B, which does not fit this layout"))
    # (what it needs at least: its 1F1B twin's, measured so; zero bubble's rank 0 held less
    # than interleaved 1F1B's on gloo, so no bound)
    needs = {c.settings.checkpoint: c.needs_bytes for c in twins
             if want == Schedule.ONE_F_ONE_B}
    return [Candidate(s, "pruned", why, needs_at_least=needs.get(s.checkpoint)) for s in group]


def _pruned(first: Settings, done: list[Candidate], prune: tuple[bool, bool]) -> str:
    """Why a layout (``first``: its first setting) is not analyzed after ``done`` ("": it
    is): a pipeline or a context-parallel layout where one of its tensor-parallel size
    without it fits (each adds to the step; a heuristic)."""
    fits = [c.settings for c in done if c.status == "fits"]
    if prune[0] and first.pp > 1 and any(s.pp == 1 and s.tp == first.tp for s in fits):
        return (f"not analyzed: a layout of tp={first.tp} without pipeline stages fits (a "
                "pipeline adds its bubble)")
    if prune[1] and first.cp > 1 and any(s.cp == 1 and s.tp == first.tp for s in fits):
        return (f"not analyzed: a layout of tp={first.tp} without context parallelism fits "
                "(its ring adds the key/value exchange)")
    return ""


def _layout(settings: list[Settings],
            analyzed: Callable[[Settings], Candidate]) -> list[Candidate]:
    """One layout's checkpoint plans (from the least recompute): the one that recomputes
    most first — it holds the least, so when it does not fit, no other does — then from the
    least recompute up until one fits (each after it only adds recompute to the step)."""
    most = analyzed(settings[-1])
    # (what each pruned one needs at least: full's need, or where full was screened over the
    # bound its scaled tensors prove, not its estimate: analyzer/app/plan_screen.py)
    least = most.needs_at_least if most.screened else most.needs_bytes
    if most.status == "over":
        why = (f"over the memory: checkpoint {most.settings.checkpoint}, which holds the "
               f"least, does not fit{' (screened)' * bool(most.screened)}")
        return [most, *(Candidate(s, "pruned", why, needs_at_least=least)
                        for s in settings[:-1])]
    out: list[Candidate] = []
    for s in settings[:-1]:
        fitting = next((c for c in out if c.status == "fits"), None)
        if fitting is not None:
            out.append(Candidate(s, "pruned", "slower: a checkpoint plan with less "
                                              "recompute fits this layout",
                                 needs_at_least=least,
                                 seconds_at_least=fitting.time and fitting.time.seconds))
        else:
            out.append(analyzed(s))
    return [*out, most]


def _suggestion(model, plan: Plan, extra: Mapping[str, Any],
                progress: Progress | None) -> str | None:
    """The smallest change found that makes the least-needing setting fit: 2, 4 or 8 times
    the GPUs (its data ranks grown), else half the sequence."""
    over = [c for c in plan.candidates if c.status == "over"]
    if not over:
        return None
    least = over[0].settings
    spec = plan.spec
    for factor in (2, 4, 8):
        gpus = spec.gpus * factor
        grown = _grown(least, factor, spec)
        if grown is not None and _fits(model, grown, plan.base, extra, progress):
            return f"{gpus} GPUs: {grown.words}"
    seq = dict(plan.base.get("dims") or {}).get("seq")
    if seq and seq >= 2:
        base = {**plan.base, "dims": {**plan.base["dims"], "seq": seq // 2}}
        if _fits(model, least, base, extra, progress):
            return f"seq {seq // 2}: {least.words}"
    return None


def _grown(s: Settings, factor: int, spec: PlanSpec) -> Settings | None:
    """``s`` with ``factor`` times the sharding ranks (the global batch, when fixed, split
    over them)."""
    shard = (s.mesh.size("dp_shard") or 1) * factor
    dims = tuple((k, shard if k == "dp_shard" else n) for k, n in s.mesh.dims)
    if "dp_shard" not in dict(s.mesh.dims):
        dims = (("dp_shard", shard), *dims)
    mesh = Mesh(dims)
    if spec.global_batch is None:
        return Settings(mesh, s.batch, s.checkpoint)
    ranks = data_ranks(mesh)
    if spec.global_batch % ranks:
        return None
    return Settings(mesh, spec.global_batch // ranks, s.checkpoint)


def _fits(model, s: Settings, base: Mapping[str, Any], extra: Mapping[str, Any],
          progress: Progress | None) -> bool:
    if progress:
        progress(f"trying {s.words}")
    try:
        from .api import run_request
        report = run_request(model, build_request(**{**base, **s.analyze_kwargs(extra)}))
    except GraphcostError:
        return False
    return candidate(s, report).status == "fits"


def explain(best: Candidate, other: Candidate) -> str:
    """Why ``best`` outruns ``other``: the part of the step where they differ most."""
    a, b = best.time, other.time
    if a is None or b is None:
        return ""
    parts: dict[str, Callable[[TimeEstimate], float]] = {
        "compute": lambda t: t.arithmetic_seconds + t.memory_seconds + t.launch_seconds,
        "recompute": lambda t: t.recompute_seconds,
        "exposed communication": lambda t: t.communication_seconds,
        "optimizer step": lambda t: t.optimizer_seconds,
        "pipeline bubble": lambda t: t.bubble_seconds,
    }
    # per sample: the two may run different batches
    per = {name: f(b) / max(other.samples, 1) - f(a) / max(best.samples, 1)
           for name, f in parts.items()}
    name = max(per, key=lambda k: per[k])
    return name if per[name] > 0 else ""
