"""The serving review against transformers on this CPU: KV cache bytes against the
``past_key_values`` it returns (after the prefill, and after the last decode step), decode
FLOPs per token against FlopCounterMode on the same step (eager attention).

    python -m benchmarks.accuracy_serving [--generate 6]

Prints a Markdown table (README "Serving LLMs"). tests/test_serving.py asserts one row per model (GPT-2 at 1 × 5, Llama and Qwen2 at
3 × 20).
"""
from __future__ import annotations

import argparse
import warnings

import torch

SIZES = [(1, 5), (3, 20)]


def main() -> None:
    from graphcost.analyzer.measure.serving import measure_steps
    from graphcost.models_zoo import hf

    from graphcost import analyze

    p = argparse.ArgumentParser()
    p.add_argument("--generate", type=int, default=6)
    g = p.parse_args().generate
    warnings.filterwarnings("ignore")
    print("| model | batch × prompt | KV after prefill (graphcost / transformers) | KV after "
          "P + G (graphcost / transformers) | KV per token | decode FLOPs per step (2·MACs / "
          "FlopCounterMode) |")
    print("|---|---|---:|---:|---:|---:|")
    for name in ("gpt2", "llama", "qwen2"):
        torch.manual_seed(0)
        model = getattr(hf, name)().eval()
        for batch, prompt in SIZES:
            s = analyze(model, batch=batch, serve={"prompt": prompt, "generate": g}).serving
            real = measure_steps(model, torch.randint(3, hf.VOCAB, (batch, prompt + g)), prompt)
            flops = 2 * round(s.decode.macs_per_token * batch)
            print(f"| hf_{name} | {batch} × {prompt} | {s.prefill.kv_cache_bytes:,} / "
                  f"{real.prefill_cache_bytes:,} | {s.kv_cache_bytes:,} / {real.after_bytes:,} | "
                  f"{s.kv_bytes_per_token:,} / "
                  f"{(real.after_bytes - real.before_bytes) // batch:,} | {flops:,} / "
                  f"{real.decode_flops:,} |")


if __name__ == "__main__":
    main()
