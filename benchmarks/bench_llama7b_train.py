"""Training analysis of the Llama-2-7B-shaped zoo model (joint forward+backward graph,
liveness, training memory, an automatic checkpoint plan for a budget, the what-ifs), with a
stage breakdown; then PyTorch's SAC estimator next to graphcost on llama_tiny and
llama7b (on fake tensors; its runtime modes need CUDA, see SAC below).

    python -m benchmarks.bench_llama7b_train [--seq 2048] [--budget-gib 110] [--no-sac]
                                             [--sac-model llama_tiny] [--sac-seq 64]

Each measurement runs in a fresh subprocess, so its time and peak RSS are its own (torch
import included; printed separately). Stages are timed by wrapping graphcost's functions in
the child process only (graphcost's code is not modified); nested calls are not counted twice
(the what-ifs' inner training passes count as what-ifs).

The budget defaults to 110 GiB: with fp32 AdamW, parameters + gradients + optimizer state of
6.74 B parameters alone take 100.4 GiB, so a 40 GiB budget has no plan (graphcost says so).
"""
from __future__ import annotations

import argparse
import sys

from benchmarks.child import run

GRAPHCOST = r"""
import time, resource, json, functools
t0 = time.perf_counter()
import torch
t_import = time.perf_counter() - t0
import graphcost.analyzer.app.api as api
import graphcost.analyzer.app.pipeline as pipeline
import graphcost.passes.training.checkpoint_search as search
import graphcost.passes.training.step as training
import graphcost.analyzer.frontends.torch.capture as tc
import graphcost.analyzer.frontends.torch.frontend as fxf
import torch._functorch.aot_autograd as aot

stages = {}
depth = [0]

def timed(mod, attr, label, inner=False):
    # inner: a sub-stage (the trace's are subtracted from "trace: other" below)
    WRAPPED.setdefault((mod, attr), getattr(mod, attr))
    setattr(mod, attr, timed_fn(getattr(mod, attr), label, inner))

WRAPPED = {}  # (module, name) -> the function before it was timed

def timed_fn(fn, label, inner=True):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        if depth[0] and not inner:
            return fn(*a, **k)
        depth[0] += not inner
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            stages[label] = stages.get(label, 0.0) + time.perf_counter() - t
            depth[0] -= not inner
    return wrapper

# the trace, split into AOTAutograd's steps (functions looked up as module globals)
timed(aot, "create_aot_state", "trace: metadata pass", True)
timed(aot, "aot_stage1_graph_capture", "trace: joint graph", True)
_make_fx = aot.make_fx  # the re-trace runs when make_fx's result is called
WRAPPED[(aot, "make_fx")] = _make_fx
aot.make_fx = lambda *a, **k: timed_fn(_make_fx(*a, **k), "trace: flatten re-trace")
timed(tc, "export_joint", "trace: other")
timed(api, "resolve", "building the model on meta", True)
timed(fxf, "lower_joint", "lowering")
timed(pipeline, "count_costs", "cost pass")
timed(pipeline, "analyze_liveness", "liveness (whole graph)")
timed(training, "training_memory", "training memory")
timed(search, "training_memory", "training memory")  # the plans' steps, looked up there
timed(training, "plan_checkpoints", "checkpoint plan")
timed(training, "what_ifs", "what-ifs")

t1 = time.perf_counter()
from graphcost import analyze
r = analyze("zoo:llama7b", dims={"seq": SEQ}, train=True, optimizer="adamw",
            checkpoint={"budget": BUDGET})
total = time.perf_counter() - t1
inner = sum(v for k, v in stages.items() if k.startswith("trace: ") and k != "trace: other")
stages["trace: other"] -= inner
stages["other (report)"] = total - sum(stages.values())
import hashlib
digest = hashlib.sha1(r.to_json().encode()).hexdigest()[:12]
for mod, attr in list(WRAPPED):  # the stages are the training analysis's alone
    setattr(mod, attr, WRAPPED[(mod, attr)])
t2 = time.perf_counter()
analyze("zoo:llama7b", dims={"seq": SEQ})
infer = time.perf_counter() - t2
t3 = time.perf_counter()
fsdp = analyze("zoo:llama7b", dims={"seq": SEQ}, train=True, optimizer="adamw",
               parallel={"strategy": "fsdp", "world_size": 8}, device="h100")
fsdp_s = time.perf_counter() - t3
t, c = r.training, r.training.checkpoint
print(json.dumps(dict(seconds=time.perf_counter() - t0, analyze=total, torch_import=t_import,
                      rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      stages=stages, nodes=len(r.nodes), params=r.totals.params,
                      flops=r.totals.flops, peak=t.peak_bytes, plan=", ".join(c.segments) or "none",
                      plan_peak=c.peak_bytes, recompute=c.recompute_flops,
                      what_if={k: {"peak_bytes": v.peak_bytes} for k, v in t.what_if.items()},
                      digest=digest, traced=r.traced_layers, inference=infer, fsdp=fsdp_s,
                      fsdp_peak=fsdp.peak_bytes)))
"""

# PyTorch's SAC estimator (torch.distributed._tools.sac_estimator), on fake tensors as its
# docstring asks. Its two runtime modes need CUDA (the roofline reads the GPU's peak FLOPs, the
# benchmark mode times kernels with torch.cuda.Event): each is tried and its error kept; then
# it runs with a zero-time runtime stub, which leaves its memory and SAC bookkeeping intact.
SAC = r"""
import time, resource, json
t0 = time.perf_counter()
import torch
t_import = time.perf_counter() - t0
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.sac_estimator import SACEstimator
from graphcost import models_zoo
spec = models_zoo.get(NAME)
errors = {}
for mode in ("operator-level-cost-model", "operator-level-benchmark"):
    try:
        with FakeTensorMode():
            model = models_zoo.get("llama_tiny").build()
            with SACEstimator()(mode):
                model(torch.zeros((1, 8), dtype=torch.long))
        errors[mode] = "ran"
    except Exception as exc:
        errors[mode] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
t1 = time.perf_counter()
est = SACEstimator()
est._estimate_runtime = lambda func, args, kwargs: (func(*args, **(kwargs or {})), 0.0)
with FakeTensorMode():
    model = spec.build()
    with est:
        model(torch.zeros((1, SEQ), dtype=torch.long))
seconds = time.perf_counter() - t1
root = est.sac_mod_stats[type(model).__name__]
print(json.dumps(dict(seconds=seconds, total=time.perf_counter() - t0, torch_import=t_import,
                      rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      modules=len(est.sac_mod_stats), ops=len(root.func_names),
                      saved=sum(root.memory[i] for i in root.saved_autograd_ops),
                      errors=errors)))
"""

GRAPHCOST_SMALL = r"""
import time, resource, json
t0 = time.perf_counter()
import torch
t_import = time.perf_counter() - t0
from graphcost import analyze
t1 = time.perf_counter()
r = analyze("zoo:" + NAME, dims={"seq": SEQ}, train=True, optimizer="adamw")
seconds = time.perf_counter() - t1
print(json.dumps(dict(seconds=seconds, total=time.perf_counter() - t0, torch_import=t_import,
                      rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      nodes=len(r.nodes), peak=r.training.peak_bytes)))
"""




def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--budget-gib", type=float, default=110.0)
    ap.add_argument("--no-sac", action="store_true", help="skip the SAC estimator comparison")
    ap.add_argument("--sac-model", default="llama_tiny")
    ap.add_argument("--sac-seq", type=int, default=64)
    a = ap.parse_args()
    budget = int(a.budget_gib * 2**30)
    g = run(GRAPHCOST.replace("SEQ", str(a.seq)).replace("BUDGET", str(budget)))
    if "error" in g:
        sys.exit(f"graphcost failed: {g['error']}")
    print(f"## llama7b training analysis (meta device), seq {a.seq}, AdamW fp32, "
          f"budget {a.budget_gib:g} GiB\n")
    print("| stage | seconds | share |\n|---|--:|--:|")
    for name, sec in g["stages"].items():
        print(f"| {name} | {sec:.2f} | {100 * sec / g['analyze']:.0f}% |")
    print(f"| **analyze() total** | **{g['analyze']:.2f}** | |")
    print(f"| torch import | {g['torch_import']:.2f} | |")
    print(f"| **process total** | **{g['seconds']:.2f}** | |\n")
    gib = 2**30
    print(f"peak RSS {g['rss_mb']:.0f} MB; {g['nodes']:,} joint nodes; params {g['params']:,}; "
          f"FLOPs {g['flops']:,}")
    print(f"step peak {g['peak'] / gib:.2f} GiB; plan: checkpoint {g['plan']} -> "
          f"{g['plan_peak'] / gib:.2f} GiB, recompute {g['recompute']:,} FLOPs")
    print("what-ifs: " + ", ".join(f"{k} {v['peak_bytes'] / gib:.2f} GiB"
                                   for k, v in g["what_if"].items()))
    print(f"report digest (sha1 of to_json, to compare code versions): {g['digest']}")
    print(f"traced: {g['traced'] or 'every layer'}")
    print(f"one inference analysis in the same process: {g['inference']:.2f} s; the training "
          f"analysis is {g['analyze'] / g['inference']:.1f}× it")
    print(f"--parallel fsdp --world-size 8 --device h100 in the same process: {g['fsdp']:.2f} s "
          f"(per-rank peak {g['fsdp_peak'] / gib:.2f} GiB)")
    print("target (training analyze() <= 5 s and < 2 GB RSS): "
          + ("met" if g["analyze"] <= 5 and g["rss_mb"] < 2048 else "NOT met"))
    if a.no_sac:
        return
    print("\n## PyTorch SACEstimator vs graphcost --train (fresh process each)\n")
    print("| model | tool | seconds (excl. torch import) | peak RSS MB | what it produces |")
    print("|---|---|--:|--:|---|")
    errors = {}
    for name, seq in ((a.sac_model, a.sac_seq), ("llama7b", a.seq)):
        sub = {"NAME": repr(name), "SEQ": str(seq)}
        sac_code, small_code = SAC, GRAPHCOST_SMALL
        for k, v in sub.items():
            sac_code, small_code = sac_code.replace(k, v), small_code.replace(k, v)
        s = run(sac_code)
        m = g if name == "llama7b" else run(small_code)
        label = f"{name}, seq {seq}"
        if "error" in s:
            print(f"| {label} | SACEstimator | failed | | {s['error'][:200]} |")
        else:
            errors = s["errors"]
            print(f"| {label} | SACEstimator (fake tensors, zero-time runtime stub) | "
                  f"{s['seconds']:.2f} | {s['rss_mb']:.0f} | forward only: {s['ops']} ops, "
                  f"{s['modules']} modules, {s['saved'] / 2**20:,.0f} MiB saved for backward |")
        if "error" in m:
            print(f"| {label} | graphcost | failed | | {m['error'][:200]} |")
        else:
            secs = m.get("analyze", m["seconds"])
            extra = ", checkpoint plan" if name == "llama7b" else ""
            print(f"| {label} | graphcost --train (meta) | {secs:.2f} | {m['rss_mb']:.0f} | "
                  f"joint fwd+bwd graph: {m['nodes']:,} nodes, step peak "
                  f"{m['peak'] / 2**20:,.0f} MiB, what-ifs{extra} |")
    for mode, err in errors.items():
        print(f"\nSACEstimator {mode!r} on CPU: {err}")


if __name__ == "__main__":
    main()
