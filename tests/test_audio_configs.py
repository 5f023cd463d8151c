"""Speech models named by a config.json take audio (analyzer/frontends/torch/config_inputs.py
``input_shapes``): Whisper its window of log-mel frames, another model of ``input_features``
``--dim frames`` of them (Parakeet, Speech2Text), a model of a waveform its samples, an
encoder-decoder its decoder's token ids beside them. Whisper, wav2vec 2.0, HuBERT and WavLM
from their configs were given token ids and refused ("'NoneType' object has no attribute
'shape'", "missing 1 required positional argument: 'input_values'"); Parakeet, Speech2Text
and Moonshine were refused until 2026-12-06."""
from __future__ import annotations

import json

import pytest
import torch
from graphcost.analyzer.frontends.torch.compat import TORCH_VERSION
from graphcost.analyzer.measure.reference import measure_training
from torch.utils.flop_counter import FlopCounterMode

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


def _written(tmp_path, cfg, arch: str) -> str:
    (tmp_path / "config.json").write_text(json.dumps({**cfg.to_dict(), "architectures": [arch]}))
    return str(tmp_path)


def _step_within(path: str, cls, cfg, dims: dict, inputs: dict, within: float):
    """graphcost's training step of the config at ``path`` (2 samples, AdamW) within
    ``within`` of MemTracker's step 2 of ``cls(cfg)`` on ``inputs``; the report."""
    r = analyze(path, batch=2, dims=dims, train=True, optimizer="adamw",
                include_inputs=False, what_if=False)
    torch.manual_seed(0)
    measured = measure_training(cls(cfg), (), "adamw", inputs)[0]
    assert abs(r.training.peak_bytes - measured) <= within * measured, \
        (r.training.peak_bytes, measured)
    return r


def test_parakeet_ctc_from_its_config_takes_frames_of_its_mel_bins(tmp_path):
    # Parakeet's CTC encoder takes input_features time first, (batch, frames, num_mel_bins of
    # its encoder config): --dim frames of them, by default 1,000 (10 s at its extractor's
    # 10 ms hop). It was refused ("missing 1 required positional argument: 'input_features'").
    # 200 frames of 32 bins, subsampled 8× to 25 positions; the loss the sum (no labels: no
    # token ids in). Measured (2026-12-06, torch 2.13): 3,767,540 B predicted, 3,767,544 B
    # MemTracker (4 B under). FLOPs: FlopCounterMode has no formula for the CPU's fused SDPA
    # kernel, so it counts eager attention: its two products, 2 layers · 2 sequences · 4
    # heads · 25 · 25 positions · 16 dims · 2 · 2 = 640,000 FLOPs
    enc = transformers.ParakeetEncoderConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_mel_bins=32, subsampling_conv_channels=32)
    cfg = transformers.ParakeetCTCConfig(vocab_size=128, encoder_config=enc.to_dict())
    path = _written(tmp_path, cfg, "ParakeetForCTC")
    assert analyze(path).dims == {"frames": 1000}
    frames = torch.randn(2, 200, 32, generator=torch.Generator().manual_seed(1))
    _step_within(path, transformers.ParakeetForCTC, cfg, {"frames": 200},
                 {"input_features": frames}, 0.005)
    forward = analyze(path, batch=2, dims={"frames": 200})
    cfg._attn_implementation = cfg.encoder_config._attn_implementation = "eager"
    model = transformers.ParakeetForCTC(cfg).eval()
    with FlopCounterMode(display=False) as counted, torch.no_grad():
        model(input_features=frames)
    assert forward.totals.params == sum(p.numel() for p in model.parameters())
    assert 2 * forward.totals.macs == counted.get_total_flops()


def test_speech2text_takes_frames_and_its_decoders_ids(tmp_path):
    # Speech2Text: frames of input_feat_per_channel × input_channels features, time first, and
    # decoder ids of min(512, max_target_positions = 64); it was refused ("'NoneType' object
    # has no attribute 'transpose'"). Measured (2026-12-06, torch 2.13): 5,881,628 B
    # predicted, 5,931,804 B MemTracker (−0.85%); 2·MACs equal FlopCounterMode's (its
    # attention is eager)
    cfg = transformers.Speech2TextConfig(
        vocab_size=256, d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_ffn_dim=128, conv_channels=64, input_feat_per_channel=32,
        max_source_positions=256, max_target_positions=64, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2)
    path = _written(tmp_path, cfg, "Speech2TextForConditionalGeneration")
    g = torch.Generator().manual_seed(1)
    inputs = {"input_features": torch.randn(2, 200, 32, generator=g),
              "decoder_input_ids": torch.randint(4, 256, (2, 64), generator=g)}
    r = _step_within(path, transformers.Speech2TextForConditionalGeneration, cfg,
                     {"frames": 200}, inputs, 0.01)
    assert r.dims == {"decoder_seq": 64, "frames": 200}
    forward = analyze(path, batch=2, dims={"frames": 200})
    model = transformers.Speech2TextForConditionalGeneration(cfg).eval()
    with FlopCounterMode(display=False) as counted, torch.no_grad():
        model(**inputs)
    assert 2 * forward.totals.macs == counted.get_total_flops()


def test_moonshine_takes_a_waveform_and_its_decoders_ids(tmp_path):
    # Moonshine's encoder-decoder takes a waveform (input_values) and decoder ids; it was given
    # the waveform alone ("You must specify exactly one of input_ids or inputs_embeds").
    # Measured (2026-12-06, torch 2.13): 6,571,768 B predicted, 6,570,744 B MemTracker
    # (+0.02%)
    cfg = transformers.MoonshineConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, encoder_num_hidden_layers=2,
        decoder_num_hidden_layers=2, encoder_num_attention_heads=4,
        decoder_num_attention_heads=4, max_position_embeddings=64, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    path = _written(tmp_path, cfg, "MoonshineForConditionalGeneration")
    g = torch.Generator().manual_seed(1)
    inputs = {"input_values": torch.randn(2, 16_000, generator=g),
              "decoder_input_ids": torch.randint(4, 256, (2, 64), generator=g)}
    r = _step_within(path, transformers.MoonshineForConditionalGeneration, cfg,
                     {"samples": 16_000}, inputs, 0.005)
    assert r.dims == {"decoder_seq": 64, "samples": 16_000}


def test_a_plan_searches_a_speech_encoder_without_token_embeddings(tmp_path):
    # graphcost plan asks transformers for the model's token embedding (a tied LM head?);
    # Parakeet's default get_input_embeddings raises NotImplementedError, which was an
    # internal error. Its layouts are data parallel: tensor parallelism of its convolutions is
    # refused by name
    from graphcost.analyzer.app.plan import plan_training
    from graphcost.analyzer.app.plan_settings import PlanSpec
    enc = transformers.ParakeetEncoderConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_mel_bins=32, subsampling_conv_channels=32)
    path = _written(tmp_path, transformers.ParakeetCTCConfig(
        vocab_size=128, encoder_config=enc.to_dict()), "ParakeetForCTC")
    p = plan_training(path, PlanSpec(gpus=2, batch=2), {"train": True, "device": "h100",
                                                        "dims": {"frames": 200}})
    assert p.best is not None and p.best.settings.mesh.size("tp") == 1
    refused = [c for c in p.candidates if c.status == "refused"]
    assert refused and all("would stay whole" in (c.detail or str(c.error)) for c in refused)
