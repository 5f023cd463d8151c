"""Breadth sweep (issue 24): every transformers model type and every timm architecture family
through graphcost and PyTorch's FlopCounterMode.

    python -m benchmarks.sweep_breadth --transformers [--json OUT]   (from the repository root)
    python -m benchmarks.sweep_breadth --timm [--json OUT]           (an environment with timm)
    python -m benchmarks.sweep_breadth --one hf:llama                (one model, one JSON line)
    python -m benchmarks.sweep_breadth --transformers --train        (the SGD training step:
        forward and backward FLOPs, and the peak against MemTracker's; sweep_training.py)

Options: --limit N (the first N names), --only NAME ... (model types, timm families or timm
model names), --timeout S (per model, default 60), --workers N (default 2), --fresh,
--json OUT (the records), --resume (run only the models missing from OUT).

Models:
  * transformers: every model_type of CONFIG_MAPPING_NAMES with an AutoModelForCausalLM class
    (else AutoModel; a type with neither is skipped). Its default config is shrunk where the
    attribute exists and its default is a larger int: width 64, MLP 128, 4 heads (2 KV
    heads, head_dim 16), 128 positions; 2 layers (per-layer lists and dicts such as
    layer_types cut to the first layer and the last), 4 experts (top 2), vocabulary 256
    (special token ids above 199 moved to 200..255), images 32×32 with 8×8 patches; nested
    configs (text_config, vision_config, ...) likewise, a backbone (out_features set) keeping
    its depth. What fails to configure, build or run is retried: with the first 2 layers,
    then without the width cut, then at the default image size too (the record's profile).
    Eager attention where the model builds with it, use_cache=False where its forward takes
    it, random weights (seed 0), float32; more than 300M parameters (counted on meta) skipped.
    Inputs by the class's main_input_name: input_ids (1, 16) (ids 4..199; plus
    decoder_input_ids for an encoder-decoder; plus pixel_values when the forward refuses ids
    alone and the config has an image size), pixel_values (1, C, H, W) for an image model
    (224×224 when its config has no image_size), input_values for a speech encoder of the
    wav2vec2 family (a config with conv_stride: one second of 16 kHz audio, (1, 16,000)) or a
    spectrogram transformer (a config with max_length and num_mel_bins: (1, max_length,
    num_mel_bins)); any other input (audio codecs, video, time series, ...) is skipped as
    "not a text, image or speech model".
  * timm: one architecture per family, a family being (timm module, the letters the model
    name starts with), test_* models left out; its representative is the smallest-looking
    name (size words such as tiny/small, then the first number, then the default input
    size), created with pretrained=False at its pretrained_cfg input_size, batch 1.

Measured per model: the module's sum(p.numel()) against graphcost's params (exact?), and
FlopCounterMode's total over one real CPU forward under torch.no_grad() against graphcost's
2·MACs (within 1%?), graphcost analyzing the same module with the same inputs. Two kernels
FlopCounterMode has no formula for are swapped for its forward only, as
benchmarks/accuracy_hf.py does for Mixtral: scaled_dot_product_attention runs on its math
kernel (CPU's fused kernel would count 0) and transformers' MoE experts run batched_mm
instead of grouped_mm (likewise), an LSTM/GRU without oneDNN (mkldnn_rnn: likewise); a
triangular solve (the gated delta rule's: Qwen3-Next, Qwen3.5, OLMo-hybrid), for which it has
no formula either, is counted by LAPACK's xTRSM count; no parameter requires grad during it.
Computations whose results no output reads (a recurrent state after the last chunk, a
backbone stage no head uses) run eagerly and are counted on both sides (graphcost keeps them
through the decompositions: docs/accuracy.md). graphcost's figure for an op whose size the
data decides is an upper bound: the records keep its "bounded" ops (coverage.bounded).

Each model runs in a process of its own (forked from a parent that imported torch,
transformers/timm and graphcost once, to spare ~2-4 s of imports per model; --fresh starts a
new interpreter per model instead, `--one KIND:NAME`), killed at the timeout; one thread per
process. Prints one row per model, then the counts (constructed, reference forward ran,
analyzed, params exact, MACs within 1%) and the failures grouped by their message's first 80
characters (digits folded to #). A graphcost failure that is not a one-line GraphcostError
naming the problem (an "internal error", another exception type, a crash) is marked BUG.
With --json the records are written as they come; a run stopped by SIGTERM (an outer
`timeout`) prints what finished, and --resume runs only the models missing from the file.

Files: this one runs the sweep (one model: ``run_one``; the processes; the command line);
sweep_hf.py and sweep_timm.py build the models and their inputs, sweep_reference.py counts
FlopCounterMode's reference, sweep_training.py the training step's, sweep_tables.py prints.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable

from .sweep_hf import hf_names, prepare_hf
from .sweep_reference import Failed, Skip, first_line, reference, step_reference
from .sweep_tables import print_table, verdict
from .sweep_timm import prepare_timm, timm_families

warnings.filterwarnings("ignore")

STEP = {"train": False}  # --train: the SGD step (benchmarks/sweep_training.py), not a forward
TRAIN_STEP = dict(train=True, optimizer="sgd", include_inputs=False)  # graphcost's, the same


def run_one(spec: str, stage: Callable[[str], None] = lambda s: None) -> dict:
    """One model, ``hf:MODEL_TYPE`` or ``timm:NAME``, measured; never raises."""
    import torch

    torch.set_num_threads(1)
    kind, _, name = spec.partition(":")
    rec: dict[str, Any] = dict(kind=kind, name=name, model="", constructed=False, ran=False,
                               analyzed=False, params_exact=False, macs_ok=False, skipped="",
                               stage="", error="", bug=False)
    t0 = time.perf_counter()
    try:
        if kind == "hf":
            import transformers
            transformers.logging.set_verbosity_error()
            model, inputs, flops = prepare_hf(name, stage, rec)
            args: Any = inputs
        elif kind == "timm":
            model, args, flops = prepare_timm(name, stage, rec)
        else:
            raise Skip(f"unknown kind {kind!r} (hf or timm)")
        if STEP["train"]:
            flops = step_reference(model, args, stage)
        rec.update(constructed=True, ran=True, flops_ref=flops,
                   params_module=sum(p.numel() for p in model.parameters()))
        rec["build_forward_s"] = round(time.perf_counter() - t0, 2)
        stage("graphcost")
        from graphcost import GraphcostError, analyze
        t1 = time.perf_counter()
        try:
            r = analyze(model, args, **(TRAIN_STEP if STEP["train"] else {}))
        except Exception as exc:
            rec["graphcost_s"] = round(time.perf_counter() - t1, 2)
            one_line = isinstance(exc, GraphcostError) and "\n" not in str(exc).strip()
            rec["bug"] = not one_line or str(exc).startswith("internal error")
            if not isinstance(exc, GraphcostError):
                rec["traceback"] = traceback.format_exc()[-3000:]
            raise Failed("graphcost", exc) from None
        rec["graphcost_s"] = round(time.perf_counter() - t1, 2)
        stage("compare")
        rec.update(analyzed=True, params_gc=r.totals.params, flops_gc=2 * r.totals.macs,
                   coverage=round(r.coverage.percent, 2),
                   unsupported=dict(r.coverage.unsupported), bounded=dict(r.coverage.bounded),
                   warnings=len(r.warnings))
        rec["params_exact"] = r.totals.params == rec["params_module"]
        ref, ours = flops, 2 * r.totals.macs
        rec["macs_ok"] = ours == ref if ref == 0 else abs(ours / ref - 1) <= 0.01
        if STEP["train"]:
            from .sweep_training import compare_peak
            compare_peak(model, args, r, rec)
    except Skip as exc:
        rec["skipped"] = str(exc)
    except Failed as exc:
        rec.update(stage=exc.stage, error=first_line(exc.exc))
        rec["constructed"] = rec["constructed"] or exc.stage in ("forward", "graphcost")
    except BaseException as exc:  # the harness itself: never crash the sweep
        rec.update(stage=rec.get("stage") or "harness", error=first_line(exc),
                   traceback=traceback.format_exc()[-3000:])
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    return rec


# ---------------------------------------------------------------------------------------------
# the sweep: one process per model


class _Job:
    def __init__(self, spec: str, fresh: bool, folder: str):
        self.spec, self.start = spec, time.monotonic()
        self.path = os.path.join(folder, re.sub(r"[^\w.-]", "_", spec) + ".out")
        if fresh:
            with open(self.path, "wb") as out:
                self.proc: subprocess.Popen | None = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.sweep_breadth", "--one", spec,
                     *(["--train"] if STEP["train"] else [])],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.pid = self.proc.pid
            return
        self.proc = None
        pid = os.fork()
        if pid == 0:  # the child: its own process group, quiet, the record in its file
            code = 0
            try:
                os.setpgid(0, 0)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.dup2(null, 2)
                with open(self.path, "w", buffering=1) as f:
                    rec = run_one(spec, lambda s: f.write(f"# stage {s}\n"))
                    f.write(json.dumps(rec) + "\n")
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        self.pid = pid

    def poll(self) -> int | None:
        """The exit status once finished (negative: the signal), else None."""
        if self.proc is not None:
            return self.proc.poll()
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return None
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
        if self.proc is not None:
            self.proc.wait()
        else:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass

    def record(self, status: int | None, timeout: float) -> dict:
        kind, _, name = self.spec.partition(":")
        try:
            with open(self.path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            lines = []
        for line in reversed(lines):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    break
        stages = [ln.split()[-1] for ln in lines if ln.startswith("# stage ")]
        where = stages[-1] if stages else "start"
        why = f"timeout ({timeout:g} s)" if status is None else \
            f"crashed (signal {-status})" if status < 0 else f"exited {status} with no record"
        return dict(kind=kind, name=name, model="", constructed=where in ("forward", "step",
                    "graphcost", "compare"), ran=where in ("graphcost", "compare"), analyzed=False,
                    params_exact=False, macs_ok=False, skipped="", stage=where,
                    error=f"{why} in {where}", bug=where == "graphcost" and status is not None,
                    seconds=round(time.monotonic() - self.start, 1))


def warm_up(kind: str) -> None:
    """One tiny model through both sides in this process before it forks: every child then
    starts with transformers' (or timm's) shared modules and graphcost's tracing imported,
    ~1.5-3 s less per model."""
    import torch
    torch.set_num_threads(1)  # (before any op: no thread pool for the children to inherit)
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        if kind == "hf":
            import transformers
            transformers.logging.set_verbosity_error()
            cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32,
                                           num_hidden_layers=1, num_attention_heads=2,
                                           vocab_size=32, use_cache=False)
            model = transformers.LlamaForCausalLM(cfg).eval()
            args: Any = {"input_ids": torch.ones((1, 4), dtype=torch.long)}
        else:
            model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                        torch.nn.LazyLinear(2)).eval()
            args = (torch.randn(1, 3, 8, 8),)
            model(*args)
        from graphcost import analyze
        reference(model, args if isinstance(args, tuple) else (),
                   args if isinstance(args, dict) else {})
        try:
            analyze(model, args)
        except Exception:
            pass


class _Stop(Exception):
    """SIGTERM (an outer `timeout`): stop, and print what has finished."""


def _stop(signum, frame):
    raise _Stop()


def sweep(specs: list[str], workers: int, timeout: float, fresh: bool,
          done: Callable[[dict], None]) -> bool:
    """Run ``specs``, ``workers`` at a time, each killed after ``timeout`` s; ``done`` gets
    each record as it comes. False when stopped (SIGTERM, Ctrl-C) before the end."""
    import torch
    torch.set_num_threads(1)  # (before forking: no thread pool to inherit)
    queue, running, finished = list(specs), [], 0
    old = signal.signal(signal.SIGTERM, _stop)
    with tempfile.TemporaryDirectory(prefix="sweep_breadth_") as folder:
        try:
            while queue or running:
                while queue and len(running) < workers:
                    running.append(_Job(queue.pop(0), fresh, folder))
                time.sleep(0.1)
                for job in list(running):
                    status = job.poll()
                    late = status is None and time.monotonic() - job.start > timeout
                    if status is None and not late:
                        continue
                    if late:
                        job.kill()
                    running.remove(job)
                    rec = job.record(None if late else status, timeout)
                    finished += 1
                    print(f"[{finished}/{len(specs)}] {job.spec}: {verdict(rec)} "
                          f"{rec.get('seconds', 0):.1f}s", file=sys.stderr, flush=True)
                    done(rec)
        except (_Stop, KeyboardInterrupt):
            print(f"stopped: {len(running) + len(queue)} models not run", file=sys.stderr)
            return False
        finally:
            signal.signal(signal.SIGTERM, old)
            for job in running:
                job.kill()
    return True


# ---------------------------------------------------------------------------------------------
# the command line


def _specs(kind: str, only: list[str], limit: int) -> tuple[list[str], dict[str, str], str]:
    """(the specs to run, {name: family}, the table's title)."""
    import torch
    if kind == "hf":
        import transformers
        names = [n for n in hf_names() if not only or n in only]
        labels = {n: n for n in names}
        title = f"transformers {transformers.__version__} (torch {torch.__version__})"
    else:
        import timm
        families = timm_families()
        if only:
            families = {f: m for f, m in families.items()
                        if f in only or m in only or f.split("/")[1] in only}
            families.update({n: n for n in only if n not in families.values()
                             and timm.is_model(n)})
        names = list(families.values())
        labels = {m: f for f, m in families.items()}
        title = f"timm {timm.__version__} (torch {torch.__version__})"
    names = names[:limit] if limit else names
    return [f"{kind}:{n}" for n in names], labels, title


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sweep_breadth",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--transformers", action="store_true", help="every transformers model type")
    ap.add_argument("--timm", action="store_true", help="one timm model per family")
    ap.add_argument("--limit", type=int, default=0, help="the first N names of each sweep")
    ap.add_argument("--only", nargs="+", default=[], metavar="NAME",
                    help="model types, timm families or timm model names")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per model")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--fresh", action="store_true",
                    help="a new interpreter per model (--one) instead of a fork")
    ap.add_argument("--json", metavar="OUT", help="the records, written as they come")
    ap.add_argument("--resume", action="store_true",
                    help="keep the records already in --json OUT and run only the others")
    ap.add_argument("--train", action="store_true",
                    help="the SGD training step: FLOPs of forward and backward, and the peak "
                         "against MemTracker's (benchmarks/sweep_training.py)")
    ap.add_argument("--one", metavar="KIND:NAME", help="one model (hf:TYPE or timm:NAME): "
                    "its record as one JSON line")
    a = ap.parse_args(argv)
    STEP["train"] = a.train
    if a.one:
        rec = run_one(a.one, lambda s: print(f"# stage {s}", file=sys.stderr, flush=True))
        print(json.dumps(rec), flush=True)
        return
    if not (a.transformers or a.timm):
        ap.error("pass --transformers and/or --timm (or --one KIND:NAME)")
    if a.resume and not a.json:
        ap.error("--resume needs --json OUT")
    out: dict[str, Any] = {}
    if a.resume and os.path.exists(a.json):
        with open(a.json) as f:
            out = json.load(f)

    def save() -> None:
        if a.json:
            with open(a.json + ".tmp", "w") as f:
                json.dump(out, f, indent=1)
            os.replace(a.json + ".tmp", a.json)
    for kind, wanted in (("hf", a.transformers), ("timm", a.timm)):
        if not wanted:
            continue
        specs, labels, title = _specs(kind, a.only, a.limit)
        title += " — the SGD training step" if a.train else ""
        part = out.setdefault(kind + ("-train" if a.train else ""), {})
        part.update(title=title, timeout_s=a.timeout, workers=a.workers)
        kept = {f"{r['kind']}:{r['name']}": r for r in part.get("records", [])}
        part["records"] = list(kept.values())
        todo = [s for s in specs if s not in kept]
        if kept:
            print(f"{len(specs) - len(todo)} records kept from {a.json}; running {len(todo)}",
                  file=sys.stderr)
        if not a.fresh:
            warm_up(kind)
        t0 = time.perf_counter()
        wall0 = part.get("wall_s", 0.0) if kept else 0.0

        def done(rec: dict) -> None:
            rec["family"] = labels.get(rec["name"], rec["name"])
            part["records"].append(rec)
            part["wall_s"] = round(wall0 + time.perf_counter() - t0, 1)
            save()
        complete = sweep(todo, a.workers, a.timeout, a.fresh, done)
        part["wall_s"] = round(wall0 + time.perf_counter() - t0, 1)
        save()
        by_spec = {f"{r['kind']}:{r['name']}": r for r in part["records"]}
        records = [by_spec[s] for s in specs if s in by_spec]
        print_table(records, title, part["wall_s"])
        if len(records) < len(specs):
            print(f"\nNOT RUN (stopped): {len(specs) - len(records)} of {len(specs)} models"
                  + (f"; rerun with --resume --json {a.json} to finish" if a.json else ""))
        if not complete:
            sys.exit(124)


if __name__ == "__main__":
    main()
