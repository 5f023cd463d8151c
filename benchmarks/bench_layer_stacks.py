"""Stacks with a head or a tail, traced as three blocks and grown, against their full trace.

    python -m benchmarks.bench_layer_stacks [--seq 512] [--only NAME]

Each model is built from its published config's shapes (transformers' own class, meta device,
no weights) and analyzed twice in one process: grown (layer_stack.py keeps the layers unlike
the blocks, three blocks and the tail) and with ``all_layers=True`` (every layer traced). The
table gives both times, the layers traced, and whether parameters, MACs and the memory peak
are the same. The first analysis pays for torch's first export, so the grown one runs first
and is the one it slows.
"""
from __future__ import annotations

import argparse
import time

MODELS = {
    # https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json: a dense first
    # layer, 26 of 64 routed experts (6 a token) and 2 shared; 15,706,484,224 parameters
    "DeepSeek-V2-Lite": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
        n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1,
        kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, n_group=1, topk_group=1, max_position_embeddings=163840)),
    # google/gemma-3-27b-it's text_config: 62 layers, five sliding and one full, ten times, two
    # sliding after them
    "Gemma-3-27B text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        vocab_size=262208, hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
        num_attention_heads=32, num_key_value_heads=16, head_dim=128, sliding_window=1024,
        query_pre_attn_scalar=168, max_position_embeddings=131072)),
    # google/gemma-3-1b-pt: 26 layers (four periods of six and two); 999,885,952 parameters
    "Gemma-3-1B": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
        query_pre_attn_scalar=256, max_position_embeddings=32768)),
}


def measure(name: str, seq: int) -> dict:
    import torch
    import transformers

    from graphcost import analyze
    config_class, model_class, config = MODELS[name]
    with torch.device("meta"):
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    kw = dict(input_shapes={"input_ids": (1, seq)}, input_dtypes={"input_ids": torch.int64})
    out = {}
    for label, whole in (("grown", False), ("whole", True)):
        start = time.perf_counter()
        out[label] = analyze(model, all_layers=whole, **kw)
        out[label + "_s"] = time.perf_counter() - start
    a, b = out["grown"], out["whole"]
    same = (a.totals.params, a.totals.macs, a.memory.peak_bytes) == \
        (b.totals.params, b.totals.macs, b.memory.peak_bytes)
    return dict(name=name, grown_s=out["grown_s"], whole_s=out["whole_s"], same=same,
                params=a.totals.params, traced=a.traced_layers.split(";")[0])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--only", choices=list(MODELS))
    args = parser.parse_args(argv)
    print(f"{'model':18} {'traced':26} {'grown s':>8} {'whole s':>8}  same  params")
    for name in [args.only] if args.only else MODELS:
        r = measure(name, args.seq)
        print(f"{r['name']:18} {r['traced']:26} {r['grown_s']:8.1f} {r['whole_s']:8.1f}  "
              f"{'yes' if r['same'] else 'NO':4}  {r['params']:,}")


if __name__ == "__main__":
    main()
