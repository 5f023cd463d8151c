"""Predicted vs measured for the Hugging Face models built from configs (README's table).

    python -m benchmarks.accuracy_hf   (from the repository root; ~3.5 minutes on 2 cores)

Models: models_zoo/hf.py (eager attention), batch 2, sequence 32 (ViT 32×32 images,
Whisper 16 mel bins × 64 frames). Measured on this CPU:
  * inference peak: MemTracker over one forward under torch.no_grad() (activations, inputs
    excluded on both sides) — graphcost's eager lifetimes;
  * training peak: MemTracker over the second real step (optimizer state allocated,
    gradients set to None first), optimizer none and adam — graphcost's joint graph;
  * FLOPs: FlopCounterMode over the forward, and over forward + backward (Mixtral with
    transformers' batched_mm experts: FlopCounterMode has no formula for grouped_mm).
Whisper's frozen sinusoidal positions are unfrozen on both sides (MemTracker cannot hook a
parameter that does not require grad). Then the known differences, each shown at its source.
"""
from __future__ import annotations

import warnings

import torch
from graphcost.analyzer.measure.reference import (
    measure_inference,
    measure_training,
    training_loss_of,
)
from graphcost.models_zoo import hf, measurable
from torch.utils.flop_counter import FlopCounterMode

from graphcost import analyze

warnings.filterwarnings("ignore")
BATCH = 2
NAMES = list(hf.HF_MODELS)


build = measurable.build_measurable


def cell(predicted: int, measured: int) -> str:
    return f"{predicted:,} / {measured:,} ({100 * (predicted / measured - 1):+.1f}%)"


def flop_cell(ours: int, theirs: int) -> str:
    return f"{ours:,} {'=' if ours == theirs else '≠'} {theirs:,}"


def counted(model, inputs, train: bool) -> int:
    counter = FlopCounterMode(display=False)
    if train:
        with counter:
            training_loss_of(measurable.KeywordCall(model.train(), inputs), ()).backward()
    else:
        with counter, torch.no_grad():
            model.eval()(**inputs)
    return counter.get_total_flops()


def row(name: str, inputs: dict | None = None, **overrides) -> str:
    inputs = inputs or measurable.example_kwargs(name, BATCH)
    model = build(name, **overrides).eval()
    inf = analyze(model, inputs, include_inputs=False)
    cells = [cell(inf.memory.peak_bytes,
                  measure_inference(measurable.KeywordCall(model, inputs), ())[0])]
    for opt in ("none", "adam"):
        model = build(name, **overrides)
        step = analyze(model, inputs, train=True, optimizer=opt, what_if=False,
                       include_inputs=False)
        cells.append(cell(step.training.peak_bytes,
                          measure_training(measurable.KeywordCall(model, inputs), (), opt)[0]))
    reference = build(name, **{**overrides, "experts": "batched_mm"}) \
        if name == "hf_mixtral" else build(name, **overrides)
    cells.append(flop_cell(2 * inf.totals.macs, counted(reference, inputs, False)))
    cells.append(flop_cell(2 * step.totals.macs, counted(reference, inputs, True)))
    return " | ".join(cells)


def main() -> None:
    print("| model | inference peak | train step, none | train step, adam | forward FLOPs | "
          "train FLOPs |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in NAMES:
        print(f"| {name} | {row(name)} |", flush=True)
    print()
    print("Known differences, each isolated:")
    ids = measurable.example_kwargs("hf_bert", BATCH)
    padded = dict(ids, attention_mask=ids["attention_mask"].clone())
    padded["attention_mask"][:, -1] = 0
    print(f"| hf_bert, one padded token (eager builds the mask too) | {row('hf_bert', padded)} |")
    print(f"| hf_t5, dropout 0 (CPU eager dropout keeps float noise) | "
          f"{row('hf_t5', dropout_rate=0.0)} |")
    print(f"| hf_gpt2, dropout 0 | "
          f"{row('hf_gpt2', resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)} |")
    base = dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                max_position_embeddings=512)
    ids = {"input_ids": torch.randint(0, hf.VOCAB, (1, 128))}
    model = build("hf_bert", **base).eval()
    r = analyze(model, ids, include_inputs=False)
    print(f"| BertModel d 768, 2 layers, 1×128, no mask: inference | "
          f"{cell(r.memory.peak_bytes, measure_inference(measurable.KeywordCall(model, ids), ())[0])} |")


if __name__ == "__main__":
    main()
