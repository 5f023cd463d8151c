"""graphcost's step time against the runs torchtitan publishes (docs/time.md, "How well it
holds: published runs"): the datasheet estimate of passes/device/gpu_engine.py, whose two
fitted constants were set on the first two rows, and every other row expressible in
graphcost's layouts as a check.

    python -m benchmarks.time_published [--markdown benchmarks/results/time_published.md]

Sources (pytorch/torchtitan, benchmarks/): llama3_h100_202412_torchtitan.md (Tables 1 and 3:
Llama 3.1 8B, FSDP 8 and 128, local batch 2, selective op AC, eager and torch.compile) and
asyncTP_llama3_h100_2025-06_torchtitan.md (vanilla TP, bfloat16: 70B FSDP 32 × TP 8, full AC,
local batch 16; 8B FSDP 8 × TP 8, op SAC, local batch 12; both torch.compile). All on H100
SXM5 96 GB HBM2e at 500 W (device ``h100-96gb``), sequence 8,192 (torchtitan's llama3
configs), bf16 parameters with fp32 reduction (FSDP2's MixedPrecisionPolicy), AdamW.

Not expressible yet, so not rows: float8 (Tables 1, 3, 4, 5, 6 and the async-TP float8 rows),
asynchronous TP, context parallelism (Tables 2 and 6), pipelines beside other dimensions
(Table 5).
"""
from __future__ import annotations

import argparse

from benchmarks.child import run

CASE = r"""
import json
from graphcost import analyze
r = analyze(MODEL, batch=BATCH, dims={"seq": 8192}, train=True, optimizer="adamw",
            precision="bf16-master", checkpoint=CHECKPOINT, device="h100-96gb",
            what_if=False, parallel={"mesh": MESH}, compile=COMPILE)
t = r.time
print(json.dumps(dict(seconds=t.seconds, tps=t.tokens_per_second, mfu=t.mfu,
                      exposed=t.communication_seconds, band=t.band)))
"""

# (name, model, local batch, checkpoint, mesh, compile, published tokens/s per GPU, fitted)
CASES = [
    ("8B FSDP 8, eager (Table 1)", "zoo:llama3_8b", 2, {"sac": True}, "dp_shard=8", False,
     5762, True),
    ("8B FSDP 8, compile (Table 1)", "zoo:llama3_8b", 2, {"sac": True}, "dp_shard=8", True,
     6667, True),
    ("8B FSDP 128, eager (Table 3)", "zoo:llama3_8b", 2, {"sac": True}, "dp_shard=128",
     False, 5605, False),
    ("8B FSDP 128, compile (Table 3)", "zoo:llama3_8b", 2, {"sac": True}, "dp_shard=128",
     True, 6514, False),
    ("8B FSDP 8 × TP 8, compile, batch 12 (async-TP doc)", "zoo:llama3_8b", 12,
     {"sac": True}, "dp_shard=8,tp=8", True, 4378, False),
    ("70B FSDP 32 × TP 8, compile, full AC, batch 16 (async-TP doc)", "zoo:llama3_70b", 16,
     {"every": 1}, "dp_shard=32,tp=8", True, 597.3, False),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", help="also write the table to this file")
    args = ap.parse_args()
    rows = ["| run (torchtitan, H100 96 GB, 500 W) | published tokens/s/GPU | graphcost | "
            "error (time) | collectives exposed |", "|---|---:|---:|---:|---:|"]
    errors = []
    for name, model, batch, ckpt, mesh, compile_, published, fitted in CASES:
        code = CASE.replace("MODEL", repr(model)).replace("BATCH", str(batch)) \
            .replace("CHECKPOINT", repr(ckpt)).replace("MESH", repr(mesh)) \
            .replace("COMPILE", repr(compile_))
        r = run(code)
        if "error" in r:
            rows.append(f"| {name} | {published:,} | {r['error'][:60]} | | |")
            print(rows[-1], flush=True)
            continue
        error = published / r["tps"] - 1   # the step's time: estimated over published
        errors.append((error, fitted))
        rows.append(f"| {name} | {published:,} | {r['tps']:,.0f} | {error:+.1%}"
                    f"{' (fitted)' if fitted else ''} | {r['exposed'] * 1e3:,.0f} ms |")
        print(rows[-1], flush=True)
    checks = sorted(abs(e) for e, fitted in errors if not fitted)
    if checks:
        rows.append("")
        rows.append(f"Rows not fitted: {len(checks)}, largest error {checks[-1]:.1%}.")
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
