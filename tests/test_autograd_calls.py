"""Eager autograd runs each backward formula as one call that holds what its forward saved
until it returns (passes/memory/liveness.py). The joint graph's nodes are marked with the formula
that made each while AOTAutograd retraces the graph (compat.marked_autograd_nodes). Against
the CPU step measured with no dispatch mode on."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.measure.reference import measure_training_unperturbed

from graphcost import analyze


def test_every_formula_of_a_gated_delta_rule_holds_what_it_saved():
    # OLMo-hybrid's linear-attention layer solves one unit lower-triangular system twice
    # (torch.linalg.solve_triangular). LinalgSolveTriangularBackward makes B's gradient,
    # then A's (a matmul, its negation, its lower triangle): eager holds the system and the
    # solution it saved until A's gradient is made. The joint graph's nodes used to be
    # matched to their formula by name after the retrace, which names views otherwise:
    # past the first mismatch most nodes went unmarked, their inputs were freed at their
    # last read, and this step's peak was 1,510,280 B against eager's 1,596,312 (−5.4%).
    # What is left, +4,080 B, is about the 4,096 B of a 64 × 64 boolean mask that tril's
    # decomposition makes and eager's kernel does not.
    transformers = pytest.importorskip("transformers")
    cfg = transformers.OlmoHybridConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.OlmoHybridForCausalLM(cfg)
    inputs = {"input_ids": torch.randint(4, 200, (1, 16))}
    r = analyze(model, inputs, train=True, optimizer="sgd", include_inputs=False,
                what_if=False)
    eager = measure_training_unperturbed(model, (), "sgd", inputs)
    assert 0 <= r.training.peak_bytes - eager <= 2 * 4_096, (r.training.peak_bytes, eager)
