"""Per-rank peaks of data-parallel training, predicted by graphcost and measured by PyTorch's
trackers on this CPU (README's table "Training on several GPUs").

    python -m benchmarks.accuracy_parallel [--world 2 4] [--fake 8]
        [--models mlp resnet18 gpt2 gpt2_lora] [--strategies ddp zero1 zero2 fsdp]

Measured (analyzer/measure/parallel.py): N processes on gloo at 127.0.0.1 (``--world``), or one
process with PyTorch's fake process group for fully_shard at larger N (``--fake``); Adam
(for-loop, PyTorch's CPU default), batch 2 per rank, steps 1 and 2, each under a fresh tracker
(FSDPMemTracker for fully_shard, MemTracker otherwise), rank 0 and the worst rank.
Predicted: one joint trace per model (the real module, CPU weights), passes/parallel/step.py per
strategy and world size, inputs excluded (the trackers do not see the batch made before).
resnet18 runs at 64x64 to keep several processes within this machine's memory and time.
"""
from __future__ import annotations

import argparse
import functools
import time
import warnings

from graphcost.analyzer.app.request import LoadOptions, PassOptions

warnings.filterwarnings("ignore")
SHAPES = {"resnet18": (("x", (2, 3, 64, 64)),)}
ITEMS = ("params", "grads", "optimizer", "activations", "comm", "temps")


@functools.lru_cache(maxsize=None)
def joint(model: str):
    import torch
    from graphcost.analyzer.load.loading import load_graph

    from graphcost import models_zoo

    shapes = dict(SHAPES.get(model, ()))
    args = (torch.randn(*shapes["x"]),) if shapes else models_zoo.example_inputs(model, 2)
    return load_graph(models_zoo.build_model(model, eval=False), LoadOptions(train=True), args)


def predict(model: str, strategy: str, world: int):
    from graphcost.analyzer.app.pipeline import run_passes
    from graphcost.passes.parallel.spec import ParallelSpec

    return run_passes(joint(model), PassOptions(optimizer="adam", include_inputs=False, what_if=False, parallel=ParallelSpec(strategy, world))).parallel


def rows(models, strategies, world: int, fake: bool) -> list[dict]:
    from graphcost.analyzer.measure.parallel import Case, measure_parallel
    from graphcost.analyzer.measure.tracker_items import items

    preds = {(m, s): predict(m, s, world) for m in models for s in strategies}
    cases = [Case(m, s, 2, SHAPES.get(m, ()), tuple(u.name for u in p.units
                                                   if u.name != "(root)"))
             for (m, s), p in preds.items()]
    t = time.perf_counter()
    measured = measure_parallel(cases, world, fake=fake)
    seconds = time.perf_counter() - t
    out = []
    for (m, s), p in preds.items():
        for step in (1, 2):
            ms = [x for x in measured if (x.case.model, x.case.strategy, x.step) == (m, s, step)]
            worst = max(ms, key=lambda x: x.peak)
            pred = p.first_step_peak_bytes if step == 1 else p.per_rank_peak_bytes
            detail = p.first_step_detail if step == 1 else p.detail_at_peak
            out.append(dict(model=m, strategy=s, world=world, fake=fake, step=step, pred=pred,
                            meas=worst.peak, rank=worst.rank, pred_rank=p.worst_rank,
                            items=items(detail, worst.categories),
                            where=p.peak_event or p.peak_node or "optimizer step"
                            if step == 2 else "", seconds=seconds))
    return out


def _cell(pred: int, meas: int) -> str:
    if not pred and not meas:
        return "0"
    diff = f" ({100 * (pred / meas - 1):+.0f}%)" if meas else ""
    return f"{pred / 2**20:.2f}/{meas / 2**20:.2f}{diff}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, nargs="*", default=[2])
    ap.add_argument("--fake", type=int, nargs="*", default=[8])
    ap.add_argument("--models", nargs="*", default=["mlp", "resnet18", "gpt2", "gpt2_lora"])
    ap.add_argument("--strategies", nargs="*", default=["ddp", "zero1", "zero2", "fsdp"])
    a = ap.parse_args()
    table = []
    for w in a.world:
        table += rows(a.models, a.strategies, w, False)
    sharded = [s for s in a.strategies if s in ("zero2", "zero3", "fsdp")]
    for w in a.fake:
        table += rows(a.models, sharded, w, True)
    print("| model | strategy | N | step | predicted B | measured B | diff | "
          + " | ".join(f"{i} MiB" for i in ITEMS) + " |")
    print("|---|---|--:|--:|--:|--:|--:|" + "---|" * len(ITEMS))
    worst = 0.0
    for r in table:
        diff = r["pred"] / r["meas"] - 1
        worst = max(worst, abs(diff))
        n = f"{r['world']}{' (fake)' if r['fake'] else ''}"
        print(f"| {r['model']} | {r['strategy']} | {n} | {r['step']} | {r['pred']:,} | "
              f"{r['meas']:,} | {100 * diff:+.2f}% | "
              + " | ".join(_cell(*r["items"][i]) for i in ITEMS) + " |")
    print(f"\nitems: predicted/measured MiB at each side's peak (worst rank); largest peak "
          f"difference {100 * worst:.2f}%")


if __name__ == "__main__":
    main()
