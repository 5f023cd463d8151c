"""A tensor-parallel serving replica (``--serve --parallel tp=N``): each rank's program under a
serving engine's plan (no sequence parallelism), checked against PyTorch's own DTensor plan
run on a fake process group of two ranks, and its collectives priced by hand."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from graphcost.passes.costs.collectives import ALPHA_S, BUS_SHARE

from graphcost import GraphcostError, analyze
from tests.cli_runner import run_cli

BATCH, PROMPT, GENERATE = 4, 64, 16
SERVE = {"prompt": PROMPT, "generate": GENERATE}

# llama_tiny parallelized by DTensor's ColwiseParallel / RowwiseParallel (analyzer/measure/
# tensor_plan.py without sequence parallelism: vLLM's layout) on two fake ranks; a prefill,
# then one decode step over a cache of P + G − 1 tokens under CommDebugMode
REAL = f"""
import json
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from graphcost.models_zoo.registry import build_model
from graphcost.analyzer.measure.tensor_plan import apply_tensor_parallel

batch, prompt, generate = {BATCH}, {PROMPT}, {GENERATE}
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
model = build_model("llama_tiny")
apply_tensor_parallel(model, init_device_mesh("cpu", (2,)), sequence=False)
local = lambda t: t.to_local() if hasattr(t, "to_local") else t
size = lambda t: local(t).numel() * t.element_size()
weights = sum(map(size, model.parameters())) + sum(map(size, model.buffers()))
with torch.no_grad():
    _, kv = model(torch.zeros(batch, prompt, dtype=torch.int64), use_cache=True)
    past = [tuple(torch.zeros(batch, t.shape[1], prompt + generate - 1, t.shape[3])
                  for t in pair) for pair in kv]
    with CommDebugMode() as comm:
        _, new = model(torch.zeros(batch, 1, dtype=torch.int64), past_key_values=past,
                       use_cache=True)
cache = sum(size(t) for pair in [*past, *new] for t in pair)
print(json.dumps({{"weights": weights, "cache": cache,
                  "counts": {{str(k): v for k, v in comm.get_comm_counts().items()}}}}))
"""


def _serving(tp: int, **kw):
    return analyze("zoo:llama_tiny", batch=BATCH, serve={**SERVE, **kw.pop("serve", {})},
                   parallel={"mesh": f"tp={tp}"} if tp > 1 else None, **kw).serving


def test_a_rank_holds_what_dtensor_shards_and_calls_its_collectives():
    proc = subprocess.run([sys.executable, "-c", REAL], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    real = json.loads(proc.stdout.splitlines()[-1])
    s, whole = _serving(2), _serving(1)
    assert s.weight_bytes == real["weights"]
    assert s.kv_cache_bytes == real["cache"] == whole.kv_cache_bytes // 2
    # the decode step: the embedding's and each of 2 blocks' o/down outputs all-reduced, the
    # logits all-gathered
    assert real["counts"] == {"c10d_functional.all_reduce": 5,
                              "c10d_functional.all_gather_into_tensor": 1}
    assert s.collectives.decode_calls == 6


def test_the_collectives_by_hand_and_on_the_clock():
    s = _serving(2, device="h100")
    c = s.collectives
    # llama_tiny: d 128, vocab 1,000, fp32. Each all-reduce holds the rank's (batch, tokens,
    # 128) partial sums; the all-gather's output is the (batch, 1, 1,000) logits of each
    # sequence's last position (what generate samples from), in the prefill too
    assert (c.decode_all_reduce_bytes, c.decode_all_gather_bytes) == \
        (5 * BATCH * 128 * 4, BATCH * 1000 * 4) == (10_240, 16_000)
    assert (c.prefill_all_reduce_bytes, c.prefill_all_gather_bytes, c.prefill_calls) == \
        (5 * BATCH * PROMPT * 128 * 4, BATCH * 1000 * 4, 6)
    # over NVLink 4 (450 GB/s each way) a ring of 2 sends all of an all-reduce's buffer and
    # half of an all-gather's: (2·10,240 + 16,000) / 2 = 18,240 B, plus 6 calls' latency
    decode = 18_240 / (BUS_SHARE * 450e9) + 6 * ALPHA_S
    assert s.time.decode_communication_seconds == pytest.approx(decode)
    prefill = (2 * 655_360 + 16_000) / 2 / (BUS_SHARE * 450e9) + 6 * ALPHA_S
    assert s.time.prefill_communication_seconds == pytest.approx(prefill)
    # both exposed: the estimate's TPOT is the kernels' (or the host's) plus them
    kernels = s.time.tpot_seconds - decode
    assert kernels > 0 and s.time.tokens_per_second == pytest.approx(
        BATCH / s.time.tpot_seconds)


def _one_and_a_rank_of_two(model: str):
    """``model``'s vLLM serving review on one GPU and on a rank of tp=2."""
    serve = {"prompt": 16, "generate": 4, "engine": "vllm"}
    one = analyze(model, serve=serve).serving
    two = analyze(model, serve=serve, parallel={"mesh": "tp=2"}).serving
    assert one is not None and two is not None
    return one, two


def test_a_mixture_of_experts_rank_holds_vllms_slice_of_every_expert():
    """vLLM's FusedMoE without expert parallelism (frontends/torch/serving_experts.py): each
    rank keeps every expert, its intermediate dimension split (w13 (experts, 2·I/T, H), w2
    (experts, H, I/T)), the router whole, and the layer's output all-reduced."""
    one, two = _one_and_a_rank_of_two("zoo:hf_mixtral")
    # d 64, 4 heads of 16 (2 key/value heads), 2 layers of 4 experts of I = 128, vocab 512,
    # fp32; 16 floats of buffers on both. One GPU: 512 × 64 × 2 (embedding, head) + 2 ×
    # (attention 12,288 + router 256 + experts 4 × (256 × 64 + 64 × 128) = 98,304 + norms
    # 128) + 64 = 287,552. A rank of 2: the vocabulary's rows 2 × 256 × 64 = 32,768 + 2 ×
    # (attention 6,144 + router 256 + experts 4 × (128 × 64 + 64 × 64) = 49,152 + 128) + 64
    # = 144,192
    assert one.weight_bytes == (287_552 + 16) * 4
    assert two.weight_bytes == (144_192 + 16) * 4
    c = two.collectives
    assert c is not None
    # each layer all-reduces the attention's output and the experts' (16 tokens × 64 fp32 =
    # 4,096 B each), the embedding its lookup: 5 × 4,096; the last position's logits
    # gathered (512 × 4 B); 6 calls, one token's worth (256 B each) in a decode step
    assert (c.prefill_all_reduce_bytes, c.prefill_all_gather_bytes, c.prefill_calls) == \
        (5 * 4_096, 2_048, 6)
    assert (c.decode_all_reduce_bytes, c.decode_calls) == (5 * 256, 6)


def test_gpt_oss_is_served_as_vllm_shards_it():
    """gpt-oss: transformers' plan for it names the embedding alone (its attention is left to
    the engine) — it was refused ("q_proj … would stay whole"); vLLM shards q/k/v column-wise
    and o row-wise as Llama's, each rank its heads' attention sinks, and its experts'
    transposed, interleaved gate/up columns in pairs with their biases."""
    one, two = _one_and_a_rank_of_two("zoo:hf_gpt_oss")
    # d 64, 4 heads of 16 (2 key/value heads), 2 layers, 4 experts of I = 128, vocab 512,
    # fp32, biases everywhere but the norms; 16 floats of buffers. A layer on one GPU: q, o
    # 64 · 64 + 64 each, k, v 64 · 32 + 32 each (12,480), sinks 4, router 4 · 64 + 4, experts
    # gate_up 4 · 64 · 256 + 4 · 256 and down 4 · 128 · 64 + 4 · 64 (99,584), norms 128:
    # 112,456; with embedding and head 2 · 512 · 64 and the final norm: 290,512. A rank of
    # 2: q 32 · 64 + 32, k, v 16 · 64 + 16, o 64 · 32 + 64 (its bias whole, added after the
    # reduction): 6,272, sinks 2, router 260, experts 4 · 64 · 128 + 4 · 128 + 4 · 64 · 64
    # + 4 · 64 (the down bias whole) = 49,920, norms 128: 56,582 a layer; the vocabulary's
    # rows 2 · 256 · 64: 145,996
    assert one.weight_bytes == (290_512 + 16) * 4
    assert two.weight_bytes == (145_996 + 16) * 4
    # the key/value cache per token: the full-attention layer's 2 heads of 16, K and V, fp32
    # (the sliding layer's is bounded by its window), a rank's one head
    assert (one.kv_bytes_per_token, two.kv_bytes_per_token) == (256, 128)
    c = two.collectives
    assert c is not None   # (as Mixtral's: attention and experts all-reduced a layer)
    assert (c.prefill_all_reduce_bytes, c.prefill_calls) == (5 * 4_096, 6)


def test_a_routing_bias_stored_as_a_row_is_held_whole_as_vllm_holds_it():
    """ERNIE 4.5's MoE router keeps its score correction bias as a (1, experts) parameter: a
    vector, not a matrix the plan left whole (it was refused: "moe_statics would stay
    whole")."""
    import torch
    import transformers

    config = transformers.Ernie4_5_MoeConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        moe_num_experts=4, moe_k=2, moe_layer_start_index=1, moe_num_shared_experts=0,
        use_cache=False, tie_word_embeddings=False, max_position_embeddings=128)
    model = transformers.Ernie4_5_MoeForCausalLM(config)
    ids = torch.zeros(1, 16, dtype=torch.int64)
    two = analyze(model, example_inputs=(ids,), serve={"prompt": 16, "generate": 4},
                  parallel={"mesh": "tp=2"}).serving
    assert two is not None
    # a rank of 2, fp32: embedding and head 2 · 256 · 64 + the final norm 64; layer 0 dense:
    # q, o 32 · 64, k, v 16 · 64, gate, up 64 · 64, down 64 · 64, norms 128 (18,560);
    # layer 1: attention 6,144, the router 4 · 64 and its bias 4 whole, 4 experts of I = 64
    # halved (4 · 64 · 64 + 4 · 64 · 32), norms 128 (31,108); 16 floats of rotary buffers
    assert two.weight_bytes == (32_832 + 18_560 + 31_108 + 16) * 4


def test_fused_projections_are_split_by_their_parts_as_vllm_splits_them():
    """Phi-3 (and Phi-4) fuse q/k/v into one ``qkv_proj`` and gate/up into one
    ``gate_up_proj``; transformers' plan gathers both for training, which a serving engine
    does not (it was refused). vLLM runs Phi-3 as its Llama: ``QKVParallelLinear`` gives a
    rank its query heads, then its key and value heads, ``MergedColumnParallelLinear`` its
    gate rows, then its up rows, o and down row-wise; the attention splits the rank's
    projection by the rank's head counts."""
    one, two = _one_and_a_rank_of_two("zoo:hf_phi3")
    # d 64, 4 heads of 16 (2 key/value heads), SwiGLU 128, 2 layers, vocab 512, fp32; 16
    # floats of rotary buffers. One GPU: embedding and head 2 · 512 · 64 = 65,536; a layer:
    # qkv 64 · (4 + 2 + 2) · 16 = 8,192, o 4,096, gate_up 64 · 256 = 16,384, down 8,192,
    # norms 128 (36,992); the final norm 64: 139,584. A rank of 2: the vocabulary's rows
    # 32,768; a layer's matrices halved (18,432) beside its whole norms: 2 · 18,560 + 64
    assert one.weight_bytes == (139_584 + 16) * 4
    assert two.weight_bytes == (32_768 + 2 * 18_560 + 64 + 16) * 4
    # a token's keys and values, fp32: 2 layers × K, V × 2 heads of 16 = 512 B; a rank's
    # one head of a layer: 256 B
    assert (one.kv_bytes_per_token, two.kv_bytes_per_token) == (512, 256)
    c = two.collectives
    assert c is not None   # (as Llama's: the embedding, o and down all-reduced; the logits)
    assert (c.prefill_all_reduce_bytes, c.prefill_all_gather_bytes, c.prefill_calls) == \
        (5 * 16 * 64 * 4, 512 * 4, 6)
    # on 4 ranks its 2 key/value heads are replicated, one a rank: qkv_proj's rows are the
    # rank's query head, then one key and one value head ((1 + 2) · 16 = 48 rows × 64); o
    # 16 columns × 64, gate_up 2 · 32 rows × 64, down 32 × 64, whole norms 128: 10,368 a
    # layer; the vocabulary's 128 rows × 64 for each of the embedding and the head
    four = analyze("zoo:hf_phi3", serve={"prompt": 16, "generate": 4, "engine": "vllm"},
                   parallel={"mesh": "tp=4"}).serving
    assert four is not None
    assert four.weight_bytes == (2 * 128 * 64 + 2 * 10_368 + 64 + 16) * 4
    assert four.kv_bytes_per_token == 2 * 2 * 16 * 4   # (2 layers × K, V × its one head)


def test_a_norm_over_all_heads_gathers_its_input_as_vllm_runs_olmo2():
    """OLMo 2 normalizes all heads' queries (and keys) at once. vLLM shards q/k/v column-wise
    and, for the norm, all-gathers the rank's queries and keys, normalizes them whole and
    takes its slice back (its ``_apply_qk_norm``): the norm's weight whole on every rank, two
    more all-gathers a layer (it was refused)."""
    import torch
    import transformers

    config = transformers.Olmo2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        use_cache=False, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
        eos_token_id=1)
    model = transformers.Olmo2ForCausalLM(config)
    ids = torch.zeros(1, 16, dtype=torch.int64)
    two = analyze(model, example_inputs=(ids,), serve={"prompt": 16, "generate": 4},
                  parallel={"mesh": "tp=2"}).serving
    assert two is not None
    # a rank of 2, fp32: the vocabulary's rows 2 · 256 · 64 = 32,768; a layer's q, o 32 · 64,
    # k, v 16 · 64, gate, up, down 64 · 64 (18,432) beside its whole norms q_norm 64, k_norm
    # 32 and the two post-norms 128 (224); the final norm 64; 16 floats of rotary buffers
    assert two.weight_bytes == (32_768 + 2 * (18_432 + 224) + 64 + 16) * 4
    assert two.kv_bytes_per_token == 2 * 2 * 16 * 4   # (2 layers × K, V × its head of 16)
    c = two.collectives
    assert c is not None
    # the prefill of 16 tokens: each layer gathers its queries (16 × 64 fp32 = 4,096 B) and
    # keys (16 × 32: 2,048 B) beside Llama's collectives (5 all-reduces of 4,096 B, the last
    # position's logits gathered: 2,048 B); the decode step one token's worth
    assert (c.prefill_all_reduce_bytes, c.prefill_all_gather_bytes, c.prefill_calls) == \
        (5 * 4_096, 2 * (4_096 + 2_048) + 2_048, 6 + 4)
    assert (c.decode_all_gather_bytes, c.decode_calls) == (2 * (256 + 128) + 2_048, 10)
    # on 4 ranks its 2 key/value heads are replicated (one a rank): gathering them would not
    # give the keys the norm normalizes back — refused by name, not a trace error
    with pytest.raises(GraphcostError, match="k_norm normalizes a whole projection"):
        analyze(model, example_inputs=(ids,), serve={"prompt": 16, "generate": 4},
                parallel={"mesh": "tp=4"})


def test_fewer_key_value_heads_than_ranks_are_replicated_as_vllm_replicates_them():
    """Qwen3-235B-A22B has 4 key/value heads, served on 8 GPUs: vLLM's ``QKVParallelLinear``
    gives each rank one key/value head, each head on two ranks, and pairs the rank's query
    heads with it (it was refused: "does not divide into 8 ranks"). A count the ranks do not
    divide into either stays refused, as vLLM refuses it."""
    import torch
    import transformers

    def served(mesh: str, heads: int, kv_heads: int):
        config = transformers.Qwen3MoeConfig(
            vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
            num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=kv_heads,
            head_dim=16, num_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
            use_cache=False, tie_word_embeddings=False)
        model = transformers.Qwen3MoeForCausalLM(config)
        return analyze(model, example_inputs=(torch.zeros(1, 16, dtype=torch.int64),),
                       serve={"prompt": 16, "generate": 4}, parallel={"mesh": mesh})

    report = served("tp=4", heads=8, kv_heads=2)
    four = report.serving
    assert four is not None
    assert any("fewer key/value heads than ranks, replicated" in w for w in report.warnings)
    # a rank of 4, fp32: q 64 · 32 (its 2 query heads of 16), k and v one head each 64 · 16,
    # o 32 · 64, the per-head q/k norms 32, the router 4 · 64, 4 experts of I = 32 split by
    # 4 (4 · 64 · 16 + 4 · 8 · 64), the norms 128: 12,704 a layer; the vocabulary's rows
    # 2 · 128 · 64, the final norm 64; 16 floats of rotary buffers
    assert four.weight_bytes == (2 * 12_704 + 16_384 + 64 + 16) * 4
    # the key/value cache per token: 2 layers × K, V × the rank's one head of 16, fp32 —
    # twice a quarter of one GPU's (2 heads: 512 B), as each head is held twice
    assert four.kv_bytes_per_token == 2 * 2 * 16 * 4
    with pytest.raises(GraphcostError, match="does not divide into 4 ranks"):
        served("tp=4", heads=12, kv_heads=6)   # (6 heads on 4 ranks: neither divides)


def test_latent_attention_keeps_its_down_projections_and_cache_whole_as_vllm_does():
    """DeepSeek-V3's multi-head latent attention on vLLM's tensor-parallel ranks: the latent
    down-projections (q_a_proj, kv_a_proj_with_mqa: ``ReplicatedLinear``) and their norms
    whole on every rank, the up-projections q_b_proj and kv_b_proj split by head, o_proj
    row-wise; the cache holds the latent, whole on every rank (it was refused:
    'mla_kv_a_proj'). The shared expert's partial sum is added to the routed experts' before
    the one all-reduce of the block (vLLM's ``reduce_results=False``)."""
    _, two = _one_and_a_rank_of_two("zoo:hf_deepseek_v3")
    # a rank of 2, fp32. Attention: q_a 64 · 32 and its norm 32, q_b 32 · 2 heads of 24 (16
    # nope + 8 rope), kv_a 64 · (16 + 8) and its norm 16, kv_b 16 · 2 heads of 32 (16 + 16),
    # o 32 · 64: 8,240. Layer 0's MLP (I 128) halved: 3 · 64 · 64; layer 1's 4 experts of
    # I = 32 halved (4 · (64 · 32 + 16 · 64)) beside the shared expert's (3 · 64 · 16), the
    # router 4 · 64 and its bias 4 whole; two norms of 64 a layer. The vocabulary's rows
    # 2 · 256 · 64, the final norm 64; 8 floats of rotary buffers
    layer0 = 8_240 + 3 * 64 * 64 + 128
    layer1 = 8_240 + 4 * (64 * 32 + 16 * 64) + 3 * 64 * 16 + 260 + 128
    assert two.weight_bytes == (32_768 + layer0 + layer1 + 64 + 8) * 4
    # the cache: each layer's latent (16) and rope key (8), fp32, whole on the rank
    assert two.kv_bytes_per_token == 2 * (16 + 8) * 4
    c = two.collectives
    assert c is not None
    # the embedding's, each o_proj's, layer 0's down and layer 1's experts-and-shared sum
    # all-reduced (16 tokens × 64 fp32 = 4,096 B each); the last position's logits gathered
    assert (c.prefill_all_reduce_bytes, c.prefill_all_gather_bytes, c.prefill_calls) == \
        (5 * 4_096, 2_048, 6)


def test_a_gated_delta_net_is_split_by_heads_as_vllm_splits_it():
    """Qwen 3.5's and Qwen3-Next's linear attention (frontends/torch/tp_linear_attention.py):
    transformers' plan gathers its projections for training, vLLM splits them by heads — it
    was refused. Each rank 1/T of the key and value heads: their projections' rows, the
    convolution's channels, A_log and dt_bias, its recurrent and convolution states; the
    head-wise norm whole; out_proj row-parallel."""
    import torch
    import transformers

    config = transformers.Qwen3_5TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_value_heads=4,
        linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(config)
    ids = torch.zeros(2, 16, dtype=torch.int64)
    two = analyze(model, example_inputs=(ids,), serve={"prompt": 16, "generate": 4},
                  parallel={"mesh": "tp=2"}).serving
    assert two is not None
    # fp32, 16 B of rotary buffers. A linear-attention layer (key dim 2 · 16, value dim
    # 4 · 16, q/k/v channels 128) on one GPU: in_proj_qkv 64 · 128, z 64 · 64, b and a
    # 64 · 4 each, the convolution 128 · 4, dt_bias and A_log 4 each, the norm 16, out_proj
    # 64 · 64 (17,432); a rank of 2 8,724 (the norm whole). The attention layer (q with its
    # gate 128 rows, k, v 32, o, q/k norms 16): 16,416, a rank 8,224. An MLP 3 · 64 · 128,
    # a rank half; layer norms 128. Embedding and head 2 · 512 · 64, a rank half; final
    # norm 64. (One GPU's 233,128 parameters and cache: tests/test_serving.py's Qwen 3.5.)
    assert two.weight_bytes == (3 * (8_724 + 12_288 + 128) + 8_224 + 12_288 + 128
                                + 32_768 + 64) * 4 + 16
    # the cache: each linear layer's convolution state (2, 128 / 2, 4) and recurrent state
    # (2, 4 / 2, 16, 16), the attention layer's keys and values of its 1 head over 20 tokens
    states = 3 * (2 * 64 * 4 + 2 * 2 * 16 * 16) * 4
    assert two.kv_cache_bytes == states + 2 * 1 * 20 * 2 * 16 * 4 == 47_104 // 2
    # all-reduced a layer: the mixer's output (linear or attention) and the MLP's, the
    # embedding's lookup: 9 of (2, 16, 64) fp32; the last positions' logits gathered
    c = two.collectives
    assert c is not None and (c.prefill_all_reduce_bytes, c.prefill_calls) == \
        (9 * 2 * 16 * 64 * 4, 10)


def test_qwen3_next_replicates_its_key_value_heads_beside_a_gated_query():
    """Qwen3-Next's q_proj holds a gate beside each head's queries (twice the heads' width):
    with fewer key/value heads than ranks each rank pairs its query heads (the config's,
    not the projection's width / head_dim) with one replicated head (a trace failure:
    "Attempting to broadcast a dimension of length 4"). Its gated delta nets split as Qwen
    3.5's; its experts as Mixtral's."""
    import torch
    import transformers

    config = transformers.Qwen3NextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
        shared_expert_intermediate_size=64, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, linear_num_value_heads=8, linear_num_key_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
        num_experts_per_tok=2, max_position_embeddings=128)
    model = transformers.Qwen3NextForCausalLM(config)
    s = analyze(model, example_inputs=(torch.zeros(1, 16, dtype=torch.int64),),
                serve={"prompt": 16, "generate": 4}, parallel={"mesh": "tp=4"}).serving
    assert s is not None
    # a token adds to the one attention layer (of 4) its rank's one key and one value head
    # of 16 fp32; the 3 gated delta nets' states on a rank of 4: convolution (1, (2 · 4 ·
    # 16 + 8 · 16) / 4, 4) and recurrent (1, 8 / 4, 16, 16)
    assert s.kv_bytes_per_token == 2 * 16 * 4
    states = 3 * (256 // 4 * 4 + 2 * 16 * 16) * 4
    assert s.kv_cache_bytes == states + 20 * 2 * 16 * 4


def test_a_mamba2_mixer_is_split_by_heads_as_vllm_splits_it():
    """Bamba's (Granite 4.0-H's, Nemotron-H's, Falcon-H1's) Mamba 2 mixer (frontends/torch/
    tp_mamba.py), which transformers' plans leave out — it was refused: each rank its share
    of the heads, one group of B and C replicated on each rank (fewer groups than ranks),
    the gated norm over the whole width by an all-reduce of each token's sum of squares."""
    import torch
    import transformers

    config = transformers.BambaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16,
        mamba_d_state=16, mamba_n_groups=1, mamba_expand=2, attn_layer_indices=[1],
        max_position_embeddings=128)
    torch.manual_seed(0)
    model = transformers.BambaForCausalLM(config)
    report = analyze(model, example_inputs=(torch.zeros(2, 16, dtype=torch.int64),),
                     serve={"prompt": 16, "generate": 4}, parallel={"mesh": "tp=2"})
    two = report.serving
    assert two is not None
    # its 2 key/value heads split, one a rank: the mixer's replicated group of B and C is no
    # replicated head (the report said so)
    assert not any("key/value heads" in w for w in report.warnings)
    # fp32, 32 B of rotary buffers; one GPU 155,384 parameters. Layer 0's mixer (inner
    # 128, 8 heads of 16, 1 group, state 16) on a rank of 2: in_proj z, x 64 each, B, C 16
    # each, dt 4 rows of 64 (10,496), the convolution's 96 channels of 4 and their biases
    # (480), A_log, D, dt_bias 4 each, the norm 64, out_proj 64 · 64: 15,148; its MLP half
    # of 3 · 128 · 64, norms 128. Layer 1's attention q, o 32 · 64, k, v 16 · 64 (6,144);
    # its MLP; norms. The vocabulary's rows 2 · 256 · 64; final norm 64
    assert two.weight_bytes == (32_768 + 15_148 + 12_288 + 128 + 6_144 + 12_288 + 128
                                + 64) * 4 + 32
    # the mixer's convolution state (2, 96, 4) and SSM state (2, 4, 16, 16); the attention's
    # one key/value head of 16 over 20 tokens
    assert two.kv_cache_bytes == (2 * 96 * 4 + 2 * 4 * 16 * 16) * 4 + 2 * 20 * 16 * 2 * 4
    # all-reduced: the embedding's lookup, the mixer's and attention's outputs, 2 MLPs'
    # (2 · 16 · 64 fp32 each), the norm's sums of squares (2 · 16 fp32); the logits gathered
    c = two.collectives
    assert c is not None and (c.prefill_all_reduce_bytes, c.prefill_calls) == \
        (5 * 2 * 16 * 64 * 4 + 2 * 16 * 4, 7)


@pytest.mark.parametrize("family", ["jamba", "falcon_mamba"])
def test_a_mamba1_mixer_is_split_by_channel_as_vllm_splits_it(family):
    """Jamba's and Falcon Mamba's Mamba 1 mixers (frontends/torch/tp_mamba.py; they were
    refused): each rank its share of the intermediate channels — in_proj's x and gate rows,
    the convolution's channels, dt_proj's rows, A_log and D — x_proj and out_proj
    row-parallel, each all-reduced (vLLM's MambaMixer), and the states of its channels."""
    import torch
    import transformers

    if family == "jamba":   # (layer 0 a mixer, layer 1 attention, an MLP each)
        model = transformers.JambaForCausalLM(transformers.JambaConfig(
            vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, mamba_d_state=16, mamba_d_conv=4,
            mamba_expand=2, mamba_dt_rank=8, attn_layer_period=2, attn_layer_offset=1,
            expert_layer_period=2, expert_layer_offset=1, num_experts=1,
            max_position_embeddings=128))
    else:                   # (2 mixers, the head tied to the embedding)
        model = transformers.FalconMambaForCausalLM(transformers.FalconMambaConfig(
            vocab_size=512, hidden_size=64, num_hidden_layers=2, state_size=16, expand=2,
            conv_kernel=4, time_step_rank=8))
    two = analyze(model, example_inputs=(torch.zeros(2, 16, dtype=torch.int64),),
                  serve={"prompt": 16, "generate": 4}, parallel={"mesh": "tp=2"}).serving
    assert two is not None and two.collectives is not None
    # a mixer (inner 128, state 16, dt rank 8, kernel 4) on a rank of 2: in_proj 2 · 64 rows
    # of 64 (8,192), the convolution's 64 channels of 4 and their biases (320), x_proj 40 ·
    # 64 (2,560), dt_proj 64 · 8 and its bias (576), A_log 64 · 16, D 64 (1,088), out_proj
    # 64 · 64 (4,096): 16,832 parameters; the vocabulary's rows 256 · 64 (16,384)
    mixer, rows = 16_832, 16_384
    if family == "jamba":
        # + its dt, B and C norms (40, whole); layer 0's and layer 1's MLPs half of 3 · 128 ·
        # 64 each, the attention's q, o 32 · 64 and k, v 16 · 64 (6,144), 5 norms of 64, the
        # head's rows
        assert two.weight_bytes == (rows + mixer + 40 + 2 * 12_288 + 6_144 + 5 * 64
                                    + rows) * 4
        # the mixer's convolution state (2, 64, 4) and SSM state (2, 64, 16); the
        # attention's one key/value head of 16 over 20 tokens
        assert two.kv_cache_bytes == (2 * 64 * 4 + 2 * 64 * 16) * 4 + 2 * 20 * 16 * 2 * 4
        # all-reduced (2 · 16 tokens, fp32): the lookup, the mixer's x_proj (40 a token) and
        # out_proj, the attention's and both MLPs' outputs (64 a token)
        reduced, calls = 5 * 2 * 16 * 64 * 4 + 2 * 16 * 40 * 4, 6
    else:
        # 2 mixers and their norms; transformers' weightless norms' dummy buffers (128 + 2 ·
        # 16 each, whole: never read); the final norm; the tied head holds the table's rows
        assert two.weight_bytes == (rows + 2 * (mixer + 64) + 2 * 160 + 64) * 4
        assert two.kv_cache_bytes == 2 * (2 * 64 * 4 + 2 * 64 * 16) * 4
        reduced, calls = 3 * 2 * 16 * 64 * 4 + 2 * 2 * 16 * 40 * 4, 5
    c = two.collectives
    assert (c.prefill_all_reduce_bytes, c.prefill_calls) == (reduced, calls + 1)   # (+ gather)


def test_a_short_convolution_is_split_by_channel_as_vllm_splits_it():
    """LFM2's gated short convolutions (frontends/torch/tp_short_conv.py; refused, as were its
    w1/w2/w3 MLPs and its attention's out_proj, which transformers' plan leaves out): vLLM's
    ShortConv splits in_proj's B, C and x by channel, the convolution and its state with them,
    out_proj row-parallel; its MLP's w1 and w3 column-, w2 row-parallel."""
    import torch
    import transformers

    model = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, num_hidden_layers=4,
        layer_types=["conv", "full_attention"] * 2))
    two = analyze(model, example_inputs=(torch.zeros(2, 64, dtype=torch.int64),),
                  serve={"prompt": 64, "generate": 16}, parallel={"mesh": "tp=2"}).serving
    assert two is not None
    # a rank of 2, fp32: a convolution layer's 32 channels of 3 (96), in_proj 3 · 32 rows of
    # 64 (6,144), out_proj 64 · 32 (2,048); every layer's MLP (its ff width adjusted to 256)
    # w1, w3 128 · 64 and w2 64 · 128 (24,576), 2 norms of 64; an attention layer's q, out
    # 32 · 64, k, v 16 · 64 (6,144) and its q, k norms of 16 (whole); the tied table's rows
    # 256 · 64, the last norm; the rotary buffers' 16 floats
    conv, attention = 96 + 6_144 + 2_048 + 24_576 + 128, 6_144 + 32 + 24_576 + 128
    assert two.weight_bytes == (256 * 64 + 2 * conv + 2 * attention + 64 + 16) * 4
    # a convolution layer's state (2, 32, 3); an attention layer's key/value head of 16 over
    # 80 tokens
    assert two.kv_cache_bytes == 2 * 2 * 32 * 3 * 4 + 2 * 2 * 2 * 80 * 16 * 4


def test_the_prefill_computes_the_logits_of_the_last_position_alone():
    every = _serving(2, serve={"logits": "all"}).collectives
    eager, vllm = _serving(2).collectives, _serving(2, serve={"engine": "vllm"}).collectives
    # the prefill's logits all-gathered: (batch, 64 positions, 1,000) fp32 as a plain forward
    # computes them, (batch, 1, 1,000) as generate and vLLM do (the token they sample)
    assert every.prefill_all_gather_bytes == BATCH * PROMPT * 1000 * 4
    assert vllm.prefill_all_gather_bytes == eager.prefill_all_gather_bytes == BATCH * 1000 * 4
    assert vllm.decode_all_gather_bytes == eager.decode_all_gather_bytes == BATCH * 1000 * 4


def test_vllm_prices_the_decode_step_as_a_cuda_graph_replay():
    eager = _serving(1, device="h100").time
    vllm = _serving(1, device="h100", serve={"engine": "vllm"}).time
    # a tiny model's eager decode step waits on the host (≈ 12 µs an op); a CUDA graph's
    # replay launches the kernels without it
    assert eager.host_bound and not vllm.host_bound
    assert vllm.tpot_seconds < eager.tpot_seconds
    assert (eager.engine, vllm.engine) == ("eager", "vllm")


@pytest.mark.parametrize("mesh, said", [
    ("dp_shard=2,tp=2", "tensor parallelism alone"),
    ("tp=8", "does not divide into 8 ranks"),
    ("tp=auto", "tp, pp, ep and cp are traced at their sizes"),
])
def test_what_a_replica_cannot_be_is_refused(mesh, said):
    with pytest.raises(GraphcostError, match=said):
        analyze("zoo:llama_tiny", batch=2, serve=SERVE, parallel={"mesh": mesh})


def test_the_command_line_serves_on_tensor_parallel_ranks():
    out = run_cli("zoo:llama_tiny", "--serve", "--prompt", "64", "--generate", "16", "--batch",
                  "4", "--device", "h100", "--parallel", "tp=2", "--engine", "vllm",
                  "--details")
    assert out.returncode == 0, out.stderr
    assert "tensor parallel 2: each GPU's share below" in out.stdout
    assert "decode step: all-reduce 10.00 KiB, all-gather 15.62 KiB in 6 calls" in out.stdout
    assert "as vLLM runs it" in out.stdout
