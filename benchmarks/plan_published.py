"""``graphcost plan`` on torchtitan's published layouts (docs/plan.md): on the GPUs each run
used, is its layout judged to fit, and is the plan's best at least as fast by graphcost's own
estimate? With each plan's wall time on this machine, and the candidates its screen scaled from
an analyzed layout instead of analyzing them (analyzer/app/plan_screen.py), with the screen's
rate (candidates evaluated a second after the traces and their programs' analyses).

    python -m benchmarks.plan_published [--markdown benchmarks/results/plan_published.md]

The runs (pytorch/torchtitan, benchmarks/; H100 SXM5 96 GB HBM2e at 500 W, ``h100-96gb``;
sequence 8,192; bf16 parameters with fp32 reduction, AdamW): Llama 3.1 8B FSDP 8, local
batch 2, selective op AC, eager (llama3_h100_202412_torchtitan.md, Table 1); 8B FSDP 8 × TP 8,
local batch 12, op SAC, and 70B FSDP 32 × TP 8, local batch 16, full AC, both under
torch.compile (asyncTP_llama3_h100_2025-06_torchtitan.md); 405B FSDP 8 × TP 8 × PP 8, local
batch 32 (1F1B, one sequence a micro-batch), full AC, under torch.compile with async TP and
float8 linears (llama3_h100_202412_torchtitan.md, Table 5: 100 tokens/s/GPU, 82.5 GiB) —
graphcost analyzes its linears in bf16 (float8 is not modelled), so its figures are the same
layout without float8.
"""
from __future__ import annotations

import argparse

from benchmarks.child import run

CASE = r"""
import json, time
from graphcost import analyze
from graphcost.analyzer.app.plan import plan_training
from graphcost.analyzer.app.plan_settings import PlanSpec, Settings
from graphcost.passes.parallel.mesh import parse_mesh
base = dict(train=True, optimizer="adamw", precision="bf16-master", dims={"seq": 8192},
            device="h100-96gb", what_if=False, compile=COMPILE)
start = time.perf_counter()
plan = plan_training(MODEL, PlanSpec(GPUS, global_batch=GLOBAL), base)
took = time.perf_counter() - start
published = Settings(parse_mesh(MESH), BATCH, CKPT)
r = analyze(MODEL, **base, **published.analyze_kwargs({}))
best = plan.best
bt = best.time if best else None
print(json.dumps(dict(
    took=took, candidates=len(plan.candidates),
    analyzed=sum(c.status in ("fits", "over") and not c.screened for c in plan.candidates),
    screened=plan.screened[0], screen_seconds=plan.screened[1],
    fits=r.roofline.fit.fits, needs=r.roofline.fit.needs, offers=r.roofline.fit.offers,
    tps=r.time.tokens_per_second, best=best.settings.words if best else None,
    best_tps=bt.tokens_per_second if bt else None)))
"""

# (name, model, GPUs, the step's sequences, published mesh, local batch, checkpoint, compile)
RUNS = [
    ("8B FSDP 8, eager (Table 1)", "zoo:llama3_8b", 8, 16, "dp_shard=8", 2, "sac", False),
    ("8B FSDP 8 × TP 8, compile (async-TP doc)", "zoo:llama3_8b", 64, 96,
     "dp_shard=8,tp=8", 12, "sac", True),
    ("70B FSDP 32 × TP 8, compile (async-TP doc)", "zoo:llama3_70b", 256, 512,
     "dp_shard=32,tp=8", 16, "full", True),
    ("405B FSDP 8 × TP 8 × PP 8, compile, bf16 (Table 5 ran float8)", "zoo:llama3_405b", 512,
     256, "pp=8,dp_shard=8,tp=8", 32, "full", True),
]


def _code(model, gpus, global_batch, mesh, batch, ckpt, compile_) -> str:
    return CASE.replace("MODEL", repr(model)).replace("GPUS", str(gpus)) \
        .replace("GLOBAL", str(global_batch)).replace("MESH", repr(mesh)) \
        .replace("BATCH", str(batch)).replace("CKPT", repr(ckpt)) \
        .replace("COMPILE", repr(compile_))


def rows() -> list[str]:
    out = ["| torchtitan run (H100 96 GB) | its layout | fits? (memory/GPU) | its tokens/s/GPU "
           "| plan's best | best tokens/s/GPU | settings analyzed | screened (a second) "
           "| plan took |",
           "|---|---|---|---:|---|---:|---:|---:|---:|"]
    for name, model, gpus, global_batch, mesh, batch, ckpt, compile_ in RUNS:
        r = run(_code(model, gpus, global_batch, mesh, batch, ckpt, compile_))
        layout = f"{mesh}, batch {batch}, {ckpt}"
        if "error" in r:
            out.append(f"| {name} | {layout} | {r['error'][:80]} | | | | | | |")
            continue
        fits = f"{'yes' if r['fits'] else 'no'} ({r['needs'] / 2**30:.1f} of " \
               f"{r['offers'] / 2**30:.1f} GiB)"
        best_tps = f"{r['best_tps']:,.0f}" if r["best_tps"] else "-"
        out.append(f"| {name} | {layout} | {fits} | {r['tps']:,.0f} | {r['best'] or 'none'} "
                   f"| {best_tps} | {r['analyzed']} of {r['candidates']} | {_screened(r)} | "
                   f"{r['took']:.0f} s |")
        print(out[-1], flush=True)
    return out


def _screened(r: dict) -> str:
    """The candidates the plan screened (analyzer/app/plan_screen.py), and how many a second
    its screen evaluates."""
    if not r["screened"]:
        return "0"
    return f"{r['screened']} ({r['screened'] / r['screen_seconds']:,.0f}/s)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args()
    table = rows()
    print("\n".join(table))
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write("graphcost plan on torchtitan's published layouts "
                     "(`python -m benchmarks.plan_published`)\n\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
