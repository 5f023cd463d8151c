"""A stack of eight or more identical blocks is traced as three and the middle block repeated
in the IR (analyzer/frontends/torch/repeat_layers.py) for an inference analysis. The reference is a
trace of every block of the same model: the report must be the same but for node names —
the same ops in the same modules with the same shapes, the same totals, the same memory
timeline (eager references held across blocks included) — and 2·MACs must equal PyTorch's
FlopCounterMode on a real forward."""
from __future__ import annotations

import json

import pytest
import torch
from graphcost.models_zoo.llama import Llama, LlamaConfig
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from graphcost import analyze

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


def _hf_gemma2():
    """Gemma-2's sliding and full attention layers alternate: grown two layers at a time."""
    t = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = t.Gemma2Config(vocab_size=200, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, sliding_window=4, max_position_embeddings=64)
    assert cfg.layer_types[:2] == ["sliding_attention", "full_attention"]
    return t.Gemma2ForCausalLM(cfg).eval()


# Gemma-2 on every torch of the range (conftest.py): on 2.8 its checks came with no module
@pytest.mark.parametrize("build", [_zoo_llama, _hf_gpt2,
                                   pytest.param(_hf_gemma2, marks=pytest.mark.every_torch)],
                         ids=["zoo_llama", "hf_gpt2", "hf_gemma2"])
def test_repeated_stack_equals_a_full_trace(build):
    model = build()
    ids = torch.randint(3, 200, (2, 12))
    repeated = analyze(model, (ids,))
    full = analyze(model, (ids,), all_layers=True)  # every block traced
    period = 2 if build is _hf_gemma2 else 1
    assert repeated.traced_layers.startswith(f"{3 * period} of {LAYERS} layers traced")
    assert full.traced_layers == ""
    assert [(n.op, n.scope, n.output_shapes) for n in repeated.nodes] == \
        [(n.op, n.scope, n.output_shapes) for n in full.nodes]
    assert repeated.totals == full.totals
    assert repeated.memory.timeline == full.memory.timeline
    assert repeated.memory.peak_bytes == full.memory.peak_bytes
    assert repeated.modules == full.modules
    # every block's own weights: eight blocks' parameters, not three (a tied head once)
    assert repeated.totals.params == sum(p.numel() for p in model.parameters())
    counter = FlopCounterMode(display=False)
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
