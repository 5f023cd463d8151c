"""Llama 4's mixture of experts routed as vLLM and torchtitan run it (analyzer/frontends/torch/
routed_llama4.py), where transformers runs every expert on every token: the routed block
computes transformers' block's function, its FLOPs are FlopCounterMode's, a vLLM replica and
an expert-parallel rank are costed with it — the replica by hand, the rank against real steps
on two gloo ranks (torchtitan's dispatcher, FSDPMemTracker).

The model: zoo hf_llama4 (d 64, 2 layers each a mixture of 4 SwiGLU experts of I = 128,
top-1, beside a shared expert of 128; 4 heads of 16, 2 key/value heads; vocab 512)."""
from __future__ import annotations

import types
from functools import cache

import pytest
import torch
from graphcost.analyzer.frontends.torch.routed_llama4 import RoutedMoe, routed
from graphcost.analyzer.measure.parallel import Case
from graphcost.models_zoo import hf
from torch.utils.flop_counter import FlopCounterMode

from graphcost import analyze
from tests.shared import assert_ranks_within, measured_steps, read_in_range

BATCH, SEQ = 2, 128
SERVE = {"prompt": 32, "generate": 8}


@pytest.mark.parametrize("top_k", [1, 2])
def test_the_routed_block_computes_transformers_block(top_k):
    # transformers scales each expert's copy of the input by sigmoid(score), 0 where the
    # expert was not chosen (sigmoid(-inf)); an expert without biases maps 0 to 0, so the
    # sum over every expert is the sum over the chosen ones
    torch.manual_seed(0)
    model = hf.llama4(num_experts_per_tok=top_k)
    block = model.model.layers[0].feed_forward
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        want, want_logits = block(x)
        got, logits = RoutedMoe(block)(x)
    assert torch.equal(logits, want_logits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_routed_flops_are_flop_counters():
    # FlopCounterMode has no formula for grouped_mm: the reference runs transformers'
    # batched_mm experts (one bmm per token and expert chosen, the routed arithmetic) on the
    # same weights. (The dense model's FLOPs are checked in test_hf_models.)
    from transformers.integrations.moe import batched_mm_experts_forward
    torch.manual_seed(0)
    model = hf.llama4()
    assert routed(model) == 2
    ids = torch.randint(0, 512, (BATCH, 32))
    graph_macs = analyze(model, example_inputs=(ids,)).totals.macs
    for block in model.modules():
        if isinstance(block, RoutedMoe):
            experts = block.experts
            experts.forward = types.MethodType(batched_mm_experts_forward, experts)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model.eval()(ids)
    assert 2 * graph_macs == counter.get_total_flops()


@cache
def _serving(engine: str, tp: int = 1):
    return analyze("zoo:hf_llama4", batch=2, serve={**SERVE, "engine": engine},
                   parallel={"mesh": f"tp={tp}"} if tp > 1 else None)


def test_vllm_runs_each_token_through_its_expert_alone():
    eager, vllm = _serving("eager"), _serving("vllm")
    assert eager.serving is not None and vllm.serving is not None
    # the prefill's 2 × 32 = 64 tokens; an expert's MACs a token: gate_up 64 · 256 + down
    # 128 · 64 = 24,576. transformers runs the 4 experts on each token, vLLM the 1 chosen:
    # 3 · 64 · 24,576 fewer a layer, 2 layers
    assert eager.serving.prefill.macs - vllm.serving.prefill.macs == 2 * 3 * 64 * 24_576
    assert any("Llama 4 expert blocks routed" in w for w in vllm.warnings)
    assert not any("Llama 4 expert blocks routed" in w for w in eager.warnings)
    # attention's products alone (a grouped matmul's integer offsets are no activation: the
    # experts were counted as attention): Q·Kᵀ and weights·V, 2 · 4 heads · 32 · 32 · 16
    # MACs each, 2 layers, 2 FLOPs a MAC
    for r in (eager, vllm, analyze("zoo:hf_mixtral", batch=2, serve=SERVE)):
        assert r.serving is not None
        assert r.serving.prefill.attention_flops_dense == 2 * 2 * 2 * (2 * 4 * 32 * 32 * 16)


def test_a_tensor_parallel_replica_holds_vllms_slice_of_every_expert():
    one, two = _serving("vllm").serving, _serving("vllm", tp=2).serving
    assert one is not None and two is not None
    # fp32; 16 floats of buffers. One GPU: embedding and head 2 · 512 · 64 = 65,536 + the
    # final norm 64 + 2 layers of (attention q, o 64 · 64, k, v 32 · 64: 12,288; router
    # 4 · 64 = 256; experts 4 · (64 · 256 + 128 · 64) = 98,304; shared expert 3 · 64 · 128 =
    # 24,576; norms 128) = 336,704. A rank of 2: the vocabulary's rows 2 · 256 · 64 = 32,768
    # + 64 + 2 · (6,144 + router 256 whole + experts' I halved 49,152 + shared 12,288 + 128)
    assert one.weight_bytes == (336_704 + 16) * 4
    assert two.weight_bytes == (32_768 + 64 + 2 * (6_144 + 256 + 49_152 + 12_288 + 128)
                                + 16) * 4
    c = two.collectives
    assert c is not None
    # a layer all-reduces the attention's output and, once, the experts' sum with the shared
    # expert's (vLLM's reduce_results=False on both), 64 tokens × 64 fp32 = 16,384 B each; the
    # embedding its lookup: 5; the last positions' logits gathered (2 × 512 × 4 B)
    assert (c.prefill_all_reduce_bytes, c.prefill_all_gather_bytes, c.prefill_calls) == \
        (5 * 16_384, 4_096, 6)


# Llama 4 as published (Scout, Maverick): Llama4ForConditionalGeneration, a vision tower and
# its projector beside the text model; hf_llama4's text config, a vision tower of d 64, 2
# layers, 56 × 56 images in patches of 14 (16 patches and a class token)
MULTIMODAL = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "torch_dtype": "bfloat16", "boi_token_index": 200, "eoi_token_index": 201,
    "image_token_index": 202,
    "text_config": {"model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 128,
                    "intermediate_size_mlp": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                    "vocab_size": 512, "num_local_experts": 4, "num_experts_per_tok": 1,
                    "interleave_moe_layer_step": 1, "attention_chunk_size": 64,
                    "max_position_embeddings": 1024},
    "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 64,
                      "intermediate_size": 128, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "image_size": 56, "patch_size": 14,
                      "vision_output_dim": 64, "projector_input_dim": 64,
                      "projector_output_dim": 64, "pixel_shuffle_ratio": 0.5}}


def test_the_published_multimodal_model_is_served_over_tensor_parallel_ranks(tmp_path):
    """vLLM shards the vision tower as the decoder (mllama4.py): q/k/v and fc1 column-,
    o and fc2 row-parallel, the patch embedding and the projector column-parallel with their
    output gathered, the class token and positional embedding whole. It was refused ("vision
    tower ... would stay whole"; the projector "gathered for training")."""
    import json

    import transformers
    if tuple(int(p) for p in transformers.__version__.split(".")[:2]) < (5, 25):
        pytest.skip("transformers 5.24's Llama4ForConditionalGeneration fails on a step "
                    "without an image ('MoeCausalLMOutputWithPast' has no 'image_outputs')")
    (tmp_path / "config.json").write_text(json.dumps(MULTIMODAL), encoding="utf-8")
    one, two = (analyze(str(tmp_path / "config.json"), batch=2,
                        serve={**SERVE, "engine": "vllm"},
                        parallel={"mesh": f"tp={tp}"} if tp > 1 else None).serving
                for tp in (1, 2))
    assert one is not None and two is not None
    # bf16. The text model as hf_llama4's: 336,704 parameters, a rank of 2 168,768. The
    # tower and projector on one GPU: class token 64, positions 17 · 64, patch embedding
    # 64 · 588, 2 layer norms 256; 2 layers of q/k/v/o 4 · (64 · 64 + 64), fc1 128 · 64 +
    # 128, fc2 64 · 128 + 64, norms 256 (33,728); the adapter's 64 · 128 + 64 · 64; the
    # projector 64 · 64: 122,368. A rank of 2: class token and positions whole 1,152, the
    # patch embedding's rows 32 · 588, norms 256; a layer q/k/v 3 · (32 · 64 + 32), o
    # 64 · 32 + 64 (its bias whole), fc1 64 · 64 + 64, fc2 64 · 64 + 64, norms 256
    # (16,928); the adapter 32 · 128 + 64 · 32; the projector's rows 32 · 64: 62,272.
    # The rotary buffers alike on both (304 B)
    buffers = one.weight_bytes - (336_704 + 122_368) * 2
    assert buffers == 304
    assert two.weight_bytes == (168_768 + 1_152 + 32 * 588 + 256 + 2 * 16_928 + 32 * 128
                                + 64 * 32 + 32 * 64) * 2 + buffers
    c = two.collectives   # (the text step's, as hf_llama4's: no image, the tower not run)
    assert c is not None and (c.prefill_all_reduce_bytes, c.prefill_calls) == \
        (5 * 64 * 64 * 2, 6)


GROWN = (("num_local_experts", 8),)
RECIPES = ("fp32", "bf16-master")


@pytest.fixture(scope="module")
def measured(request):
    units = ("model.layers.0", "model.layers.1")
    return measured_steps([Case("hf_llama4", "fsdp", BATCH, (("input_ids", (BATCH, SEQ)),),
                                units, precision=r, ep=2, overrides=GROWN)
                           for r in read_in_range(request, RECIPES)], 2)


@pytest.mark.parametrize("precision", RECIPES)
def test_an_expert_parallel_rank_within_5_percent_of_a_real_step(measured, precision):
    """``dp_shard=2,ep=2``: Llama 4 routed as torchtitan's Llama 4 runs it (scores scaling
    the rows before they are sent, ``score_before_experts``), each rank 4 of 8 experts;
    measured by FSDPMemTracker with torchtitan's dispatcher on two gloo ranks (2026-12-07,
    torch 2.13, steps 1 / 2): fp32 rank 0 8,712,088 / 10,838,244 B, rank 1 8,758,328 /
    10,865,988, graphcost 8,739,304 / 10,874,708; bf16-master 6,021,368 / 8,156,772 and
    6,053,848 / 8,182,292 against 6,041,672 / 8,177,076 — each within 0.35%."""
    torch.manual_seed(0)
    ids = torch.randint(0, 512, (BATCH, SEQ))
    p = analyze(hf.llama4(**dict(GROWN)), example_inputs=(ids,), train=True,
                optimizer="adam", include_inputs=False, precision=precision,
                parallel={"mesh": "dp_shard=2,ep=2"}).parallel
    rows = [m for m in measured if m.case.precision == precision]
    if not rows:
        pytest.skip("the torch range measures the first recipe alone")
    assert len(rows) == 4                                   # 2 ranks × steps 1 and 2
    assert_ranks_within(p, [(m.step, m.rank, m.peak) for m in rows], step1=0.05)
    # a rank's 4 of 8 experts a layer, whole (efsdp 1): gate_up (64 × 256), down (128 × 64)
    experts = [u for u in p.units if u.ep == 2]
    size = 4 if precision == "fp32" else 2
    assert [u.name for u in experts] == ["model.layers.0.feed_forward.experts",
                                         "model.layers.1.feed_forward.experts"]
    assert all(u.shard_bytes == 4 * (64 * 256 + 128 * 64) * size for u in experts)
    # each layer exchanges 2 · 128 tokens · top-1 = 256 rows of 64 twice forward and twice
    # backward: 8 all-to-alls of 256 · 64 elements
    assert p.comm.all_to_all_bytes == 8 * 256 * 64 * size
