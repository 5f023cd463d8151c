"""Speech encoder-decoders named by a config.json take their window of log-mel frames and
their decoder's token ids (analyzer/frontends/torch/hub.py ``input_shapes``): Whisper from its
config was given token ids and refused ("'NoneType' object has no attribute 'shape'")."""
from __future__ import annotations

import json

import pytest
import torch
from graphcost.analyzer.measure.reference import measure_training

from graphcost import GraphcostError, analyze

transformers = pytest.importorskip("transformers")


def test_whisper_from_its_config_trains_against_memtracker(tmp_path):
    # Whisper hears 30 s: 2 · max_source_positions frames of num_mel_bins (here 2 · 64 = 128
    # frames of 16 bins), its decoder ids min(512, max_target_positions = 64) long, the loss
    # cross-entropy over its 1,024 tokens. Measured (2026-12-06, torch 2.13): 7,103,848 B
    # predicted, 7,102,824 B MemTracker (+0.01%)
    cfg = transformers.WhisperConfig(
        vocab_size=1024, num_mel_bins=16, encoder_layers=2, decoder_layers=2, d_model=64,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_ffn_dim=128, max_source_positions=64, max_target_positions=64,
        decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    (tmp_path / "config.json").write_text(json.dumps(
        {**cfg.to_dict(), "architectures": ["WhisperForConditionalGeneration"]}))
    r = analyze(str(tmp_path), batch=2, train=True, optimizer="adamw", include_inputs=False,
                what_if=False)
    assert r.dims == {"decoder_seq": 64}
    assert "1,024" in r.training.loss
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    inputs = {"input_features": torch.randn(2, 16, 128, generator=g),
              "decoder_input_ids": torch.randint(4, 1024, (2, 64), generator=g)}
    measured = measure_training(transformers.WhisperForConditionalGeneration(cfg), (),
                                "adamw", inputs)[0]
    assert abs(r.training.peak_bytes - measured) <= 0.005 * measured, \
        (r.training.peak_bytes, measured)
    with pytest.raises(GraphcostError, match="has no dim 'seq'; its dims: decoder_seq"):
        analyze(str(tmp_path), dims={"seq": 16})
