"""The training step with PyTorch's attention kernels: graphcost against MemTracker on this
CPU (issue 22's table in docs/training.md and benchmarks/README.md).

    python -m benchmarks.accuracy_attention   (from the repository root; ~2 minutes)

Models: the 2-block SDPA decoder of tests/test_step_as_run.py (analyzed on the meta device),
and transformers' Llama, GPT-2 and BERT built from small configs (d 256, 2 layers, 4 heads;
Llama with 2 key/value heads) with ``attn_implementation="sdpa"`` and no dropout, analyzed
as the real modules; sequence 256 and 2048, no optimizer and AdamW; the math rows force the
math kernel in both (``sdpa_kernel`` / ``attention="math"``). Measured: MemTracker over the
second real CPU training step (analyzer/measure/reference.py measure_training).
"""
from __future__ import annotations

import contextlib
import warnings

import torch
from graphcost.analyzer.measure.reference import measure_training
from torch.nn.attention import SDPBackend, sdpa_kernel

from graphcost import analyze
from tests.test_step_as_run import Decoder

warnings.filterwarnings("ignore")


def _hf(name: str):
    import transformers as t

    common = dict(attn_implementation="sdpa")
    if name == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(
            hidden_size=256, intermediate_size=688, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096, **common))
    if name == "gpt2":
        return t.GPT2LMHeadModel(t.GPT2Config(
            n_embd=256, n_layer=2, n_head=4, vocab_size=1000, n_positions=4096, attn_pdrop=0,
            resid_pdrop=0, embd_pdrop=0, bos_token_id=0, eos_token_id=0, **common))
    return t.BertForMaskedLM(t.BertConfig(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
        vocab_size=1000, max_position_embeddings=4096, hidden_dropout_prob=0,
        attention_probs_dropout_prob=0, **common))


def row(name: str, seq: int, optimizer: str, attention: str = "auto") -> str:
    torch.manual_seed(0)
    if name == "decoder":
        model, args = Decoder(), (torch.randn(1, seq, 256),)
    else:
        model, args = _hf(name), (torch.randint(0, 1000, (1, seq)),)
    forced = sdpa_kernel([SDPBackend.MATH]) if attention == "math" else contextlib.nullcontext()
    # graphcost traces a training step without a KV cache (call_defaults in
    # analyzer/frontends/torch); a decoder's default use_cache=True would keep the cache's
    # concatenated key/value copies for the backward (GPT-2: 4 · S · 256 · 4 B more), so the
    # measured step runs without one too
    kwargs = {"use_cache": False} if name in ("gpt2", "llama") else None
    with forced:
        measured, _ = measure_training(model, args, optimizer, kwargs)
    if name == "decoder":  # analyzed on the meta device, as a 7B model would be
        with torch.device("meta"):
            model = Decoder()
        args = (torch.empty(1, seq, 256, device="meta"),)
    r = analyze(model, args, train=True, optimizer=optimizer, what_if=False,
                attention=attention)
    kernels = ", ".join(f"{u.kernel} ×{u.calls}" for u in r.attention) or "—"
    got = r.training.peak_bytes
    return (f"| {name} | {seq} | {optimizer} | {kernels} | {got / 1e6:.1f} | "
            f"{measured / 1e6:.1f} | {100 * (got / measured - 1):+.1f}% |")


def main() -> None:
    print("| model | seq | optimizer | kernel (graphcost) | graphcost MB | MemTracker MB | error |")
    print("|---|---:|---|---|---:|---:|---:|")
    for name in ("decoder", "llama", "gpt2", "bert"):
        for seq in (256, 2048):
            for optimizer in ("none", "adamw"):
                print(row(name, seq, optimizer), flush=True)
    for seq in (256, 2048):
        print(row("decoder", seq, "none", "math"), flush=True)


if __name__ == "__main__":
    main()
