"""PyTorch's CUDA caching allocator on real steps: its peaks and its own event trace, kept so
graphcost's replay of that allocator can be checked offline, without a GPU.

    python -m benchmarks.cuda_traces --json FILE[.gz] [--only NAME ...] [--workers N]

Needs a CUDA GPU (``GRAPHCOST_BENCH_DRY=1`` runs every case on this CPU with empty traces and
zero statistics: a check of the script itself). Each case runs in its own process (a fresh
CUDA context and allocator; ``--one NAME`` runs one and prints its JSON line), ``--workers``
(4) at once on the shared GPU, each within 120 s; a case that raises or times out is a row
with its ``error`` (and, when it raised, the trace up to that point). The cases:

- ``fsdp8-*``: a zoo model under ``fully_shard`` (each unit graphcost's parallel report names,
  then the root; ``zero2``: ``reshard_after_forward=False``; ``bf16master``:
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``) with PyTorch's fake process
  group at world size 8 in one process (collectives are no-ops), batch 2, Adam (for-loop),
  steps 1 to 3: zero_grad(set_to_none=True), the sum of the float outputs, backward, step.
- ``ddp8-*``: the same steps under DistributedDataParallel, fp32.
- ``serve-llama-*``: accuracy_cuda's 160M Llama (use_cache=True, seeded random weights, bf16),
  batch 4, a 512-token prompt: phase ``prefill`` (one forward keeping its cache until the
  phase ends), phase ``generate`` (greedy, exactly 64 new tokens; the dynamic cache, or
  ``cache_implementation="static"`` with transformers' auto-compile off).
- ``trace:NAME``: accuracy_cuda's case NAME, its steps as ``measure()`` runs them, three of them.

Recorded per case: ``params`` (enough to redo graphcost's prediction), ``phases``
(``[phase, allocated, reserved]``: ``max_memory_allocated``/``max_memory_reserved`` with the
peaks reset at the phase's start), ``reserved_process`` (the reserved peak over the whole
process, model building included), ``trace`` (every ``device_traces[0]`` entry as ``[action,
size, stream, addr]``; no stacks), ``markers`` (where each phase begins in the trace),
``segments`` (the allocator's segments at the end) and ``stats`` (retries, cudaMalloc and
cudaFree counts). The file's ``formats`` entry spells each out.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor

from benchmarks.accuracy_cuda import (
    CASES,
    DEV,
    DRY,
    _hf_llama,
    make_step,
    prepare,
)

warnings.filterwarnings("ignore")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
TIMEOUT_S = 120
MAX_ENTRIES = 1_000_000  # the allocator's ring buffer: older entries are overwritten past it
LONG_TRACE = 400_000
WORLD, BATCH, STEPS = 8, 2, 3
# A phase begins with the allocation (freed at once) of MARKER * (MARKER_BASE + k) bytes, k the
# phase's number: multiples of 512 keep their size through the allocator's rounding, and a
# prime base makes a step's own tensor of that size unlikely.
MARKER, MARKER_BASE = 512, 1009
STATS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms")

FORMATS = {
    "phases": "[phase, allocated peak, reserved peak] in bytes; the peaks reset at the "
              "phase's start (after its marker was freed)",
    "reserved_process": "max_memory_reserved over the whole process (before any reset, and "
                        "every phase's)",
    "trace": "[action, size, stream, addr] for every entry of _snapshot()['device_traces'][0],"
             " oldest first; alloc/free_* sizes are the requested bytes (not rounded), "
             "segment_* sizes the segment's",
    "markers": "phase -> {size, index}: trace[index] is the phase marker's alloc; the next "
               "entries with its addr are its free_requested/free_completed (a segment_alloc "
               "just before it, if it needed one). Real allocations: replaying the trace as "
               "is gives the measured peaks; against graphcost's own events drop them (a "
               "2 MiB small-pool segment one created stays reserved)",
    "segments": "[stream, total_size, segment_type, is_expandable, [[block size, state], ...],"
                " address] per _snapshot()['segments'] entry at the end",
    "stats": "torch.cuda.memory_stats() at the end, plus allocated/reserved now",
}


class Recorder:
    """One case's peaks per phase and the allocator's history (recording starts in start(),
    which each case calls before its model reaches the device)."""

    def __init__(self):
        self.info: dict = {}
        self.phases: list = []
        self.markers: dict[str, int] = {}
        self.reserved_process = 0
        self.on = False

    def start(self) -> None:
        if DRY:
            return
        import torch
        # the history is kept by the per-device allocators, which CUDA's initialisation makes
        torch.cuda.init()
        # context=None: no tracebacks, the trace stays actions, sizes, streams and addresses
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=MAX_ENTRIES)
        self.on = True

    @contextlib.contextmanager
    def phase(self, name: str):
        import torch
        size = MARKER * (MARKER_BASE + len(self.markers))
        self.markers[name] = size
        marker = torch.empty(size, dtype=torch.uint8, device=DEV)
        del marker  # freed before the reset: it is in the trace, not in the phase's peaks
        if not DRY:
            torch.cuda.synchronize()
            self.reserved_process = max(self.reserved_process, torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:  # a phase that raised still reports the peaks it reached (an OOM's, say)
            self._read(name)

    def _read(self, name: str) -> None:
        if DRY:
            self.phases.append([name, 0, 0])
            return
        import torch
        torch.cuda.synchronize()
        reserved = torch.cuda.max_memory_reserved()
        self.reserved_process = max(self.reserved_process, reserved)
        self.phases.append([name, torch.cuda.max_memory_allocated(), reserved])

    def finish(self) -> dict:
        snap, stats = {"segments": [], "device_traces": [[]]}, {}
        if self.on:
            import torch
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            raw = torch.cuda.memory_stats()
            stats = {k: raw.get(k, 0) for k in STATS}
            stats.update(allocated_end=torch.cuda.memory_allocated(),
                         reserved_end=torch.cuda.memory_reserved())
            torch.cuda.memory._record_memory_history(enabled=None)
            self.on = False
        out = {**self.info, "phases": self.phases, "reserved_process": self.reserved_process,
               "stats": stats}
        out.update(_compact(snap, self.markers))
        return out


def _compact(snap: dict, markers: dict[str, int]) -> dict:
    """The snapshot as small lists, and where each phase's marker sits in the trace."""
    entries = (snap.get("device_traces") or [[]])[0]
    trace = [[e["action"], e["size"], e["stream"], e["addr"]] for e in entries]
    segments = [[s["stream"], s["total_size"], s["segment_type"], s.get("is_expandable", False),
                 [[b["size"], b["state"]] for b in s["blocks"]], s["address"]]
                for s in snap.get("segments", [])]
    out = {"trace_len": len(trace), "markers": _marker_indices(trace, markers),
           "trace": trace, "segments": segments}
    if len(trace) >= MAX_ENTRIES:
        out["trace_note"] = f"{len(trace)} entries: the ring buffer is full, the oldest are lost"
    elif len(trace) > LONG_TRACE:
        out["trace_note"] = f"{len(trace)} entries (over {LONG_TRACE})"
    return out


def _marker_indices(trace: list, markers: dict[str, int]) -> dict:
    """Each phase's marker alloc, searched in phase order (index None: not found)."""
    out, start = {}, 0
    for name, size in markers.items():
        at = next((i for i in range(start, len(trace))
                   if trace[i][0] == "alloc" and trace[i][1] == size), None)
        out[name] = {"size": size, "index": at}
        start = start if at is None else at + 1
    return out


# ----------------------------------------------------------------------------- training cases

def _fake_pg() -> None:
    """PyTorch's fake process group at WORLD ranks, this process rank 0 (no communication)."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if not DRY:
        torch.cuda.set_device(0)  # the device mesh fully_shard builds picks the current device
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)


def _zoo_model(name: str):
    """The seeded zoo model and its real inputs, built on the CPU as parallel._run_case does."""
    import torch
    from graphcost.analyzer.frontends.torch.capture import real_inputs

    from graphcost import models_zoo
    model = models_zoo.build_model(name, eval=False)  # seeds torch with 0 itself
    spec = models_zoo.get(name)
    ranges = {k: (int(v[0]), int(v[1])) for k, v in spec.int_ranges.items()}
    torch.manual_seed(0)
    args = real_inputs(models_zoo.input_shapes(name, BATCH), spec.input_dtypes, ranges)
    return model, tuple(a.to(DEV) for a in args.values())


def _units(model: str, strategy: str, precision: str) -> list[str]:
    """The modules graphcost's parallel report wraps, the root aside."""
    from graphcost import analyze
    p = analyze(f"zoo:{model}", batch=BATCH, train=True, optimizer="adam",
                include_inputs=False, what_if=False, precision=precision,
                parallel={"strategy": strategy, "world_size": WORLD}).parallel
    return [u.name for u in p.units if u.name != "(root)"]


def _train_steps(rec: Recorder, model, opt, args) -> None:
    from graphcost.analyzer.measure.reference import training_loss_of
    for step in range(1, STEPS + 1):
        with rec.phase(f"step{step}"):
            opt.zero_grad(set_to_none=True)
            loss = training_loss_of(model, args)
            loss.backward()
            del loss
            opt.step()


def _fsdp(model_name: str, strategy: str, precision: str):
    def run(rec: Recorder) -> None:
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        units = _units(model_name, strategy, precision)
        rec.info["params"] = dict(model=model_name, strategy=strategy, precision=precision,
                                  batch=BATCH, world=WORLD, units=units, steps=STEPS,
                                  optimizer="adam", optimizer_impl="forloop")
        _fake_pg()
        rec.start()  # before the model reaches the device: the trace is the whole history
        model, args = _zoo_model(model_name)
        model = model.to(DEV)  # on the device before fully_shard, which shards it there
        kw: dict = {"reshard_after_forward": strategy != "zero2"}
        if precision == "bf16-master":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
        for name in units:
            fully_shard(model.get_submodule(name), **kw)
        fully_shard(model, **kw)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad],
                               foreach=False)
        _train_steps(rec, model, opt, args)
    return run


def _ddp(model_name: str):
    def run(rec: Recorder) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP
        rec.info["params"] = dict(model=model_name, strategy="ddp", precision="fp32",
                                  batch=BATCH, world=WORLD, steps=STEPS, optimizer="adam",
                                  optimizer_impl="forloop")
        _fake_pg()
        rec.start()  # before the model reaches the device: the trace is the whole history
        model, args = _zoo_model(model_name)
        model = DDP(model.to(DEV))
        # the fake group's allreduce future holds None, which DDP's reducer rejects: the
        # hook stands in for it, its bucket reduced in place as allreduce does
        model.register_comm_hook(None, _inplace_allreduce)
        rec.info["params"]["comm_hook"] = "in-place no-op (fake group)"
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad],
                               foreach=False)
        _train_steps(rec, model, opt, args)
    return run


def _inplace_allreduce(state, bucket):
    import torch
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


# ------------------------------------------------------------------------------ serving cases

PROMPT, NEW_TOKENS, SERVE_BATCH, VOCAB = 512, 64, 4, 32000


def _serve(cache: str):
    def run(rec: Recorder) -> None:
        import torch
        import transformers
        rec.info["params"] = dict(model="accuracy_cuda._hf_llama, use_cache=True",
                                  dtype="bfloat16", batch=SERVE_BATCH, prompt=PROMPT,
                                  new_tokens=NEW_TOKENS, cache=cache, compile=False,
                                  transformers=transformers.__version__)
        rec.start()  # before the model reaches the device: the trace is the whole history
        model = _llama_for_serving()
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, VOCAB, (SERVE_BATCH, PROMPT), generator=gen).to(DEV)
        with torch.no_grad():
            with rec.phase("prefill"):
                out = model(ids, use_cache=True)
                del out  # its past_key_values with it, at the phase's end
            with rec.phase("generate"):
                kw = {"cache_implementation": "static"} if cache == "static" else {}
                seq = model.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS,
                                     min_new_tokens=NEW_TOKENS, pad_token_id=0, **kw)
                rec.info["generated"] = seq.shape[1] - PROMPT
                del seq
    return run


def _llama_for_serving():
    import torch
    torch.manual_seed(0)
    model = _hf_llama(False)  # on the CPU, seeded random weights
    model.config.use_cache = True
    gc = model.generation_config
    gc.use_cache = True
    gc.eos_token_id = None  # random weights: never stop before NEW_TOKENS
    # a static cache would otherwise compile the decode step (CUDA graphs, their own pool)
    gc.disable_compile = True
    return model.to(torch.bfloat16).to(DEV).eval()


# ------------------------------------------------------------------- accuracy_cuda's cases

def _trace(name: str):
    def run(rec: Recorder) -> None:
        import torch
        _, _, train, optimizer, precision, attention = CASES[name]
        rec.info["params"] = dict(accuracy_cuda=name, train=train, optimizer=optimizer,
                                  precision=precision, attention=attention, steps=STEPS)
        rec.start()  # before the model reaches the device: the trace is the whole history
        model, args, opt = prepare(name)
        if not DRY:  # as measure(): what building the model cached is not the steps'
            torch.cuda.empty_cache()
        step = make_step(model, args, train, opt, precision, attention)
        for k in range(1, STEPS + 1):
            with rec.phase(f"step{k}"):
                step()
    return run


TRACE_CASES = {
    "fsdp8-mlp-fsdp": _fsdp("mlp", "fsdp", "fp32"),
    "fsdp8-mlp-zero2": _fsdp("mlp", "zero2", "fp32"),
    "fsdp8-gpt2-fsdp": _fsdp("gpt2", "fsdp", "fp32"),
    "fsdp8-gpt2-fsdp-bf16master": _fsdp("gpt2", "fsdp", "bf16-master"),
    "fsdp8-mlp-fsdp-bf16master": _fsdp("mlp", "fsdp", "bf16-master"),
    "ddp8-mlp": _ddp("mlp"),
    "ddp8-gpt2": _ddp("gpt2"),
    "serve-llama-dynamic": _serve("dynamic"),
    "serve-llama-static": _serve("static"),
    "trace:resnet50-infer-b64": _trace("resnet50-infer-b64"),
    "trace:llama-160M-train-b2-s2048-adamw-bf16true":
        _trace("llama-160M-train-b2-s2048-adamw-bf16true"),
    "trace:decoder-train-s8192-bf16mixed": _trace("decoder-train-s8192-bf16mixed"),
    # the training rows still missing by more than 3% (not recorded yet)
    "trace:resnet50-train-b32-momentum": _trace("resnet50-train-b32-momentum"),
    "trace:llama-160M-train-b2-s2048-adamw": _trace("llama-160M-train-b2-s2048-adamw"),
}


# ------------------------------------------------------------------------------- the driver

def one(name: str) -> dict:
    """Run one case in this process: its row (an error is recorded, never raised)."""
    if name == "env":
        return _env()
    row: dict = {"case": name}
    rec = Recorder()
    try:
        TRACE_CASES[name](rec)
    except Exception as e:  # noqa: BLE001 - a failed case is a row, with its trace so far
        row["error"] = f"{type(e).__name__}: {e}"[:500]
        row["traceback"] = traceback.format_exc()[-1500:]
    try:
        row.update(rec.finish())
    except Exception as e:  # noqa: BLE001
        row["record_error"] = f"{type(e).__name__}: {e}"[:500]
    with contextlib.suppress(Exception):
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    return row


def _env() -> dict:
    import platform

    import torch
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "dry": DRY,
           "python": platform.python_version(), "device": DEV,
           "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
           "timeout_s": TIMEOUT_S, "max_entries": MAX_ENTRIES}
    with contextlib.suppress(Exception):
        import transformers
        out["transformers"] = transformers.__version__
    if not DRY:
        out["gpu"] = torch.cuda.get_device_name()
        out["total_memory"] = torch.cuda.get_device_properties(0).total_memory
        out["allocator_backend"] = torch.cuda.get_allocator_backend()
    return out


def _run(name: str) -> dict:
    """One case in its own process (a fresh CUDA context and allocator): its row."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "benchmarks.cuda_traces", "--one", name],
                              capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        row = {"case": name, "error": f"timed out after {TIMEOUT_S} s"}
    else:
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
        try:
            row = json.loads(lines[-1])
        except (IndexError, ValueError):
            row = {"case": name, "error": f"exit {done.returncode}: {done.stderr[-800:]}"}
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"{name}: {row['wall_s']} s, {row.get('trace_len', 0)} trace entries"
          + (f", error: {row['error'][:120]}" if "error" in row else ""), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--only", nargs="*")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--one")  # internal: one case in this process
    a = p.parse_args()
    if a.one:
        print(json.dumps(one(a.one), separators=(",", ":")))
        return
    out = {"env": _run("env"), "formats": FORMATS, "cases": []}
    with ThreadPoolExecutor(a.workers) as pool:  # each case's allocator is its process's own
        for row in pool.map(_run, a.only or TRACE_CASES):
            out["cases"].append(row)
            if a.json:  # after every case: a cut-short run keeps what it measured
                _write(a.json, out)
    _table(out["cases"])


def _write(path: str, out: dict) -> None:
    """The JSON, gzipped when the path ends in .gz (the traces are most of it)."""
    import gzip
    with (gzip.open(path, "wt") if path.endswith(".gz") else open(path, "w")) as f:
        json.dump(out, f, separators=(",", ":"))


def _table(rows: list[dict]) -> None:
    print("\n| case | phase | allocated MiB | reserved MiB | trace entries | error |")
    print("|---|---|---:|---:|---:|---|")
    for r in rows:
        err = (r.get("error") or r.get("record_error") or "")[:80]
        phases = r.get("phases") or [["—", 0, 0]]
        for i, (phase, alloc, reserved) in enumerate(phases):
            first = i == 0
            print(f"| {r['case'] if first else ''} | {phase} | {alloc / MiB:.1f} | "
                  f"{reserved / MiB:.1f} | {r.get('trace_len', 0) if first else ''} | "
                  f"{err if first else ''} |")
        print(f"| | reserved_process | | {r.get('reserved_process', 0) / MiB:.1f} | | |")


if __name__ == "__main__":
    main()
