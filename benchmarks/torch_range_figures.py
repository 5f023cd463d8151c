"""The figures of every zoo model on the installed torch, to compare across the supported range.

    python -m benchmarks.torch_range_figures --json figures-2.13.json     # in each venv
    python -m benchmarks.torch_range_figures --compare a.json b.json c.json

Per model (traced with torch.export: `--fx` for the zoo's ONNX-exported ones): params, MACs,
FLOPs, the inference peak, and the training step's peak with AdamW (models that train).
`--compare` prints one row per figure that differs between the files, with each file's torch.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

# Detectors train through a data-dependent loop; llama7b trains in minutes: inference only.
NO_TRAIN = {"fasterrcnn_tiny", "retinanet_tiny", "llama7b"}


def figures(name: str) -> dict:
    from graphcost import analyze

    r = analyze(f"zoo:{name}", zoo_exporter="fx")
    out = {"params": r.totals.params, "macs": r.totals.macs, "flops": r.totals.flops,
           "inference_peak": r.memory.peak_bytes}
    if name not in NO_TRAIN:
        t = analyze(f"zoo:{name}", train=True, optimizer="adamw")
        out["training_peak"] = t.peak_bytes
        out["training_flops"] = t.totals.flops
    return out


def run(path: str) -> None:
    import torch

    from graphcost import models_zoo

    rows, t0 = {}, time.perf_counter()
    for name in models_zoo.names():
        try:
            rows[name] = figures(name)
        except Exception as exc:  # noqa: BLE001 - a model that fails is a row too
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(name, rows[name], file=sys.stderr)
    body = {"torch": torch.__version__, "seconds": round(time.perf_counter() - t0, 1),
            "models": rows}
    with open(path, "w") as f:
        json.dump(body, f, indent=1, sort_keys=True)


def compare(paths: list[str]) -> int:
    runs = [json.load(open(p)) for p in paths]
    print("torch: " + ", ".join(r["torch"] for r in runs))
    differ = 0
    for name in sorted(set().union(*(r["models"] for r in runs))):
        keys = sorted(set().union(*(r["models"].get(name, {}) for r in runs)))
        for key in keys:
            values = [r["models"].get(name, {}).get(key) for r in runs]
            if len(set(map(str, values))) > 1:
                differ += 1
                print(f"{name:16} {key:15} " + "  ".join(f"{v}" for v in values))
    print(f"{differ} figure(s) differ")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write this torch's figures here")
    p.add_argument("--compare", nargs="+", metavar="FILE")
    args = p.parse_args()
    if args.compare:
        return compare(args.compare)
    run(args.json or "torch_range_figures.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
