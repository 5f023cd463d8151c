"""Small Hugging Face ``transformers`` models built from configs: no download, no hub file,
random weights (the optional extra ``hf``).

One of each family a deployment review meets: GPT-2 (MHA, tied head), Llama (GQA), Phi
(parallel attention and MLP), Phi-3 (fused projections), Qwen2
(one full and one sliding-window layer), BERT, T5 (encoder-decoder), ViT, the Whisper encoder
Mixtral (a sparse MoE, top-2 of 4 experts) and gpt-oss (another experts layout: transposed,
interleaved, biased). Sizes are tiny (d 64, 2 layers, vocab 512) so
a real CPU step measures in milliseconds. Attention is ``eager`` (matmul, softmax, matmul):
what PyTorch's FlopCounterMode counts on CPU and what MemTracker measures; pass
``attn="sdpa"`` for the fused kernel. Config overrides go in ``**overrides``.

Reachable as ``zoo:hf_<name>``; ``transformers`` is imported only when a model is built.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .zoo_model import BATCH, SEQ, ZooModel

VOCAB = 512
SEQ_LEN = 32
# Every config: d 64, 4 heads of 16, MLP 128, 2 layers; token ids < VOCAB; bos/eos inside
# the vocabulary (transformers warns otherwise).
_TEXT = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0, use_cache=False)


def _build(cls_name: str, config_name: str, attn: str, defaults: dict[str, Any],
           overrides: dict[str, Any], module: str = "", **config_attrs) -> torch.nn.Module:
    import transformers

    config = getattr(transformers, config_name)(**{**defaults, **overrides},
                                                attn_implementation=attn)
    for key, value in config_attrs.items():
        setattr(config, key, value)
    if module:  # a class not exported at transformers' top level
        import importlib
        cls = getattr(importlib.import_module(module), cls_name)
    else:
        cls = getattr(transformers, cls_name)
    return cls(config)


def gpt2(attn: str = "eager", **overrides) -> torch.nn.Module:
    """GPT2LMHeadModel: learned positions, pre-LN, MHA, lm_head tied to the token embedding."""
    return _build("GPT2LMHeadModel", "GPT2Config", attn,
                  dict(_TEXT, n_positions=128, n_embd=64, n_layer=2, n_head=4), overrides)


def llama(attn: str = "eager", **overrides) -> torch.nn.Module:
    """LlamaForCausalLM: RMSNorm, rotary, GQA (4 query heads share 2 KV heads), SwiGLU."""
    return _build("LlamaForCausalLM", "LlamaConfig", attn,
                  dict(_TEXT, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128), overrides)


def phi(attn: str = "eager", **overrides) -> torch.nn.Module:
    """PhiForCausalLM (Phi-1/2): attention and a GELU MLP (fc1, fc2) in parallel on one
    LayerNorm's output, biases throughout (the head's too), rotary on half of each head,
    4 heads of 16."""
    return _build("PhiForCausalLM", "PhiConfig", attn,
                  dict(_TEXT, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=128,
                       partial_rotary_factor=0.5), overrides)


def phi3(attn: str = "eager", **overrides) -> torch.nn.Module:
    """Phi3ForCausalLM (Phi-3, Phi-4-mini): Llama's block with q/k/v fused into one
    ``qkv_proj`` and gate/up into one ``gate_up_proj``; GQA (4 query heads, 2 KV heads)."""
    return _build("Phi3ForCausalLM", "Phi3Config", attn,
                  dict(_TEXT, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128), overrides)


def qwen2(attn: str = "eager", **overrides) -> torch.nn.Module:
    """Qwen2ForCausalLM: GQA; layer 0 full attention, layer 1 a sliding window of 16."""
    return _build("Qwen2ForCausalLM", "Qwen2Config", attn,
                  dict(_TEXT, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128, use_sliding_window=True, sliding_window=16,
                       max_window_layers=1, tie_word_embeddings=False), overrides)


def bert(attn: str = "eager", **overrides) -> torch.nn.Module:
    """BertModel (with its pooler): post-LN encoder, GELU MLP."""
    return _build("BertModel", "BertConfig", attn,
                  dict(_TEXT, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=128, max_position_embeddings=128), overrides)


def t5(attn: str = "eager", **overrides) -> torch.nn.Module:
    """T5ForConditionalGeneration: encoder-decoder, relative position bias, ReLU MLP."""
    return _build("T5ForConditionalGeneration", "T5Config", attn,
                  dict(_TEXT, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                       num_heads=4, decoder_start_token_id=0), overrides)


def vit(attn: str = "eager", **overrides) -> torch.nn.Module:
    """ViTForImageClassification: 32×32 images in 8×8 patches (16 + the CLS token), 10
    classes."""
    return _build("ViTForImageClassification", "ViTConfig", attn,
                  dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=128, image_size=32, patch_size=8, num_labels=10),
                  overrides)


def whisper_encoder(attn: str = "eager", **overrides) -> torch.nn.Module:
    """WhisperEncoder: two strided convolutions over 16 mel bins × 64 frames → 32 positions."""
    return _build("WhisperEncoder", "WhisperConfig", attn,
                  dict(vocab_size=VOCAB, num_mel_bins=16, d_model=64, encoder_layers=2,
                       encoder_attention_heads=4, encoder_ffn_dim=128, decoder_layers=1,
                       decoder_attention_heads=4, decoder_ffn_dim=128, max_source_positions=32,
                       max_target_positions=32, use_cache=False,
                       # (Whisper's special ids are 50,256 and up: in this vocabulary, or
                       # transformers warns on every build)
                       decoder_start_token_id=1, bos_token_id=1, eos_token_id=2,
                       pad_token_id=0),
                  overrides, module="transformers.models.whisper.modeling_whisper")


def mixtral(attn: str = "eager", experts: str = "grouped_mm", **overrides) -> torch.nn.Module:
    """MixtralForCausalLM: GQA attention, a sparse MoE MLP per layer (4 SwiGLU experts, top-2
    routing). ``experts``: transformers' expert kernel — "grouped_mm" (its default: one
    grouped matmul over the tokens sorted by expert, static shapes), "batched_mm" (each
    token's chosen experts gathered and multiplied one by one; FlopCounterMode counts it) or
    "eager" (a Python loop over the experts that the data hits: not traceable)."""
    return _build("MixtralForCausalLM", "MixtralConfig", attn,
                  dict(_TEXT, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                       num_experts_per_tok=2, max_position_embeddings=128,
                       tie_word_embeddings=False), overrides,
                  _experts_implementation=experts)


def gpt_oss(attn: str = "eager", experts: str = "grouped_mm", **overrides) -> torch.nn.Module:
    """GptOssForCausalLM (gpt-oss): attention with learned sinks, layers alternating a
    sliding window (16) and full attention, a sparse MoE MLP per layer (4 experts of 128,
    top-2) whose stacked weights are transposed, their gate and up columns interleaved and
    biased, with gpt-oss's clamped SwiGLU. ``experts`` as :func:`mixtral`'s."""
    return _build("GptOssForCausalLM", "GptOssConfig", attn,
                  dict(_TEXT, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                       max_position_embeddings=128, tie_word_embeddings=False,
                       # (plain rotary: the config's YaRN is scaled for 128k positions)
                       rope_parameters={"rope_type": "default", "rope_theta": 150000.0}),
                  overrides,
                  _experts_implementation=experts)


def deepseek_v3(attn: str = "eager", experts: str = "grouped_mm",
                **overrides) -> torch.nn.Module:
    """DeepseekV3ForCausalLM (DeepSeek-V3/R1, Kimi K2): multi-head latent attention (queries
    through a rank-32 latent, keys and values through a rank-16 one beside an 8-wide rope
    key), layer 0 a dense SwiGLU MLP, layer 1 a mixture of 4 experts of 32 (top-2, sigmoid
    scores with a correction bias) beside one shared expert. ``experts`` as
    :func:`mixtral`'s."""
    return _build("DeepseekV3ForCausalLM", "DeepseekV3Config", attn,
                  dict(_TEXT, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                       num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                       num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
                       qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                       n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                       n_shared_experts=1, max_position_embeddings=128,
                       tie_word_embeddings=False),
                  overrides, _experts_implementation=experts)


def llama4(attn: str = "eager", **overrides) -> torch.nn.Module:
    """Llama4ForCausalLM (Llama 4 Scout/Maverick's text model): GQA with an L2 norm of the
    queries and keys, complex rotary frequencies, chunked attention; each layer a mixture of
    4 SwiGLU experts of 128 (top-1, sigmoid scores scaling the input) beside a shared
    expert, which transformers runs densely (every expert on every token)."""
    return _build("Llama4ForCausalLM", "Llama4TextConfig", attn,
                  dict(_TEXT, hidden_size=64, intermediate_size=128, intermediate_size_mlp=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, num_local_experts=4, num_experts_per_tok=1,
                       interleave_moe_layer_step=1, attention_chunk_size=64,
                       max_position_embeddings=128, tie_word_embeddings=False), overrides)


def _tokens(*names: str) -> Callable[..., dict[str, tuple[int, ...]]]:
    def shapes(batch: int, seq: int = SEQ_LEN) -> dict[str, tuple[int, ...]]:
        return {n: (batch, seq) for n in names}
    return shapes


def _fixed(name: str, *shape: int) -> Callable[..., dict[str, tuple[int, ...]]]:
    def shapes(batch: int) -> dict[str, tuple[int, ...]]:
        return {name: (batch, *shape)}
    return shapes


def _text(name: str, build, description: str, *inputs: str) -> ZooModel:
    inputs = inputs or ("input_ids",)
    return ZooModel(name, build, _tokens(*inputs), {i: torch.int64 for i in inputs},
                    description, {i: {0: BATCH, 1: SEQ} for i in inputs}, ("output",),
                    int_ranges={i: (0, VOCAB) for i in inputs}, hf=True)


HF_MODELS: dict[str, ZooModel] = {m.name: m for m in [
    _text("hf_gpt2", gpt2, "transformers GPT2LMHeadModel from a config: d 64, 4 heads, 2 "
          "layers, vocab 512, tied lm_head, eager attention"),
    _text("hf_llama", llama, "transformers LlamaForCausalLM from a config: d 64, GQA 4 heads / "
          "2 KV heads, SwiGLU 128, 2 layers, vocab 512, eager attention"),
    _text("hf_phi", phi, "transformers PhiForCausalLM from a config: d 64, 4 heads, attention "
          "and a GELU MLP of 128 in parallel, biases, partial rotary, 2 layers, vocab 512, "
          "eager attention"),
    _text("hf_phi3", phi3, "transformers Phi3ForCausalLM from a config: d 64, GQA 4 heads / 2 "
          "KV heads, fused qkv_proj and gate_up_proj (SwiGLU 128), 2 layers, vocab 512, eager "
          "attention"),
    _text("hf_qwen2", qwen2, "transformers Qwen2ForCausalLM from a config: GQA, layer 0 full "
          "attention, layer 1 sliding window 16, eager attention"),
    _text("hf_bert", bert, "transformers BertModel from a config: d 64, 4 heads, MLP 128, 2 "
          "layers, pooler, eager attention", "input_ids", "attention_mask"),
    _text("hf_t5", t5, "transformers T5ForConditionalGeneration from a config: d 64, 2+2 "
          "layers, 4 heads, eager attention", "input_ids", "decoder_input_ids"),
    ZooModel("hf_vit", vit, _fixed("pixel_values", 3, 32, 32),
             {"pixel_values": torch.float32}, "transformers ViTForImageClassification from "
             "a config: 32×32 images, 8×8 patches, d 64, 2 layers, eager attention",
             {"pixel_values": {0: BATCH}}, ("output",), hf=True),
    ZooModel("hf_whisper_encoder", whisper_encoder, _fixed("input_features", 16, 64),
             {"input_features": torch.float32}, "transformers WhisperEncoder from a config: "
             "16 mel bins × 64 frames, d 64, 2 layers, eager attention",
             {"input_features": {0: BATCH}}, ("output",), hf=True),
    _text("hf_mixtral", mixtral, "transformers MixtralForCausalLM from a config: d 64, 2 "
          "layers, MoE of 4 SwiGLU experts (128) with top-2 routing (grouped_mm), GQA, eager "
          "attention"),
    _text("hf_deepseek_v3", deepseek_v3, "transformers DeepseekV3ForCausalLM from a config: "
          "d 64, 2 layers (a dense MLP, then a MoE of 4 experts of 32, top-2, beside a shared "
          "expert), multi-head latent attention (ranks 32 and 16), eager attention"),
    _text("hf_llama4", llama4, "transformers Llama4ForCausalLM from a config: d 64, 2 layers "
          "of 4 SwiGLU experts (128, top-1, run densely as transformers runs them) beside a "
          "shared expert, GQA with q/k L2 norms, complex rotary, eager attention"),
    _text("hf_gpt_oss", gpt_oss, "transformers GptOssForCausalLM from a config: d 64, 2 "
          "layers (sliding window 16, then full), attention sinks, MoE of 4 experts (128; "
          "transposed, interleaved, biased) with top-2 routing (grouped_mm), GQA, eager "
          "attention"),
]}
