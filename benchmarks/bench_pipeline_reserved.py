"""A long pipeline stage's reserved bytes as graphcost extrapolates them, against the same
stage traced whole and replayed (passes/parallel/pipeline_reserved.py): a stage of more than
3 blocks is analyzed from its 2- and 3-block programs, its reserved bytes the 3-block
program's replay's reserved-to-allocated ratio applied to its grown peak.

    python -m benchmarks.bench_pipeline_reserved [--markdown benchmarks/results/pipeline_reserved.md]

Each way runs in a fresh process (the whole stages' analysis takes about twice as long).
"""
from __future__ import annotations

import argparse

from benchmarks.child import add_row, run, write_rows

CASE = r"""
import json
from graphcost import analyze
from graphcost.analyzer.app import pipeline_stages
pipeline_stages.SHORT = _SHORT_
r = analyze(MODEL, batch=BATCH, dims={"seq": SEQ}, train=True, optimizer="adamw",
            precision="bf16-master", checkpoint={"every": 1}, device="h100-sxm",
            what_if=False, parallel={"mesh": MESH, "microbatches": MICRO})
print(json.dumps([[s.peak_bytes, s.reserved_bytes] for s in r.pipeline.per_stage]))
"""

# (name, model, batch, seq, mesh, micro-batches)
CASES = [("Llama 3.1 8B, pp 4 (8 blocks a stage)", "zoo:llama3_8b", 8, 8192, "pp=4", 8)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args()
    rows = ["| layout | stage | allocated GiB | reserved GiB, extrapolated | "
            "reserved GiB, whole stage | error |", "|---|---:|---:|---:|---:|---:|"]
    for name, model, batch, seq, mesh, micro in CASES:
        def way(short: int):
            code = CASE
            for key, value in (("_SHORT_", short), ("MODEL", repr(model)), ("BATCH", batch),
                               ("SEQ", seq), ("MESH", repr(mesh)), ("MICRO", micro)):
                code = code.replace(key, str(value))
            return run(code)
        grown, whole = way(3), way(1000)
        if "error" in grown or "error" in whole:
            raise SystemExit(f"{name}: {grown}, {whole}")
        for k, ((peak, r), (_, w)) in enumerate(zip(grown, whole)):
            add_row(rows, f"| {name} | {k} | {peak / 2**30:.2f} | {r / 2**30:.2f} | "
                          f"{w / 2**30:.2f} | {r / w - 1:+.1%} |")
    write_rows(rows, args.markdown)


if __name__ == "__main__":
    main()
