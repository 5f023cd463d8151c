"""Speech models named by a config.json take audio (analyzer/frontends/torch/config_inputs.py
``input_shapes``): an encoder-decoder of log-mel frames its window and its decoder's token ids,
a model of a waveform its samples. Whisper, wav2vec 2.0, HuBERT and WavLM from their configs
were given token ids and refused ("'NoneType' object has no attribute 'shape'", "missing 1
required positional argument: 'input_values'")."""
from __future__ import annotations

import json

import pytest
import torch
from graphcost.analyzer.frontends.torch.compat import TORCH_VERSION
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


@pytest.mark.skipif(TORCH_VERSION < (2, 9), reason="torch 2.8 has no meta kernel for weight "
                    "norm's backward (wav2vec 2.0's positional convolution): the analysis "
                    "says so in one line")
def test_wav2vec2_from_its_config_takes_a_waveform(tmp_path):
    # wav2vec 2.0's CTC model takes input_values, a waveform: --dim samples of it (by default
    # 160,000, 10 s at the 16 kHz its feature extractor takes). Its conv feature encoder
    # strides 5·2·2·2·2·2·2 = 320 here: 16,000 samples make 49 frames. LayerDrop and
    # SpecAugment's random masks off (layerdrop 0, mask_time_prob 0), so the two steps run
    # the same ops; the loss is the sum (a waveform in: no token ids, no LM head by the
    # definition). Measured (2026-12-06, torch 2.13): 6,988,772 B predicted, 6,988,776 B
    # MemTracker (4 B under)
    cfg = transformers.Wav2Vec2Config(
        vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, conv_dim=(32,) * 7, num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, layerdrop=0.0, mask_time_prob=0.0)
    (tmp_path / "config.json").write_text(json.dumps(
        {**cfg.to_dict(), "architectures": ["Wav2Vec2ForCTC"]}))
    assert analyze(str(tmp_path)).dims == {"samples": 160_000}
    r = analyze(str(tmp_path), batch=2, dims={"samples": 16_000}, train=True,
                optimizer="adamw", include_inputs=False, what_if=False)
    torch.manual_seed(0)
    wave = torch.randn(2, 16_000, generator=torch.Generator().manual_seed(1))
    measured = measure_training(transformers.Wav2Vec2ForCTC(cfg), (), "adamw",
                                {"input_values": wave})[0]
    assert abs(r.training.peak_bytes - measured) <= 0.005 * measured, \
        (r.training.peak_bytes, measured)
