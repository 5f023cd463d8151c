"""Models analyzed in their own dtype (issue 24): the published weights' dtype by default for
inference and serving (zoo:llama7b as Llama-2-7b-hf's config.json says, float16), ``--dtype``
(API ``dtype=``) to choose, and serving's what-ifs that never repeat the setting chosen."""
from __future__ import annotations

import pytest
import torch

from graphcost import GraphcostError, analyze
from tests.cli_runner import run_cli

LLAMA7B_PARAMS = 6_738_415_616  # Llama-2-7B's published parameter count


def test_llama7b_serves_in_float16_by_default():
    # weights fp16: 6,738,415,616 params × 2 B + the rotary inv_freq buffer (64 × 2 B) =
    # 13,476,831,360 B; the KV cache fp16: 2 (K, V) × 32 layers × 4,096 × 2 B = 512 KiB per
    # token per sequence (Llama-2's published figure)
    r = analyze("zoo:llama7b", serve={"prompt": 64, "generate": 8})
    assert r.totals.params == LLAMA7B_PARAMS
    assert r.serving.weight_bytes == LLAMA7B_PARAMS * 2 + 64 * 2
    assert r.serving.kv_bytes_per_token == 2 * 32 * 4096 * 2
    assert (r.serving.weight_dtype, r.serving.kv_dtype) == ("fp16", "fp16")
    assert "float16 from its published config" in r.model
    # --dtype chooses: fp32 doubles the weights
    fp32 = analyze("zoo:llama7b", serve={"prompt": 64, "generate": 8}, dtype="fp32")
    assert fp32.serving.weight_bytes == LLAMA7B_PARAMS * 4 + 64 * 4
    assert "float32 from the dtype asked" in fp32.model


def test_dtype_casts_a_module_for_inference():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    x = (torch.randn(4, 256),)
    fp32 = analyze(model, x)
    bf16 = analyze(model, x, dtype="bf16")
    # (256·512 + 512 + 512·10 + 10) params: 4 B each, then 2 B
    params = 256 * 512 + 512 + 512 * 10 + 10
    assert (fp32.totals.param_bytes, bf16.totals.param_bytes) == (4 * params, 2 * params)
    assert bf16.memory.peak_bytes * 2 == fp32.memory.peak_bytes  # activations halve too
    # the caller's module is left as it was (the cast is of a copy)
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("kw, message", [
    (dict(train=True), "training step's dtypes are its precision recipe's"),
    (dict(), "the file's"),  # zoo:mlp without fx: its cached ONNX export
])
def test_dtype_is_refused_where_it_does_not_apply(kw, message):
    with pytest.raises(GraphcostError, match=message):
        analyze("zoo:mlp", dtype="fp16", **kw)
    with pytest.raises(GraphcostError, match="expected one of fp32, fp16, bf16"):
        analyze("zoo:mlp", dtype="int3", zoo_exporter="fx")


def test_serving_what_ifs_never_repeat_the_setting_chosen():
    # int4 weights with an fp8 cache chosen: no what-if is "int4 weights, fp8 KV" (the
    # (None, fp8) what-if is the setting itself), and none is listed twice
    done = run_cli("zoo:llama_tiny", "--serve", "--prompt", "64", "--generate", "16",
                   "--weight-dtype", "int4", "--kv-dtype", "fp8", "--max-rows", "0")
    assert done.returncode == 0, done.stderr
    rows = [line.split(":")[0] for line in done.stdout.splitlines()
            if line.startswith("what-if")]
    assert "what-if     int4 weights, fp8 KV" not in rows and len(rows) == len(set(rows)) == 3
