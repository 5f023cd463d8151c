"""Large-model training layouts graphcost answers, with the time each answer takes on this
machine (docs/large-models.md): Llama 3.1 8B / 70B / 405B shapes in the torchtitan-style zoo
decoder, traced on the meta device, under FSDP2, FSDP × TP and pipeline stages; and where
torchtitan publishes its memory for the same settings, that figure beside graphcost's.

    python -m benchmarks.bench_large_layouts [--markdown benchmarks/results/large_layouts.md]

Each case runs in a fresh process (its time is its own; torch's import excluded).
"""
from __future__ import annotations

import argparse

from benchmarks.child import run, write_rows

CASE = r"""
import json, time
from graphcost import analyze
w0 = time.perf_counter()
r = analyze(MODEL, batch=BATCH, dims={"seq": SEQ}, train=True, optimizer="adamw",
            precision=PRECISION, checkpoint=CHECKPOINT, device="h100-sxm", what_if=False,
            parallel=PARALLEL)
wall = time.perf_counter() - w0
peak = r.peak
print(json.dumps(dict(wall=wall, allocated=peak.allocated_bytes,
                      reserved=peak.reserved_bytes, ranks=peak.world_size)))
"""

# (name, model, batch, seq, checkpoint, parallel, torchtitan's published GiB or None); bf16
# parameters with fp32 master weights and reduction (FSDP2's MixedPrecisionPolicy) unless
# the name says bf16-mixed
CASES = [
    ("8B FSDP 8", "zoo:llama3_8b", 2, 8192, {"sac": True}, {"mesh": "dp_shard=8"}, 82.4),
    ("8B FSDP 128", "zoo:llama3_8b", 2, 8192, {"sac": True}, {"mesh": "dp_shard=128"}, 67.0),
    # (tensor parallel alone: no FSDP to hold fp32 master weights; torchtitan autocasts)
    ("8B TP 8 (bf16-mixed)", "zoo:llama3_8b", 2, 8192, {"sac": True}, {"mesh": "tp=8"}, None),
    ("8B PP 4 (1F1B, 8 micro-batches)", "zoo:llama3_8b", 8, 8192, {"every": 1},
     {"mesh": "pp=4", "microbatches": 8}, None),
    ("70B FSDP 32 × TP 8", "zoo:llama3_70b", 16, 8192, {"every": 1},
     {"mesh": "dp_shard=32,tp=8"}, None),
    ("70B FSDP 8 × TP 8", "zoo:llama3_70b", 1, 8192, {"every": 1},
     {"mesh": "dp_shard=8,tp=8"}, None),
    ("405B FSDP 8 × TP 8", "zoo:llama3_405b", 1, 8192, {"every": 1},
     {"mesh": "dp_shard=8,tp=8"}, None),
    # torchtitan's 405B layout (its Table 5 ran float8 linears, which graphcost does not
    # model: its 82.5 GiB is not this step's)
    ("405B FSDP 8 × TP 8 × PP 8 (1F1B, 32 micro-batches)", "zoo:llama3_405b", 32, 8192,
     {"every": 1}, {"mesh": "pp=8,dp_shard=8,tp=8"}, None),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args()
    rows = ["| layout | batch × seq | allocated GiB | reserved GiB | torchtitan GiB | "
            "answered in |", "|---|---|---:|---:|---:|---:|"]
    for name, model, batch, seq, ckpt, parallel, published in CASES:
        precision = "bf16-mixed" if "bf16-mixed" in name else "bf16-master"
        code = CASE.replace("PRECISION", repr(precision)).replace("MODEL", repr(model)).replace("BATCH", str(batch)) \
            .replace("SEQ", str(seq)).replace("CHECKPOINT", repr(ckpt)) \
            .replace("PARALLEL", repr(parallel))
        r = run(code)
        if "error" in r:
            rows.append(f"| {name} | {batch} × {seq:,} | {r['error'][:60]} | | | |")
            print(rows[-1], flush=True)
            continue
        reserved = f"{r['reserved'] / 2**30:.2f}" if r["reserved"] else "—"
        rows.append(f"| {name} | {batch} × {seq:,} | {r['allocated'] / 2**30:.2f} | "
                    f"{reserved} | {published if published else '—'} | {r['wall']:.1f} s |")
        print(rows[-1], flush=True)
    write_rows(rows, args.markdown)


if __name__ == "__main__":
    main()
