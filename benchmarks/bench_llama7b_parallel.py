"""Per-rank training memory of the Llama-2-7B-shaped zoo model (traced on the meta device)
under FSDP over 8 and 64 ranks, and the smallest world size that fits an H100 80GB: time of
the whole ``analyze`` call (trace, lowering, passes), of the data-parallel pass alone, and
what it answers.

    python -m benchmarks.bench_llama7b_parallel [--seq 2048] [--worlds 8 64 auto]
                                                [--strategy fsdp] [--optimizer adamw]

Each case runs in a fresh process, so its time and peak RSS are its own (torch import
excluded from the analyze time). Wall time and this process's CPU time are both printed: on a
shared machine the wall time includes other processes' load, the CPU time does not.
"""
from __future__ import annotations

import argparse

from benchmarks.child import run

CASE = r"""
import json, resource, time
import torch
import graphcost.analyzer.app.pipeline as pipeline
from graphcost import analyze
spent = {"parallel": 0.0}
orig = pipeline.parallel_step
def timed(*a, **k):
    t = time.process_time()
    try:
        return orig(*a, **k)
    finally:
        spent["parallel"] += time.process_time() - t
pipeline.parallel_step = timed
w0, c0 = time.perf_counter(), time.process_time()
r = analyze("zoo:llama7b", dims={"seq": SEQ}, train=True, optimizer=OPT, device="h100-80gb",
            parallel={"strategy": STRATEGY, "world_size": WORLD, "interconnect": "nvlink4"})
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
p = r.parallel
print(json.dumps(dict(wall=wall, cpu=cpu, parallel_cpu=spent["parallel"],
                      rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      world=p.world_size, peak=p.per_rank_peak_bytes,
                      first=p.first_step_peak_bytes, single=p.single_device_peak_bytes,
                      where=p.peak_event or p.peak_node or "optimizer step",
                      phase=p.peak_phase, breakdown=p.breakdown_at_peak,
                      comm_s=p.comm.seconds, compute_s=r.roofline.total_seconds,
                      wire=p.comm.wire_bytes, fits=r.roofline.fits,
                      tried=p.world_size_search, nodes=len(r.nodes))))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--worlds", nargs="*", default=["8", "64", "auto"])
    ap.add_argument("--strategy", default="fsdp")
    ap.add_argument("--optimizer", default="adamw")
    a = ap.parse_args()
    gib = 2**30
    print(f"## llama7b, {a.strategy}, {a.optimizer}, seq {a.seq}, batch 1 per rank, "
          "h100-80gb, nvlink4\n")
    print("| world size | analyze wall s | analyze CPU s | parallel pass CPU s | peak RSS MB | "
          "per-rank peak GiB | first step GiB | peak at | comm ≥ | compute ≥ |")
    print("|---|--:|--:|--:|--:|--:|--:|---|--:|--:|")
    for w in a.worlds:
        world = repr(w) if w == "auto" else str(int(w))
        code = (CASE.replace("SEQ", str(a.seq)).replace("OPT", repr(a.optimizer))
                .replace("STRATEGY", repr(a.strategy)).replace("WORLD", world))
        g = run(code)
        if "error" in g:
            print(f"| {w} | failed: {g['error'][:200]} |")
            continue
        label = f"auto → {g['world']}" if w == "auto" else w
        print(f"| {label} | {g['wall']:.2f} | {g['cpu']:.2f} | {g['parallel_cpu']:.2f} | "
              f"{g['rss_mb']:.0f} | {g['peak'] / gib:.2f} | {g['first'] / gib:.2f} | "
              f"{g['phase']}: {g['where']} | {g['comm_s'] * 1e3:.0f} ms | "
              f"{g['compute_s'] * 1e3:.0f} ms |")
        last = g
    print(f"\none device at this batch: {last['single'] / gib:.2f} GiB; "
          f"{last['nodes']:,} joint nodes")
    print("breakdown at the last case's peak (GiB): "
          + ", ".join(f"{k} {v / gib:.2f}" for k, v in last["breakdown"].items() if v))
    if last.get("tried"):
        print("auto tried (N: per-rank peak GiB): "
              + ", ".join(f"{n}: {b / gib:.1f}" for n, b in last["tried"]))


if __name__ == "__main__":
    main()
