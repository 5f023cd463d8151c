"""Hostile config.json files and hub ids (issue #49): each is refused with one line and exit 2
before anything is built or called, and before torch is imported; a hub revision never reads
outside the Hugging Face cache. The base config is a tiny Llama (hidden 64, 2 layers, 4
heads, a vocabulary of 128) with one field changed per case."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_runner import run
from tests.test_bad_input import assert_one_line_error

ROOT = Path(__file__).resolve().parents[1]
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "vocab_size": 128, "max_position_embeddings": 256}
TINY_MIXTRAL = {**TINY_LLAMA, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "num_local_experts": 4, "num_experts_per_tok": 2}


def _folder(tmp_path: Path, config: dict | None = None, text: str | None = None,
            **changes) -> Path:
    """A snapshot folder whose config.json is ``text``, or ``config`` (the tiny Llama) with
    ``changes``."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(text if text is not None else
                                        json.dumps({**(config or TINY_LLAMA), **changes}))
    return folder


# --- A. architectures names a model class, or nothing is built --------------------------

def test_architectures_is_a_list_of_names(tmp_path):
    assert_one_line_error(run(_folder(tmp_path, architectures=["LlamaForCausalLM", ["x"]])),
                          "architectures is not a list of class names")


NOT_MODELS = ["set_seed", "enable_full_determinism", "pipeline", "Trainer", "Seq2SeqTrainer",
              "TrainingArguments", "TextStreamer", "HfArgumentParser", "AutoTokenizer",
              "GenerationConfig", "utils", "logging", "__getattr__", "AutoModelForCausalLM",
              "PreTrainedModel"]


def _transformers():
    """transformers as graphcost will import it: the first import of a model class replaces
    the module in sys.modules (transformers 5's lazy imports), so patches go on the one after."""
    import transformers
    transformers.LlamaForCausalLM  # noqa: B018 - imported for its side effect
    return sys.modules["transformers"]


@pytest.mark.parametrize("name", NOT_MODELS)
def test_architectures_naming_no_model_class_is_refused_uncalled(tmp_path, monkeypatch, name):
    transformers, calls = _transformers(), []
    for fn in ("set_seed", "enable_full_determinism"):  # graphcost used to call them
        monkeypatch.setattr(transformers, fn, lambda *a, _fn=fn, **k: calls.append(_fn))
    p = run(_folder(tmp_path, architectures=[name]))
    assert_one_line_error(p, name, "not a model class")
    assert calls == [] and sys.modules["transformers"] is transformers


class _NotAModel:
    def __init__(self, config):
        _NotAModel.built = True


@pytest.mark.parametrize("impostor", [lambda config: setattr(_NotAModel, "built", True),
                                      _NotAModel], ids=["function", "class"])
def test_a_model_name_that_is_no_model_class_is_never_called(tmp_path, monkeypatch, impostor):
    # LlamaForCausalLM's module is a modelling module, so the name alone passes: the object
    # found must itself be a PreTrainedModel subclass before it is called
    transformers = _transformers()
    monkeypatch.setattr(transformers, "LlamaForCausalLM", impostor)
    monkeypatch.setattr(_NotAModel, "built", False, raising=False)
    assert_one_line_error(run(_folder(tmp_path)), "LlamaForCausalLM", "not a model class")
    assert _NotAModel.built is False and sys.modules["transformers"] is transformers


# --- B. the JSON is bounded before and while it is parsed ---------------------------------

def _nested(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize("field, value, needle", [
    ("num_hidden_layers", _nested(1000), "nests lists or objects more than 64 deep"),
    ("num_hidden_layers", '{"a": ' * 1000 + "1" + "}" * 1000, "more than 64 deep"),
    ("architectures", _nested(1000, '"LlamaForCausalLM"'), "more than 64 deep"),
    ("extra", _nested(64), "more than 64 deep"),  # 65 levels with the config's own object
    ("vocab_size", "9" * 5000, "an integer of more than 64 digits"),
    ("bos_token_id", "-" + "1" * 65, "an integer of more than 64 digits"),
], ids=["list", "object", "architectures", "65", "5000-digits", "65-digits"])
def test_deep_or_long_json_is_refused(tmp_path, field, value, needle):
    # (a key given twice: json keeps the last, so architectures is the nested one)
    text = json.dumps(TINY_LLAMA).replace('"vocab_size": 128',
                                          f'"vocab_size": 128, "{field}": {value}')
    assert_one_line_error(run(_folder(tmp_path, text=text)), needle)


def test_json_at_the_bounds_is_read(tmp_path):
    from graphcost.analyzer.frontends.torch import config_json

    # 64 levels: the config's object and 63 lists; a 64-digit integer
    extra = f'"extra": {_nested(63)}, "seed": {"9" * 64}, "text": "[[[[\\"]]]"'
    text = json.dumps(TINY_LLAMA).replace('"vocab_size": 128', f'"vocab_size": 128, {extra}')
    path = _folder(tmp_path, text=text) / "config.json"
    data = config_json.read_config(path, "model")
    assert data["seed"] == int("9" * 64) and data["text"] == '[[[["]]]'


# --- C. the sizes that shape the model, before it is built ---------------------------------

@pytest.mark.parametrize("config, changes, needle", [
    (TINY_LLAMA, {"num_hidden_layers": 10 ** 4}, "num_hidden_layers is 10000: it must be an "
     "integer from 1 to 1,024"),
    (TINY_LLAMA, {"num_hidden_layers": 10 ** 9}, "num_hidden_layers is 1000000000"),
    (TINY_LLAMA, {"num_hidden_layers": -1}, "num_hidden_layers is -1"),
    (TINY_LLAMA, {"num_hidden_layers": 0}, "num_hidden_layers is 0"),
    (TINY_LLAMA, {"num_hidden_layers": True}, "num_hidden_layers is true"),
    (TINY_LLAMA, {"num_hidden_layers": 2.0}, "num_hidden_layers is 2.0"),
    (TINY_LLAMA, {"num_hidden_layers": "2"}, "num_hidden_layers is '2'"),
    (TINY_LLAMA, {"vocab_size": 0}, "vocab_size is 0: it must be an integer from 1 to "
     "16,777,216"),
    (TINY_LLAMA, {"num_attention_heads": 0}, "num_attention_heads is 0"),
    (TINY_LLAMA, {"intermediate_size": [128, -1]}, "intermediate_size is -1"),
    (TINY_LLAMA, {"hidden_size": 2 ** 40}, "hidden_size is 1099511627776"),
    (TINY_LLAMA, {"max_position_embeddings": 0}, "max_position_embeddings is 0"),
    (TINY_LLAMA, {"text_config": {"num_hidden_layers": -1}},
     "text_config.num_hidden_layers is -1"),
    ({"architectures": ["ViTForImageClassification"], "model_type": "vit", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
      "patch_size": 4}, {"image_size": -32}, "image_size is -32: it must be an integer from 1"),
    (TINY_MIXTRAL, {"num_local_experts": -1}, "num_local_experts is -1"),
    (TINY_MIXTRAL, {"num_experts_per_tok": 0}, "num_experts_per_tok is 0: it must be from 1 "
     "to its 4 experts"),
    (TINY_MIXTRAL, {"num_experts_per_tok": 5}, "num_experts_per_tok is 5"),
], ids=["layers-1e4", "layers-1e9", "layers-neg", "layers-0", "layers-true", "layers-float",
        "layers-str", "vocab-0", "heads-0", "ffn-list", "hidden-2e40", "positions-0",
        "text-config", "image-neg", "experts-neg", "top-k-0", "top-k-past-experts"])
def test_sizes_out_of_range_are_refused(tmp_path, config, changes, needle):
    assert_one_line_error(run(_folder(tmp_path, config, **changes)), needle)


LLAMA_31_405B = {  # meta-llama/Llama-3.1-405B config.json: 126 layers
    "architectures": ["LlamaForCausalLM"], "hidden_size": 16384, "intermediate_size": 53248,
    "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 128,
    "num_hidden_layers": 126, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
    "vocab_size": 128256}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 config.json: 61 layers, 256 routed experts
    "architectures": ["DeepseekV3ForCausalLM"], "first_k_dense_replace": 3, "hidden_size": 7168,
    "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
    "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_attention_heads": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 61, "num_key_value_heads": 128, "q_lora_rank": 1536,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    "torch_dtype": "bfloat16", "vocab_size": 129280}
SWIN = {  # microsoft/swin-tiny-patch4-window7-224: lists of sizes, one per stage
    "architectures": ["SwinForImageClassification"], "model_type": "swin", "image_size": 224,
    "patch_size": 4, "num_channels": 3, "depths": [2, 2, 6, 2], "num_heads": [3, 6, 12, 24]}


@pytest.mark.parametrize("config", [LLAMA_31_405B, DEEPSEEK_V3, SWIN,
                                    {**TINY_LLAMA, "num_hidden_layers": 1024,
                                     "num_key_value_heads": None}],
                         ids=["llama-405b", "deepseek-v3", "swin", "1024-layers"])
def test_published_sizes_pass_the_checks(tmp_path, config):
    from graphcost.analyzer.frontends.torch import config_json

    assert config_json.read_config(_folder(tmp_path, config) / "config.json", "model") == config


def test_refusals_come_before_torch_is_imported(tmp_path):
    # the whole command must refuse in about the time Python takes to start: torch's import
    # alone is seconds and over 200 MB
    folder = _folder(tmp_path, num_hidden_layers=10 ** 9)
    code = ("import sys; from graphcost.analyzer.cli.main import main; "
            "code = main(sys.argv[1:]); print(code, 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.stdout.split() == ["2", "False"], p.stderr
    assert "num_hidden_layers is 1000000000" in p.stderr


# --- D. one line means one line; the dtypes a config may name -------------------------------

@pytest.mark.parametrize("key, value", [("torch_dtype", "int8"), ("dtype", "float8_e4m3fn"),
                                        ("torch_dtype", "floot16"), ("dtype", 16)])
def test_dtypes_graphcost_does_not_build_in_are_refused(tmp_path, key, value):
    assert_one_line_error(run(_folder(tmp_path, **{key: value})), f"{key} is ",
                          "float32, float16, bfloat16 or float64")


BUILD_TWICE = """
import json, os, sys
from graphcost.analyzer.frontends.torch import hub
hub.build(sys.argv[1])          # warm-up: every import and lazily loaded module
opened = set()
def hook(event, a):
    if event == "open" and isinstance(a[0], (str, bytes)):
        opened.add(os.path.realpath(a[0]))
sys.addaudithook(hook)
model, config, dtype, source = hub.build(sys.argv[1])
print(json.dumps({"opened": sorted(opened), "model": type(model).__name__,
                  "dtype": str(dtype), "source": source}))
"""


def test_a_config_transformers_warns_about_is_read_quietly_and_alone(tmp_path):
    # No dtype: graphcost used to ask transformers' config for torch_dtype, which logged
    # "`torch_dtype` is deprecated!"; a bos_token_id past the vocabulary logged another
    # line. Both went to stderr ahead of the report (the command's stderr is hub.build's and
    # the trace's, which logs nothing for this model). The second build opens the config alone.
    folder = _folder(tmp_path, bos_token_id=1000)
    p = subprocess.run([sys.executable, "-c", BUILD_TWICE, str(folder)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert json.loads(p.stdout) == {"opened": [os.path.realpath(folder / "config.json")],
                                    "model": "LlamaForCausalLM", "dtype": "torch.float32",
                                    "source": "default"}


@pytest.mark.parametrize("value, dtype", [("float64", "float64"), ("auto", "float32")])
def test_float64_and_auto(tmp_path, value, dtype):
    from graphcost import analyze

    r = analyze(str(_folder(tmp_path, torch_dtype=value)), dims={"seq": 8})
    assert r.model.endswith(f"({dtype} from {'default' if value == 'auto' else 'config.json'})")
    # the tiny Llama's parameters: embeddings and lm_head 2·128·64, 2 layers · (q, k, v, o
    # 64² each, MLP 3·64·128, 2 norms 64) + the final norm 64 = 16,384 + 2·41,088 + 64
    assert r.totals.params == 98_624
    assert r.totals.param_bytes == 98_624 * (8 if dtype == "float64" else 4)


# --- E, F. hub ids and revisions, checked before the cache is read -----------------------

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A local hub cache (HF_HOME) holding acme/tiny at COMMIT, offline, and a file outside it
    that holds that commit: read as a ref, it led to the cached config."""
    home = tmp_path / "hf"
    repo = home / "hub" / "models--acme--tiny"
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "snapshots" / COMMIT / "config.json").write_text(json.dumps(TINY_LLAMA))
    (tmp_path / "outside").write_text(COMMIT)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c  # read at import: point it at this cache too
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(home / "hub"))
    return tmp_path


def test_a_revision_never_reads_outside_the_cache(cache):
    # huggingface_hub read the ref file hf/hub/models--acme--tiny/refs/REVISION
    outside = cache / "outside"
    hub_id = "acme/tiny@../../../../outside"
    code = """
import json, os, sys
opened = []
def hook(event, a):
    if event == "open" and isinstance(a[0], str) and os.path.realpath(a[0]) == sys.argv[2]:
        opened.append(a[0])
sys.addaudithook(hook)
from graphcost.analyzer.cli.main import main
print(json.dumps({"code": main(sys.argv[1:2]), "opened": opened}))
"""
    p = subprocess.run([sys.executable, "-c", code, hub_id, os.path.realpath(outside)],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert json.loads(p.stdout) == {"code": 2, "opened": []}, p.stderr
    assert "is no revision" in p.stderr and len(p.stderr.splitlines()) == 1


@pytest.mark.parametrize("hub_id, needle", [
    ("acme/tiny@../../../../outside", "is no revision"),
    ("acme/tiny@/etc/passwd", "is no revision"),
    ("acme/tiny@refs//main", "is no revision"),
    ("acme/tiny@.git", "is no revision"),
    ("acme/tiny@v1..2", "is no revision"),
    ("acme/tiny@" + "a" * 129, "is no revision"),
    ("acme/..", "not a hub id"),
    ("acme/ti--ny", "not a hub id"),
])
def test_bad_ids_and_revisions_are_one_line(cache, hub_id, needle):
    assert_one_line_error(run(hub_id), needle)


@pytest.mark.parametrize("revision", ["", "@main", "@" + COMMIT])
def test_good_revisions_read_the_cached_config(cache, revision):
    from graphcost.analyzer.frontends.torch import hub

    path = hub.config_file("acme/tiny" + revision)
    assert path == cache / "hf" / "hub" / "models--acme--tiny" / "snapshots" / COMMIT / \
        "config.json"


def test_an_uncached_id_says_what_to_pass_instead(cache):
    assert_one_line_error(run("acme/other"), "not in the local Hugging Face cache",
                          "pass a local config.json or a folder holding one")
