"""graphcost against PyTorch's CUDA allocator on a real GPU (issues 22 and 23).

    python -m benchmarks.accuracy_cuda --device h100-sxm [--json FILE] [--only NAME ...]

Needs a CUDA GPU; ``--device`` names the graphcost device table's row for it. Each case runs
in its own process (a fresh allocator and CUDA context):

- measured: the model moved to the GPU, then two steps (inference: two no_grad forwards;
  training: zero_grad(set_to_none=True), forward (under ``torch.autocast("cuda", dtype)``
  for the autocast recipes), the sum of the float outputs, backward, optimizer step).
  ``allocated``: ``torch.cuda.max_memory_allocated()`` over the second step (the peak stats
  reset after the first); ``reserved``: ``torch.cuda.max_memory_reserved()`` over the whole
  process, as graphcost replays the allocator over two steps from an empty cache;
  ``process``: what NVML says the process holds on the GPU at the end (its context and every
  reserved segment: no ``empty_cache`` ran).
- graphcost: the same module built on the meta device, ``analyze(..., device=DEVICE)``:
  ``report.peak_bytes`` and the reserved peak (``memory``/``training.reserved_peak_bytes``),
  each plus the cuBLAS workspaces (allocated through the allocator, so both CUDA figures hold
  them; passes/device/fits.py), and ``roofline.fit.needs`` against ``process``.

The ``runtime`` case measures what the process holds on the GPU outside PyTorch's allocator
(``cudaMemGetInfo``'s used bytes − ``torch.cuda.memory_reserved()``) after CUDA's
initialisation, the first matmul (cuBLAS/cuBLASLt handles), the first convolution (cuDNN) and
the first fused attention call: the runtime share issue 23 asks the fits answer to include.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

warnings.filterwarnings("ignore")

GiB = 1 << 30
# GRAPHCOST_BENCH_DRY=1 runs the steps on this CPU with zero statistics: a check of the
# script itself before device time is spent on it
DRY = os.environ.get("GRAPHCOST_BENCH_DRY") == "1"
DEV = "cpu" if DRY else "cuda"


def _hf_llama(meta: bool):
    import torch
    import transformers as t

    cfg = t.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                        num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                        max_position_embeddings=4096, use_cache=False,
                        attn_implementation="sdpa")
    with torch.device("meta" if meta else "cpu"):
        return t.LlamaForCausalLM(cfg)


def _hf_gpt2(meta: bool):
    import torch
    import transformers as t

    cfg = t.GPT2Config(n_positions=1024, attn_pdrop=0, resid_pdrop=0, embd_pdrop=0,
                       use_cache=False, attn_implementation="sdpa")
    with torch.device("meta" if meta else "cpu"):
        return t.GPT2LMHeadModel(cfg)


def _llama7b(meta: bool):
    """transformers' Llama at Llama-2-7B's shape (its LlamaConfig defaults) in bf16, with
    SDPA, built where it runs (on the GPU 27 GB in fp32 for a moment; measure() empties the
    cache before the steps)."""
    import torch
    import transformers as t

    cfg = t.LlamaConfig(use_cache=False, attn_implementation="sdpa")
    with torch.device("meta" if meta else DEV):
        return t.LlamaForCausalLM(cfg).to(torch.bfloat16)


def _decoder(meta: bool):
    import torch

    from tests.test_step_as_run import Decoder
    with torch.device("meta" if meta else "cpu"):
        return Decoder()


def _zoo(name: str):
    def build(meta: bool):
        from graphcost import models_zoo
        model = models_zoo.build_model(name, eval=False)
        return model.to("meta") if meta else model
    return build


def _tokens(batch: int, seq: int, vocab: int):
    def make(device: str):
        import torch
        g = torch.Generator().manual_seed(0)
        return (torch.randint(0, vocab, (batch, seq), generator=g).to(device),)
    return make


def _floats(*shape: int):
    def make(device: str):
        import torch
        return (torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(device),)
    return make


def _zoo_inputs(name: str, batch: int, **dims: int):
    def make(device: str):
        from graphcost import models_zoo
        return tuple(t.to(device) for t in models_zoo.example_inputs(name, batch=batch, **dims))
    return make


# name: (build(meta) -> module, inputs(device) -> args, train, optimizer, precision, attention)
CASES = {
    "llama7b-infer-b1-s2048-bf16": (_llama7b, _tokens(1, 2048, 32000), False, "none", "fp32",
                                    "auto"),
    "resnet50-infer-b64": (_zoo("resnet50"), _zoo_inputs("resnet50", 64), False, "none",
                           "fp32", "auto"),
    "resnet50-train-b32-momentum": (_zoo("resnet50"), _zoo_inputs("resnet50", 32), True,
                                    "momentum", "fp32", "auto"),
    "resnet50-train-b32-adamw-bf16mixed": (_zoo("resnet50"), _zoo_inputs("resnet50", 32), True,
                                           "adamw", "bf16-mixed", "auto"),
    "llama_tiny-train-b8-adamw": (_zoo("llama_tiny"), _zoo_inputs("llama_tiny", 8), True,
                                  "adamw", "fp32", "auto"),
    "gpt2-124M-infer-b8-s1024": (_hf_gpt2, _tokens(8, 1024, 50257), False, "none", "fp32",
                                 "auto"),
    "gpt2-124M-train-b4-s1024-adamw": (_hf_gpt2, _tokens(4, 1024, 50257), True, "adamw",
                                       "fp32", "auto"),
    "llama-160M-train-b2-s2048-adamw": (_hf_llama, _tokens(2, 2048, 32000), True, "adamw",
                                        "fp32", "auto"),
    "llama-160M-train-b2-s2048-adamw-bf16mixed": (_hf_llama, _tokens(2, 2048, 32000), True,
                                                  "adamw", "bf16-mixed", "auto"),
    "llama-160M-train-b2-s2048-adamw-bf16true": (_hf_llama, _tokens(2, 2048, 32000), True,
                                                 "adamw", "bf16-true", "auto"),
    "decoder-train-s8192-bf16mixed": (_decoder, _floats(1, 8192, 256), True, "none",
                                      "bf16-mixed", "auto"),
    "decoder-train-s8192-fp32": (_decoder, _floats(1, 8192, 256), True, "none", "fp32",
                                 "auto"),
    "decoder-train-s8192-math": (_decoder, _floats(1, 8192, 256), True, "none", "fp32",
                                 "math"),
}

_AUTOCAST = {"bf16-mixed": "bfloat16", "16-mixed": "float16"}
_TRUE = {"bf16-true": "bfloat16", "16-true": "float16"}


def _optimizer(name: str, params):
    import torch
    return {"none": lambda: None,
            "momentum": lambda: torch.optim.SGD(params, lr=0.01, momentum=0.9),
            "adamw": lambda: torch.optim.AdamW(params)}[name]()


def prepare(name: str):
    """Case ``name``'s model on the device (seeded), its inputs and optimizer."""
    import torch
    build, make_inputs, train, optimizer, precision, _ = CASES[name]
    torch.manual_seed(0)
    model = build(False)
    if precision in _TRUE:
        model = model.to(getattr(torch, _TRUE[precision]))
    model = model.to(DEV).train(train)
    opt = _optimizer(optimizer, list(model.parameters())) if train else None
    return model, make_inputs(DEV), opt


def make_step(model, args, train: bool, opt, precision: str, attention: str):
    """One step of a case: two no_grad forwards' one for inference; for training
    zero_grad(set_to_none=True), the forward under the recipe's autocast, the sum of the float
    outputs, backward, the optimizer's step. ``attention`` "math" forces SDPA's math kernel."""
    import contextlib

    import torch
    from graphcost.analyzer.measure.reference import training_loss_of
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype = _AUTOCAST.get(precision)

    def forced():
        return sdpa_kernel([SDPBackend.MATH]) if attention == "math" else \
            contextlib.nullcontext()

    def step():
        ctx = torch.autocast(DEV, getattr(torch, dtype)) if dtype else contextlib.nullcontext()
        if not train:
            with torch.no_grad(), ctx, forced():
                model(*args)
            return
        model.zero_grad(set_to_none=True)
        with ctx, forced():
            loss = training_loss_of(model, args)
        with forced():
            loss.backward()
        del loss
        if opt is not None:
            opt.step()
    return step


def measure(name: str) -> dict:
    """The real steps on the GPU: allocated peak of the second, reserved peak of both."""
    import torch
    _, _, train, _, precision, attention = CASES[name]
    model, args, opt = prepare(name)
    if not DRY:  # what building the model cached is not the steps'
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    step = make_step(model, args, train, opt, precision, attention)
    with _AttentionOps() as seen:  # the first step: which attention kernels really ran
        step()
    if DRY:
        step()
        return {"allocated": 0, "reserved": 0, "process": 0}
    torch.cuda.synchronize()
    first_reserved = torch.cuda.max_memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return {"ran": sorted(seen.ops), "allocated": torch.cuda.max_memory_allocated(),
            "reserved": max(first_reserved, torch.cuda.max_memory_reserved()),
            "process": _process_bytes()}


def _process_bytes() -> int | None:
    """What the driver says this process holds on the GPU (NVML; no empty_cache ran, so the
    allocator's segments are all still reserved): graphcost's fit.needs is the comparison."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == os.getpid():
                return p.usedGpuMemory
    except Exception:  # noqa: BLE001 - NVML may not see processes in a container
        return None
    return None


class _AttentionOps:
    """A dispatch mode that notes the attention kernels a step dispatches (it allocates
    nothing; the peaks are read over the second step, outside it)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        ops = self.ops = set()

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if "attention" in str(func):
                    ops.add(str(func).replace("aten.", "").replace(".default", ""))
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def predict(name: str, device: str) -> dict:
    import torch
    from graphcost.analyzer.app.devices import get_device
    from graphcost.passes.device.fits import cublas_workspace_bytes

    from graphcost import analyze
    build, make_inputs, train, optimizer, precision, attention = CASES[name]
    model = build(True).train(train)  # the measured run sets the same mode
    args = tuple(torch.empty_like(a, device="meta") for a in make_inputs("cpu"))
    t0 = time.perf_counter()
    kw = dict(train=True, optimizer=optimizer, precision=precision, attention=attention,
              what_if=False) if train else {}
    r = analyze(model, args, device=device, **kw)
    assert r.roofline is not None
    fit = r.roofline.fit
    # the cuBLAS workspaces are allocated through the allocator: the measured peaks hold them
    # (the replays hold their own, one per matmul thread, where its first matmul allocates it)
    reserved = (r.training.reserved_peak_bytes if train else r.memory.reserved_peak_bytes)
    held = (2 if train else 1) * cublas_workspace_bytes(get_device(device))
    return {"peak": r.peak_bytes + held, "reserved_pred": reserved, "needs": fit.needs,
            "kernels": [f"{u.kernel} x{u.calls}" for u in r.attention],
            "analysis_s": round(time.perf_counter() - t0, 2)}


def runtime_share() -> dict:
    """Bytes the process holds on the GPU outside PyTorch's allocator, stage by stage."""
    import torch
    import torch.nn.functional as F

    def outside() -> int:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return total - free - torch.cuda.memory_reserved()

    free0, total = torch.cuda.mem_get_info()  # initialises the context
    out = {"gpu": torch.cuda.get_device_name(), "total": total, "free_at_start": free0,
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version(), "context": outside()}
    a = torch.randn(1024, 1024, device="cuda")
    a @ a
    out["after_matmul"] = outside()
    out["allocated_after_matmul"] = torch.cuda.memory_allocated() - a.nbytes
    F.conv2d(torch.randn(8, 64, 56, 56, device="cuda"), torch.randn(64, 64, 3, 3, device="cuda"))
    out["after_conv"] = outside()
    q = torch.randn(1, 8, 1024, 64, device="cuda", dtype=torch.bfloat16)
    F.scaled_dot_product_attention(q, q, q)
    out["after_sdpa"] = outside()
    h = a.half()
    h @ h
    out["after_half_matmul"] = outside()
    return out


def one(name: str, device: str) -> dict:
    if name == "runtime":
        return {} if DRY else runtime_share()
    row = {"case": name}
    try:
        row.update(measure(name))
    except Exception as e:  # noqa: BLE001 - a failed case is a row, the others go on
        row["measure_error"] = f"{type(e).__name__}: {e}"[:300]
    try:
        row.update(predict(name, device))
    except Exception as e:  # noqa: BLE001
        row["predict_error"] = f"{type(e).__name__}: {e}"[:300]
    for key, pred in (("allocated", "peak"), ("reserved", "reserved_pred"),
                      ("process", "needs")):
        if row.get(key) and row.get(pred):
            row[f"{key}_err"] = round(row[pred] / row[key] - 1, 4)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="h100-sxm")
    p.add_argument("--json")
    p.add_argument("--only", nargs="*")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--case")  # internal: one case in this process
    a = p.parse_args()
    if a.case:
        print(json.dumps(one(a.case, a.device)))
        return
    rows = [_run("runtime", a.device)]  # alone: it reads the whole GPU's used bytes
    with ThreadPoolExecutor(a.workers) as pool:  # the cases' allocator stats are per process
        for row in pool.map(lambda n: _run(n, a.device), a.only or CASES):
            rows.append(row)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(rows, f, indent=1)
    _table(rows)


def _run(name: str, device: str) -> dict:
    """One case in its own process (a fresh CUDA context and allocator): its JSON row."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "benchmarks.accuracy_cuda", "--case", name,
                               "--device", device], capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        row = {"case": name, "error": "timed out after 240 s"}
    else:
        try:
            row = json.loads((done.stdout.strip().splitlines() or [""])[-1])
        except ValueError:
            row = {"case": name, "error": done.stderr[-600:]}
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(row), flush=True)
    return row


def _ran(ops: list[str]) -> str:
    """The attention kernels a case's step dispatched ("—": none seen, the math kernel's
    decomposition)."""
    kinds = {k for op in ops for k in ("flash", "efficient", "cudnn", "math") if k in op}
    return ", ".join(sorted(kinds)) or "—"


def _table(rows: list[dict]) -> None:
    print("\n| case | allocated GiB (graphcost / CUDA) | err | reserved GiB (graphcost / CUDA) "
          "| err | needs / process GiB | err | kernel (graphcost / ran) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if "allocated" not in r and "peak" not in r:
            continue
        def cell(p, m):
            return f"{(r.get(p) or 0) / GiB:.3f} / {(r.get(m) or 0) / GiB:.3f}"
        print(f"| {r['case']} | {cell('peak', 'allocated')} | "
              f"{100 * r.get('allocated_err', float('nan')):+.1f}% | "
              f"{cell('reserved_pred', 'reserved')} | "
              f"{100 * r.get('reserved_err', float('nan')):+.1f}% | "
              f"{cell('needs', 'process')} | "
              f"{100 * r.get('process_err', float('nan')):+.1f}% | "
              f"{', '.join(r.get('kernels', [])) or '—'} / "
              f"{_ran(r.get('ran', []))} |")


if __name__ == "__main__":
    main()
