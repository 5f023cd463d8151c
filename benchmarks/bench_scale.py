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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import graphcost.analyzer.frontends.onnx_frontend as onnx_frontend  # noqa: E402
import graphcost.analyzer.pipeline as pipeline  # noqa: E402
from graphcost.analyzer.api import analyze  # noqa: E402

HIDDEN = 64
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
MLP = 2 * HIDDEN
SEQ = 64            # 8x8 patches of a 32x32 image
IMG = 32
CLASSES = 10
OPSET = 17          # LayerNormalization; GELU decomposed with Erf, as torch exports it
BATCH = 16          # the binding used for the analysis
SEED = 0
GEN_VERSION = 1     # bump when the generator changes (invalidates cached files)


# --------------------------------------------------------------------------------------------
# Graph generation
# --------------------------------------------------------------------------------------------

class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.shared: dict[tuple, str] = {}

    def weight(self, name: str, shape: tuple[int, ...], scale: float = 0.02) -> str:
        arr = (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def ones(self, name: str, shape: tuple[int, ...]) -> str:
        self.inits.append(numpy_helper.from_array(np.ones(shape, np.float32), name))
        return name

    def zeros(self, name: str, shape: tuple[int, ...]) -> str:
        self.inits.append(numpy_helper.from_array(np.zeros(shape, np.float32), name))
        return name

    def const(self, values, dtype) -> str:
        """A shared (deduplicated) small constant initializer, as exporters fold them."""
        key = (tuple(np.asarray(values).reshape(-1).tolist()), np.asarray(values).shape,
               np.dtype(dtype).str)
        name = self.shared.get(key)
        if name is None:
            name = f"onnx::Constant_{len(self.shared)}"
            self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
            self.shared[key] = name
        return name

    def op(self, op_type: str, inputs: list[str], name: str, n_out: int = 1, **attrs) -> str:
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0]

    # -- building blocks (node counts in comments) --

    def linear(self, x: str, p: str, fan_in: int, fan_out: int) -> str:       # 2 nodes
        w = self.weight(f"{p}.weight", (fan_in, fan_out))
        b = self.zeros(f"{p}.bias", (fan_out,))
        y = self.op("MatMul", [x, w], f"{p}/MatMul")
        return self.op("Add", [y, b], f"{p}/Add")

    def layer_norm(self, x: str, p: str) -> str:                                # 1 node
        return self.op("LayerNormalization",
                       [x, self.ones(f"{p}.weight", (HIDDEN,)), self.zeros(f"{p}.bias", (HIDDEN,))],
                       f"{p}/LayerNormalization", axis=-1, epsilon=1e-5)

    def conv_bn_relu(self, x: str, p: str, cin: int, cout: int, k: int, relu=True,
                     **attrs) -> str:                                           # 2-3 nodes
        w = self.weight(f"{p}.conv.weight", (cout, cin, k, k), 0.1)
        y = self.op("Conv", [x, w], f"{p}/conv/Conv", kernel_shape=[k, k], **attrs)
        y = self.op("BatchNormalization",
                    [y, self.ones(f"{p}.bn.weight", (cout,)), self.zeros(f"{p}.bn.bias", (cout,)),
                     self.zeros(f"{p}.bn.running_mean", (cout,)),
                     self.ones(f"{p}.bn.running_var", (cout,))],
                    f"{p}/bn/BatchNormalization", epsilon=1e-5)
        return self.op("Relu", [y], f"{p}/relu/Relu") if relu else y

    def stem(self, x: str) -> str:                                              # 15 nodes
        h = self.conv_bn_relu(x, "/stem.0", 3, 16, 3, pads=[1, 1, 1, 1])
        r = self.conv_bn_relu(h, "/stem.1.a", 16, 16, 3, pads=[1, 1, 1, 1])
        r = self.conv_bn_relu(r, "/stem.1.b", 16, 16, 3, relu=False, pads=[1, 1, 1, 1])
        h = self.op("Add", [r, h], "/stem.1/Add")
        h = self.op("Relu", [h], "/stem.1/Relu")
        # Patch embedding: Conv stride 4 -> (B, 64, 8, 8) -> (B, 64, 64) -> (B, SEQ, HIDDEN).
        w = self.weight("/patch.weight", (HIDDEN, 16, 4, 4), 0.1)
        b = self.zeros("/patch.bias", (HIDDEN,))
        h = self.op("Conv", [h, w, b], "/patch/Conv", kernel_shape=[4, 4], strides=[4, 4])
        h = self.op("Reshape", [h, self.const([0, HIDDEN, -1], np.int64)], "/patch/Reshape")
        h = self.op("Transpose", [h], "/patch/Transpose", perm=[0, 2, 1])
        pos = self.weight("/pos_embed", (1, SEQ, HIDDEN))
        return self.op("Add", [h, pos], "/pos/Add")

    def transformer_block(self, x: str, i: int) -> str:                         # 33 nodes
        p = f"/blocks.{i}"
        h = self.layer_norm(x, f"{p}/ln_1")
        heads = self.const([0, -1, HEADS, HEAD_DIM], np.int64)
        q = self.linear(h, f"{p}/attn/q", HIDDEN, HIDDEN)
        k = self.linear(h, f"{p}/attn/k", HIDDEN, HIDDEN)
        v = self.linear(h, f"{p}/attn/v", HIDDEN, HIDDEN)
        q = self.op("Reshape", [q, heads], f"{p}/attn/Reshape")
        k = self.op("Reshape", [k, heads], f"{p}/attn/Reshape_1")
        v = self.op("Reshape", [v, heads], f"{p}/attn/Reshape_2")
        q = self.op("Transpose", [q], f"{p}/attn/Transpose", perm=[0, 2, 1, 3])
        k = self.op("Transpose", [k], f"{p}/attn/Transpose_1", perm=[0, 2, 3, 1])
        v = self.op("Transpose", [v], f"{p}/attn/Transpose_2", perm=[0, 2, 1, 3])
        s = self.op("MatMul", [q, k], f"{p}/attn/MatMul")
        s = self.op("Mul", [s, self.const(1.0 / math.sqrt(HEAD_DIM), np.float32)],
                    f"{p}/attn/Mul")
        a = self.op("Softmax", [s], f"{p}/attn/Softmax", axis=-1)
        o = self.op("MatMul", [a, v], f"{p}/attn/MatMul_1")
        o = self.op("Transpose", [o], f"{p}/attn/Transpose_3", perm=[0, 2, 1, 3])
        o = self.op("Reshape", [o, self.const([0, -1, HIDDEN], np.int64)], f"{p}/attn/Reshape_3")
        o = self.linear(o, f"{p}/attn/proj", HIDDEN, HIDDEN)
        x = self.op("Add", [x, o], f"{p}/Add")
        h = self.layer_norm(x, f"{p}/ln_2")
        h = self.linear(h, f"{p}/mlp/fc1", HIDDEN, MLP)
        # GELU(x) = x * 0.5 * (1 + erf(x / sqrt(2))), the torch.onnx decomposition.
        g = self.op("Div", [h, self.const(math.sqrt(2.0), np.float32)], f"{p}/mlp/act/Div")
        g = self.op("Erf", [g], f"{p}/mlp/act/Erf")
        g = self.op("Add", [g, self.const(1.0, np.float32)], f"{p}/mlp/act/Add")
        g = self.op("Mul", [h, g], f"{p}/mlp/act/Mul")
        g = self.op("Mul", [g, self.const(0.5, np.float32)], f"{p}/mlp/act/Mul_1")
        h = self.linear(g, f"{p}/mlp/fc2", MLP, HIDDEN)
        return self.op("Add", [x, h], f"{p}/Add_1")

    def conv_mixer(self, x: str, i: int) -> str:                                # 7 nodes
        p = f"/mixer.{i}"
        side = int(math.isqrt(SEQ))
        h = self.op("Transpose", [x], f"{p}/Transpose", perm=[0, 2, 1])
        h = self.op("Reshape", [h, self.const([0, HIDDEN, side, side], np.int64)], f"{p}/Reshape")
        w = self.weight(f"{p}.dw.weight", (HIDDEN, 1, 3, 3), 0.1)
        b = self.zeros(f"{p}.dw.bias", (HIDDEN,))
        h = self.op("Conv", [h, w, b], f"{p}/dw/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                    group=HIDDEN)
        h = self.op("Relu", [h], f"{p}/Relu")
        h = self.op("Reshape", [h, self.const([0, HIDDEN, -1], np.int64)], f"{p}/Reshape_1")
        h = self.op("Transpose", [h], f"{p}/Transpose_1", perm=[0, 2, 1])
        return self.op("Add", [x, h], f"{p}/Add")

    def head(self, x: str) -> str:                                              # 3 nodes
        h = self.layer_norm(x, "/ln_f")
        h = self.op("Gather", [h, self.const(0, np.int64)], "/head/Gather", axis=1)
        w = self.weight("/head.weight", (CLASSES, HIDDEN))
        b = self.zeros("/head.bias", (CLASSES,))
        return self.op("Gemm", [h, w, b], "/head/Gemm", transB=1)


def build_model(target_nodes: int, seed: int = SEED) -> onnx.ModelProto:
    b = _Builder(seed)
    x = b.stem("input")
    i = 0
    head_nodes = 3
    while True:
        mixer = (i % 8 == 7)
        need = 33 + (7 if mixer else 0)
        if len(b.nodes) + need + head_nodes > target_nodes and i > 0:
            break
        x = b.transformer_block(x, i)
        if mixer:
            x = b.conv_mixer(x, i // 8)
        i += 1
    b.head(x)
    graph = helper.make_graph(
        b.nodes, f"synthetic_vit_{target_nodes}",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, IMG, IMG])],
        [helper.make_tensor_value_info(b.nodes[-1].output[0], TensorProto.FLOAT,
                                       ["batch", CLASSES])],
        initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="graphcost-bench")
    return model


def ensure_model(directory: Path, target_nodes: int) -> Path:
    path = directory / f"synthetic_{target_nodes}_v{GEN_VERSION}_s{SEED}.onnx"
    if path.is_file():
        return path
    t0 = time.perf_counter()
    model = build_model(target_nodes)
    if target_nodes <= 20_000:
        onnx.checker.check_model(model, full_check=True)
    tmp = path.with_suffix(".tmp")
    onnx.save(model, str(tmp))  # no external data: one self-contained file
    os.replace(tmp, path)
    print(f"  generated {path.name}: {len(model.graph.node)} nodes, "
          f"{path.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


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
        (onnx_frontend._Lowering, "graph", "lower.ir_lowering"),
        (pipeline, "count_costs", "passes.costs"),
        (pipeline, "count_params", "passes.params"),
        (pipeline, "analyze_liveness", "passes.liveness"),
        (pipeline, "plan_arena", "passes.arena"),
        (pipeline, "check_shapes", "passes.shapes"),
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
            dt, graph = _clock(lambda: onnx_frontend.lower_onnx(proto, name=path.name,
                                                                batch=BATCH))
            keep("lower_onnx", dt)
            del proto
            dt, report = _clock(lambda: pipeline.run_passes(graph))
            keep("run_passes", dt)
            dt, _js = _clock(report.to_json)
            keep("to_json", dt)
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
                "passes.costs", "passes.params", "passes.liveness", "passes.arena",
                "passes.shapes", "passes.assemble_report"]
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
