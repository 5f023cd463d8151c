"""LayerDrop in a training step (transformers_tracing.every_layer_runs): traced with every
layer run, the most a step costs, and said so; the eager step with p = 0 is the reference."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.measure.reference import measure_training, training_loss_of
from torch.utils.flop_counter import FlopCounterMode

from graphcost import analyze

transformers = pytest.importorskip("transformers")


def _m2m(layerdrop: float):
    cfg = transformers.M2M100Config(
        vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, encoder_layerdrop=layerdrop,
        decoder_layerdrop=layerdrop, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.M2M100Model(cfg)


def test_a_layerdrop_step_is_costed_with_every_layer_run():
    ids = torch.randint(4, 120, (2, 16))
    inputs = dict(input_ids=ids, decoder_input_ids=ids, use_cache=False)
    r = analyze(_m2m(0.5), inputs, train=True, optimizer="sgd", include_inputs=False)
    assert any("LayerDrop (p = 0.5)" in w and "upper bound" in w for w in r.warnings)
    # the eager step with p = 0 (no layer skipped) is what the trace ran
    every = _m2m(0.0).train()
    counter = FlopCounterMode(display=False)
    with counter:
        training_loss_of(every, (), inputs).backward()
    every.zero_grad(set_to_none=True)
    assert 2 * r.totals.macs == counter.get_total_flops()
    measured, _ = measure_training(every, (), "sgd", kwargs=inputs)
    assert abs(r.training.peak_bytes / measured - 1) < 0.01
    model = _m2m(0.5)
    analyze(model, inputs, train=True)
    assert model.encoder.layerdrop == model.config.encoder_layerdrop == 0.5  # put back
