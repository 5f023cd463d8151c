"""Models named by their Hugging Face hub id, read from a local hub cache written here in the
layout huggingface_hub writes (models--ORG--NAME/snapshots/REV/config.json, refs/main), offline
(HF_HUB_OFFLINE=1). The configs are the published config.json values; the parameter counts are
the published ones (each source in a comment), never graphcost's own output."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from graphcost import GraphcostError, analyze
from tests.cli_runner import run
from tests.test_bad_input import assert_one_line_error

LLAMA_31_8B = {  # meta-llama/Llama-3.1-8B config.json
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192,
                                            "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256}
MISTRAL_7B = {  # mistralai/Mistral-7B-v0.1 config.json
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 32000}
QWEN25_7B = {  # Qwen/Qwen2.5-7B config.json
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072,
    "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 152064}
BERT_BASE = {  # google-bert/bert-base-uncased config.json (no dtype: float32)
    "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
    "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
    "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
    "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522}
GEMMA2_9B = {  # https://huggingface.co/google/gemma-2-9b/blob/main/config.json (stored in fp32)
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
    "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
    "sliding_window": 4096, "sliding_window_size": 4096, "torch_dtype": "float32",
    "transformers_version": "4.42.0.dev0", "use_cache": True, "vocab_size": 256000}
PHI3_MINI_4K = {  # https://huggingface.co/microsoft/Phi-3-mini-4k-instruct/blob/main/config.json
    "_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"],
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                 "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
    "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.2",
    "use_cache": True, "attention_bias": False, "vocab_size": 32064}

MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1 config.json
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 32000}
DEEPSEEK_V2_LITE = {  # https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV2Config",
                 "AutoModel": "modeling_deepseek.DeepseekV2Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001,
    "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 102400}


MODELS = {
    # model.safetensors.index.json metadata.total_size 16,060,522,496 B in bf16 / 2; by hand:
    # embeddings and lm_head 2·128,256·4,096 + 32 layers · (q, o 4,096² each; k, v 4,096·1,024
    # each; MLP 3·4,096·14,336; 2 norms 4,096) + the final norm 4,096
    "meta-llama/Llama-3.1-8B": (LLAMA_31_8B, 8_030_261_248, "bfloat16"),
    # index total_size 14,483,464,192 B / 2: as Llama-3.1-8B with a 32,000-token vocabulary
    "mistralai/Mistral-7B-v0.1": (MISTRAL_7B, 7_241_732_096, "bfloat16"),
    # index total_size 15,231,233,024 B / 2: 28 layers of 233,057,792 (q, k, v with biases)
    # + embeddings and lm_head 2·152,064·3,584 + the final norm 3,584
    "Qwen/Qwen2.5-7B": (QWEN25_7B, 7_615_616_512, "bfloat16"),
    # BertForMaskedLM as published (model.safetensors 440 MB in fp32): BertModel's 109,482,240
    # less the pooler (768² + 768) plus the MLM head's transform (768² + 768 + LayerNorm
    # 2·768) and output bias 30,522; its decoder weight is tied to the word embeddings
    "google-bert/bert-base-uncased": (BERT_BASE, 109_514_298, "float32"),
    # the hub's safetensors parameter count for google/gemma-2-9b (and keras-hub's gemma2_9b_en
    # preset), 9,241,705,984; google/gemma-2-9b-it, the same model in bf16: its index
    # total_size 18,483,411,968 B / 2. The base config says float32: 4 B a parameter.
    # By hand: 42 layers · (q 3,584·4,096, k, v 3,584·2,048 each, o 4,096·3,584; MLP
    # 3·3,584·14,336; 4 norms 3,584) = 42 · 198,195,200, + the embeddings 256,000·3,584 once
    # (lm_head is tied to them, and the checkpoint stores the one tensor) + the final norm 3,584
    "google/gemma-2-9b": (GEMMA2_9B, 9_241_705_984, "float32"),
    # index total_size 7,642,159,104 B / 2; by hand: 32 layers · (qkv_proj 3,072·9,216, o_proj
    # 3,072², gate_up_proj 3,072·16,384, down_proj 8,192·3,072, 2 norms 3,072) = 32 ·
    # 113,252,352, + embeddings and lm_head 2·32,064·3,072 + the final norm 3,072
    "microsoft/Phi-3-mini-4k-instruct": (PHI3_MINI_4K, 3_821_079_552, "bfloat16"),
}


def _write(home, repo: str, config: dict, rev: str = "0123abcd") -> None:
    folder = home / "hub" / ("models--" + repo.replace("/", "--"))
    (folder / "snapshots" / rev).mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(rev)
    (folder / "snapshots" / rev / "config.json").write_text(json.dumps(config))


@pytest.fixture
def hub(tmp_path, monkeypatch):
    home = tmp_path / "hf"
    for repo, (config, _, _) in MODELS.items():
        _write(home, repo, config)
    _write(home, "acme/no-architectures", {"model_type": "llama"})
    # repository code transformers has no class of its own for (Phi-3's and DeepSeek-V2's
    # configs above carry auto_map too, and are built with transformers' own classes)
    _write(home, "acme/remote-code", {**LLAMA_31_8B, "model_type": "acme_lm",
                                      "architectures": ["AcmeForCausalLM"],
                                      "auto_map": {"AutoModel": "modeling_acme.AcmeModel"}})
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c  # read at import: point it at this cache too
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(home / "hub"))
    return home


# Mistral's and BERT's configs are analyzed from a local folder and file instead, one trace
# each (test_a_local_config_file_and_snapshot_folder): the same counts, the same dtypes
LOCAL = ("mistralai/Mistral-7B-v0.1", "google-bert/bert-base-uncased")


@pytest.mark.parametrize("repo", [repo for repo in MODELS if repo not in LOCAL])
def test_published_parameter_counts_in_the_configs_dtype(hub, repo):
    _, params, dtype = MODELS[repo]
    r = analyze(repo, dims={"seq": 128})
    assert r.totals.params == params
    config = MODELS[repo][0]
    source = "config.json" if "torch_dtype" in config else "default"
    if "auto_map" in config:   # Phi-3's repository code is not run: transformers' own class is
        source += f"; transformers' own {config['architectures'][0]}, not the repository's code"
    assert r.model == f"{repo} ({dtype} from {source})"
    assert r.totals.param_bytes == params * (2 if dtype == "bfloat16" else 4)


def test_moe_total_and_active_parameters(hub, tmp_path):
    # Mixtral-8x7B: the model card's 46.7B total / 12.9B active; total = index total_size
    # 93,405,585,408 B / 2. Experts 32 layers · 8 · 3·4,096·14,336 = 45,097,156,608, the rest
    # 1,605,636,096; active per token: the rest + 2 of 8 experts = 12,879,925,248
    (tmp_path / "mixtral.json").write_text(json.dumps(MIXTRAL_8X7B))
    r = analyze(str(tmp_path / "mixtral.json"), dims={"seq": 64})
    assert r.totals.params == r.moe.total_params == 46_702_792_704
    assert r.moe.active_params == 12_879_925_248


def test_deepseek_style_moe_shared_experts_and_a_dense_first_layer(hub):
    # DeepSeek-V2-Lite, by its hub id. The model card: "15.7B total params", "2.4B active";
    # total = index total_size 31,412,968,448 B / 2. By hand from the config:
    #   attention, 27 layers (q_lora_rank null): q_proj 2,048·16·(128+64), kv_a_proj_with_mqa
    #     2,048·(512+64), kv_a_layernorm 512, kv_b_proj 512·16·(128+128), o_proj 16·128·2,048,
    #     + 2 norms 2,048 = 13,767,168 a layer
    #   layer 0 dense (first_k_dense_replace 1): MLP 3·2,048·10,944 = 67,239,936
    #   layers 1-26 MoE: 64 routed experts 64·3·2,048·1,408 = 553,648,128, 2 shared experts
    #     as one MLP 3·2,048·2,816 = 17,301,504, router 64·2,048 = 131,072
    #   embeddings and lm_head 2·102,400·2,048 (untied) + the final norm 2,048
    # total 419,430,400 + 27·13,767,168 + 67,239,936 + 26·571,080,704 + 2,048 = 15,706,484,224.
    # Active per token, the Mixtral convention (embeddings, lm_head, attention, routers, the
    # dense layer and the shared experts whole; 6 of the 64 routed experts): total − 26 ·
    # 553,648,128 · 58/64 = 15,706,484,224 − 13,045,334,016 = 2,661,150,208
    _write(hub, "deepseek-ai/DeepSeek-V2-Lite", DEEPSEEK_V2_LITE)
    r = analyze("deepseek-ai/DeepSeek-V2-Lite", dims={"seq": 64})
    assert r.model == ("deepseek-ai/DeepSeek-V2-Lite (bfloat16 from config.json; "
                       "transformers' own DeepseekV2ForCausalLM, not the repository's code)")
    assert r.totals.params == r.moe.total_params == 15_706_484_224
    assert r.totals.param_bytes == 31_412_968_448
    assert round(r.moe.total_params / 1e9, 1) == 15.7
    assert [(m.experts, m.top_k, m.expert_params) for m in r.moe.layers] == \
        [(64, 6, 553_648_128)] * 26  # the shared experts are no routed layer: whole
    # the dense layer 0 traced as it is, three of the 26 MoE layers, the rest repeated: the
    # per-layer list above is all 26, each with its own experts
    assert r.traced_layers.startswith("4 of 27 layers traced; layers 3–25 are layer 2 repeated")
    assert r.moe.active_params == 2_661_150_208
    # The card's "2.4B" is not this count rounded (2.7B), and DeepSeek does not say how it
    # counts. The nearest convention leaves out the input embedding, a table look-up,
    # 102,400·2,048: 2,451,435,008 = 2.45B, which the card's 2.4B truncates (Mixtral's 12.9B
    # above counts both embeddings, as graphcost does)
    assert 2.4e9 <= r.moe.active_params - 102_400 * 2_048 < 2.5e9


def test_a_local_config_file_and_snapshot_folder(hub, tmp_path):
    # the published counts and dtypes of MODELS (their hub ids are the same configs)
    (tmp_path / "mistral").mkdir()
    (tmp_path / "mistral" / "config.json").write_text(json.dumps(MISTRAL_7B))
    (tmp_path / "bert.json").write_text(json.dumps(BERT_BASE))
    mistral = analyze(str(tmp_path / "mistral"), dims={"seq": 64})
    assert mistral.model == f"{tmp_path / 'mistral'} (bfloat16 from config.json)"
    assert mistral.totals.params == 7_241_732_096
    assert mistral.totals.param_bytes == 2 * 7_241_732_096
    bert = analyze(str(tmp_path / "bert.json"))
    assert bert.model == f"{tmp_path / 'bert.json'} (float32 from default)"
    assert bert.totals.params == 109_514_298 and bert.totals.param_bytes == 4 * 109_514_298
    # an encoder's default sequence: 512, its max_position_embeddings
    assert bert.dims["seq"] == 512


def test_bad_names_are_one_line(hub):
    with pytest.raises(GraphcostError, match="not in the local Hugging Face cache"):
        analyze("meta-llama/Llama-3.2-1B")
    with pytest.raises(GraphcostError, match="has no 'architectures'"):
        analyze("acme/no-architectures")
    with pytest.raises(GraphcostError, match="never runs"):
        analyze("acme/remote-code")


def test_command_line_offline(hub):
    # a fresh process: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE from the environment.
    # The config it finds there is read (and refused for what it lacks, before torch is
    # imported): not found, the error would be "not in the local Hugging Face cache". The
    # models the cache builds are analyzed in this process above.
    env = {**os.environ, "HF_HOME": str(hub), "HF_HUB_OFFLINE": "1", "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "graphcost", "acme/no-architectures"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert_one_line_error(out, "acme/no-architectures: config.json has no 'architectures'")
    assert_one_line_error(run("meta-llama/Llama-3.2-1B"),
                          "online graphcost fetches only its config.json")


def test_no_network_reads_the_cache_at_once(hub, monkeypatch):
    # Online mode (HF_HUB_OFFLINE unset) on a machine whose DNS knows no hub (a .invalid name
    # never resolves, RFC 2606): huggingface_hub alone retried an uncached config for 23 s
    # (1 + 2 + 4 + 8 + 8), logging "Retrying in 1s [Retry 1/5]" and so on; graphcost asks for
    # the cache only when the hub's name does not resolve
    import time

    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(c, "ENDPOINT", "https://hub.graphcost-test.invalid")
    start = time.monotonic()
    p = run("meta-llama/Llama-3.2-1B", "--dim", "seq=64")
    assert time.monotonic() - start < 5
    assert_one_line_error(p, "not in the local Hugging Face cache and the hub cannot be reached")
    # a cached config is read as offline reads it
    assert analyze("Qwen/Qwen2.5-7B", dims={"seq": 64}).totals.params == 7_615_616_512


T5_SMALL = {  # google-t5/t5-small config.json (the fields transformers reads)
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 2048, "d_kv": 64,
    "d_model": 512, "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1,
    "feed_forward_proj": "relu", "initializer_factor": 1.0, "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512, "num_heads": 8,
    "num_layers": 6, "output_past": True, "pad_token_id": 0,
    "relative_attention_num_buckets": 32, "vocab_size": 32128}


@pytest.mark.same_on_every_torch   # (the inputs a config gets: graphcost's, not torch's)
def test_an_encoder_decoder_config_gets_decoder_ids_too(tmp_path):
    # a T5 config failed for every request ("You must specify exactly one of input_ids or
    # inputs_embeds": only input_ids were made); its decoder's ids are made too, their length
    # --dim decoder_seq (by default the encoder's seq)
    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    (tmp_path / "t5.json").write_text(json.dumps(T5_SMALL))
    r = analyze(str(tmp_path / "t5.json"), dims={"seq": 32, "decoder_seq": 8})
    assert r.totals.params == 60_506_624   # t5-small's published count (the hub's 60.5M)
    assert dict(r.dims) == {"seq": 32, "decoder_seq": 8}
    # the same model run for real: FlopCounterMode's FLOPs are 2 × graphcost's MACs. (Its
    # attention run eagerly, as matmuls: FlopCounterMode has no formula for the CPU flash
    # kernel SDPA dispatches here, and counts it 0: at 64 and 16 tokens 33,030,144 MACs short)
    config = transformers.T5Config(**{k: v for k, v in T5_SMALL.items()
                                      if k != "architectures"}, attn_implementation="eager")
    model = transformers.T5ForConditionalGeneration(config).eval()
    ids = torch.zeros(1, 32, dtype=torch.long), torch.zeros(1, 8, dtype=torch.long)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids[0], decoder_input_ids=ids[1])
    assert r.totals.macs * 2 == counter.get_total_flops()
    # without --dim decoder_seq, as many decoder ids as the encoder's
    from graphcost.analyzer.frontends.torch.config_inputs import input_shapes
    assert input_shapes(config, 2, {"seq": 16}) == {"input_ids": (2, 16),
                                                    "decoder_input_ids": (2, 16)}
