"""A vision-language model served over tensor-parallel ranks (``--serve --parallel tp=N``): its
vision tower and projector held as vLLM's encoder ranks hold them (analyzer/frontends/torch/
serving_towers.py) — sharded where graphcost knows each linear's split (vLLM's default,
``mm_encoder_tp_mode`` "weights"), else whole on every rank ("data"), said in the report.
Both were refused ("... would stay whole on every rank"). Checked by hand arithmetic; the
Llama 4 case is in tests/test_llama4_routed.py."""
from __future__ import annotations

import transformers

from graphcost import analyze

# every text model: d 64, 2 layers, 4 heads of 16 (2 key/value heads), MLP 128, vocab 512,
# fp32; every tower: d 64, 2 layers, 4 heads, MLP 128, 56 × 56 images in patches of 14
TEXT = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=512)
TOWER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, image_size=56, patch_size=14)


def _rank_of_two(tmp_path, config, architecture: str):
    """(the model's own parameter count and buffer bytes on one GPU, a rank of 2's report)."""
    import torch
    config.architectures = [architecture]
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = getattr(transformers, architecture)._from_config(config)
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    two = analyze(str(tmp_path / "config.json"), batch=2,
                  serve={"prompt": 32, "generate": 8, "engine": "vllm"},
                  parallel={"mesh": "tp=2"})
    assert two.serving is not None
    return params, buffers, two


def test_a_clip_tower_is_sharded_as_vllm_shards_it(tmp_path):
    config = transformers.LlavaConfig(text_config=transformers.LlamaConfig(**TEXT).to_dict(),
                                      vision_config=transformers.CLIPVisionConfig(**TOWER)
                                      .to_dict(), image_token_index=500)
    params, buffers, two = _rank_of_two(tmp_path, config, "LlavaForConditionalGeneration")
    assert two.serving is not None
    # one GPU: the Llama text model 139,584 parameters, the CLIP tower and projector 114,304,
    # and 200 B of buffers (position ids 17 int64, two rotary tables of 8 fp32)
    assert (params, buffers) == (139_584 + 114_304, 200)
    # a rank of 2 — the text model as Llama's: its vocabulary's rows 2 · 256 · 64, the final
    # norm 64, a layer q/o 2 · 32 · 64, k/v 2 · 16 · 64, gate/up/down 3 · 64 · 64, norms 128
    # (18,560): 69,952. The tower: its class token 64, patch convolution 64 · 3 · 14 · 14,
    # positions 17 · 64 and 2 layer norms 256 whole; a layer q/k/v 3 · (32 · 64 + 32),
    # out_proj 64 · 32 + 64 (its bias whole), fc1 64 · 64 + 64, fc2 64 · 64 + 64, norms 256
    # (16,928); the projector's linear_1 32 · 64 + 32 and linear_2 64 · 32 + 64
    text = 2 * 256 * 64 + 64 + 2 * 18_560
    tower = 64 + 64 * 3 * 14 * 14 + 17 * 64 + 256 + 2 * 16_928 + (32 * 64 + 32) \
        + (64 * 32 + 64)
    assert two.serving.weight_bytes == (text + tower) * 4 + 200 == 588_360
    assert not any("vision tower whole" in w for w in two.warnings)
    # the served steps make their own ids: text alone (the plain analysis's image and its 16
    # tokens are not theirs; the report said so before)
    assert any(w.startswith("text alone: no image in the prompt") for w in two.warnings)
    assert not any("image a sample" in w for w in two.warnings)


def test_a_tower_graphcost_cannot_split_is_held_whole_as_vllms_data_mode_holds_it(tmp_path):
    # Qwen2.5-VL's tower fuses q/k/v into one `qkv` (vLLM splits it by heads its own way)
    config = transformers.Qwen2_5_VLConfig(
        text_config=dict(TEXT, model_type="qwen2_5_vl_text",
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4,
                           out_hidden_size=64, model_type="qwen2_5_vl"), image_token_id=500)
    params, buffers, two = _rank_of_two(tmp_path, config,
                                        "Qwen2_5_VLForConditionalGeneration")
    assert two.serving is not None
    # the tower whole: a rank holds all but half of the text model's matrices — the
    # embedding and head 2 · 256 · 64; a layer's q 32 · 64 + 32, k, v 16 · 64 + 16 (biased),
    # o 32 · 64, gate/up/down 3 · 64 · 64 (18,496)
    saved = 2 * 256 * 64 + 2 * (32 * 64 + 32 + 2 * (16 * 64 + 16) + 32 * 64 + 3 * 64 * 64)
    assert two.serving.weight_bytes == (params - saved) * 4 + buffers
    assert any("vision tower whole on each rank (vLLM's 'data' encoder mode)" in w
               for w in two.warnings)
