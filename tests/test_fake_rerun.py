"""One trace for every batch (--max-batch): a model traced at a marker batch and re-run on fake
tensors at another batch (analyzer/frontends/torch/fake_rerun.py) must be, node for node, the graph
torch.export traces at that batch itself — the same ops on the same values with the same
shapes and dtypes. A forward whose Python depends on the batch is never re-run: it is traced
at each batch instead."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from graphcost.analyzer.app.by_batch import analyze_by_batch, traced_once
from graphcost.analyzer.app.request import LoadOptions, build_request
from graphcost.analyzer.cli.main import main
from graphcost.analyzer.frontends.torch.fake_rerun import marker_batch
from graphcost.analyzer.load.loading import load_graph
from graphcost.models_zoo import hf
from graphcost.models_zoo.bert import Bert, BertConfig
from graphcost.models_zoo.gpt2 import GPT2, GPT2Config
from graphcost.models_zoo.llama import TINY, Llama, LlamaConfig
from graphcost.models_zoo.mobilenet import MobileNetV2
from graphcost.models_zoo.resnet import BasicBlock, ResNet

from graphcost import analyze


def _same_graph(got, real):
    assert [(n.op, n.inputs, n.outputs, n.scope, n.repeat) for n in got.nodes] == \
        [(n.op, n.inputs, n.outputs, n.scope, n.repeat) for n in real.nodes]
    assert {k: v.spec for k, v in got.values.items()} == \
        {k: v.spec for k, v in real.values.items()}
    assert got.batch == real.batch


def _zoo(name):
    return f"zoo:{name}", {"exporter": "fx"}


def _on_meta(build, **shapes):
    """A model built on the meta device, as the zoo builds its own, with its token inputs'
    shapes (an image model's ``x`` given as is)."""
    with torch.device("meta"):
        model = build().eval()
    load = {"input_shapes": shapes}
    if "x" not in shapes:
        load["input_dtypes"] = {k: "int64" for k in shapes}
    return model, load


class _MobileNetV2(MobileNetV2):
    """The zoo's MobileNetV2 with its first two stages of inverted residual blocks, then its
    1,280-channel conv and classifier."""
    SETTINGS = [[1, 16, 1, 1], [6, 24, 2, 2]]


# The zoo's small models by name; the rest built smaller in their own classes (one layer, one
# block a stage): the re-run follows each kind of model's ops, whatever its depth. Attention
# with b·s views (gpt2, bert: its mask and pooler too), BatchNorm, a classifier head and
# residual blocks with and without a downsampling shortcut (resnet10), skips and upsampling
# (unet), depthwise convs whose marker is above 1,280 channels (mobilenet_v2), transformers'
# encoder-decoder and mixture of experts (hf_t5, hf_mixtral); transformers checks its inputs'
# data in eager (GPT-2's padding warning, Mixtral's packed-sequence mask) and skips that under
# export, as it must under the path check too
BUILD = {
    "gpt2": lambda: _zoo("gpt2"),
    "bert": lambda: _on_meta(lambda: Bert(BertConfig(n_layer=1)), input_ids=(2, 64),
                             attention_mask=(2, 64)),
    "unet": lambda: _zoo("unet"),
    "mobilenet_v2": lambda: _on_meta(_MobileNetV2, x=(2, 3, 64, 64)),
    "hf_t5": lambda: _on_meta(lambda: hf.t5(num_layers=1, num_decoder_layers=1),
                              input_ids=(2, 32), decoder_input_ids=(2, 32)),
    "hf_mixtral": lambda: _on_meta(lambda: hf.mixtral(num_hidden_layers=1), input_ids=(2, 32)),
    "gpt2_1layer": lambda: _on_meta(lambda: GPT2(GPT2Config(n_layer=1)), input_ids=(2, 64)),
    "resnet10": lambda: _on_meta(lambda: ResNet(BasicBlock, [1, 1, 1, 1]), x=(2, 3, 64, 64)),
    "llama_1layer": lambda: _on_meta(lambda: Llama(replace(TINY, n_layer=1)), input_ids=(2, 64)),
    "hf_llama": lambda: _on_meta(lambda: hf.llama(num_hidden_layers=1), input_ids=(2, 32)),
    "hf_gpt2": lambda: _on_meta(lambda: hf.gpt2(n_layer=1), input_ids=(2, 32)),
}
INFERENCE = ["gpt2", "bert", "resnet10", "unet", "mobilenet_v2", "hf_t5", "hf_mixtral"]
TRAINING = ["gpt2_1layer", "resnet10", "llama_1layer", "hf_llama", "hf_gpt2"]


@pytest.mark.parametrize("name,train", [(n, False) for n in INFERENCE]
                         + [(n, True) for n in TRAINING])
def test_rerun_equals_a_trace_at_that_batch(name, train):
    model, load = BUILD[name]()
    once = traced_once(model, LoadOptions(train=train, **load))
    assert once is not None
    graph, rerun = once
    assert graph.batch >= 1009 and graph.batch == marker_batch([graph.batch - 1])  # a prime
    assert graph.batch > 1_280 or name != "mobilenet_v2"
    _same_graph(rerun(3), load_graph(model, LoadOptions(batch=3, train=train, **load)))


def test_rerun_of_a_stack_traced_as_three_layers():
    # eight identical blocks: traced as three at the marker, the middle one repeated; the
    # re-run at batch 3 grows the same way and equals a trace at 3
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=200, d_model=32, n_layer=8, n_head=4, n_kv_head=2,
                              ffn=64, max_seq=64)).eval()
    load = {"input_shapes": {"input_ids": (2, 12)}, "input_dtypes": {"input_ids": "int64"}}
    graph, rerun = traced_once(model, LoadOptions(**load))
    assert graph.traced_layers.startswith("3 of 8 layers traced")
    _same_graph(rerun(3), load_graph(model, LoadOptions(batch=3, **load)))


class _PerSample(torch.nn.Module):
    """A forward that loops over its batch: one Linear(16, 16) call per sample."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.stack([self.fc(row) for row in x])


class _Branches(torch.nn.Module):
    """A forward that takes another path on a large batch."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.fc(x) if x.shape[0] < 1000 else self.fc(x).relu()


@pytest.mark.parametrize("cls", [_PerSample, _Branches])
def test_a_forward_that_depends_on_the_batch_is_traced_at_each(cls):
    load = {"input_shapes": {"x": (2, 16)}}
    assert traced_once(cls(), LoadOptions(**load)) is None
    at = analyze_by_batch(cls(), build_request(**load))
    assert at.traced_at is None if at.rebound else True
    # batch 5 as traced at 5: Linear(16,16) per sample = 16·16 MACs, 5 samples -> 1,280
    assert at(5).totals.macs == 5 * 16 * 16 == 1_280


def test_max_batch_traces_once_and_its_answer_holds():
    # zoo:mlp's training step on a 64 MB device: the answer from one trace, re-bound, must
    # be what a fresh trace at the answer and one above says (fits, does not fit). Its peak
    # is in the optimizer step at small batches, where the batch does not reach (1,054,218
    # params = 4,216,872 B; weights, grads and Adam's two states 4 · that = 16,867,488 B, plus
    # the for-loop step's temporaries), so the same bytes at b = 1 and 2: the fit looks
    # further out for memory that grows
    spec = "flops=1T,bandwidth=1G,memory=64MB"
    args = ["zoo:mlp", "--max-batch", "--train", "--device-spec", spec, "--overhead", "none",
            "--format", "json"]
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(args) == 0
    doc = json.loads(out.getvalue())
    assert doc["traces"] == 1 and doc["traced_at"] >= 1009
    assert doc["fit"]["fit_batches"][1] > 2 and doc["fit"]["memory_per_sample_bytes"] > 0
    b = doc["max_batch"]
    from graphcost.analyzer.app.devices import parse_device_spec, parse_overhead
    kw = dict(train=True, device=parse_device_spec(spec), overhead=parse_overhead("none"),
              what_if=False)
    fits = analyze("zoo:mlp", batch=b, **kw).roofline
    over = analyze("zoo:mlp", batch=b + 1, **kw).roofline
    assert fits.fit.needs == doc["required_bytes"] <= 64_000_000 < over.fit.needs
    assert over.fit.needs == doc["next_required_bytes"]


def test_a_rerun_leaves_transformers_models_traceable(tmp_path):
    # transformers registers its output classes with torch's pytree when modeling_outputs is
    # first imported, and skips it while torch says it is compiling: a plain model's re-run
    # (inside torch.export's compiling context) that first imports it used to break every
    # later export of a transformers model in the process. A fresh process, as a user's.
    import subprocess
    import sys
    code = ("import transformers\n"
            "from graphcost.analyzer.app.by_batch import analyze_by_batch\n"
            "from graphcost.analyzer.app.request import build_request\n"
            "assert 'transformers.modeling_outputs' not in __import__('sys').modules\n"
            "assert analyze_by_batch('zoo:mlp', build_request(train=True)).rebound\n"
            "from graphcost import analyze\n"
            "print(analyze('zoo:hf_gpt2').totals.params)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip()) > 0
