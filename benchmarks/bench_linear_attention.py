"""Qwen3.5's gated delta rule traced as eager runs it (a triangular solve) against the branch
transformers takes under torch.export (forward substitution in a Python loop).

    python -m benchmarks.bench_linear_attention [--seq 4096] [--train]

transformers' default ``Qwen3_5TextConfig`` (32 layers, three gated-delta layers to one
full-attention layer; 8,953,803,264 parameters) on the meta device, analyzed twice in one
process: as graphcost traces it (``transformers_tracing.eager_paths``) and with the gated
delta rule left on its export branch. The table gives the time, the nodes, 2·MACs and the
memory peak (inference, or the AdamW step's with ``--train``). The first analysis pays for
torch's first export, so the eager branch runs first and is the one it slows.
"""
from __future__ import annotations

import argparse
import contextlib
import time


def measure(seq: int, train: bool) -> list[tuple]:
    import graphcost.analyzer.frontends.torch.transformers_tracing as tracing
    import torch
    import transformers

    from graphcost import analyze
    with torch.device("meta"):
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(use_cache=False))
    kw = dict(input_shapes={"input_ids": (1, seq)}, input_dtypes={"input_ids": torch.int64},
              train=train, optimizer="adamw" if train else "none")
    rows, eager = [], tracing._eager_solves
    for label in ("eager branch", "export branch"):
        if label == "export branch":
            tracing._eager_solves = contextlib.nullcontext
        try:
            start = time.perf_counter()
            r = analyze(model, **kw)
            seconds = time.perf_counter() - start
        finally:
            tracing._eager_solves = eager
        peak = r.training.peak_bytes if train else r.memory.peak_bytes
        rows.append((label, seconds, len(r.nodes), 2 * r.totals.macs, peak))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--train", action="store_true")
    args = parser.parse_args(argv)
    print(f"{'traced':14} {'s':>7} {'nodes':>8} {'2·MACs':>20} {'peak B':>16}")
    for label, seconds, nodes, flops, peak in measure(args.seq, args.train):
        print(f"{label:14} {seconds:7.1f} {nodes:8,} {flops:20,} {peak:16,}")


if __name__ == "__main__":
    main()
