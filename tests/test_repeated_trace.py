"""A stack of eight or more identical blocks is traced as three and the middle block repeated
in the IR (analyzer/frontends/torch/repeat_layers.py) for an inference analysis; a stack of
blocks of a period of layers, a head of layers unlike the rest and a tail of part of a
period likewise (analyzer/frontends/torch/layer_stack.py). The reference is a
trace of every block of the same model: the report must be the same but for node names —
the same ops in the same modules with the same shapes, the same totals, the same memory
timeline (eager references held across blocks included) — and 2·MACs must equal PyTorch's
FlopCounterMode on a real forward."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from graphcost.models_zoo.llama import Llama, LlamaConfig
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from graphcost import GraphcostError, analyze

LAYERS = 8   # the smallest stack repeated (REPEAT_AT): copies 2…6 of layer 1


def _zoo_llama():
    torch.manual_seed(0)
    return Llama(LlamaConfig(vocab_size=200, d_model=32, n_layer=LAYERS, n_head=4, n_kv_head=2,
                             ffn=64, max_seq=64)).eval()


def _hf_gpt2():
    pytest.importorskip("transformers")
    from graphcost.models_zoo import hf
    torch.manual_seed(0)
    return hf.gpt2(n_layer=LAYERS).eval()  # learned positions, tied head, eager attention


def _hf_gemma3():
    """Gemma-3's sliding and full attention layers, here alternating (its checkpoints: five
    sliding, one full), nine of them: four blocks of two grown two layers at a time and a
    tail of one sliding layer, traced as it is (62 = 10 · 6 + 2 in gemma-3-27b). Built as
    its 4B-27B checkpoints are, with a vision tower: the layer types are its text config's."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    text = t.Gemma3TextConfig(vocab_size=200, hidden_size=32, intermediate_size=64,
                              num_hidden_layers=LAYERS + 1, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=8, sliding_window=4,
                              max_position_embeddings=64,
                              layer_types=["sliding_attention", "full_attention"] * 4
                              + ["sliding_attention"])
    vision = t.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, image_size=28, patch_size=14)
    cfg = t.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                         mm_tokens_per_image=4, image_token_index=2, boi_token_index=1,
                         eoi_token_index=0)  # (below the ids the test draws: text alone)
    return t.Gemma3ForConditionalGeneration(cfg).eval()


def _hf_deepseek():
    """DeepSeek-V2's first layer is a dense MLP, the seven after it mixtures of experts: the
    head of one layer traced as it is, the experts' layers grown one at a time."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = t.DeepseekV2Config(vocab_size=200, hidden_size=32, intermediate_size=64,
                             moe_intermediate_size=16, num_hidden_layers=LAYERS,
                             num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4,
                             n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
                             kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8,
                             qk_rope_head_dim=8, v_head_dim=8, max_position_embeddings=64,
                             n_group=1, topk_group=1)
    return t.DeepseekV2ForCausalLM(cfg).eval()


# layers traced: three blocks of one layer, of two (Gemma-3: and its tail), DeepSeek's
# dense head and three blocks
TRACED = {"zoo_llama": (3, LAYERS), "hf_gpt2": (3, LAYERS), "hf_gemma3": (7, LAYERS + 1),
          "hf_deepseek": (4, LAYERS)}


# Gemma-3 on every torch of the range (conftest.py): on 2.8 a periodic stack's checks came
# with no module paths
@pytest.mark.parametrize("build", [_zoo_llama, _hf_gpt2,
                                   pytest.param(_hf_gemma3, marks=pytest.mark.every_torch),
                                   _hf_deepseek],
                         ids=list(TRACED))
def test_repeated_stack_equals_a_full_trace(build, request):
    model = build()
    ids = torch.randint(3, 200, (2, 12))
    repeated = analyze(model, (ids,))
    full = analyze(model, (ids,), all_layers=True)  # every block traced
    traced, layers = TRACED[request.node.callspec.id]
    assert repeated.traced_layers.startswith(f"{traced} of {layers} layers traced")
    assert full.traced_layers == ""
    assert [(n.op, n.scope, n.output_shapes) for n in repeated.nodes] == \
        [(n.op, n.scope, n.output_shapes) for n in full.nodes]
    assert repeated.totals == full.totals
    assert repeated.memory.timeline == full.memory.timeline
    assert repeated.memory.peak_bytes == full.memory.peak_bytes
    assert repeated.modules == full.modules
    # every block's own weights: all blocks' parameters, not three (a tied head once)
    assert repeated.totals.params == sum(p.numel() for p in model.parameters())
    counter = FlopCounterMode(display=False)
    if build is _hf_deepseek:
        # FlopCounterMode has no formula for grouped_mm, the experts graphcost traces (the
        # eager loop cannot be): counted with batched_mm's, one bmm per token and expert
        # chosen, the same arithmetic (as tests/test_hf_models.py counts Mixtral's)
        model.set_experts_implementation("batched_mm")
    with counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):  # attention as its matmuls
        model(ids)
    assert 2 * repeated.totals.macs == counter.get_total_flops()

    # the report says so wherever it is read: JSON, the terminal summary, Markdown, HTML
    from graphcost.analyzer.render.files import render_markdown
    from graphcost.analyzer.render.html import html_report
    from graphcost.analyzer.render.summary import summary_lines
    note = repeated.traced_layers
    assert json.loads(repeated.to_json())["traced_layers"] == note
    assert json.loads(full.to_json())["traced_layers"] == ""
    assert any(line.startswith("traced") for line in summary_lines(repeated))
    assert not any(line.startswith("traced") for line in summary_lines(full))
    assert note in render_markdown(repeated) and note in html_report(repeated)


def test_the_stack_pattern_by_hand():
    from graphcost.analyzer.frontends.torch.layer_stack import (
        Stack,
        _repeating,
        layers_note,
    )

    s, f, dense, moe = "sliding", "full", "dense", "moe"
    # gemma-3-27b: 62 layers, five sliding then one full: ten periods of six and two sliding
    # layers after them; traced: 3 · 6 + 2 = 20
    gemma3 = ([s] * 5 + [f]) * 10 + [s] * 2
    assert _repeating(gemma3) == (6, 0, 2)
    stack = Stack("model.layers", 62, 6, 0, 2)
    assert (stack.blocks, stack.traced) == (10, 20)
    # blocks 0, 1, 2 … 9: copies 2–8 of block 1 are layers 12–53 (block 9 the third traced)
    assert layers_note(stack) == ("20 of 62 layers traced; layers 12–53 are layers 6–11 "
                                  "repeated in the IR (layer kinds repeat every 6 layers)")
    # DeepSeek-V3: 61 layers, the first three dense (first_k_dense_replace 3); traced: 3 + 3
    assert _repeating([dense] * 3 + [moe] * 58) == (1, 3, 0)
    assert layers_note(Stack("model.layers", 61, 1, 3, 0)) == (
        "6 of 61 layers traced; layers 5–59 are layer 4 repeated in the IR (identical blocks)")
    # Bamba-9B: attention at 9, 18 and 27 of 32, its last four layers alike: one copy
    assert layers_note(Stack("model.layers", 32, 1, 28, 0)) == (
        "31 of 32 layers traced; layer 30 is layer 29 repeated in the IR (identical blocks)")
    # gpt-oss-20b: 24 alternating; a stack of one kind; kinds in no order: traced whole
    assert _repeating([s, f] * 12) == (2, 0, 0)
    assert _repeating([moe] * 8) == (1, 0, 0)
    assert _repeating([s, f, f, s, s, f, s, s]) is None
    # more than three whole periods: 4 · 2 + 1 repeats, 3 · 2 + 1 does not
    assert _repeating([s, f] * 4 + [s]) == (2, 0, 1)
    assert _repeating([s, f] * 3 + [s]) is None


def test_a_check_inside_a_layer_is_placed_in_that_layer():
    # torch 2.8's export gives the check of a tensor DeepSeek-V2's layers all read (its rotary
    # table) the module path of the layer before, in the middle of the next layer's nodes
    # (layers.2.self_attn's nodes, then a check "in" layers.1.self_attn): the layer's nodes
    # would be two runs and the stack traced whole. A check between two nodes of one module
    # is that module's; one at a module's edge keeps its own
    from graphcost.analyzer.frontends.torch.fx_lowering import _placed
    from graphcost.passes.ir import Node

    def node(i, scope, outputs=("y",)):
        return Node(i, f"n{i}", "aten.check" if not outputs else "aten.view", ("x",),
                    tuple(f"{o}{i}" for o in outputs), {}, scope)
    a, b = "model.layers.2.self_attn", "model.layers.1.self_attn"
    nodes = [node(0, a), node(1, b, ()), node(2, a, ()), node(3, a), node(4, b, ()), node(5, b)]
    assert [n.scope for n in _placed(nodes)] == [a, a, a, a, b, b]


STACK = """
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Net(torch.nn.Module):  # eight identical blocks
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(8))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x
"""


def test_all_layers_from_the_command_line(tmp_path):
    from tests.cli_runner import run_cli

    path = tmp_path / "net.py"
    path.write_text(STACK)
    args = (f"{path}:Net", "--input-shape", "x=4x16", "--format", "json")
    three, every = run_cli(*args), run_cli(*args, "--all-layers")
    assert three.returncode == every.returncode == 0, (three.stderr, every.stderr)
    a, b = json.loads(three.stdout), json.loads(every.stdout)
    assert a["traced_layers"].startswith("3 of 8 layers traced") and b["traced_layers"] == ""
    # 8 · (16·16 + 16) = 2,176 parameters; 8 · 4·16·16 = 8,192 MACs — either way
    assert a["totals"]["params"] == b["totals"]["params"] == 2_176
    assert a["totals"]["macs"] == b["totals"]["macs"] == 8_192
    assert a["memory"]["peak_bytes"] == b["memory"]["peak_bytes"]


class _Groups(nn.Module):
    """RF-DETR's query groups: a list of eight identical heads that the forward indexes by a
    count of its own, not by iterating the list; cut to three, ``heads[3]`` does not exist."""

    def __init__(self, groups: int = LAYERS):
        super().__init__()
        self.groups = groups
        self.heads = nn.ModuleList(nn.Linear(16, 16) for _ in range(groups))

    def forward(self, x):
        return torch.cat([self.heads[g](x) for g in range(self.groups)], dim=-1)


@pytest.mark.parametrize("train", [False, True])
def test_a_stack_the_model_indexes_by_its_own_count_is_traced_whole(train):
    # 8 heads of 16·16 + 16 = 272 parameters; x (4, 16): each head 4·16·16 = 1,024 MACs
    # forward (the training step adds its weight gradient, 1,024 more: x needs none)
    r = analyze(_Groups(), input_shapes={"x": (4, 16)}, train=train)
    assert r.totals.params == 8 * 272
    assert r.totals.macs == 8 * 1_024 * (2 if train else 1)
    assert r.traced_layers == ""  # (traced whole: no layers repeated in the IR)


class _PerLayerInputs(nn.Module):
    """Gemma 4's per-layer inputs: one projection as wide as every layer's input, viewed by
    the config's layer count; cut to three layers with a config saying three, the view of
    the eight layers' width fails ("shape '[4, 3, 4]' is invalid for input of size 128")."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(num_hidden_layers=LAYERS)
        self.per_layer = nn.Linear(16, LAYERS * 4)
        self.layers = nn.ModuleList(nn.Linear(20, 16) for _ in range(LAYERS))

    def forward(self, x):
        inputs = self.per_layer(x).view(x.shape[0], self.config.num_hidden_layers, 4)
        for i, layer in enumerate(self.layers):
            x = layer(torch.cat([x, inputs[:, i]], dim=-1))
        return x


@pytest.mark.parametrize("train", [False, True])
def test_a_stack_whose_inputs_the_config_counts_is_traced_whole(train):
    # Gemma 4 from its config was refused for a view of its per-layer inputs (tensors made
    # for every layer, viewed by the cut config's count). 16·32 + 32 + 8 · (20·16 + 16) =
    # 3,232 parameters; x (4, 16): 4·16·32 + 8 · 4·20·16 = 12,288 MACs forward (training
    # adds each weight's gradient, 12,288, and each layer's input's, 8 · 4·20·16: every
    # layer reads the projection, which needs one; x needs none)
    r = analyze(_PerLayerInputs(), input_shapes={"x": (4, 16)}, train=train)
    assert r.totals.params == 3_232
    assert r.totals.macs == (12_288 * 2 + 8 * 4 * 20 * 16 if train else 12_288)
    assert r.traced_layers == ""


_RUNS: list[int] = []


class _FailsAfterItsStack(nn.Module):
    """Eight identical layers, then a check of the model's own that fails whatever the
    stack's length (a ValueError): the forward notes each run's layer count in ``_RUNS`` (a
    list the module holds would be a copy in a later trace)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(LAYERS))

    def forward(self, x):
        _RUNS.append(len(self.layers))
        for layer in self.layers:
            x = layer(x)
        raise ValueError("the model's own check")


@pytest.mark.parametrize("train", [False, True])
def test_a_failure_the_cut_stack_does_not_cause_is_the_whole_traces(train):
    # a model's code may count on its whole list in any way (DPT's neck checks that it has a
    # hidden state of each layer it reads: a ValueError): whatever a trace of the cut stack
    # raises, the stack is traced whole, and a failure there is the model's own — one trace
    # more than needed for a model that fails either way
    _RUNS.clear()
    with pytest.raises(GraphcostError, match="the model's own check"):
        analyze(_FailsAfterItsStack(), input_shapes={"x": (4, 16)}, train=train)
    assert _RUNS == [3, LAYERS]  # (the stack cut to three layers, then whole)
