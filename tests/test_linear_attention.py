"""Linear attention as PyTorch runs it: transformers' chunked gated delta rule (Qwen3-Next,
Qwen3.5, OLMo-hybrid; ``torch_chunk_gated_delta_rule``) solves each chunk's triangular system
with ``torch.linalg.solve_triangular`` when it runs eagerly and by a Python loop of forward
substitution when ``torch.export`` traces it. graphcost traces the eager branch
(analyzer/frontends/torch/transformers_tracing.py): the ops eager dispatches, against a
TorchDispatchMode log of a real forward (all of them: what no output reads is kept,
dead_ends.py), and the memory of a real training step, against MemTracker."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from graphcost.analyzer.measure.reference import measure_training
from torch.utils._python_dispatch import TorchDispatchMode

from graphcost import analyze

transformers = pytest.importorskip("transformers")

SEQ = 100   # two chunks of 64 (the rule pads the sequence to 128)
PRODUCTS = ("aten.mm.default", "aten.bmm.default", "aten.linalg_solve_triangular.default")


def _qwen35():
    # one gated-delta layer (2 key heads, 4 value heads of 16) and one full-attention layer,
    # eager attention (its products as matmuls on every torch: which SDPA kernel a CPU runs
    # is tests/test_attention_kernels.py's)
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "full_attention"], max_position_embeddings=256,
        use_cache=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        attn_implementation="eager")
    return Qwen3_5ForCausalLM(cfg)


class _Products(TorchDispatchMode):
    """The matrix products (and triangular solves) a forward dispatches, with their operands'
    shapes."""

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in PRODUCTS:
            self.calls[(str(func), tuple(tuple(a.shape) for a in args[:2]))] += 1
        return func(*args, **(kwargs or {}))


def test_the_products_are_the_ones_eager_dispatches():
    model, ids = _qwen35().eval(), torch.randint(3, 256, (2, SEQ))
    log = _Products()
    with log, torch.no_grad():
        model(ids, use_cache=False)
    r = analyze(model, (ids,))
    traced = Counter((n.op, tuple(tuple(int(d) for d in s.split("×")) for s in
                                  n.input_shapes[:2])) for n in r.nodes if n.op in PRODUCTS)
    # the two solves (new values, decayed keys: B·H·chunks = 2·4·2 systems of 64 against 16
    # columns) are traced, not the export branch's loop and its two extra products
    solve = ("aten.linalg_solve_triangular.default", ((2, 4, 2, 64, 64), (2, 4, 2, 64, 16)))
    assert traced[solve] == log.calls[solve] == 2
    # and every product eager runs: the recurrent state's update (kᵀ·v of a chunk, (B·H, 16,
    # 64)·(B·H, 64, 16)) after each of the two chunks, the last too, which no output reads
    # without a cache: a dead end the decompositions would drop (dead_ends.py)
    update = ("aten.bmm.default", ((8, 16, 64), (8, 64, 16)))
    assert traced[update] == log.calls[update] == 2
    assert traced == log.calls
    assert r.coverage.unsupported == {}


def test_a_training_step_holds_what_memtracker_measures():
    # AdamW, batch 2 × 100 tokens: 6,621,512 B measured on this CPU (torch 2.13), 6,607,972
    # predicted (−0.2%); the export branch's graph (4,962 nodes against 1,308) held its
    # forward substitution's row copies for the backward: 12,264,548 B predicted (+85%)
    model, ids = _qwen35(), torch.randint(3, 256, (2, SEQ))
    measured = measure_training(model, (ids,), "adamw", {"use_cache": False})[0]
    r = analyze(model, (ids,), train=True, optimizer="adamw", include_inputs=False)
    assert abs(r.training.peak_bytes / measured - 1) <= 0.01
    assert "aten.linalg_solve_triangular.default" in {n.op for n in r.nodes}
