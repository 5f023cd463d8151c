#!/usr/bin/env python
"""Small files, big costs: graphcost's analysis of hostile ONNX graphs vs onnx.load of them.

    python benchmarks/bench_hostile.py [--outputs 10000 20000 40000] [--repeat 3]
                                       [--validation PATH.onnx]

1. A Split with N outputs (one node, a 0.9 MB file at N = 40k): every output is live at once,
   the worst case of the greedy-by-size arena planner (quadratic before: 20k outputs took 32 s,
   40k over 60 s). Printed: onnx.load, the whole analysis, the arena pass alone, the tensors
   the arena stacked, and the ratio analysis / onnx.load. Target: ≤ 2 s at 40k.
2. A 213-byte ConstantOfShape([n, n]) -> NonZero with n = 100,000 (evaluating it would allocate
   40 GB): the analysis time and peak RSS.
3. --validation PATH: the cost of analyzer/frontends/onnx/validate.py on a big graph (e.g. bench_scale's
   100k-node model): analyze() with and without the validation step (monkeypatched to a
   no-op), alternated, best of --repeat, and their ratio.
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import graphcost.analyzer.frontends.onnx.frontend as onnx_frontend  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from graphcost.analyzer.app.api import analyze  # noqa: E402
from graphcost.analyzer.load.loading import load_graph  # noqa: E402
from graphcost.passes.memory.arena import plan_arena  # noqa: E402
from graphcost.passes.memory.liveness import analyze_liveness  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def best(fn, repeat: int) -> tuple[float, object]:
    out, t_best = None, float("inf")
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t)
    return t_best, out


def split_model(n: int, path: Path) -> Path:
    outs = [f"o{i}" for i in range(n)]
    g = helper.make_graph([helper.make_node("Split", ["x"], outs, name="split", axis=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                           for o in outs])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def constant_of_shape_model(n: int, path: Path) -> Path:
    g = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["dims"], ["c"], name="cos",
                          value=numpy_helper.from_array(np.array([1], np.float32))),
         helper.make_node("NonZero", ["c"], ["nz"], name="nz"),
         helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("nz", TensorProto.INT64, None)],
        [numpy_helper.from_array(np.array([n, n], np.int64), "dims")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def bench_split(sizes: list[int], repeat: int, folder: Path) -> None:
    print(f"{'outputs':>8} {'file MB':>8} {'onnx.load s':>12} {'analyze s':>10} "
          f"{'arena s':>8} {'stacked':>8} {'ratio':>8}")
    for n in sizes:
        path = split_model(n, folder / f"split_{n}.onnx")
        t_load, _ = best(lambda: onnx.load(str(path)), repeat)
        t_all, report = best(lambda: analyze(str(path)).to_json(), repeat)
        live = analyze_liveness(load_graph(str(path)))
        t_arena, plan = best(lambda: plan_arena(live.storages), repeat)
        print(f"{n:>8} {path.stat().st_size / 1e6:>8.2f} {t_load:>12.4f} {t_all:>10.2f} "
              f"{t_arena:>8.2f} {plan.stacked:>8} {t_all / t_load:>8.0f}", flush=True)


def bench_constant_of_shape(folder: Path) -> None:
    path = constant_of_shape_model(100_000, folder / "cos.onnx")
    t, _ = best(lambda: analyze(str(path)).to_json(), 1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"ConstantOfShape([1e5, 1e5]) -> NonZero, {path.stat().st_size} bytes: analyze "
          f"{t:.2f} s, peak RSS of this process {rss:.0f} MiB")


def bench_validation(path: str, repeat: int) -> None:
    real = onnx_frontend.validate_model
    times = {"without": float("inf"), "with": float("inf")}
    t_load, _ = best(lambda: onnx.load(path), 1)
    for _ in range(repeat):  # alternated, so that a change in machine load hits both
        for mode in ("without", "with"):
            onnx_frontend.validate_model = real if mode == "with" else (lambda m, name="": m)
            t, _ = best(lambda: analyze(path, batch=16).to_json(), 1)
            times[mode] = min(times[mode], t)
    onnx_frontend.validate_model = real
    print(f"{os.path.basename(path)}: onnx.load {t_load:.2f} s; analyze without validation "
          f"{times['without']:.2f} s ({times['without'] / t_load:.2f}x load), with "
          f"{times['with']:.2f} s ({times['with'] / t_load:.2f}x load); ratio with/without "
          f"{times['with'] / times['without']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--outputs", type=int, nargs="+", default=[10_000, 20_000, 40_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--validation", metavar="PATH.onnx")
    args = ap.parse_args()
    print(f"graphcost bench_hostile: python {sys.version.split()[0]}, onnx {onnx.__version__}, "
          f"cpus {os.cpu_count()}, loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        bench_split(args.outputs, args.repeat, Path(tmp))
        bench_constant_of_shape(Path(tmp))
    if args.validation:
        bench_validation(args.validation, args.repeat)


if __name__ == "__main__":
    main()
