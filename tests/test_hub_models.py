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

MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1 config.json
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 32000}

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
    _write(home, "acme/remote-code", {**LLAMA_31_8B, "auto_map": {"AutoModel": "x.Model"}})
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c  # read at import: point it at this cache too
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(home / "hub"))
    return home


@pytest.mark.parametrize("repo", list(MODELS))
def test_published_parameter_counts_in_the_configs_dtype(hub, repo):
    _, params, dtype = MODELS[repo]
    r = analyze(repo, dims={"seq": 128})
    assert r.totals.params == params
    source = "config.json" if "torch_dtype" in MODELS[repo][0] else "default"
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


def test_a_local_config_file_and_snapshot_folder(hub, tmp_path):
    (tmp_path / "mistral").mkdir()
    (tmp_path / "mistral" / "config.json").write_text(json.dumps(MISTRAL_7B))
    (tmp_path / "bert.json").write_text(json.dumps(BERT_BASE))
    assert analyze(str(tmp_path / "mistral"), dims={"seq": 64}).totals.params == 7_241_732_096
    bert = analyze(str(tmp_path / "bert.json"))
    # an encoder's default sequence: 512, its max_position_embeddings
    assert bert.totals.params == 109_514_298 and bert.dims["seq"] == 512


def test_bad_names_are_one_line(hub):
    with pytest.raises(GraphcostError, match="not in the local Hugging Face cache"):
        analyze("meta-llama/Llama-3.2-1B")
    with pytest.raises(GraphcostError, match="has no 'architectures'"):
        analyze("acme/no-architectures")
    with pytest.raises(GraphcostError, match="never runs"):
        analyze("acme/remote-code")


def test_command_line_offline(hub):
    # a fresh process: huggingface_hub reads HF_HOME and HF_HUB_OFFLINE from the environment
    env = {**os.environ, "HF_HOME": str(hub), "HF_HUB_OFFLINE": "1", "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "graphcost", "Qwen/Qwen2.5-7B", "--dim",
                          "seq=64", "--format", "json"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["totals"]["params"] == 7_615_616_512
    assert_one_line_error(run("meta-llama/Llama-3.2-1B"),
                          "online graphcost fetches only its config.json")
