"""Vision models named by a config.json (a hub id's, or a folder's): they take pixel values at
the config's image size, its vision tower's, or ImageNet's 224 where the config names none
(analyzer/frontends/torch/config_inputs.py ``input_shapes``; ``--dim image=S`` sets the side). Before,
ResNet, RegNet, BiT, SegFormer (no image_size) and CLIP's and SigLIP's image classifiers (the
size in their vision_config) were given token ids and refused ("'NoneType' object has no
attribute 'shape'")."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from graphcost import GraphcostError, analyze

transformers = pytest.importorskip("transformers")


def _folder(tmp_path, cfg, cls: str):
    (tmp_path / "config.json").write_text(json.dumps({**cfg.to_dict(), "architectures": [cls]}))
    return str(tmp_path)


def test_resnet50_from_its_config_at_imagenets_size(tmp_path):
    # microsoft/resnet-50's architecture (ResNetConfig's defaults) with ImageNet's 1,000
    # labels: torchvision's published resnet50 has 25,557,032 parameters and 4.09 GMACs at
    # 224 × 224 (its docs' "GFLOPS" column counts multiply-adds)
    cfg = transformers.ResNetConfig(num_labels=1000)
    r = analyze(_folder(tmp_path, cfg, "ResNetForImageClassification"))
    assert r.totals.params == 25_557_032
    assert r.dims == {"image": 224}
    assert round(r.totals.macs / 1e9, 2) == 4.09


def test_a_vision_towers_size_and_a_side_asked(tmp_path):
    # CLIP's image classifier: the image size is its vision_config's (32 here: 2 × 2 patches
    # of 16 and the class token, so 5 positions); --dim image asks another side, and a dim
    # the model does not take is refused by name
    cfg = transformers.CLIPConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 16},
        text_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                     "num_attention_heads": 2})
    folder = _folder(tmp_path, cfg, "CLIPForImageClassification")
    r = analyze(folder, batch=2)
    assert r.dims == {"image": 32}
    torch.manual_seed(0)
    built = transformers.CLIPForImageClassification(cfg)
    assert r.totals.params == sum(p.numel() for p in built.parameters())
    with pytest.raises(GraphcostError, match="has no dim 'seq'; its dims: image"):
        analyze(folder, dims={"seq": 16})


def test_a_resnets_step_from_its_config_against_the_real_step(tmp_path):
    # A small ResNet (two basic stages of 16 and 32 channels), 2 images of 64 × 64, AdamW's
    # second step. The real step measured with no dispatch mode on
    # (measure_training_unperturbed): while a dispatch mode is on, autograd adds gradients
    # out of place, and MemTracker measured 913,896 B. Measured (2026-12-06, torch 2.13): 897,892 B
    # predicted, 897,512 B unperturbed (+0.04%)
    from graphcost.analyzer.measure.reference import measure_training_unperturbed

    cfg = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                    layer_type="basic", num_labels=10)
    r = analyze(_folder(tmp_path, cfg, "ResNetForImageClassification"), batch=2,
                dims={"image": 64}, train=True, optimizer="adamw", include_inputs=False,
                what_if=False)
    torch.manual_seed(0)
    pixels = torch.randn(2, 3, 64, 64)
    real = measure_training_unperturbed(transformers.ResNetForImageClassification(cfg), (),
                                        "adamw", {"pixel_values": pixels})
    assert abs(r.training.peak_bytes - real) <= 0.005 * real, (r.training.peak_bytes, real)


def test_a_text_model_beside_a_vision_tower_takes_token_ids(tmp_path):
    # Gemma 3's sequence classifier has a vision_config (image_size 32 here) but its forward
    # takes input_ids first: it is a model of tokens, as before the vision tower's size was read
    cfg = transformers.Gemma3Config(
        text_config={"vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
                     "num_hidden_layers": 1, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "head_dim": 16},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 16})
    r = analyze(_folder(tmp_path, cfg, "Gemma3ForSequenceClassification"),
                dims={"seq": 16})
    assert r.dims == {"seq": 16}
    # said: its forward takes pixel values too, and the step is of its text alone
    assert any(w.startswith("no image: the step of its text alone") for w in r.warnings)


@pytest.mark.skipif(importlib.util.find_spec("timm") is not None,
                    reason="timm is installed here: DETR's timm backbone builds")
def test_a_missing_backbone_library_is_named(tmp_path):
    # DETR's config asks for a timm backbone; transformers' ImportError starts with a newline,
    # and the one-line error showed nothing after "ImportError:"
    cfg = transformers.DetrConfig()
    with pytest.raises(GraphcostError, match="ImportError: TimmBackbone requires the timm "
                                             "library"):
        analyze(_folder(tmp_path, cfg, "DetrForObjectDetection"))


def test_an_image_to_text_encoder_decoder_takes_decoder_ids_too(tmp_path):
    # VisionEncoderDecoder (TrOCR's, Donut's class): pixel_values at its image encoder's size
    # (32 here) and decoder ids of decoder_seq (512, at most the decoder's 64 positions); the
    # loss cross-entropy over the decoder's 1,024 tokens. Before, it was given 224-pixel images
    # and no decoder ids and refused. Measured (2026-12-06, torch 2.13): 3,463,680 B
    # predicted, 3,462,656 B MemTracker (+0.03%)
    from graphcost.analyzer.measure.reference import measure_training

    vit = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, image_size=32, patch_size=16)
    gpt2 = transformers.GPT2Config(vocab_size=1024, n_embd=32, n_layer=1, n_head=2,
                                   n_positions=64, add_cross_attention=True, is_decoder=True,
                                   bos_token_id=1, eos_token_id=2)
    cfg = transformers.VisionEncoderDecoderConfig.from_encoder_decoder_configs(vit, gpt2)
    cfg.decoder_start_token_id, cfg.pad_token_id = 0, 0
    r = analyze(_folder(tmp_path, cfg, "VisionEncoderDecoderModel"), batch=2, train=True,
                optimizer="adamw", include_inputs=False, what_if=False)
    assert r.dims == {"decoder_seq": 64, "image": 32}
    assert "1,024" in r.training.loss
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    inputs = {"pixel_values": torch.randn(2, 3, 32, 32, generator=g),
              "decoder_input_ids": torch.randint(4, 1024, (2, 64), generator=g)}
    measured = measure_training(transformers.VisionEncoderDecoderModel(cfg), (), "adamw",
                                inputs)[0]
    assert abs(r.training.peak_bytes - measured) <= 0.005 * measured, \
        (r.training.peak_bytes, measured)


def test_a_text_model_whose_config_names_an_image_size_takes_token_ids(tmp_path):
    # Perceiver's config names the image size its image classifiers take (56 by default), but
    # its text classifier's forward takes token ids (``inputs``, alias ``input_ids``) and no
    # pixels: given an image it failed ("embedding(): argument 'indices' must be Tensor").
    # Token ids of its 256 positions; 2·MACs equal FlopCounterMode's on the eager forward
    from torch.utils.flop_counter import FlopCounterMode

    cfg = transformers.PerceiverConfig(num_latents=32, d_latents=64, d_model=64, num_blocks=1,
                                       num_self_attends_per_block=2, num_labels=2,
                                       num_self_attention_heads=4, num_cross_attention_heads=4,
                                       vocab_size=262, max_position_embeddings=256)
    r = analyze(_folder(tmp_path, cfg, "PerceiverForSequenceClassification"))
    assert r.dims == {"seq": 256}
    torch.manual_seed(0)
    built = transformers.PerceiverForSequenceClassification(cfg).eval()
    assert r.totals.params == sum(p.numel() for p in built.parameters())
    counter = FlopCounterMode(display=False)
    with counter:
        built(input_ids=torch.zeros(1, 256, dtype=torch.long))
    assert 2 * r.totals.macs == counter.get_total_flops()


def _llava(image: int = 64):
    """A small LLaVA: a Llama of 2 layers after a CLIP tower of 2, patches of 16 — 16 image
    features at 64 pixels (the class token dropped: its 'default' feature strategy)."""
    text = transformers.LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=256)
    vision = transformers.CLIPVisionConfig(image_size=image, patch_size=16, hidden_size=64,
                                           intermediate_size=128, num_hidden_layers=2,
                                           num_attention_heads=4)
    return transformers.LlavaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                    image_token_index=1000, image_seq_length=16)


def test_a_vision_language_model_trains_on_an_image_and_its_text(tmp_path):
    # A config.json of LLaVA was given token ids alone: its vision tower never ran, and the
    # step left it without gradients ("no grad" 491.50 KiB here), a text model's step. Now one
    # 64 × 64 image a sample, its 16 image tokens first in each sequence, the model's own loss
    # over the logits; against the same step run on the CPU with MemTracker (the tower's last
    # layer, whose output LLaVA does not read, left without gradient as eager leaves it).
    # Measured (2026-12-07, torch 2.13): 7,211,608 B predicted, 7,323,800 B MemTracker (-1.5%;
    # its "Temp" 1 MiB is the CPU attention's scratch)
    from graphcost.analyzer.measure.reference import measure_training

    cfg = _llava()
    r = analyze(_folder(tmp_path, cfg, "LlavaForConditionalGeneration"), batch=2,
                dims={"seq": 64}, train=True, optimizer="adamw", include_inputs=False,
                what_if=False)
    assert r.dims == {"seq": 64, "image": 64}
    assert "ForCausalLMLoss" in r.training.loss
    assert any("its 16 image tokens first in each sequence of 64" in n for n in r.warnings), \
        r.warnings
    torch.manual_seed(0)
    ids = torch.full((2, 64), 3)
    ids[:, :16] = 1000   # (what LLaVA's processor makes of "<image>" at 64 pixels)
    measured = measure_training(transformers.LlavaForConditionalGeneration(cfg), (), "adamw",
                                {"input_ids": ids, "pixel_values": torch.randn(2, 3, 64, 64)})[0]
    assert abs(r.training.peak_bytes / measured - 1) <= 0.02, (r.training.peak_bytes, measured)


def test_an_images_side_is_its_towers_and_its_tokens_must_fit_the_sequence(tmp_path):
    # LLaVA's processor resizes every image to its tower's side (CLIP's refuses another: "Input
    # image size (128*128) doesn't match model (64*64)"); 16 image tokens leave no text in 16
    folder = _folder(tmp_path, _llava(), "LlavaForConditionalGeneration")
    with pytest.raises(GraphcostError, match="resizes every image to its vision tower's 64"):
        analyze(folder, dims={"seq": 96, "image": 128})
    with pytest.raises(GraphcostError, match="holds no text beside the 16 tokens of the image"):
        analyze(folder, dims={"seq": 16})


def test_a_depth_model_whose_neck_reads_every_layer_from_its_config(tmp_path):
    # DPT's neck reads the hidden states of 4 of its 8 layers (backbone_out_indices): traced
    # with the layer list cut to three it fails ("The number of hidden states should be equal
    # to the number of neck hidden sizes"), and traced whole after that it failed the same
    # way — transformers had installed its hidden-state hooks on the three layers the first
    # run had, and never again (layer_stack.py). Refused before; now traced whole, its step
    # the same as with every layer traced and as MemTracker's of the CPU-built model.
    # Measured (2026-12-07, torch 2.13): 6,117,204 B predicted, 6,117,208 MemTracker (4 B under)
    from graphcost.analyzer.measure.reference import measure_training

    cfg = transformers.DPTConfig(hidden_size=32, num_hidden_layers=8, num_attention_heads=2,
                                 intermediate_size=64, image_size=32, patch_size=8,
                                 backbone_out_indices=[1, 3, 5, 7],
                                 neck_hidden_sizes=[16, 16, 16, 16], fusion_hidden_size=16,
                                 head_in_index=-1)
    folder = _folder(tmp_path, cfg, "DPTForDepthEstimation")
    kw = dict(batch=2, train=True, optimizer="adamw", include_inputs=False, what_if=False)
    r = analyze(folder, **kw)
    assert r.dims == {"image": 32} and not r.traced_layers
    assert r.training.peak_bytes == analyze(folder, all_layers=True, **kw).training.peak_bytes
    torch.manual_seed(0)
    measured = measure_training(transformers.DPTForDepthEstimation(cfg), (), "adamw",
                                {"pixel_values": torch.randn(2, 3, 32, 32)})[0]
    assert abs(r.training.peak_bytes - measured) <= 64, (r.training.peak_bytes, measured)


def test_a_video_model_takes_its_configs_frames(tmp_path):
    # VideoMAE's classifier takes a clip, (batch, frames, channels, side, side): it was given
    # images and refused ("not enough values to unpack (expected 5, got 4)"). Its config's 4
    # frames of 32 × 32 here, tubelets of 2 frames × 16 × 16 pixels: 2 · 2 · 2 = 8 tokens.
    # Against the CPU-built model's AdamW second step measured with no dispatch mode on (as
    # the ResNet above: MemTracker's mode makes autograd add gradients out of place, 1,555,684
    # B). Measured (2026-12-07, torch 2.13): 1,456,352 B predicted, 1,456,364 B (12 B under)
    from graphcost.analyzer.measure.reference import measure_training_unperturbed

    cfg = transformers.VideoMAEConfig(image_size=32, patch_size=16, num_frames=4, tubelet_size=2,
                                      hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, intermediate_size=64,
                                      num_labels=5)
    r = analyze(_folder(tmp_path, cfg, "VideoMAEForVideoClassification"), batch=2, train=True,
                optimizer="adamw", include_inputs=False, what_if=False)
    assert r.dims == {"image": 32}
    torch.manual_seed(0)
    clip = torch.randn(2, 4, 3, 32, 32)
    real = measure_training_unperturbed(transformers.VideoMAEForVideoClassification(cfg), (),
                                        "adamw", {"pixel_values": clip})
    assert abs(r.training.peak_bytes - real) <= 0.001 * real, (r.training.peak_bytes, real)
