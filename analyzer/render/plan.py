"""A plan's face (analyzer/app/plan.py): what was searched, the best candidates in a table,
then the answer last — the best setting with its throughput, memory and why it beats the
next, and the command that analyzes it alone. JSON: every candidate."""
from __future__ import annotations

import json
from typing import Any, Callable

from ...passes.errors import GraphcostError
from ...passes.parallel.schedules import SCHEDULE_WORDS, Schedule
from ..app.plan import Candidate, Plan, explain
from ..app.units import human_bytes, human_time

Words = Callable[[GraphcostError], str]   # an error as the face words it

PLAN_SCHEMA = 5   # 2: a candidate's schedule; 3: a pruned one's bounds (…_at_least);
# 4: "flushes" (the allocator's cache flushes a candidate's fit counts on); 5: "screened" (the
# layout a candidate's figures are scaled from: analyzer/app/plan_screen.py; null: analyzed)
HEAD = f"{'#':>2}  {'layout':<30}{'batch':>5}  {'ckpt':<5}{'memory':>10}  {'step':<8}" \
       f"{'tok/s/GPU':>9}{'MFU':>5}"


Engine = Callable[[Candidate], "str | None"]   # the engine's command line of a candidate
# a row's schedule of two stages a rank (the legend names it as the parallel report does)
SHORT: dict[str, str] = {Schedule.INTERLEAVED: "I1F1B", Schedule.ZERO_BUBBLE: "IZB",
                         Schedule.ZBV: "ZBV"}
FLUSHING = "~: fits with PyTorch's allocator emptying its cache (cudaMalloc retries)"


def plan_lines(plan: Plan, command: Callable[[Candidate], str], top: int = 5,
               word: Words = str, engine: Engine = lambda c: None) -> list[str]:
    """The plan in at most 24 lines of 80 columns: ``command(c)`` is the command line that
    analyzes candidate ``c`` alone, ``engine(c)`` the one that runs it (None: no engine
    says it); the refused are grouped by what ``word`` makes of their error."""
    counts = {s: sum(c.status == s for c in plan.candidates)
              for s in ("fits", "over", "pruned", "refused")}
    lines = [f"plan: {plan.model} on {plan.spec.gpus} × {plan.device}", _shape(plan),
             f"{len(plan.candidates)} setting{'s' * (len(plan.candidates) != 1)}: "
             f"{counts['fits']} fit, {counts['over']} over "
             f"the memory, {counts['pruned']} pruned, {counts['refused']} refused"
             + _screened(plan), ""]
    # (analyses only: a screened candidate's figures are estimates, its JSON's)
    shown = [c for c in plan.candidates if c.status in ("fits", "over") and not c.screened][:top]
    if shown:
        lines += [HEAD, *(_row(i, c) for i, c in enumerate(shown, 1)), _legend(shown)]
        lines += _schedules_legend(shown)
        lines += [FLUSHING] * any(c.flushes for c in shown) + [""]
    lines += _refused(plan, word)
    lines += [f"not searched: {w}" for w in plan.not_searched]
    lines += [""] if plan.not_searched else []
    best = plan.best
    if best is None:
        return lines + _no_fit(plan)
    run = engine(best)
    return lines + _answer(plan, best, command) + ([f"torchtitan: {run}"] if run else [])


def _shape(plan: Plan) -> str:
    base = plan.base
    seq = dict(base.get("dims") or {}).get("seq")
    words = [f"seq {seq:,}" if seq else "",
             f"global batch {plan.spec.global_batch}" if plan.spec.global_batch else "",
             str(base.get("precision", "")),
             f"float8 {base['float8']}" if base.get("float8") else "",
             "gathered in float8" if (base.get("parallel") or {}).get("float8_all_gather")
             else "",
             str(base.get("optimizer", ""))]
    return " · ".join(w for w in words if w)


def _row(i: int, c: Candidate) -> str:
    s, t = c.settings, c.time
    step = human_time(t.seconds) if t is not None else "-"
    rate = f"{t.tokens_per_second:,.0f}" if t is not None and t.tokens_per_second else "-"
    mfu = f"{t.mfu:.0%}" if t is not None and t.mfu else "-"
    mark = "!" if c.status != "fits" else "~" if c.flushes else " "
    memory = f"{(c.needs_bytes or 0) / 2**30:.1f} GiB{mark}"
    layout = (s.mesh.words or "one GPU") + (f" {SHORT[s.schedule]}" if s.interleaved else "")
    return (f"{i:>2}  {layout:<30}{s.batch:>5}  {s.checkpoint:<5}"
            f"{memory:>10}  {step:<8}{rate:>9}{mfu:>5}")


def _schedules_legend(shown: list[Candidate]) -> list[str]:
    """One line naming the schedules of two stages a rank the rows show ([] where none)."""
    named = "; ".join(f"{short}: {SCHEDULE_WORDS[s]}" for s, short in SHORT.items()
                      if any(c.settings.schedule == s for c in shown))
    whose = " (two stages a rank, torchtitan's)"
    return [named + whose * (len(named + whose) <= 80)] if named else []


def _legend(shown: list[Candidate]) -> str:
    bands = {c.time.band for c in shown if c.time is not None}
    band = f" ± {bands.pop():.0%}" if len(bands) == 1 and None not in bands else ""
    return (f"memory: reserved + runtime per GPU (! over the device); step: estimate{band}"
            if shown else "")


def _answer(plan: Plan, best: Candidate, command: Callable[[Candidate], str]) -> list[str]:
    t = best.time
    out = [f"best: {best.settings.words}"]
    if t is not None:
        rate = (f"{t.tokens_per_second:,.0f} tokens/s per GPU" if t.tokens_per_second
                else f"{_figure(best.samples_per_second or 0)} samples/s")
        band = f" ± {t.band:.0%}" if t.band else ""
        mfu = f", MFU {t.mfu:.0%}" if t.mfu else ""
        out.append(f"  {rate} (estimate{band}), step {human_time(t.seconds)}{mfu}")
    # (in two steps; 80 columns: the legend says whose)
    flushing = f", {best.flushes} cache flush{'es' * (best.flushes != 1)}" if best.flushes else ""
    out.append(f"  memory {human_bytes(best.needs_bytes or 0)} of "
               f"{human_bytes(best.offers_bytes or 0)} per GPU (reserved + runtime{flushing})")
    fitting = plan.fitting
    if len(fitting) > 1:
        nxt = fitting[1]   # (#2 of the table: the fitting come first)
        gain = (best.samples_per_second or 0) / (nxt.samples_per_second or 1) - 1
        why = explain(best, nxt)
        pct = f"{gain:.1%}" if gain < 0.1 else f"{gain:.0%}"
        out.append(f"  {pct} faster than #2" + (f": less {why}" if why else ""))
    return out + [f"run: {command(best)}"]


def _refused(plan: Plan, word: Words, most: int = 2) -> list[str]:
    """The refused settings by reason (the first ``most`` reasons), each with one mesh."""
    reasons: dict[str, list[Candidate]] = {}
    for c in plan.candidates:
        if c.error is not None:
            reasons.setdefault(word(c.error), []).append(c)
    out = [f"refused ({len(cs)}, e.g. {cs[0].settings.mesh.words}): {why}"
           for why, cs in list(reasons.items())[:most]]
    return out + ([""] if out else [])


def _figure(x: float) -> str:
    """1234.5 → 1,234; 12.345 → 12.3 (three figures below a hundred)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _no_fit(plan: Plan) -> list[str]:
    least = next(c for c in plan.candidates if c.status == "over")   # (all refused: raised)
    s = least.settings
    out = [f"nothing fits {plan.spec.gpus} × {plan.device}: the least needs "
           f"{human_bytes(least.needs_bytes or 0)} of {human_bytes(least.offers_bytes or 0)}",
           f"  ({s.mesh.words or 'one GPU'}, batch {s.batch}, checkpoint {s.checkpoint})"]
    if plan.suggestion:
        return out + [f"it fits on {plan.suggestion}"]
    return out + ["nor on 8× the GPUs or at half the sequence"]


def _screened(plan: Plan) -> str:
    """How many of the counted were screened (their figures scaled, not analyzed)."""
    n = sum(bool(c.screened) for c in plan.candidates)
    return f" ({n} screened)" if n else ""


def plan_json(plan: Plan, command: Callable[[Candidate], str], word: Words = str,
              engine: Engine = lambda c: None) -> str:
    """Every candidate, ranked, for tools."""
    body = {"schema_version": PLAN_SCHEMA, "kind": "plan", "model": plan.model,
            "device": plan.device, "gpus": plan.spec.gpus,
            "global_batch": plan.spec.global_batch, "suggestion": plan.suggestion,
            "candidates": [{**_candidate_json(c, command, word), "torchtitan": engine(c)}
                           for c in plan.candidates]}
    return json.dumps(body, indent=1) + "\n"


def _candidate_json(c: Candidate, command: Callable[[Candidate], str],
                    word: Words) -> dict[str, Any]:
    s, t = c.settings, c.time
    time = None if t is None else {
        "seconds": t.seconds, "band": t.band, "low_seconds": t.low_seconds,
        "high_seconds": t.high_seconds, "tokens_per_second": t.tokens_per_second,
        "mfu": t.mfu, "communication_seconds": t.communication_seconds,
        "recompute_seconds": t.recompute_seconds}
    return {"mesh": s.mesh.words, "batch": s.batch, "checkpoint": s.checkpoint,
            "schedule": s.schedule if s.pp > 1 else None,
            "status": c.status,
            "detail": word(c.error) if c.error is not None else c.detail, "needs_bytes": c.needs_bytes,
            "offers_bytes": c.offers_bytes, "allocated_bytes": c.allocated_bytes,
            "samples": c.samples, "time": time, "command": command(c),
            # (a pruned candidate's bounds: what pruned it proves of it, None where nothing)
            "needs_at_least_bytes": c.needs_at_least,
            "time_at_least_seconds": c.seconds_at_least, "flushes": c.flushes,
            "screened": c.screened or None}
