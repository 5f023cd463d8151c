"""Checkpoint plans of a training step: by module name, every N repeated blocks, sqrt(n)
groups, or ``auto`` (the least recompute whose step fits a budget), each evaluated by the
training-memory pass on the checkpointed schedule.
"""
from __future__ import annotations

from ..errors import GraphcostError, opt
from ..ir import Graph
from ..memory.liveness import analyze_liveness
from .checkpoint import (
    MEGATRON_CORE_ATTN,
    Segment,
    group_every,
    merge,
    repeated_blocks,
    sac_saved,
    segments_by_name,
    sqrt_groups,
)
from .checkpoint_plan import block_table, cheapest_plan, plan_segments
from .memory import CheckpointPlan, TrainingMemory, forward_set, training_memory


def _plan(mode: str, segs: list[Segment], plain: TrainingMemory, got: TrainingMemory,
          node_flops: list[int], budget: int | None) -> CheckpointPlan:
    recompute = sum(node_flops[i] for s in segs for i in s.nodes - s.saved)
    return CheckpointPlan(
        mode=mode, segments=tuple(s.name for s in segs), peak_without_bytes=plain.peak_bytes,
        peak_bytes=got.peak_bytes, recompute_flops=recompute,
        recompute_pct=round(100.0 * recompute / max(1, sum(node_flops)), 3),
        budget_bytes=budget, timeline=got.timeline, peak_phase=got.peak_phase, plain=plain,
        checkpointed=got,
        recomputed=frozenset(i for s in segs for i in s.nodes - s.saved))


def plan_checkpoints(graph: Graph, optimizer: str, node_flops: list[int], *,
                     names: list[str] | None = None, every: int | None = None,
                     sqrt: bool = False, budget: int | None = None,
                     sac: tuple[str, ...] | None = None, nth: int | None = None,
                     master_weights: bool = False, include_inputs: bool = True,
                     impl: str = "forloop",
                     plain: TrainingMemory | None = None) -> CheckpointPlan:
    """Build a checkpoint plan and evaluate it; ``budget`` alone asks for the plan with the
    least recompute that fits. ``node_flops``: the cost pass's FLOPs per joint-graph node;
    ``plain``: the step without a plan where the caller has it (``training_memory`` of the
    same graph and settings), else made here."""
    fwd = forward_set(graph)

    def step(segs: list[Segment] | None = None) -> TrainingMemory:
        return training_memory(graph, optimizer, segs, master_weights,
                               include_inputs=include_inputs, impl=impl)

    plain = step() if plain is None else plain
    if sac:  # each repeated block, as torchtitan wraps each TransformerBlock
        blocks = repeated_blocks(graph, fwd)
        if not blocks:
            raise GraphcostError(f"{opt('checkpoint', value='sac')}: no repeated blocks to wrap")
        segs = [sac_saved(graph, s, sac) for s in segments_by_name(graph, fwd, blocks)]
        mode = "core_attn" if sac == MEGATRON_CORE_ATTN else "sac"
        return _plan(mode, segs, plain, step(segs), node_flops, budget)
    if nth:  # torchtitan counts the blocks it wraps from 1 and checkpoints each N-th
        blocks = repeated_blocks(graph, fwd)[nth - 1::nth]
        if not blocks:
            raise GraphcostError(f"{opt('checkpoint.nth', value=nth)}: fewer than {nth} "
                                 "repeated blocks")
        segs = segments_by_name(graph, fwd, blocks)
        return _plan("nth", segs, plain, step(segs), node_flops, budget)
    if names:
        segs, mode = segments_by_name(graph, fwd, names), "names"
    elif every is not None or sqrt:
        blocks = repeated_blocks(graph, fwd)
        if not blocks:
            raise GraphcostError("no repeated blocks found to checkpoint: name the modules "
                                 f"with {opt('checkpoint')} NAME[,NAME…]")
        groups = sqrt_groups(blocks) if sqrt else group_every(blocks, every or 1)
        segs = [merge("+".join(g), segments_by_name(graph, fwd, g)) for g in groups]
        mode = "sqrt" if sqrt else "every"
    elif budget is not None:
        return _auto(graph, fwd, plain, budget, step, node_flops)
    else:
        raise GraphcostError(f"{opt('checkpoint')} needs module names, sqrt, auto (with "
                             f"{opt('checkpoint.budget')}), or {opt('checkpoint.every')} N")
    return _plan(mode, segs, plain, step(segs), node_flops, budget)


def _auto(graph, fwd, plain, budget, step, node_flops) -> CheckpointPlan:
    """The plan with the least recompute that fits: exact under Chen et al.'s memory model
    over segments of consecutive repeated blocks (passes/training/checkpoint_plan.py), each answer
    checked by the liveness pass; the greedy search below is the fallback where the model
    keeps missing."""
    floor = plain.param_bytes + plain.buffer_bytes + plain.optimizer_state_bytes + \
        plain.grad_bytes + plain.breakdown_at_peak["master_weights"]
    if budget < floor:
        raise GraphcostError(f"no checkpoint plan can fit {budget:,} B: parameters, gradients "
                             f"and optimizer state alone take {floor:,} B")
    if plain.peak_bytes <= budget:
        return _plan("auto", [], plain, plain, node_flops, budget)
    blocks = repeated_blocks(graph, fwd)
    if blocks:
        table = block_table(graph, analyze_liveness(graph, include_inputs=plain.include_inputs,
                                                    python_refs=True),
                            fwd, blocks, node_flops, plain.timeline)
        # the model overstates a plan's peak by up to 2% (tests/test_checkpoint_plan.py), so
        # the cheapest plan that fits may be modelled over the budget by as much: start there
        target = budget + budget // 50
        for _ in range(6):   # lower the target by each shortfall of the model
            ranges = cheapest_plan(table, target)
            if ranges is None:
                break
            segs = plan_segments(table, ranges)
            got = step(segs)
            if got.peak_bytes <= budget:
                return _plan("auto", segs, plain, got, node_flops, budget)
            target -= got.peak_bytes - budget
    return _auto_greedy(graph, fwd, plain, budget, step, node_flops, floor)


def _auto_greedy(graph, fwd, plain, budget, step, node_flops, floor) -> CheckpointPlan:
    """Greedy over the repeated blocks: checkpoint the blocks that free the most memory per
    recomputed FLOP first, and stop at the first plan whose peak fits the budget."""
    blocks = repeated_blocks(graph, fwd)
    segs = segments_by_name(graph, fwd, blocks) if blocks else []
    scored = []
    for seg in segs:
        saved = plain.peak_bytes - step([seg]).peak_bytes
        scored.append((-saved / max(1, sum(node_flops[i] for i in seg.nodes)), seg))
    scored.sort(key=lambda t: t[0])
    chosen: list[Segment] = []
    best = plain
    for _, seg in scored:
        chosen.append(seg)
        best = step(chosen)
        if best.peak_bytes <= budget:
            return _plan("auto", chosen, plain, best, node_flops, budget)
    # the most any plan over the blocks frees: every block checkpointed as one segment
    whole = step([merge("all", segs)]) if segs else plain
    lowest = min(best.peak_bytes, whole.peak_bytes)
    raise GraphcostError(f"no checkpoint plan fits {budget:,} B: checkpointing the repeated "
                         f"blocks reaches {lowest:,} B at best (parameters, gradients and "
                         f"optimizer state take {floor:,} B)")
