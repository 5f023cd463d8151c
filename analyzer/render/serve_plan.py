"""A serving plan's face (analyzer/app/serve_plan.py): what was searched, the best settings in
a table, then the answer last — the best setting with its output tokens/s, latencies and
memory, the command that analyzes it alone and vLLM's arguments. JSON: every candidate."""
from __future__ import annotations

import json
from typing import Any, Callable

from ...passes.errors import GraphcostError
from ..app.serve_plan import ServeCandidate, ServePlan, least_needing
from ..app.units import human_bytes, human_time

SERVE_PLAN_SCHEMA = 2   # 2: ``suggestion`` (when nothing fits: the smaller weights that do)
HEAD = f"{'#':>2}  {'tp':>3}{'replicas':>9}{'seqs':>6}  {'weights/KV':<12}{'memory':>10}" \
       f"{'TTFT':>9}{'TPOT':>9}{'tok/s/GPU':>11}"

Words = Callable[[GraphcostError], str]   # an error as the face words it
Command = Callable[[ServeCandidate], str]
Engine = Callable[[ServeCandidate], "str | None"]


def serve_plan_lines(plan: ServePlan, command: Command, top: int = 5,
                     engine: Engine = lambda c: None, word: Words = str) -> list[str]:
    """The plan in at most 24 lines of 80 columns."""
    spec = plan.spec
    counts = {s: sum(c.status == s for c in plan.candidates)
              for s in ("fits", "slow", "over", "refused")}
    targets = [f"{n} ≤ {human_time(t)}" for n, t in (("TTFT", spec.ttft), ("TPOT", spec.tpot))
               if t is not None]
    lines = [f"serving plan: {plan.model} on {spec.gpus} × {plan.device}",
             f"requests of {spec.prompt:,} + {spec.generate:,} tokens in waves, priced as "
             "vLLM runs them",
             *([", ".join(targets)] if targets else []),
             f"{len(plan.candidates)} settings: {counts['fits']} fit"
             + (f", {counts['slow']} miss a target" if targets else "")
             + f", {counts['over']} over the memory, {counts['refused']} refused", ""]
    shown = [c for c in plan.candidates if c.status != "refused"][:top]
    if shown:
        band = shown[0].serving.time.band if shown[0].serving and shown[0].serving.time else 0
        lines += [HEAD, *(_row(i, c) for i, c in enumerate(shown, 1)),
                  f"memory: reserved + runtime per GPU (! over); times: estimates ± {band:.0%}",
                  ""]
    lines += _refused(plan, word)
    if any(c.serving is not None and c.serving.cache_update == "concat" for c in shown):
        lines += ["its cache concatenates (transformers' DynamicCache): each decode step copies",
                  "it, as vLLM's paged cache does not — TPOT here is above vLLM's", ""]
    best = plan.best
    if best is None:
        return lines + _none(plan, command)
    run = engine(best)
    return lines + _answer(plan, best, command) + ([f"vllm: {run}"] if run else [])


def _row(i: int, c: ServeCandidate) -> str:
    s, serving = c.settings, c.serving
    t = serving.time if serving else None
    fit = serving.fit if serving else None
    memory = f"{(fit.needs if fit else 0) / 2**30:.1f} GiB" + ("!" if c.status == "over" else " ")
    dtypes = f"{serving.weight_dtype}/{serving.kv_dtype}" if serving else "-"
    rate = c.tokens_per_second_per_gpu
    mark = "*" if c.status == "slow" else " "
    return (f"{i:>2}  {s.tp:>3}{c.replicas:>9}{s.batch:>6}  {dtypes:<12}{memory:>10}"
            f"{_t(t and t.ttft_seconds):>9}{_t(t and t.tpot_seconds):>9}"
            f"{(f'{rate:,.0f}' if rate else '-'):>10}{mark}")


def _t(seconds: float | None) -> str:
    return human_time(seconds) if seconds else "-"


def _refused(plan: ServePlan, word: Words) -> list[str]:
    slow = [c for c in plan.candidates if c.status == "slow"]
    out = [f"* misses a target, e.g. {slow[0].detail}"] if slow else []
    refused = [c for c in plan.candidates if c.status == "refused"]
    if refused:
        c = refused[0]
        assert c.error is not None
        out.append(f"refused ({len(refused)}, e.g. tp={c.settings.tp}): {word(c.error)}")
    return out + ([""] if out else [])


def _answer(plan: ServePlan, best: ServeCandidate, command: Command) -> list[str]:
    s, serving = best.settings, best.serving
    assert serving is not None and serving.time is not None and serving.fit is not None
    t = serving.time
    total = best.tokens_per_second or 0
    out = [f"best: tp={s.tp} × {best.replicas} replica{'s' * (best.replicas != 1)}, "
           f"{s.batch} sequences each, weights {serving.weight_dtype}, KV {serving.kv_dtype}",
           f"  {total:,.0f} output tokens/s, {best.tokens_per_second_per_gpu or 0:,.0f} a GPU "
           f"(estimate ± {t.band:.0%})",
           f"  TTFT {human_time(t.ttft_seconds)}, TPOT {human_time(t.tpot_seconds)}; memory "
           f"{human_bytes(serving.fit.needs)} of {human_bytes(serving.fit.offers)} per GPU"]
    return out + [f"run: {command(best)}"]


def _none(plan: ServePlan, command: Command) -> list[str]:
    slow = [c for c in plan.candidates if c.status == "slow"]
    if slow:
        c = slow[0]
        b = c.settings.batch
        return ["no setting meets the targets; the fastest that fits misses them:",
                f"  tp={c.settings.tp}, {b} sequence{'s' * (b != 1)}: {c.detail}"]
    c = least_needing(plan.candidates)
    fit = c.serving.fit if c and c.serving else None
    if c is None or fit is None:
        return ["no setting could be analyzed"]
    out = [f"nothing fits {plan.spec.gpus} × {plan.device}: tp={c.settings.tp} needs "
           f"{human_bytes(fit.needs)} of {human_bytes(fit.offers)} per GPU for one sequence"]
    smaller = plan.suggestion
    done = smaller.serving.fit if smaller and smaller.serving else None
    if smaller is None or done is None:
        return out + ["  nor with smaller weights (fp8 where the GPU runs it, 4-bit)"]
    return out + [f"  with {smaller.settings.weight_dtype} weights it fits: "
                  f"{human_bytes(done.needs)} of {human_bytes(done.offers)} per GPU",
                  f"run: {command(smaller)}"]


def serve_plan_json(plan: ServePlan, command: Command, engine: Engine,
                    word: Words = str) -> str:
    """Every candidate, ranked, for tools."""
    spec = plan.spec
    body = {"schema_version": SERVE_PLAN_SCHEMA, "kind": "serve_plan", "model": plan.model,
            "device": plan.device, "gpus": spec.gpus, "prompt": spec.prompt,
            "generate": spec.generate, "ttft_target_seconds": spec.ttft,
            "tpot_target_seconds": spec.tpot,
            "candidates": [{**_candidate_json(c, command, word), "vllm": engine(c)}
                           for c in plan.candidates],
            "suggestion": None if plan.suggestion is None else {
                **_candidate_json(plan.suggestion, command, word),
                "vllm": engine(plan.suggestion)}}
    return json.dumps(body, indent=1) + "\n"


def _candidate_json(c: ServeCandidate, command: Command, word: Words) -> dict[str, Any]:
    s, serving = c.settings, c.serving
    t = serving.time if serving else None
    fit = serving.fit if serving else None
    return {"tp": s.tp, "replicas": c.replicas, "sequences": s.batch,
            "weight_dtype": serving.weight_dtype if serving else s.weight_dtype,
            "kv_dtype": serving.kv_dtype if serving else s.kv_dtype, "status": c.status,
            "detail": word(c.error) if c.error is not None else c.detail,
            "needs_bytes": fit and fit.needs, "offers_bytes": fit and fit.offers,
            "ttft_seconds": t and t.ttft_seconds, "tpot_seconds": t and t.tpot_seconds,
            "band": t and t.band, "request_seconds": c.request_seconds,
            "tokens_per_second": c.tokens_per_second,
            "tokens_per_second_per_gpu": c.tokens_per_second_per_gpu,
            "command": command(c)}
