"""The serving review of the Llama-2-7B-shaped zoo model, timed as a user runs it:

    python -m benchmarks.bench_serve_llama7b [--prompt 2048] [--generate 256]
                                             [--device a100-80gb] [--check-full]

1. ``graphcost zoo:llama7b --serve --prompt P --generate G --device D --format json`` in a
   fresh process (torch import included), wall-clock time printed; the issue's target is
   15 s. Repeated three times; the median is the figure.
2. The decode time per token at batch 1 against its bound, (weight bytes + KV bytes) /
   bandwidth: every weight and every cached byte read once per generated token.
3. ``--check-full`` (about a minute): the same two steps traced with all 32 layers, and
   compared node for node (ops, scopes, output shapes), and by totals and memory timeline,
   with the three-layer trace grown to 32 (analyzer/frontends/torch/repeat_layers.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def run_cli(args: list[str]) -> tuple[float, dict]:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "graphcost", *args], check=True,
                         capture_output=True, text=True).stdout
    return time.perf_counter() - t, json.loads(out)


def check_full(prompt: int, generate: int) -> None:
    import torch
    from graphcost.analyzer.app.pipeline import run_passes
    from graphcost.analyzer.frontends.torch.serve import capture
    from graphcost.models_zoo import get

    with torch.device("meta"):
        model = get("llama7b").build().eval()
    t = time.perf_counter()
    grown = capture(model, batch=1, prompt=prompt, generate=generate, name="llama7b")
    t_grown = time.perf_counter() - t
    full = capture(model, batch=1, prompt=prompt, generate=generate, name="llama7b",
                   repeat_at=0)
    t_full = time.perf_counter() - t - t_grown
    print(f"traces: 3 layers grown to 32 in {t_grown:.1f} s, all 32 layers in {t_full:.1f} s")
    for phase in ("prefill", "decode"):
        a, b = getattr(grown, phase), getattr(full, phase)
        same_nodes = [(n.op, n.scope, tuple(a.spec(o) for o in n.outputs)) for n in a.nodes] \
            == [(n.op, n.scope, tuple(b.spec(o) for o in n.outputs)) for n in b.nodes]
        ra, rb = run_passes(a), run_passes(b)
        print(f"  {phase}: {len(a.nodes):,} nodes; same ops, scopes and shapes: {same_nodes}; "
              f"same totals: {ra.totals == rb.totals}; same memory timeline: "
              f"{ra.memory.timeline == rb.memory.timeline}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--generate", type=int, default=256)
    p.add_argument("--device", default="a100-80gb")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--check-full", action="store_true")
    a = p.parse_args()
    cmd = ["zoo:llama7b", "--serve", "--prompt", str(a.prompt), "--generate", str(a.generate),
           "--device", a.device, "--format", "json"]
    times = []
    for _ in range(a.repeat):
        seconds, report = run_cli(cmd)
        times.append(seconds)
    s = report["serving"]
    d = s["decode"]
    print(f"graphcost {' '.join(cmd)}")
    print(f"  wall time: median {statistics.median(times):.1f} s of "
          f"{', '.join(f'{x:.1f}' for x in times)} (target ≤ 15 s)")
    print(f"  weights {s['weight_bytes']:,} B, KV cache {s['kv_cache_bytes']:,} B "
          f"({s['kv_bytes_per_token']:,} B per token), {s['traced_layers']}")
    bound = d["bandwidth_bound_seconds"]
    print(f"  decode at batch 1: {d['seconds_per_token'] * 1e3:.2f} ms/token (roofline of the "
          f"traced step) vs (weights + KV) / bandwidth = {bound * 1e3:.2f} ms: "
          f"{100 * (d['seconds_per_token'] / bound - 1):+.1f}% (target within 10%)")
    print(f"  prefill {s['prefill']['seconds']:.3f} s ({s['prefill']['bound']}-bound); "
          f"max {s['max_concurrent_sequences']} sequences, max context {s['max_context']:,}")
    if a.check_full:
        check_full(a.prompt, a.generate)


if __name__ == "__main__":
    main()
