"""graphcost's time estimate against real steps on a CUDA GPU (issue 46: "whenever a GPU is
available: graphcost calibrate on it, then real steps measured and predicted").

On the GPU (about six minutes on an H200):

    python -m benchmarks.time_cuda measure --device h200 --out DIR

1. ``graphcost calibrate --device h200 -o DIR/profile.json``: the kernels measured and the
   profile validated on the zoo's models (analyzer/measure/calibrate_cuda.py);
2. the held-out steps below, none of which calibrate ran, each in its own process (a fresh
   CUDA context): warmed up, then the wall clock of whole steps (the GPU synchronized after
   each round; analyzer/measure/calibrate_cuda_runs.wall_seconds), into DIR/time_cuda.json.

Anywhere (the analyses need no GPU):

    python -m benchmarks.time_cuda predict --device h200 --measured DIR/time_cuda.json \\
        --profile DIR/profile.json [--markdown FILE]

estimates each step on the device's datasheet (passes/device/gpu_engine.py) and with the
calibrated profile, and prints the table (benchmarks/results/time_cuda_h200.md holds one).

The steps: transformers' GPT-2 (124M) and a 160M Llama (accuracy_cuda.py's cases: training
with AdamW in fp32 and bf16-mixed, an inference forward), transformers' Llama at Llama-2-7B's
shape (a bf16 forward of 2,048 tokens), and the zoo's Llama-2-7B decoder serving in fp16 (its
published dtype) with its own KV cache: the prefill of 2,040 tokens and one decode step over a
cache of 2,047 tokens (``--serve --prompt 2040 --generate 8``: TTFT and TPOT), at batch 1,
16 and 64. ``GRAPHCOST_BENCH_DRY=1`` runs them on this CPU at the tiny zoo Llama's size (a check
of the script before device time is spent).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

DRY = os.environ.get("GRAPHCOST_BENCH_DRY") == "1"
DEV = "cpu" if DRY else "cuda"
PROMPT, GENERATE = 2040, 8
# accuracy_cuda.py's cases, timed here
TRAINING = ("gpt2-124M-train-b4-s1024-adamw", "llama-160M-train-b2-s2048-adamw-bf16mixed",
            "llama-160M-train-b2-s2048-adamw", "gpt2-124M-infer-b8-s1024",
            "llama7b-infer-b1-s2048-bf16")
# name: (phase, batch)
SERVING = {"serve-llama7b-prefill-b1": ("prefill", 1),
           "serve-llama7b-decode-b1": ("decode", 1),
           "serve-llama7b-decode-b16": ("decode", 16),
           "serve-llama7b-decode-b64": ("decode", 64)}


def _serving_model():
    import torch

    from graphcost import models_zoo
    torch.manual_seed(0)
    name = "llama_tiny" if DRY else "llama7b"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)   # (the zoo's llama7b: its published dtype)
    try:
        with torch.device(DEV):
            return models_zoo.get(name).build().eval()
    finally:
        torch.set_default_dtype(previous)


def serving_step(name: str):
    """A serving case's step: the prefill (the whole prompt, the cache made), or one decode
    step over a cache of PROMPT + GENERATE - 1 tokens (random keys and values)."""
    import torch
    phase, batch = SERVING[name]
    model = _serving_model()
    cfg = model.cfg
    prompt = 60 if DRY else PROMPT
    if phase == "prefill":
        ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device=DEV)
        return lambda: model(ids, use_cache=True)
    context, head = prompt + GENERATE - 1, cfg.d_model // cfg.n_head
    past = tuple((torch.randn(batch, cfg.n_kv_head, context, head, device=DEV,
                              dtype=torch.float16),) * 2 for _ in range(cfg.n_layer))
    ids = torch.randint(0, cfg.vocab_size, (batch, 1), device=DEV)
    return lambda: model(ids, past)


def measure_one(name: str) -> dict:
    import torch
    from graphcost.analyzer.measure.calibrate_cuda_runs import wall_seconds

    if name in SERVING:
        step = serving_step(name)
    else:
        from benchmarks import accuracy_cuda as ac
        _, _, train, _, precision, attention = ac.CASES[name]
        model, args, opt = ac.prepare(name)
        step = ac.make_step(model, args, train, opt, precision, attention)
    with torch.no_grad() if name in SERVING else torch.enable_grad():
        seconds = wall_seconds(step, torch.device(DEV))
    return {"case": name, "measured_s": seconds}


def measure(device: str, out: str) -> None:
    os.makedirs(out, exist_ok=True)
    profile = os.path.join(out, "profile.json")
    t = time.perf_counter()
    if not DRY:
        subprocess.run([sys.executable, "-m", "graphcost", "calibrate", "--device", device,
                        "-o", profile], check=True)
    print(f"calibrate: {time.perf_counter() - t:.0f} s", flush=True)
    rows = []
    for name in (*SERVING, *TRAINING):
        if DRY and name not in SERVING and "7b" in name:
            continue
        done = subprocess.run([sys.executable, "-m", "benchmarks.time_cuda", "one", name],
                              capture_output=True, text=True)
        if done.returncode:
            print(f"{name}: failed\n{done.stderr[-2000:]}", flush=True)
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
        # written after each step: a run stopped at its time limit keeps what it measured
        with open(os.path.join(out, "time_cuda.json"), "w", encoding="utf-8") as f:
            json.dump({"device": device, "rows": rows, **_machine()}, f, indent=1)


def _machine() -> dict:
    import torch
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        smi = "(no nvidia-smi)"
    return {"torch": torch.__version__, "cuda": str(torch.version.cuda), "nvidia_smi": smi,
            "date": time.strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "(none)"}


def estimate(name: str, device: str, profile) -> float:
    """graphcost's estimate of a case on ``device`` (with ``profile``: a calibrated one)."""
    import torch

    from graphcost import analyze
    if name in SERVING:
        phase, batch = SERVING[name]
        t = _serving_time(batch, device, profile)
        return t.ttft_seconds if phase == "prefill" else t.tpot_seconds
    from benchmarks import accuracy_cuda as ac
    build, make_inputs, train, optimizer, precision, attention = ac.CASES[name]
    args = tuple(torch.empty_like(a, device="meta") for a in make_inputs("cpu"))
    kw = dict(train=True, optimizer=optimizer, precision=precision, attention=attention,
              what_if=False) if train else {"what_if": False}
    r = analyze(build(True).train(train), args, device=device, device_profile=profile, **kw)
    assert r.time is not None
    return r.time.seconds


@functools.lru_cache(maxsize=8)
def _serving_time(batch: int, device: str, profile):
    """The serving review's time at ``batch`` (one analysis gives a batch's prefill and
    decode step)."""
    from graphcost import analyze
    r = analyze("zoo:llama7b", batch=batch, device=device, device_profile=profile,
                serve={"prompt": PROMPT, "generate": GENERATE}, what_if=False)
    assert r.serving is not None and r.serving.time is not None
    return r.serving.time


def predict(device: str, measured: str, profile: str | None) -> list[dict]:
    with open(measured, encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    out = []
    for row in rows:
        name, real = row["case"], row["measured_s"]
        sheet = estimate(name, device, None)
        calibrated = estimate(name, device, profile) if profile else None
        out.append({"case": name, "measured_s": real, "datasheet_s": sheet,
                    "datasheet_err": sheet / real - 1, "profile_s": calibrated,
                    "profile_err": None if calibrated is None else calibrated / real - 1})
    return out


def table(rows: list[dict]) -> str:
    lines = ["| step | measured | datasheet estimate | error | calibrated estimate | error |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        cal = (f"{r['profile_s'] * 1e3:,.1f} ms | {r['profile_err']:+.1%}"
               if r["profile_s"] is not None else "— | —")
        lines.append(f"| {r['case']} | {r['measured_s'] * 1e3:,.1f} ms | "
                     f"{r['datasheet_s'] * 1e3:,.1f} ms | {r['datasheet_err']:+.1%} | {cal} |")
    for key in ("datasheet_err", "profile_err"):
        errs = [abs(r[key]) for r in rows if r[key] is not None]
        if errs:
            lines.append(f"\n{key.split('_')[0]}: median |error| "
                         f"{statistics.median(errs):.1%}, largest {max(errs):.1%} "
                         f"over {len(errs)} steps")
    return "\n".join(lines)


def _header(measured: str, profile: str | None) -> str:
    """Where and when the steps were measured, and the profile's own figures."""
    with open(measured, encoding="utf-8") as f:
        m = json.load(f)
    line = (f"Measured on {m.get('nvidia_smi') or m.get('gpu')} (torch {m.get('torch')}, CUDA "
            f"{m.get('cuda')}), {m.get('date')}: the wall clock of whole steps.")
    if not profile:
        return line
    from graphcost.passes.device.profile import profile_from_json
    with open(profile, encoding="utf-8") as f:
        e = profile_from_json(json.load(f)).engines["torch"]
    gemm = max(rate for _, rate in e.arithmetic["gemm"]["bf16"].points)
    memory = max(rate for _, rate in e.memory.points)
    return (f"{line}\nThe profile (graphcost calibrate --device, same run): bf16 GEMMs up to "
            f"{gemm / 1e12:,.0f} TFLOP/s, memory-bound kernels up to {memory / 1e9:,.0f} GB/s, "
            f"a kernel's launch {e.launch_s * 1e6:.1f} µs, eager host "
            f"{e.host_s * 1e6:.1f} µs per op and {e.autograd_s * 1e6:.1f} µs per "
            f"autograd node, kernels' scale {e.scale:.2f}, validation band "
            f"±{e.band or 0:.0%} over {len(e.validation)} zoo runs.")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.time_cuda")
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--device", required=True)
    m.add_argument("--out", required=True)
    one = sub.add_parser("one")
    one.add_argument("name")
    e = sub.add_parser("predict")
    e.add_argument("--device", required=True)
    e.add_argument("--measured", required=True)
    e.add_argument("--profile")
    e.add_argument("--markdown")
    a = p.parse_args()
    if a.what == "measure":
        measure(a.device, a.out)
    elif a.what == "one":
        print(json.dumps(measure_one(a.name)))
    else:
        text = f"{_header(a.measured, a.profile)}\n\n{table(predict(a.device, a.measured, a.profile))}"
        print(text)
        if a.markdown:
            with open(a.markdown, "w", encoding="utf-8") as f:
                f.write(text + "\n")


if __name__ == "__main__":
    main()
