#!/usr/bin/env python
"""Scaling benchmark: graphcost's whole ONNX analysis vs. onnx.load's parse time.

    python benchmarks/bench_scale.py [--sizes 1000 10000 100000] [--repeat 3] [--profile]
                                     [--dir CACHE_DIR] [--json OUT.json]

1. Generates (once per size; cached when --dir is given, else in a temp dir) deterministic
   synthetic ONNX graphs that look like real exports: a conv stem with a residual conv block
   (Conv/BatchNormalization/Relu), a ViT-like patch embedding (Conv stride 4, Reshape,
   Transpose), then repeated pre-LN transformer blocks (LayerNormalization, MatMul+Add with
   float32 initializer weights, Reshape/Transpose heads, Softmax, erf-GELU as torch exports it,
   residual Adds), a depthwise conv-mixer block every 8 transformer blocks, and a
   Gather+Gemm head. Hidden size 64, sequence 64, input dim 0 is the symbol "batch".
   Generation is not timed.
2. For each size, best of --repeat (time.perf_counter), in this one process:
     * onnx.load(path)                                   -- the baseline (parse only)
     * analyze(path, batch=16) + report.to_json()        -- graphcost end to end
     * the same with the cyclic garbage collector disabled (gc.disable), for its share
     * the stages, called directly: load_model / lower_onnx / run_passes / to_json,
       with lower_onnx split into skeleton / onnx infer_shapes / IR lowering and
       run_passes split into its passes (by wrapping the functions for the breakdown run
       only; graphcost's code is not modified).
   Prints a table, checks growth (µs/node at the largest vs the smallest size) and peak RSS.
3. --profile: cProfile of the largest size's analysis, top 25 by cumulative and by tottime.
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import os
import pstats
import resource
import sys
import tempfile
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import graphcost.analyzer.app.pipeline as pipeline  # noqa: E402
import graphcost.analyzer.frontends.onnx.frontend as onnx_frontend  # noqa: E402
import graphcost.analyzer.frontends.onnx.lowering as onnx_lowering  # noqa: E402
import onnx  # noqa: E402
from graphcost.analyzer.app.api import analyze  # noqa: E402

from benchmarks.synthetic_vit import BATCH, HIDDEN, OPSET, SEQ, ensure_model  # noqa: E402

# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

@contextmanager
def _timed_wrappers(acc: dict[str, float]):
    """Wrap graphcost's sub-stage functions (for the breakdown run only) to time them.

    Only module attributes are swapped, and restored afterwards; no code is changed.
    """
    patches = [
        (onnx.shape_inference, "infer_shapes", "lower.infer_shapes"),  # every call summed
        (onnx_lowering.Lowering, "graph", "lower.ir_lowering"),
        (pipeline, "count_costs", "passes.costs"),
        (pipeline, "count_params", "passes.graph.params"),
        (pipeline, "analyze_liveness", "passes.memory.liveness"),
        (pipeline, "plan_arena", "passes.memory.arena"),
        (pipeline, "check_shapes", "passes.graph.shapes"),
    ]
    saved = []
    for owner, attr, key in patches:
        orig = getattr(owner, attr, None)
        if orig is None:  # graphcost's internals were renamed: that sub-stage reads 0
            continue
        saved.append((owner, attr, orig))

        def wrapper(*a, __orig=orig, __key=key, **kw):
            t = time.perf_counter()
            try:
                return __orig(*a, **kw)
            finally:
                acc[__key] = acc.get(__key, 0.0) + time.perf_counter() - t
        setattr(owner, attr, wrapper)
    try:
        yield
    finally:
        for owner, attr, orig in saved:
            setattr(owner, attr, orig)


def _clock(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def measure(path: Path, repeat: int) -> dict:
    best: dict[str, float] = {}

    def keep(key: str, dt: float) -> None:
        best[key] = min(best.get(key, math.inf), dt)

    n_nodes = None
    for _ in range(repeat):
        # Baseline: protobuf parse of the whole file (weights included).
        gc.collect()
        dt, m = _clock(lambda: onnx.load(str(path)))
        keep("onnx_load", dt)
        n_nodes = len(m.graph.node)
        del m

        # graphcost end to end.
        gc.collect()
        dt, js = _clock(lambda: analyze(str(path), batch=BATCH).to_json())
        keep("graphcost", dt)
        json_bytes = len(js)
        del js

        # The same with the cyclic GC paused: how much of the time is collector work.
        gc.collect()
        gc.disable()
        try:
            dt, js = _clock(lambda: analyze(str(path), batch=BATCH).to_json())
        finally:
            gc.enable()
        keep("graphcost_gc_off", dt)
        del js

        # Stage breakdown, calling the stages directly.
        gc.collect()
        sub: dict[str, float] = {}
        with _timed_wrappers(sub):
            dt, proto = _clock(lambda: onnx_frontend.load_model(path))
            keep("load_model", dt)
            dt, graph = _clock(partial(onnx_frontend.lower_onnx, proto, name=path.name,
                                       batch=BATCH))
            keep("lower_onnx", dt)
            del proto
            dt, report = _clock(partial(pipeline.run_passes, graph))
            keep("run_passes", dt)
            dt, _js = _clock(report.to_json)
            keep("to_json", dt)
            body = report.to_dict()  # json's C encoder alone, on the report's plain values
            dt, _ = _clock(partial(json.dumps, body, ensure_ascii=False, separators=(",", ":")))
            keep("json.dumps", dt)
            del body
        for k, v in sub.items():
            keep(k, v)
        del graph, report, _js
    # Remainders (best-of values are not additive exactly, but close enough to read).
    best["lower.skeleton+bind"] = max(0.0, best["lower_onnx"] - best.get("lower.infer_shapes", 0)
                                      - best.get("lower.ir_lowering", 0))
    passes = sum(v for k, v in best.items() if k.startswith("passes."))
    best["passes.assemble_report"] = max(0.0, best["run_passes"] - passes)
    best["nodes"] = n_nodes
    best["json_mb"] = json_bytes / 1e6
    return best


def profile(path: Path, top: int = 25) -> None:
    gc.collect()
    pr = cProfile.Profile()
    pr.enable()
    analyze(str(path), batch=BATCH).to_json()
    pr.disable()
    for key in ("cumulative", "tottime"):
        s = io.StringIO()
        st = pstats.Stats(pr, stream=s)
        st.strip_dirs().sort_stats(key).print_stats(top)
        print(f"\n--- cProfile of analyze()+to_json() on {path.name}: top {top} by {key} ---")
        # Skip the pstats preamble lines up to the column header.
        text = s.getvalue()
        start = text.find("   ncalls")
        print(text[start if start >= 0 else 0:].rstrip())


# --------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000],
                    help="approximate node counts (default: 1000 10000 100000)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N (default 3)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the largest size's analysis (top 25 cumulative / tottime)")
    ap.add_argument("--dir", type=Path, default=None,
                    help="cache directory for the generated .onnx files (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    args = ap.parse_args(argv)

    sizes = sorted(set(args.sizes))
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="graphcost-bench-")
        directory = Path(tmp.name)
    else:
        directory = args.dir
        directory.mkdir(parents=True, exist_ok=True)

    print(f"graphcost bench_scale: python {sys.version.split()[0]}, onnx {onnx.__version__}, "
          f"cpus {os.cpu_count()}, loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"models in {directory} (hidden {HIDDEN}, seq {SEQ}, opset {OPSET}, batch bound to "
          f"{BATCH}); best of {args.repeat}")
    newest = max((f for d in ("analyzer", "passes") for f in (ROOT / d).rglob("*.py")),
                 key=lambda f: f.stat().st_mtime)
    print(f"graphcost sources: newest {newest.relative_to(ROOT)} modified "
          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(newest.stat().st_mtime))}; "
          f"run started {time.strftime('%Y-%m-%d %H:%M:%S')}")
    paths = {n: ensure_model(directory, n) for n in sizes}

    results = []
    for n in sizes:
        r = measure(paths[n], args.repeat)
        r["target"] = n
        r["file_mb"] = paths[n].stat().st_size / 1e6
        results.append(r)
        print(f"  measured {n}: {r['nodes']} nodes, graphcost {r['graphcost']:.3f} s, "
              f"onnx.load {r['onnx_load']:.3f} s", flush=True)

    print()
    hdr = (f"{'nodes':>8} {'file MB':>8} {'onnx.load s':>11} {'graphcost s':>11} "
           f"{'ratio':>6} {'µs/node':>8} {'load_model':>10} {'lower_onnx':>10} "
           f"{'run_passes':>10} {'to_json':>8} {'gc-off s':>8}")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        print(f"{r['nodes']:>8} {r['file_mb']:>8.1f} {r['onnx_load']:>11.3f} "
              f"{r['graphcost']:>11.3f} {r['graphcost'] / r['onnx_load']:>6.2f} "
              f"{1e6 * r['graphcost'] / r['nodes']:>8.1f} {r['load_model']:>10.3f} "
              f"{r['lower_onnx']:>10.3f} {r['run_passes']:>10.3f} {r['to_json']:>8.3f} "
              f"{r['graphcost_gc_off']:>8.3f}")

    sub_keys = ["lower.skeleton+bind", "lower.infer_shapes", "lower.ir_lowering",
                "passes.costs", "passes.graph.params", "passes.memory.liveness", "passes.memory.arena",
                "passes.graph.shapes", "passes.assemble_report"]
    print("\nsub-stages (s, best of repeat):")
    print(f"{'nodes':>8} " + " ".join(f"{k.split('.', 1)[1]:>14}" for k in sub_keys))
    for r in results:
        print(f"{r['nodes']:>8} " + " ".join(f"{r.get(k, 0.0):>14.4f}" for k in sub_keys))
    print("(lower.* sum to lower_onnx, passes.* to run_passes; gc-off s = graphcost s with "
          "gc.disable(); JSON output "
          + ", ".join(f"{r['json_mb']:.1f} MB" for r in results) + ")")

    if len(results) >= 2:
        a, z = results[0], results[-1]
        ua, uz = a["graphcost"] / a["nodes"], z["graphcost"] / z["nodes"]
        la, lz = a["onnx_load"] / a["nodes"], z["onnx_load"] / z["nodes"]
        expo = math.log(z["graphcost"] / a["graphcost"]) / math.log(z["nodes"] / a["nodes"])
        print(f"\ngrowth {a['nodes']} -> {z['nodes']} nodes: graphcost µs/node "
              f"{1e6 * ua:.1f} -> {1e6 * uz:.1f} (x{uz / ua:.2f}); onnx.load µs/node "
              f"{1e6 * la:.1f} -> {1e6 * lz:.1f} (x{lz / la:.2f}); time ~ nodes^{expo:.2f}")
        print("  linear" if uz / ua < 1.5 else "  SUPERLINEAR (µs/node grew > 1.5x)",
              "growth; target ratio <= 2.0 at the largest size:",
              "met" if z["graphcost"] / z["onnx_load"] <= 2.0 else
              f"NOT met ({z['graphcost'] / z['onnx_load']:.2f}x)")
        floor = z["load_model"] + z.get("lower.infer_shapes", 0) + z["json.dumps"]
        print(f"  the dependencies' own share at the largest size: load_model (protobuf's "
              f"parse) {z['load_model']:.3f} + ONNX's C++ infer_shapes "
              f"{z.get('lower.infer_shapes', 0):.3f} + json.dumps of the report "
              f"{z['json.dumps']:.3f} = {floor:.3f} s = {floor / z['onnx_load']:.2f}x "
              "onnx.load, before any Python work per node")

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(f"\npeak RSS of this process: {rss / 1024:.0f} MiB")

    if args.json:
        args.json.write_text(json.dumps({"results": results, "peak_rss_mib": rss / 1024},
                                        indent=1))
    if args.profile:
        profile(paths[sizes[-1]])
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
