"""Hugging Face transformers models built from configs (models_zoo/hf.py), against PyTorch:
exact parameter counts, FlopCounterMode, and MemTracker measuring a real CPU forward and
training step. Each model is traced once per mode (module-scoped cache) and the passes are
re-run per optimizer. A trace costs about a second a layer: a model is built with one layer
where a second would repeat the first (LAYERS)."""
from __future__ import annotations

import warnings
from functools import cache

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

pytest.importorskip("transformers")

from graphcost.analyzer.app.pipeline import run_passes  # noqa: E402
from graphcost.analyzer.app.request import LoadOptions, PassOptions
from graphcost.analyzer.load.loading import load_graph  # noqa: E402
from graphcost.analyzer.measure.reference import (
    measure_inference,
    measure_training,
    training_loss_of,
)
from graphcost.models_zoo import hf, measurable  # noqa: E402
from graphcost.passes.errors import GraphcostError
from graphcost.passes.training.checkpoint import CheckpointSpec

from graphcost import analyze  # noqa: E402

warnings.filterwarnings("ignore", category=FutureWarning)
BATCH = 2
NAMES = list(hf.HF_MODELS)


# One layer where it runs every op the model has: GPT-2's, Llama's, Phi's, Phi-3's, BERT's,
# ViT's and the Whisper encoder's layers are alike, T5's first encoder and decoder layers hold the relative
# position bias (later ones read it) and Mixtral's layer is its MoE. Qwen2 keeps the zoo's two,
# one full and one sliding layer: zoo:hf_qwen2 is compared with it, and it is checkpointed
# block by block.
LAYERS = {"hf_gpt2": {"n_layer": 1}, "hf_llama": {"num_hidden_layers": 1},
          "hf_phi": {"num_hidden_layers": 1}, "hf_phi3": {"num_hidden_layers": 1},
          "hf_bert": {"num_hidden_layers": 1}, "hf_vit": {"num_hidden_layers": 1},
          "hf_t5": {"num_layers": 1, "num_decoder_layers": 1},
          "hf_whisper_encoder": {"encoder_layers": 1}, "hf_mixtral": {"num_hidden_layers": 1}}
# Qwen2 at 24 tokens: its sliding window of 16 inside them, and not the zoo's 32, so that
# zoo:hf_qwen2 is shown to take the dims it is given
DIMS = {"hf_qwen2": {"seq": 24}}


def build(name: str, **overrides):
    return measurable.build_measurable(name, **LAYERS.get(name, {}), **overrides)


@cache
def traced(name: str, train: bool):
    """(model, inputs, graph) — one trace per model and mode for the whole module."""
    model = build(name).train(train)
    inputs = measurable.example_kwargs(name, BATCH, **DIMS.get(name, {}))
    return model, inputs, load_graph(model, LoadOptions(train=train), inputs)


@pytest.mark.parametrize("name", NAMES)
def test_analyzes_inference_and_training(name):
    model, inputs, graph = traced(name, False)
    r = run_passes(graph, PassOptions(include_inputs=False))
    assert r.coverage.unsupported == {} and r.coverage.unknown_shape == {}
    assert r.totals.params == sum(p.numel() for p in model.parameters())
    _, _, joint = traced(name, True)
    t = run_passes(joint, PassOptions(optimizer="adam", what_if=False))
    assert t.coverage.unsupported == {} and t.coverage.unknown_shape == {}
    assert t.totals.params == r.totals.params
    # the joint graph's forward nodes keep their modules (checkpointing by block name)
    blocks = {n.scope for n in joint.nodes if n.scope}
    assert any(".0." in s or s.endswith(".0") for s in blocks), sorted(blocks)[:5]


# Inference: eager lifetimes incl. what the model's Python holds, inputs excluded on both
# sides, against MemTracker over one forward under no_grad. BERT, T5 and ViT are left out:
# transformers skips their attention mask in eager when no token is padded (it cannot under
# torch.export), see test_bert_mask_eager_skips.
@pytest.mark.parametrize("name", ["hf_gpt2", "hf_llama", "hf_phi", "hf_qwen2",
                                  "hf_whisper_encoder", "hf_mixtral"])
def test_inference_peak_vs_memtracker(name):
    model, inputs, graph = traced(name, False)
    predicted = run_passes(graph, PassOptions(include_inputs=False)).memory.peak_bytes
    measured = measure_inference(measurable.KeywordCall(model.eval(), inputs), ())[0]
    assert abs(predicted / measured - 1) <= 0.05, (predicted, measured)


def test_bert_mask_eager_skips():
    # With one padded token eager builds the additive mask as the trace does: exact. With
    # none, eager skips it (a data-dependent shortcut export cannot take) and graphcost is
    # higher by exactly that mask, B·1·S·S float32: 2·1·32·32·4 = 8,192 B.
    model, inputs, graph = traced("hf_bert", False)
    predicted = run_passes(graph, PassOptions(include_inputs=False)).memory.peak_bytes
    model.eval()
    padded = dict(inputs, attention_mask=inputs["attention_mask"].clone())
    padded["attention_mask"][:, -1] = 0
    assert measure_inference(measurable.KeywordCall(model, padded), ())[0] == predicted
    assert predicted - measure_inference(measurable.KeywordCall(model, inputs), ())[0] == 8_192


# Training: the second real step (optimizer state allocated) under MemTracker. GPT-2, BERT
# and T5 train with dropout 0.1, which eager CPU runs as a float32 noise tensor per dropout
# where graphcost models the fused native_dropout's 1-byte mask (T5, 16 dropouts, is 12.7%
# under; benchmarks/accuracy_hf.py prints all of them).
@pytest.mark.parametrize("optimizer", ["none", "adam"])
@pytest.mark.parametrize("name", ["hf_llama", "hf_phi", "hf_phi3", "hf_whisper_encoder",
                                  "hf_mixtral"])
def test_training_peak_vs_memtracker(name, optimizer):
    model, inputs, joint = traced(name, True)
    predicted = run_passes(joint, PassOptions(optimizer=optimizer, what_if=False, include_inputs=False)).training.peak_bytes  # as MemTracker
    measured = measure_training(measurable.KeywordCall(model, inputs), (), optimizer)[0]
    assert abs(predicted / measured - 1) <= 0.10, (predicted, measured)


@pytest.mark.parametrize("name", NAMES)
def test_flops_equal_flop_counter(name):
    # Eager attention is matmuls FlopCounterMode counts. It has no formula for grouped_mm:
    # the MoE is counted with transformers' batched_mm experts (one bmm per token and
    # expert chosen: the same arithmetic) on the same weights.
    model, inputs, graph = traced(name, False)
    reference = model
    if name in ("hf_mixtral", "hf_gpt_oss", "hf_deepseek_v3"):
        reference = build(name, experts="batched_mm")
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        reference.eval()(**inputs)
    assert 2 * run_passes(graph, PassOptions(what_if=False)).totals.macs == counter.get_total_flops()


@pytest.mark.parametrize("name", ["hf_llama", "hf_mixtral"])
def test_training_flops_equal_flop_counter(name):
    model, inputs, joint = traced(name, True)
    reference = build(name, experts="batched_mm") if name == "hf_mixtral" else model
    counter = FlopCounterMode(display=False)
    with counter:
        training_loss_of(measurable.KeywordCall(reference.train(), inputs), ()).backward()
    assert 2 * run_passes(joint, PassOptions(optimizer="none", what_if=False)).totals.macs == \
        counter.get_total_flops()


def test_moe_active_params_hand_count():
    # hf_mixtral as traced here: vocab 512, d 64, 1 layer, GQA 4 heads / 2 KV heads of 16, 4
    # SwiGLU experts of 128, top-2. The layer: q, o 64·64 = 4,096 each; k, v 64·32 = 2,048
    # each (12,288); two RMSNorms 128; router 4·64 = 256; experts 4·(2·128·64 + 64·128) =
    # 98,304: 110,976; + embedding and head 2·512·64 = 65,536 + final norm 64 = 176,576.
    # Active per token: the experts count 2/4: 98,304/2 = 49,152 fewer → 127,424.
    _, _, graph = traced("hf_mixtral", False)
    moe = run_passes(graph).moe
    assert (moe.total_params, moe.active_params) == (176_576, 127_424)
    assert [(m.experts, m.top_k, m.tokens) for m in moe.layers] == [(4, 2, 64)]
    # each layer's experts see 64 tokens · 2 = 128 rows: up 128·256·64 + down 128·64·128
    # MACs = 3,145,728, i.e. 6,291,456 FLOPs; balanced, 128 / 4 = 32 rows per expert
    assert all(m.expert_flops == 6_291_456 and m.rows_per_expert_estimate == 32 for m in moe.layers)
    assert moe.layers[0].rows_per_expert_bound == 64  # the bound: every token to one expert


def test_moe_eager_experts_are_an_estimate():
    # the eager expert loop cannot be traced: grouped_mm stands in, said in one warning
    model = build("hf_mixtral", experts="eager")
    r = analyze(model, measurable.example_kwargs("hf_mixtral", BATCH))
    assert model.config._experts_implementation == "eager"  # put back
    assert [w for w in r.warnings if "ESTIMATE" in w and "experts" in w]
    assert r.moe.active_params == 127_424  # (test_moe_active_params_hand_count's)


def test_positional_keyword_and_zoo_inputs():
    model, inputs, graph = traced("hf_llama", False)
    by_name = run_passes(graph, PassOptions(include_inputs=False))
    positional = analyze(model, (inputs["input_ids"],), include_inputs=False)
    assert (positional.totals.flops, positional.memory.peak_bytes) == \
        (by_name.totals.flops, by_name.memory.peak_bytes)
    # zoo:hf_* builds on the meta device (nothing materialized) and takes the zoo's dims: at
    # 24 tokens (its default is 32), the trace of the 24 tokens given by name
    _, inputs, graph = traced("hf_qwen2", False)
    by_name = run_passes(graph, PassOptions(include_inputs=False))
    zoo = analyze("zoo:hf_qwen2", batch=BATCH, dims={"seq": 24}, include_inputs=False)
    assert zoo.dims["seq"] == 24 and inputs["input_ids"].shape == (BATCH, 24)
    assert (zoo.totals.flops, zoo.memory.peak_bytes) == \
        (by_name.totals.flops, by_name.memory.peak_bytes)


def test_checkpoint_by_block_name():
    _, _, joint = traced("hf_qwen2", True)
    plain = run_passes(joint, PassOptions(optimizer="adam", what_if=False)).training
    ckpt = run_passes(joint, PassOptions(optimizer="adam", what_if=False, checkpoint=CheckpointSpec(every=1))).training.checkpoint
    assert ckpt.segments == ("model.layers.0", "model.layers.1")
    assert ckpt.peak_bytes < plain.peak_bytes and ckpt.recompute_flops > 0


def test_a_model_whose_export_makes_no_mask_is_traced_with_the_eager_one():
    # LongT5's stack makes its all-ones attention mask only when not compiling
    # (``if attention_mask is None and not is_torchdynamo_compiling()``), then indexes it:
    # its export failed without a mask ("'NoneType' object has no attribute 'shape'").
    # Traced with the mask eager makes, 2·MACs equal FlopCounterMode's on the eager forward
    # without one, and the parameters are the module's. (The encoder alone: its stack is the
    # decoder's class.)
    import transformers

    cfg = transformers.LongT5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128,
                                    num_layers=1, num_decoder_layers=1, num_heads=4)
    torch.manual_seed(0)
    model = transformers.LongT5EncoderModel(cfg).eval()
    ids = torch.randint(4, 200, (1, 16))
    inputs = {"input_ids": ids}
    r = analyze(model, inputs)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(**inputs)
    assert 2 * r.totals.macs == counter.get_total_flops()
    assert r.totals.params == sum(p.numel() for p in model.parameters())
    assert any("all-ones attention_mask" in w for w in r.warnings), r.warnings
    # a failure the mask does not mend is the first failure, in its own words
    with pytest.raises(GraphcostError) as err:
        analyze(transformers.LongT5Model(cfg).eval(), inputs)  # (it needs decoder inputs)
    assert "mask" not in str(err.value)


_RUNS: list[str] = []


def _final_norm_fails(x):
    _RUNS.append("ln_f")
    raise ValueError("the model's own failure")


def test_a_failure_a_mask_cannot_mend_is_reported_after_one_trace():
    # GPT-2 given no mask, failing in its final norm: no mask would mend that, so it is not
    # traced a second time with eager's mask (its norm ran once, not twice)
    import transformers

    model = transformers.GPT2Model(transformers.GPT2Config(
        vocab_size=256, n_embd=64, n_layer=1, n_head=4, n_positions=32)).eval()
    model.ln_f.forward = _final_norm_fails
    _RUNS.clear()
    with pytest.raises(GraphcostError, match="the model's own failure"):
        analyze(model, {"input_ids": torch.randint(4, 200, (1, 16))})
    assert _RUNS == ["ln_f"]


class _FloatConfig(torch.nn.Module):
    """A module whose ``config`` attribute is a number (Idefics' gated cross-attention keeps
    ``self.config = config.alpha_initializer``-like scalars so)."""

    def __init__(self):
        super().__init__()
        self.fc, self.config = torch.nn.Linear(8, 8), 0.5

    def forward(self, x):
        return self.fc(x) * self.config


def test_a_config_attribute_that_is_not_a_config_is_left_alone():
    # the LayerDrop check read every module's ``config`` as an object with attributes:
    # Idefics' training step was an internal error ("vars() argument must have __dict__
    # attribute", exit 70). Linear(8, 8): 8·8 + 8 = 72 parameters
    r = analyze(_FloatConfig(), (torch.randn(4, 8),), train=True, what_if=False)
    assert r.totals.params == 72 and r.training is not None
