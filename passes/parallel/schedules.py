"""Pipeline schedules and the blocks each stage runs: the order of a stage's (or a rank's)
forwards (F) and backwards (B) that passes/parallel/pipeline.py lays its memory out by, and
torchtitan's split of a decoder's blocks into stages.

The schedule orders the micro-batches' forwards (F) and backwards (B) on the stage:

* ``gpipe`` (``ScheduleGPipe``): every forward, then every backward — all m micro-batches'
  saved tensors in flight on every stage;
* ``1f1b`` (``Schedule1F1B``): ``min(m, p − i)`` forwards on stage ``i`` (its warm-up), then a
  backward and a forward in turn, then the remaining backwards — at most ``p − i`` in flight;
* ``interleaved-1f1b`` (``ScheduleInterleaved1F1B``): each of the ``p`` ranks runs ``v`` stages
  (rank ``r`` the stages ``r``, ``r + p``, …), in the order PyTorch's schedule computes for it
  (the caller passes it: analyzer/load reads it off torch), its warm-up longer (``v − 1``
  rounds of micro-batches, ``p`` a round, plus ``2(p − 1 − r)`` forwards on rank ``r``) and
  its bubble ``v`` times shorter;
* ``interleaved-zb`` (``ScheduleInterleavedZeroBubble``, the zero-bubble paper's ZB1P): the
  same ranks of ``v`` stages, each backward split into its input half (I) and its weight half
  (W), W run later to fill the bubble (passes/parallel/zero_bubble.py), in PyTorch's order;
* ``zbv`` (``ScheduleZBVZeroBubble``): zero bubble over two stages a rank placed in a V, rank
  ``r`` the stages ``r`` and ``2p − 1 − r`` (so rank 0 runs the first and the last).
"""
from __future__ import annotations

from ..choices import Choice
from ..errors import GraphcostError, opt


class Schedule(Choice):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved-1f1b"
    ZERO_BUBBLE = "interleaved-zb"
    ZBV = "zbv"


# each schedule in the reports' words (the parallel report's line, the plan's legend and rows)
SCHEDULE_WORDS: dict[str, str] = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B",
                                  Schedule.INTERLEAVED: "interleaved 1F1B",
                                  Schedule.ZERO_BUBBLE: "interleaved zero bubble",
                                  Schedule.ZBV: "zero bubble V"}


def interleaved(schedule: str) -> bool:
    """A schedule of several stages a rank, in the order PyTorch computes for each rank."""
    return schedule in (Schedule.INTERLEAVED, Schedule.ZERO_BUBBLE, Schedule.ZBV)


def zero_bubble(schedule: str) -> bool:
    """A schedule that splits each backward into its input and weight halves."""
    return schedule in (Schedule.ZERO_BUBBLE, Schedule.ZBV)


def rank_stages(schedule: str, rank: int, ranks: int, per_rank: int) -> list[int]:
    """The stages rank ``rank`` of ``ranks`` runs, its local stages in order: every
    ``ranks``-th from its own, or, under ``zbv``, its own and its mirror in the V."""
    if schedule == Schedule.ZBV:
        return [rank, 2 * ranks - 1 - rank]
    return list(range(rank, ranks * per_rank, ranks))


# the stages a rank runs under an interleaved schedule unless told: torchtitan's default
INTERLEAVED_STAGES = 2


# a rank's forwards and backwards in order: (its local stage, "F" or "B" — or a zero-bubble
# schedule's "I" and "W" — the micro-batch)
Order = list[tuple[int, str, int]]


def stage_layers(n_layers: int, stage: int, stages: int) -> range:
    """The blocks stage ``stage`` of ``stages`` runs, as torchtitan 0.3 splits a decoder
    (distributed/pipeline_parallel.py ``_generate_llm_fqn_per_model_part`` at its defaults,
    ``pipeline_parallel_first_stage_less_layers`` = ``…_last_stage_less_layers`` = 1): the
    embedding and the norm and head count as a block each, the n + 2 are shared evenly, the
    remainder to the first stages (Llama 3 8B on 4 stages: 8, 9, 8, 7 blocks; 405B's 126 on 8:
    15, 16 × 6, 15). The first or last stage may so hold no block (``fits_stages``)."""
    per, extra = divmod(n_layers + 2, stages)
    sizes = [per + (i < extra) - (i == 0) - (i == stages - 1) for i in range(stages)]
    start = sum(sizes[:stage])
    return range(start, start + sizes[stage])


def fits_stages(n_layers: int, stages: int) -> bool:
    """torchtitan's split has a share for each stage: at most n + 2 of them."""
    return 1 <= stages <= n_layers + 2


def events(schedule: str, stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    """The stage's forwards and backwards in the order the schedule runs them."""
    if schedule == Schedule.GPIPE:
        return [("F", j) for j in range(micro)] + [("B", j) for j in range(micro)]
    warm = min(micro, stages - stage)
    out, f = [("F", j) for j in range(warm)], warm
    for b in range(micro):
        out.append(("B", b))
        if f < micro:
            out.append(("F", f))
            f += 1
    return out


def check_schedule(schedule: str, micro: int, stages: int, per_rank: int = 1) -> None:
    """``stages``: the pipeline's ranks (each running ``per_rank`` stages)."""
    if schedule not in Schedule.words():
        raise GraphcostError(f"{opt('parallel.schedule', value=schedule)}: known: "
                             f"{', '.join(Schedule.words())}")
    if not isinstance(micro, int) or micro < 1:
        raise GraphcostError(f"{opt('parallel.microbatches', value=micro)}: a whole number ≥ 1")
    if schedule == Schedule.ONE_F_ONE_B and micro < stages:
        raise GraphcostError(f"{opt('parallel.microbatches', value=micro)}: 1F1B needs at least "
                             f"as many micro-batches as stages ({stages})")
    if (per_rank > 1) != interleaved(schedule) or per_rank < 1:
        raise GraphcostError(f"{opt('parallel.stages_per_rank', value=per_rank)} with "
                             f"{opt('parallel.schedule', value=schedule)}: an interleaved "
                             "schedule runs 2 or more stages a rank, the others one")
    if schedule == Schedule.ZBV and per_rank != 2:
        raise GraphcostError(f"{opt('parallel.stages_per_rank', value=per_rank)} with "
                             f"{opt('parallel.schedule', value=schedule)}: the V runs exactly "
                             "2 stages a rank")
    rounds = max(1, micro // stages)   # (ScheduleInterleaved1F1B's own condition)
    if interleaved(schedule) and schedule != Schedule.ZBV and micro % rounds:
        raise GraphcostError(f"{opt('parallel.microbatches', value=micro)}: the interleaved "
                             f"schedule runs them in rounds of {stages} (the pipeline's "
                             f"ranks); {micro} is not a whole number of its {rounds} rounds")
