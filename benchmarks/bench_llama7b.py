"""Inference analysis of the Llama-2-7B-shaped zoo model on the meta device, next to
torch.utils.flop_counter.FlopCounterMode over the same model, in one run.

    python benchmarks/bench_llama7b.py [--seq 2048] [--batch 1] [--hf]

``--hf``: transformers' own ``LlamaForCausalLM(LlamaConfig())`` (its defaults are the
Llama-2-7B shape), built on the meta device, instead of the zoo's plain-torch model.

Each side runs in a fresh subprocess so its time and peak RSS are its own (torch import
included in both; the import time is printed separately).
"""
from __future__ import annotations

import argparse

from benchmarks.child import run

GRAPHCOST = """
import time, resource, json, sys
t0 = time.perf_counter()
import torch
t_import = time.perf_counter() - t0
from graphcost import analyze
{build}
r = analyze(model, (ids,)) if model is not None else \
    analyze("zoo:llama7b", batch={batch}, dims={{"seq": {seq}}})
out = r.to_json()
print(json.dumps(dict(seconds=time.perf_counter() - t0, torch_import=t_import,
                      rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      params=r.totals.params, macs=r.totals.macs, flops=r.totals.flops,
                      peak=r.memory.peak_bytes, nodes=len(r.nodes))))
"""

FLOP_COUNTER = """
import time, resource, json
t0 = time.perf_counter()
import torch
t_import = time.perf_counter() - t0
from torch.utils.flop_counter import FlopCounterMode
from torch.nn.attention import sdpa_kernel, SDPBackend
from graphcost import models_zoo
{build}
model = model if model is not None else models_zoo.build_model("llama7b")
counter = FlopCounterMode(display=False)
with counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
    model(ids)
print(json.dumps(dict(seconds=time.perf_counter() - t0, torch_import=t_import,
                      rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      flops=counter.get_total_flops())))
"""




ZOO = """
ids = torch.zeros(({batch}, {seq}), dtype=torch.long, device="meta")
model = None
"""
HF = """
from transformers import LlamaConfig, LlamaForCausalLM
ids = torch.zeros(({batch}, {seq}), dtype=torch.long, device="meta")
with torch.device("meta"):
    model = LlamaForCausalLM(LlamaConfig(attn_implementation="sdpa")).eval()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hf", action="store_true", help="transformers' LlamaForCausalLM")
    a = ap.parse_args()
    build = (HF if a.hf else ZOO).format(batch=a.batch, seq=a.seq)
    g = run(GRAPHCOST.format(batch=a.batch, seq=a.seq, build=build))
    f = run(FLOP_COUNTER.format(batch=a.batch, seq=a.seq, build=build))
    for side, out in (("graphcost", g), ("FlopCounterMode", f)):
        if "error" in out:
            raise SystemExit(f"{side} failed: {out['error']}")
    which = "transformers LlamaForCausalLM" if a.hf else "zoo llama7b"
    print(f"{which} (meta device), batch {a.batch}, seq {a.seq}")
    print(f"{'':28s}{'time s':>9s}{'of which torch import':>23s}{'peak RSS MB':>13s}")
    print(f"{'graphcost analyze + JSON':28s}{g['seconds']:9.2f}{g['torch_import']:23.2f}"
          f"{g['rss_mb']:13.0f}")
    print(f"{'FlopCounterMode forward':28s}{f['seconds']:9.2f}{f['torch_import']:23.2f}"
          f"{f['rss_mb']:13.0f}")
    print(f"params {g['params']:,}; nodes {g['nodes']:,}; MACs {g['macs']:,}; "
          f"inference peak {g['peak'] / 2**20:,.0f} MiB")
    print(f"2·MACs {2 * g['macs']:,} vs FlopCounterMode {f['flops']:,}: "
          f"{'equal' if 2 * g['macs'] == f['flops'] else 'DIFFERENT'}")
    limit = 8 if a.hf else 10  # #13: transformers' Llama-2-7B in 8 s
    print(f"targets: graphcost <= {limit} s and < 1 GB RSS: "
          + ("met" if g["seconds"] <= limit and g["rss_mb"] < 1024 else "NOT met"))


if __name__ == "__main__":
    main()
