"""A training step's joint graph traced with three blocks and grown to all of them
(analyzer/frontends/torch/repeat_joint.py), against the trace of every block (--all-layers):
node for node the same ops, output shapes, dataflow (which node each input comes from),
module paths, parameters and their gradients, attention calls — and so the same training
memory, timeline included."""
from __future__ import annotations

from dataclasses import replace
from functools import cache

import pytest
import torch
from graphcost.analyzer.app.pipeline import run_passes
from graphcost.analyzer.app.request import build_request
from graphcost.analyzer.load.loading import load_graph
from graphcost.models_zoo.llama import Llama, LlamaConfig
from graphcost.passes.training.memory import training_memory


def _zoo_llama():
    cfg = LlamaConfig(vocab_size=1000, d_model=128, n_layer=8, n_head=4, n_kv_head=2, ffn=344,
                      max_seq=256)
    with torch.device("meta"):
        return Llama(cfg), {"input_ids": (2, 64)}


def _hf_gemma2():
    """Sliding and full attention layers alternate: grown two layers at a time; nine of them,
    so the ninth is a tail of part of a period, traced as it is."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Gemma2Config(hidden_size=128, intermediate_size=344, num_hidden_layers=9,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                    vocab_size=1000, sliding_window=16)   # eager attention
    with torch.device("meta"):
        return transformers.Gemma2ForCausalLM(cfg), {"input_ids": (1, 64)}


def _hf_deepseek():
    """A dense first layer, then seven mixtures of experts: the head traced as it is."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DeepseekV2Config(
        vocab_size=1000, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=32,
        q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, n_group=1,
        topk_group=1)
    model_class = transformers.DeepseekV2ForCausalLM  # (imported first under the meta device,
    # transformers' generation module fails on torch 2.8: torch._dynamo partly initialized)
    with torch.device("meta"):
        return model_class(cfg), {"input_ids": (1, 64)}


# the layers traced, of the stack's
TRACED = {"zoo_llama": (3, 8), "hf_gemma2": (7, 9), "hf_deepseek": (4, 8)}


@cache
def _traced(build, device: str | None = None):
    """The load options of ``build``'s training step (attention as ``device`` runs it) and the
    step traced with every block and grown from three: one pair of traces for the tests below
    that read the same model."""
    model, shapes = build()
    load = build_request(train=True, input_shapes=shapes, input_dtypes={"input_ids": torch.int64},
                         device=device).load
    return load, load_graph(model, replace(load, all_layers=True)), load_graph(model, load)


def _dataflow(g):
    """Each node's inputs as (the producing node's index) or (a leaf's kind and shape)."""
    return [tuple(None if not x else
                  ("node", g.values[x].producer) if g.values[x].producer is not None else
                  ("leaf", str(g.values[x].kind), g.values[x].spec) for x in n.inputs)
            for n in g.nodes]


def _held(g):
    return {g.values[v].producer: p for v, p in g.eager_refs.items()}


def _inplace(g):
    return {g.values[o].producer: g.values[i].producer for o, i in g.eager_inplace.items()}


# The zoo's Llama with attention as an H100 runs it (the FSDP test below reads the same
# traces); the transformers models with this CPU's: DeepSeek's layers after its head are
# transformers' identical blocks (SDPA), Gemma-2's eager attention alternates sliding and full.
# Gemma-2 on every torch of the range (conftest.py): on 2.8 its checks came with no module
@pytest.mark.parametrize("build,device", [(_zoo_llama, "h100"),
                                          pytest.param(_hf_gemma2, None,
                                                       marks=pytest.mark.every_torch),
                                          (_hf_deepseek, None)],
                         ids=list(TRACED))
def test_grown_joint_graph_is_the_full_trace(build, device, request):
    _, full, grown = _traced(build, device)
    traced, layers = TRACED[request.node.callspec.id]
    assert grown.traced_layers.startswith(f"{traced} of {layers} layers traced")
    assert not full.traced_layers
    assert [(n.op, n.scope, tuple(full.spec(o) for o in n.outputs)) for n in full.nodes] == \
        [(n.op, n.scope, tuple(grown.spec(o) for o in n.outputs)) for n in grown.nodes]
    assert _dataflow(full) == _dataflow(grown)
    assert sorted((full.param_paths[p], full.values[g].producer) for p, g in full.grads.items()) \
        == sorted((grown.param_paths[p], grown.values[g].producer) for p, g in grown.grads.items())
    assert [c.scope for c in full.attention] == [c.scope for c in grown.attention]
    # how long the model's Python held each forward tensor, and what it wrote in place: the
    # same, by the producing node's place (the copies' values are named after layer 1's)
    assert full.eager_refs and _held(full) == _held(grown)
    assert _inplace(full) == _inplace(grown)
    for optimizer in ("none", "adamw"):
        a, b = training_memory(full, optimizer), training_memory(grown, optimizer)
        assert (a.peak_bytes, a.timeline) == (b.peak_bytes, b.timeline)


def test_fsdp_over_the_grown_graph_is_the_full_traces():
    # FSDP2's units are the stack's blocks (param_paths): every copy is its own unit. What
    # analyze(model, **kw) runs: the passes kw asks for over the graphs traced as kw loads
    # them (with and without all_layers), which the test above traced
    load, full_graph, grown_graph = _traced(_zoo_llama, "h100")
    kw = dict(input_shapes={"input_ids": (2, 64)}, input_dtypes={"input_ids": torch.int64},
              train=True, optimizer="adamw", parallel={"strategy": "fsdp", "world_size": 4},
              device="h100")
    request = build_request(**kw)
    assert request.load == load
    full, grown = run_passes(full_graph, request.passes), run_passes(grown_graph, request.passes)
    assert grown.traced_layers and not full.traced_layers
    assert full.parallel is not None and grown.parallel is not None
    # the same figures and units; a copy's weights are named after layer 1's ("arg10_1~2")
    units = [replace(u, members=()) for u in full.parallel.units]
    assert [replace(u, members=()) for u in grown.parallel.units] == units
    # the peak at the same node: by its place, since a grown copy is named after the layer it
    # repeats (the last layer's mul_84 is the grown graph's mul_39)
    def placed(r):
        names = [n.name for n in r.nodes]
        return replace(r.parallel, units=(), peak_node=names.index(r.parallel.peak_node))
    assert placed(full) == placed(grown)


def test_the_grown_step_against_memtracker():
    # the grown graph against PyTorch itself: the same 8-layer Llama built with real weights,
    # MemTracker over its second AdamW step on this CPU (the full trace is checked against
    # MemTracker in tests/test_training.py; this holds the grown one to the same reality:
    # 32,590,192 B against 32,524,660 B measured, +0.2%, on 2026-11-25)
    from graphcost.analyzer.measure.reference import measure_training

    from graphcost import analyze
    cfg = LlamaConfig(vocab_size=1000, d_model=128, n_layer=8, n_head=4, n_kv_head=2, ffn=344,
                      max_seq=256)
    torch.manual_seed(0)
    model, ids = Llama(cfg), torch.randint(0, 1000, (2, 64))
    measured, _ = measure_training(model, (ids,), "adamw")
    r = analyze(model, (ids,), train=True, optimizer="adamw", what_if=False,
                include_inputs=False)
    assert r.traced_layers.startswith("3 of 8 layers traced")
    assert abs(r.training.peak_bytes / measured - 1) <= 0.05, (r.training.peak_bytes, measured)
