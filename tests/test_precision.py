"""The half-precision recipes against the same recipe run for real under MemTracker: the
master-weights recipe (half weights, activations and gradients; fp32 master weights and
optimizer state), pure bf16, and autocast (tests/test_autocast.py)."""
from __future__ import annotations

import warnings

import pytest
import torch
from graphcost.analyzer.measure.reference import training_loss_of

from graphcost import GraphcostError, analyze, models_zoo
from tests.shared import inputs, train_report

warnings.filterwarnings("ignore", category=FutureWarning)


def measured_mixed_step_peak(name: str, optimizer: str, dtype=torch.bfloat16) -> int:
    """Second step of the recipe: the model in ``dtype``; fp32 master copies (held by a module
    so MemTracker counts them) stepped by the optimizer on fp32 copies of the gradients."""
    from torch.distributed._tools.mem_tracker import MemTracker
    model = models_zoo.build_model(name, eval=False).to(dtype)
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in inputs(name))
    params = list(model.parameters())
    holder = torch.nn.Module()
    holder.master = torch.nn.ParameterList(
        torch.nn.Parameter(p.detach().float().clone()) for p in params)
    master = list(holder.master)
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.01),
            "adam": lambda p: torch.optim.Adam(p)}[optimizer]
    opt = make(master)

    def step():
        model.zero_grad(set_to_none=True)
        for m in master:
            m.grad = None
        training_loss_of(model, args).backward()
        for p, m in zip(params, master):
            m.grad = p.grad.float()
        for p in params:
            p.grad = None
        opt.step()
        with torch.no_grad():
            for p, m in zip(params, master):
                p.copy_(m)

    step()
    tracker = MemTracker()
    tracker.track_external(model, holder, opt)
    with tracker:
        step()
    return next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]


# hf_mixtral (Adam alone): transformers' experts check the grouped matmul's alignment by data
# pointer on torch <= 2.10, which a traced bf16 weight does not have (transformers_tracing.py
# _eager_grouped_mm); on every torch of the range
@pytest.mark.parametrize("name, optimizer", [
    *((n, o) for n in ("small_cnn", "mnist_net", "resnet18", "gpt2") for o in ("sgd", "adam")),
    pytest.param("hf_mixtral", "adam", marks=pytest.mark.every_torch)])
def test_bf16_master_vs_memtracker(name, optimizer):
    r = train_report(name, optimizer, precision="bf16-master", what_if=False)  # shared trace
    t = r.training
    n = sum(p.numel() for p in models_zoo.build_model(name).parameters())
    assert t.param_bytes == 2 * n and t.breakdown_at_peak["master_weights"] == 4 * n
    measured = measured_mixed_step_peak(name, optimizer)
    assert abs(t.peak_bytes / measured - 1) <= 0.10, (t.peak_bytes, measured)


def test_precision_needs_train():
    with pytest.raises(GraphcostError, match=r"add train=True"):
        analyze("zoo:small_cnn", precision="bf16-mixed")


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("name", ["mlp", "small_cnn", "gpt2"])
def test_bf16_true_vs_memtracker(name, optimizer):
    # pure bf16 (Lightning's bf16-true): the module cast to bf16, so weights, gradients and
    # AdamW's state are bf16 and there is no master copy; measured on the cast module's second
    # step, graphcost tracing the module cast as the recipe runs it
    from graphcost.analyzer.measure.reference import measure_training
    r = train_report(name, optimizer, precision="bf16-true", what_if=False)
    n = sum(p.numel() for p in models_zoo.build_model(name).parameters())
    t = r.training
    assert t.param_bytes == 2 * n and t.breakdown_at_peak["master_weights"] == 0
    model = models_zoo.build_model(name, eval=False).to(torch.bfloat16)
    args = tuple(a.to(torch.bfloat16) if a.is_floating_point() else a for a in inputs(name))
    measured, _ = measure_training(model, args, optimizer)
    # zoo gpt2 measured 19% above the prediction while the fp32 trace was re-typed (its CPU
    # attention, the math kernel under dropout, upcasts q, k, v to float32: 458,752 B) and
    # dropout kept a byte mask (this CPU keeps a noise tensor in the input's dtype: 262,144 B
    # in bf16): now 3,832,066 B against 3,832,068 with SGD (the 2 B: the loss's gradient seed)
    assert abs(t.peak_bytes / measured - 1) <= 0.001, (t.peak_bytes, measured)


def test_bf16_true_keeps_the_models_own_float32_upcasts():
    # transformers' Llama casts the hidden state to float32 in each RMSNorm (and saves it for
    # the backward): under bf16-true the module runs in bf16 but those copies stay float32.
    # graphcost traces the cast module, as the recipe runs it: MemTracker's second step of the
    # cast model on this CPU 10,176,664 B, graphcost within 3% (re-typing an fp32 trace, as
    # before, made the upcasts bf16: 9,233,302 B, -9.3%)
    from graphcost.analyzer.measure.reference import measure_training
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                      max_position_embeddings=512, use_cache=False)
    ids = torch.randint(0, 1000, (2, 256))
    model = LlamaForCausalLM(cfg)
    r = analyze(model, (ids,), train=True, optimizer="adamw", precision="bf16-true",
                what_if=False)
    assert next(model.parameters()).dtype == torch.float32   # the caller's module untouched
    measured, _ = measure_training(LlamaForCausalLM(cfg).to(torch.bfloat16), (ids,), "adamw")
    assert abs(r.training.peak_bytes / measured - 1) <= 0.03, (r.training.peak_bytes, measured)
    assert r.training.param_bytes == 2 * sum(p.numel() for p in model.parameters())


def test_other_names_are_the_same_recipes():
    # Lightning's 32-true is fp32; torch.amp's fp16-mixed is 16-mixed (autocast)
    for alias, name in (("32-true", "fp32"), ("fp16-mixed", "16-mixed")):
        a = analyze("zoo:mlp", train=True, precision=alias, what_if=False).training
        b = analyze("zoo:mlp", train=True, precision=name, what_if=False).training
        assert (a.peak_bytes, a.breakdown_at_peak) == (b.peak_bytes, b.breakdown_at_peak)
