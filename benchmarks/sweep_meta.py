"""Models built on the meta device against the same models built on the CPU.

Every transformers model type with a causal-LM class: its default config shrunk as the breadth
sweep shrinks it (sweep_hf.py ``shrink``: width 64, 2 layers, vocabulary 256, …), written as a
config.json and analyzed as a user's config is — built on the meta device — then the same
config built on the CPU with random weights (seed 0) and analyzed with 2 × 32 token ids: one
training step each (AdamW, the model's loss, inputs left out). Their FLOPs and step peak must
be equal: the two traces run the same module code, and graphcost runs the ops whose gradient
PyTorch's AOTAutograd drops on meta tensors as the CPU does
(analyzer/frontends/torch/meta_gradients.py: before it, T5 from its config was refused and
xLSTM's step was 0.98% under MemTracker's).

    python -m benchmarks.sweep_meta [--only TYPE ...] [--workers N] [--markdown OUT]
                                    [--memtracker]

With --memtracker the CPU build's real step is measured too (MemTracker, AdamW's step 2, the
model's own loss; where that is more than 0.5% off graphcost's analysis of the same model, also
the step with no dispatch mode on) and a type whose analysis is further than 0.5% from it is a
row as well.

Prints a row for each type whose two steps differ or that failed (a config the sweep's
shrinking makes inconsistent fails on both), then the counts. Each type runs in a process of
its own, killed after --timeout seconds (default 180).
"""
from __future__ import annotations

import argparse
import re
from concurrent.futures import ThreadPoolExecutor

from benchmarks.child import add_row, run, write_rows

CASE = r"""
import json, os, tempfile, torch, transformers
from benchmarks.sweep_hf import hf_class, shrink
from graphcost import analyze
cls = hf_class(TYPE)
folder = tempfile.mkdtemp()
data = json.loads(shrink(transformers.AutoConfig.for_model(TYPE), width=True).to_json_string())
with open(os.path.join(folder, "config.json"), "w") as fh:
    json.dump({**data, "architectures": [cls.__name__]}, fh)
kw = dict(train=True, optimizer="adamw", include_inputs=False, what_if=False)
meta = analyze(folder, batch=2, dims={"seq": 32}, **kw)
cfg = transformers.AutoConfig.from_pretrained(folder)
torch.manual_seed(0)
model = cls(cfg)
vocab = getattr(cfg, "vocab_size", None) or cfg.get_text_config().vocab_size
g = torch.Generator().manual_seed(0)
names = ["input_ids"] + (["decoder_input_ids"] if getattr(cfg, "is_encoder_decoder", False) else [])
ids = {n: torch.randint(4, min(200, vocab), (2, 32), generator=g) for n in names}
cpu = analyze(model, ids, **kw)
out = dict(meta_flops=meta.totals.flops, cpu_flops=cpu.totals.flops,
           meta_peak=meta.training.peak_bytes, cpu_peak=cpu.training.peak_bytes)
if MEASURE:   # (the CPU build's real step: MemTracker, AdamW's step 2, the model's own loss;
    # off by more than 0.5%, also the step with no dispatch mode on, which MemTracker's is)
    from graphcost.analyzer.measure import reference as ref
    out["measured"] = ref.measure_training(model, (), "adamw", ids)[0]
    if abs(out["cpu_peak"] / out["measured"] - 1) > 0.005:
        out["unperturbed"] = ref.measure_training_unperturbed(model, (), "adamw", ids)
print(json.dumps(out))
"""


def causal_lm_types() -> list[str]:
    from transformers.models.auto import modeling_auto as ma
    return sorted(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def one(model_type: str, timeout: float, measure: bool = False) -> tuple[str, dict]:
    code = CASE.replace("TYPE", repr(model_type)).replace("MEASURE", repr(measure))
    return model_type, run(code, timeout)


def _row(model_type: str, r: dict) -> str | None:
    """The table's row for ``model_type`` (None: its two steps are equal)."""
    if "error" in r:
        return f"| {model_type} | failed: {_said(r['error'])[:140]} | | |"
    flops = r["meta_flops"] / r["cpu_flops"] - 1
    peak = r["meta_peak"] / r["cpu_peak"] - 1
    real = _real(r)
    if r["meta_flops"] == r["cpu_flops"] and r["meta_peak"] == r["cpu_peak"] \
            and abs(real) <= REAL_OFF:
        return None
    row = f"| {model_type} | differ | {flops:+.3%} | {peak:+.3%} |"
    if "unperturbed" in r:
        mem = r["cpu_peak"] / r["measured"] - 1
        return row + f" {real:+.3%} (MemTracker's mode on: {mem:+.3%}) |"
    return row + (f" {real:+.3%} |" if "measured" in r else "")


def _real(r: dict) -> float:
    """The CPU analysis against the real step: MemTracker's, or where that was more than 0.5%
    off, the step with no dispatch mode on (analyzer.measure.reference
    measure_training_unperturbed: MemTracker's mode makes autograd add gradients out of
    place)."""
    real = r.get("unperturbed", r.get("measured"))
    return r["cpu_peak"] / real - 1 if real else 0.0


REAL_OFF = 0.005   # (--memtracker: a CPU step further than this from MemTracker's is a row)


def _said(error: str) -> str:
    """A child's last line of error as graphcost said it: without the exception's module path
    and the sweep's temporary folder."""
    error = re.sub(r"^[\w.]+(Error|Failure|Exception): ", "", error)
    return re.sub(r"/tmp/\w+:? (\([^)]*\): )?", "", error)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+", help="these model types only")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--markdown", help="also write the table to this file")
    ap.add_argument("--memtracker", action="store_true",
                    help="also the CPU build's real step (MemTracker) against its analysis")
    args = ap.parse_args()
    types = args.only or causal_lm_types()
    rows = ["| model type | meta vs CPU | FLOPs | step peak |", "|---|---|---:|---:|"]
    if args.memtracker:
        rows = [rows[0] + " CPU analysis vs MemTracker |", rows[1] + "---:|"]
    equal = failed = real = 0
    with ThreadPoolExecutor(args.workers) as pool:
        for model_type, r in pool.map(lambda t: one(t, args.timeout, args.memtracker),
                                      types):
            row = _row(model_type, r)
            failed += "error" in r
            equal += row is None
            real += "measured" in r and abs(_real(r)) <= REAL_OFF
            if row is not None:
                add_row(rows, row)
    analyzed = len(types) - failed
    add_row(rows, f"\n{len(types)} model types: {analyzed} analyzed both ways, {equal} of them "
                  f"equal to the byte and the FLOP, {analyzed - equal} differ; {failed} failed"
                  + (f"; {real} CPU steps within {REAL_OFF:.1%} of the real step's"
                     if args.memtracker else ""))
    write_rows(rows, args.markdown)


if __name__ == "__main__":
    main()
