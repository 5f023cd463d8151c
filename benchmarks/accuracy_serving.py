"""The serving review against transformers on this CPU: KV cache bytes against the
``past_key_values`` it returns (after the prefill, and after the last decode step), decode
FLOPs per token against FlopCounterMode on the same step (eager attention).

    python -m benchmarks.accuracy_serving [--generate 6]

Prints a Markdown table (README "Serving LLMs"). tests/test_serving.py asserts the same.
"""
from __future__ import annotations

import argparse
import warnings

import torch
from torch.utils.flop_counter import FlopCounterMode

SIZES = [(1, 5), (3, 20)]


def cache_bytes(past) -> int:
    return sum(t.numel() * t.element_size() for layer in past.layers
               for t in (layer.keys, layer.values))


def main() -> None:
    from graphcost import analyze
    from graphcost.models_zoo import hf

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
            ids = torch.randint(3, hf.VOCAB, (batch, prompt + g))
            with torch.no_grad():
                pre = cache_bytes(model(input_ids=ids[:, :prompt], use_cache=True)
                                  .past_key_values)
                past = model(input_ids=ids[:, :-1], use_cache=True).past_key_values
                before = cache_bytes(past)
                counter = FlopCounterMode(display=False)
                with counter:
                    model(input_ids=ids[:, -1:], past_key_values=past, use_cache=True,
                          attention_mask=torch.ones(batch, prompt + g, dtype=torch.long))
            after = cache_bytes(past)
            flops = 2 * round(s.decode.macs_per_token * batch)
            print(f"| hf_{name} | {batch} × {prompt} | {s.prefill.kv_cache_bytes:,} / {pre:,} | "
                  f"{s.kv_cache_bytes:,} / {after:,} | {s.kv_bytes_per_token:,} / "
                  f"{(after - before) // batch:,} | {flops:,} / "
                  f"{counter.get_total_flops():,} |")


if __name__ == "__main__":
    main()
