"""Serving a Mamba 1 hybrid at its published size: Jamba v0.1's config (ai21labs/Jamba-v0.1:
32 layers, attention every 8th, 16 experts top-2 every other layer, 51.6 B parameters) on
8 H100s over tensor parallelism (vLLM's split: frontends/torch/tp_mamba.py), 16 sequences of
2,048 + 256 tokens, built from the config on the meta device.

    python -m benchmarks.bench_recurrent_serve [--prompt 2048] [--tp 8] [--bamba]

Its 28 Mamba 1 scans are traced as the fused kernel vLLM runs (frontends/torch/
fused_scan.py). Traced through transformers' PyTorch fallback, a loop over the prompt's
tokens in each layer, the same analysis ran past 10 minutes (2026-12-07, this machine; at 128
tokens it took 1 min 51 s); with the fused scan, 22 s.

``--bamba``: Bamba-9B's config (ibm-ai-platform/Bamba-9B: 32 layers, attention at 9, 18 and
27, Mamba 2 mixers of 128 heads of 64 and 128 states) on 2 H100s, its chunked scans as
mamba-ssm's kernels: a prefill working peak of 2.60 GiB a GPU, where transformers' fallback
(every chunk's scores per head) read 8.02 GiB (2026-12-07).
"""
from __future__ import annotations

import argparse
import time

JAMBA = dict(attn_layer_offset=4, attn_layer_period=8, expert_layer_offset=1,
             expert_layer_period=2, hidden_size=4096, intermediate_size=14336,
             mamba_conv_bias=True, mamba_d_conv=4, mamba_d_state=16, mamba_dt_rank=256,
             mamba_expand=2, mamba_proj_bias=False, max_position_embeddings=262144,
             num_attention_heads=32, num_experts=16, num_experts_per_tok=2,
             num_hidden_layers=32, num_key_value_heads=8, rms_norm_eps=1e-6,
             tie_word_embeddings=False, vocab_size=65536)
BAMBA = dict(attn_layer_indices=[9, 18, 27], hidden_size=4096, intermediate_size=14336,
             mamba_chunk_size=256, mamba_conv_bias=True, mamba_d_conv=4, mamba_d_head=64,
             mamba_d_state=128, mamba_expand=2, mamba_n_groups=1, mamba_n_heads=128,
             mamba_proj_bias=False, max_position_embeddings=262144, num_attention_heads=32,
             num_hidden_layers=32, num_key_value_heads=8, rms_norm_eps=1e-5,
             tie_word_embeddings=False, vocab_size=128256)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--tp", type=int, default=None, help="default 8 (Jamba), 2 (Bamba)")
    p.add_argument("--bamba", action="store_true", help="Bamba-9B's config instead")
    args = p.parse_args()
    import torch
    import transformers

    from graphcost import analyze
    name = "Bamba-9B" if args.bamba else "Jamba v0.1"
    args.tp = args.tp or (2 if args.bamba else 8)
    with torch.device("meta"):
        model = (transformers.BambaForCausalLM(transformers.BambaConfig(**BAMBA))
                 if args.bamba else
                 transformers.JambaForCausalLM(transformers.JambaConfig(**JAMBA))).to(
            torch.bfloat16)
    start = time.perf_counter()
    r = analyze(model, batch=16, serve={"prompt": args.prompt, "generate": 256,
                                        "engine": "vllm"},
                parallel={"mesh": f"tp={args.tp}"} if args.tp > 1 else None,
                device="h100-sxm")
    took = time.perf_counter() - start
    s = r.serving
    assert s is not None and s.fit is not None and s.time is not None
    print(f"{name}, tp={args.tp}, 16 × ({args.prompt} + 256): weights "
          f"{s.weight_bytes / 2**30:.2f} GiB a GPU, cache {s.kv_cache_bytes / 2**20:.1f} MiB, "
          f"prefill work {s.prefill.peak_bytes / 2**30:.2f} GiB, "
          f"needs {s.fit.needs / 2**30:.2f} GiB; TTFT {s.time.ttft_seconds * 1e3:.0f} ms, "
          f"TPOT {s.time.tpot_seconds * 1e3:.1f} ms; analyzed in {took:.1f} s")


if __name__ == "__main__":
    main()
