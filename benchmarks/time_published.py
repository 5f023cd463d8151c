"""graphcost's step time against published runs (docs/time.md, "How well it holds: published
runs"): the datasheet estimate of passes/device/gpu_engine.py, whose two fitted constants were
set on the first two rows, and every other published row graphcost's layouts can express as a
check.

    python -m benchmarks.time_published [--markdown benchmarks/results/time_published.md]

torchtitan (pytorch/torchtitan, benchmarks/): llama3_h100_202412_torchtitan.md (Tables 1 and
3: Llama 3.1 8B, FSDP 8 and 128, local batch 2, selective op AC, eager, torch.compile and
torch.compile with float8; Table 2: FSDP × CP with float8, full AC, local batch 1, sequences
of 32k to 256k) and
asyncTP_llama3_h100_2025-06_torchtitan.md (bfloat16, torch.compile, vanilla and async TP: 70B
FSDP 32 × TP 8, full AC, local batch 16; 8B FSDP 8 × TP 8, op SAC, local batch 12). All on
H100 SXM5 96 GB HBM2e at 500 W (device ``h100-96gb``), sequence 8,192 (torchtitan's llama3
configs), bf16 parameters with fp32 reduction (FSDP2's MixedPrecisionPolicy), AdamW.

Megatron-LM (NVIDIA/Megatron-LM, README's model table): GPT models on H100 SXM, each step
priced as the zoo decoder of that shape under FSDP × TP with torch.compile's fusion standing
in for Transformer Engine's kernels and async TP for --tp-comm-overlap (``MEGATRON``).

Megatron's 70B to 462B rows run pipeline stages beside TP 8 and DP 48. graphcost expresses the
layout only as torchtitan runs it, which these rows do not: they are priced and shown, but
counted apart from the checks (``PIPELINE_GAP``). The table gives neither the schedule nor the
micro-batch size, so they are priced as 1F1B over micro-batches of one sequence (Megatron's
``--micro-batch-size 1`` as its GPT examples set it); an interleaved schedule
(``--num-layers-per-virtual-pipeline-stage``; graphcost's ``interleaved-1f1b``, not assumed as
the table does not say) would shrink the bubble — (p − 1)/(m + p − 1) is 11% at PP 2 × 8
micro-batches, 19% at PP 16 × 64 — and Megatron's ``--overlap-grad-reduce``
reduce-scatters each bucket of gradients during the last micro-batch's backward, where
torchtitan's fully_shard beside a pipeline reduces them all after it, exposed (0.5 s of the
70B row's 3.0 s, over InfiniBand across 48 nodes).

Float8 rows (``--float8 tensorwise``: torchao's dynamic tensorwise scaling, its default when
those runs were made, without FSDP's float8 all-gather, which the tables do not say was on
and torchtitan's config left off by default): Tables 1, 2 (with context parallelism) and 3,
and beside tensor parallelism (torchao's float8 styles: ``PrepareFloat8ModuleInput`` gathers
each attention and MLP input in float8) Table 4 (70B FSDP 32 × TP 8, 2D and 2D + async TP)
and the async-TP document's tensorwise rows (8B and 70B); its rowwise rows are not
expressible (torchao's float8 styles are tensorwise's). Table 5 (torchtitan's 405B FSDP 8 ×
TP 8 × PP 8 with float8 and async TP, 1F1B and interleaved 1F1B, local batch 32 in 32
micro-batches) is a pipeline band of its own; Table 6 (× CP) is not a row yet.
"""
from __future__ import annotations

import argparse

from benchmarks.child import run

CASE = r"""
import json
import graphcost.models_zoo.llama as zoo
from graphcost import analyze
SHAPE
r = analyze(MODEL, batch=BATCH, dims={"seq": SEQ}, train=True, optimizer="adamw",
            precision="bf16-master", checkpoint=CHECKPOINT, device=DEVICE,
            what_if=False, parallel=PARALLEL, compile=COMPILE, float8=FLOAT8)
t = r.time
fit = r.roofline.fit
print(json.dumps(dict(seconds=t.seconds, tps=t.tokens_per_second, mfu=t.mfu,
                      exposed=t.communication_seconds, band=t.band,
                      reserved=r.peak.reserved_bytes and r.peak.reserved_bytes / 2 ** 30,
                      needs=fit.needs / 2 ** 30)))
"""

# torchtitan: (name, model, local batch, sequence, checkpoint, parallel, compile, float8
# recipe, published tokens/s per GPU, published memory in GiB (max reserved; None: not
# published), fitted (True), a row apart ("cp", "pp": a band of its own) or a check (False))
TORCHTITAN = [
    ("8B FSDP 8, eager (Table 1)", "zoo:llama3_8b", 2, 8192, {"sac": True},
     {"mesh": "dp_shard=8"}, False, None, 5762, 82.4, True),
    ("8B FSDP 8, compile (Table 1)", "zoo:llama3_8b", 2, 8192, {"sac": True},
     {"mesh": "dp_shard=8"}, True, None, 6667, 77.0, True),
    ("8B FSDP 8, compile, float8 (Table 1)", "zoo:llama3_8b", 2, 8192, {"sac": True},
     {"mesh": "dp_shard=8"}, True, "tensorwise", 8532, 76.8, False),
    ("8B FSDP 128, eager (Table 3)", "zoo:llama3_8b", 2, 8192, {"sac": True},
     {"mesh": "dp_shard=128"}, False, None, 5605, 67.0, False),
    ("8B FSDP 128, compile (Table 3)", "zoo:llama3_8b", 2, 8192, {"sac": True},
     {"mesh": "dp_shard=128"}, True, None, 6514, 62.0, False),
    ("8B FSDP 128, compile, float8 (Table 3)", "zoo:llama3_8b", 2, 8192, {"sac": True},
     {"mesh": "dp_shard=128"}, True, "tensorwise", 8380, 61.8, False),
    *((f"8B FSDP {8 // cp}, CP {cp}, seq {seq:,}, compile, float8, full AC (Table 2)",
       "zoo:llama3_8b", 1, seq, {"every": 1}, {"mesh": f"dp_shard={8 // cp}" + (f",cp={cp}" if cp > 1 else "")}, True,
       "tensorwise", tps, gib, "cp" if cp > 1 else False)
      for cp, seq, tps, gib in ((1, 32768, 3890, 83.9), (2, 65536, 2540, 84.2),
                                (4, 131072, 1071, 84.0), (8, 262144, 548, 84.5))),
    ("8B FSDP 8 × TP 8, compile, batch 12 (async-TP doc)", "zoo:llama3_8b", 12, 8192,
     {"sac": True}, {"mesh": "dp_shard=8,tp=8"}, True, None, 4378, None, False),
    ("the same with async TP", "zoo:llama3_8b", 12, 8192, {"sac": True},
     {"mesh": "dp_shard=8,tp=8", "async_tp": True}, True, None, 4809.4, None, False),
    ("70B FSDP 32 × TP 8, compile, full AC, batch 16 (async-TP doc)", "zoo:llama3_70b", 16,
     8192, {"every": 1}, {"mesh": "dp_shard=32,tp=8"}, True, None, 597.3, None, False),
    ("the same with async TP", "zoo:llama3_70b", 16, 8192, {"every": 1},
     {"mesh": "dp_shard=32,tp=8", "async_tp": True}, True, None, 652.4, None, False),
    # float8 beside tensor parallelism (torchao's float8 styles, tensorwise)
    ("70B FSDP 32 × TP 8, compile, float8, full AC (Table 4)", "zoo:llama3_70b", 16, 8192,
     {"every": 1}, {"mesh": "dp_shard=32,tp=8"}, True, "tensorwise", 829, 71.9, False),
    ("the same with async TP (Table 4)", "zoo:llama3_70b", 16, 8192, {"every": 1},
     {"mesh": "dp_shard=32,tp=8", "async_tp": True}, True, "tensorwise", 876, 67.6, False),
    ("8B FSDP 8 × TP 8, compile, float8, batch 12 (async-TP doc)", "zoo:llama3_8b", 12, 8192,
     {"sac": True}, {"mesh": "dp_shard=8,tp=8"}, True, "tensorwise", 5078.1, None, False),
    ("the same with async TP", "zoo:llama3_8b", 12, 8192, {"sac": True},
     {"mesh": "dp_shard=8,tp=8", "async_tp": True}, True, "tensorwise", 5570.1, None, False),
    ("70B FSDP 32 × TP 8, compile, float8, full AC, batch 16 (async-TP doc)",
     "zoo:llama3_70b", 16, 8192, {"every": 1}, {"mesh": "dp_shard=32,tp=8"}, True,
     "tensorwise", 809.8, None, False),
    ("the same with async TP", "zoo:llama3_70b", 16, 8192, {"every": 1},
     {"mesh": "dp_shard=32,tp=8", "async_tp": True}, True, "tensorwise", 942.4, None, False),
    # pipelines: a band of their own (passes/device/gpu_engine.py PIPELINE_RUNS)
    *((f"405B FSDP 8 × TP 8 × PP 8, {name}, compile, float8, async TP, full AC (Table 5)",
       "zoo:llama3_405b", 32, 8192, {"every": 1},
       {"mesh": "pp=8,dp_shard=8,tp=8", "microbatches": 32, "schedule": schedule,
        "async_tp": True}, True, "tensorwise", tps, gib, "pp")
      for name, schedule, tps, gib in (("1F1B", "1f1b", 100, 82.5),
                                       ("interleaved 1F1B", "interleaved-1f1b", 128, 72.7))),
]

# Megatron-LM's README model table (images/model_table.png, added 2024-07-15 in f2e5db402c):
# GPT models, vocabulary 131,072, sequence 4,096, DP 48, H100 SXM; (name, hidden, heads,
# layers, TP, PP, global batch in sequences, per-GPU TFLOP/s)
MEGATRON = [("1.7B", 2048, 16, 24, 1, 1, 192, 408.8), ("7.1B", 4096, 32, 30, 2, 1, 192, 465.9),
            ("16B", 6144, 48, 32, 4, 1, 192, 489.1), ("32B", 7168, 56, 48, 8, 1, 192, 459.6),
            ("70B", 8192, 64, 84, 8, 2, 384, 419.7), ("119B", 10240, 80, 92, 8, 4, 768, 420.5),
            ("177B", 12288, 96, 96, 8, 6, 1152, 432.8),
            ("314B", 16384, 128, 96, 8, 8, 1536, 474.4),
            ("462B", 18432, 144, 112, 8, 16, 3072, 459.9)]
VOCAB, SEQ, DP = 131072, 4096, 48
PIPELINE_GAP = ("priced as torchtitan runs a pipeline beside FSDP (1F1B; the gradients "
                "reduced after the last backward, exposed), not as Megatron runs it")


def megatron_flops(h: int, layers: int, sequences: int) -> float:
    """A global batch's FLOPs as Megatron-LM counted them for that table (megatron/training/
    training.py ``num_floating_point_operations`` at f2e5db402c: a GELU MLP of 4h, every
    attention score counted, as graphcost's FLOPs count them)."""
    return 12 * sequences * SEQ * layers * h * h * ((1 + 1 + SEQ / h) + 4
                                                     + VOCAB / (2 * layers * h))


def megatron_shape(h: int, heads: int, layers: int) -> str:
    """The stand-in: the zoo's decoder with that table's shape, its SwiGLU MLP of 8h/3 (to a
    multiple of 64) doing a 4h GELU MLP's matmul FLOPs, RMSNorm and RoPE for LayerNorm and
    learned positions, an untied output layer; built in place of the zoo's 8B."""
    ffn = round(8 * h / 3 / 64) * 64
    return (f"zoo.LLAMA3['8b'] = zoo.LlamaConfig(vocab_size={VOCAB}, d_model={h}, "
            f"n_layer={layers}, n_head={heads}, n_kv_head={heads}, ffn={ffn}, "
            f"max_seq={SEQ}, rope_base=10000.0)")


def _code(model, batch, seq, ckpt, parallel, compile_, device, shape="",
          float8=None) -> str:
    return CASE.replace("SHAPE", shape).replace("MODEL", repr(model)) \
        .replace("BATCH", str(batch)).replace("SEQ", str(seq)) \
        .replace("CHECKPOINT", repr(ckpt)).replace("PARALLEL", repr(parallel)) \
        .replace("COMPILE", repr(compile_)).replace("DEVICE", repr(device)) \
        .replace("FLOAT8", repr(float8))


def torchtitan_rows(errors: list) -> list[str]:
    rows = ["| run (torchtitan, H100 96 GB, 500 W) | published tokens/s/GPU | graphcost | "
            "error (time) | collectives exposed | reserved: published | graphcost |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for (name, model, batch, seq, ckpt, parallel, compile_, float8, published, gib,
         fitted) in TORCHTITAN:
        r = run(_code(model, batch, seq, ckpt, parallel, compile_, "h100-96gb",
                      float8=float8))
        if "error" in r:
            rows.append(f"| {name} | {published:,} | {r['error'][:60]} | | | | |")
            continue
        error = published / r["tps"] - 1   # the step's time: estimated over published
        # (the same tokens a GPU a step on both sides: a context-parallel rank's is its shard)
        errors.append((error, fitted))
        # (a pipeline's allocator is not replayed: its fit's need, reserved + the runtime's
        # share, the largest stage's)
        ours = f"{r['reserved']:.1f} GiB" if r["reserved"] else f"{r['needs']:.1f} GiB needed"
        memory = f"{gib} GiB | {ours}" if gib else " | "
        rows.append(f"| {name} | {published:,} | {r['tps']:,.0f} | {error:+.1%}"
                    f"{' (fitted)' if fitted is True else ''} | {r['exposed'] * 1e3:,.0f} ms | "
                    f"{memory} |")
        print(rows[-1], flush=True)
    return rows


def megatron_rows(errors: list) -> list[str]:
    rows = ["| Megatron-LM (H100 SXM) | TP × PP × DP | published TFLOP/s/GPU | step: published | "
            "graphcost | error |", "|---|---|---:|---:|---:|---:|"]
    for name, h, heads, layers, tp, pp, sequences, tflops in MEGATRON:
        parallel = {"mesh": f"dp_shard={DP}" + (f",tp={tp}" if tp > 1 else "")
                    + (f",pp={pp}" if pp > 1 else "")}
        parallel |= {"async_tp": True} if tp > 1 else {}   # (--tp-comm-overlap)
        r = run(_code("zoo:llama3_8b", sequences // DP, SEQ, None, parallel, True, "h100-sxm",
                      megatron_shape(h, heads, layers)))
        published = megatron_flops(h, layers, sequences) / (tflops * 1e12 * DP * tp * pp)
        layout = f"{tp} × {pp} × {DP}"
        if "error" in r:
            rows.append(f"| {name} | {layout} | {tflops} | {published:.3f} s | "
                        f"{r['error'][:60]} | |")
            continue
        error = r["seconds"] / published - 1
        errors.append((error, "apart" if pp > 1 else False))
        rows.append(f"| {name} | {layout} | {tflops} | {published:.3f} s | "
                    f"{r['seconds']:.3f} s | {error:+.1%}{' †' if pp > 1 else ''} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", help="also write the tables to this file")
    args = ap.parse_args()
    errors: list = []
    rows = torchtitan_rows(errors) + [""] + megatron_rows(errors)
    checks = sorted(abs(e) for e, fitted in errors if fitted is False)
    apart = [e for e, fitted in errors if fitted == "apart"]
    for kind, what, runs in (("cp", "Context-parallel", "CONTEXT_PARALLEL_RUNS"),
                             ("pp", "Pipeline", "PIPELINE_RUNS")):
        own = [e for e, fitted in errors if fitted == kind]
        if own:
            rows += ["", f"{what} rows: a band of their own (passes/device/gpu_engine.py "
                     f"{runs}; errors {min(own):+.1%} to {max(own):+.1%})."]
    if apart:
        rows += ["", f"† Not counted: {PIPELINE_GAP} (errors {min(apart):+.1%} to "
                 f"{max(apart):+.1%}; benchmarks/time_published.py says how)."]
    if checks:
        within = sum(e <= 0.15 for e in checks)
        rows += ["", f"Rows not fitted: {len(checks)}; within ±15%: {within}; largest error "
                 f"{checks[-1]:.1%}; 90th percentile "
                 f"{checks[min(len(checks) - 1, -(-9 * len(checks) // 10) - 1)]:.1%}."]
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
