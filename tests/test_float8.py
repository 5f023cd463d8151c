"""Float8 training (``--float8``; analyzer/frontends/torch/float8_linears.py): torchao's
Float8Linear traced as torchao runs it, against PyTorch's MemTracker on real CPU steps of
torchao's own Float8Linear (torch._scaled_mm runs on this CPU: slowly, so the model is small).

The measured model is converted here, by torchao's ``convert_to_float8_training`` with
torchtitan's rule written out (``_torchtitan_filter``), not by graphcost's converter."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.measure.reference import measure_training

from graphcost import GraphcostError, analyze
from tests.cli_runner import run_cli

transformers = pytest.importorskip("transformers")
float8 = pytest.importorskip("torchao.float8")

HIDDEN, FFN, VOCAB, BATCH, SEQ = 64, 192, 128, 1, 32


def _llama(layers: int):
    # 8 layers: the stack is traced as three and grown (repeat_joint.py), as a real model's
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, use_cache=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _tokens():
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ),
                                       generator=torch.Generator().manual_seed(1))}


def _torchtitan_filter(module: torch.nn.Module, fqn: str) -> bool:
    # torchtitan's Float8LinearConverter (components/quantization/utils.py module_filter_fn,
    # filter_fqns=["lm_head"]): both dimensions divisible by 16, the output projection kept
    if not isinstance(module, torch.nn.Linear):
        return True
    return "lm_head" not in fqn and module.in_features % 16 == 0 and \
        module.out_features % 16 == 0


def _step(recipe: str, layers: int):
    return analyze(_llama(layers), _tokens(), train=True, optimizer="adamw", precision="bf16-true",
                   float8=recipe, include_inputs=False, what_if=False)


# MACs over 32 tokens a layer: q and o 32·64·64 = 131,072 each, k and v (2 of 4 heads)
# 65,536 each, gate, up and down 32·64·192 = 393,216 each: 1,572,864 a layer
LAYER_MACS = 1_572_864


@pytest.mark.parametrize("recipe, layers", [("tensorwise", 2), ("rowwise", 8)])
def test_a_float8_step_against_memtracker(recipe, layers):
    r = _step(recipe, layers)
    model = _llama(layers).to(torch.bfloat16)
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    float8.convert_to_float8_training(model, config=config, module_filter_fn=_torchtitan_filter)
    measured, _ = measure_training(model, (), "adamw", _tokens())
    assert abs(r.training.peak_bytes / measured - 1) <= 0.05, (r.training.peak_bytes, measured)
    # the seven linears of each layer swapped, the head kept
    assert f"torchao float8 {recipe}: {7 * layers} of {7 * layers + 1} linears" in r.model
    assert r.coverage.unsupported == {}
    # each float8 linear's three products (forward, input gradient, weight gradient) one
    # _scaled_mm each
    products = r.by_op_type["aten._scaled_mm.default"]
    assert (products.count, products.macs) == (21 * layers, 3 * layers * LAYER_MACS)
    if layers == 8:
        # the stack grown from three traced layers: torchao's backward returns the weight's
        # gradient transposed, a view AOTAutograd writes at the graph's end, outside its
        # layer, moved into it to grow the stack (repeat_joint.py; when this landed the grown
        # rowwise step equalled an all-layers trace of it in peak, reserved peak, FLOPs and
        # node count)
        assert r.traced_layers.startswith("3 of 8 layers traced")


def test_a_model_converted_already_is_traced_as_it_is():
    model = _llama(2)
    float8.convert_to_float8_training(model, module_filter_fn=_torchtitan_filter)
    r = analyze(model, _tokens(), train=True, what_if=False)
    assert r.by_op_type["aten._scaled_mm.default"].count == 42 and "torchao" not in r.model
    with pytest.raises(GraphcostError, match="torchao's float8 ones already"):
        analyze(model, _tokens(), train=True, float8="rowwise")


def test_float8_products_run_at_the_parts_fp8_rate():
    # the roofline prices a _scaled_mm at the part's fp8 rate (DeviceRates.narrow_flops); a
    # part without one (A100) falls back to fp32's and says so
    written = {}
    for device, precision, fp8 in (("h100-sxm", "fp32", True), ("a100-80gb", "fp32", False),
                                   ("h100-sxm", "bf16-mixed", True)):
        r = analyze("zoo:mlp", batch=16, train=True, float8="tensorwise", device=device,
                    what_if=False, precision=precision)
        assert r.roofline is not None
        rates = {t.dtype for t, n in zip(r.roofline.nodes, r.nodes)
                 if n.op == "aten._scaled_mm.default"}
        assert rates == {"fp8"}
        assert ("fp8" in r.roofline.fallbacks) is not fp8
        written[device, precision] = r.by_op_type["aten._scaled_mm.default"].bytes_written
    # under CUDA autocast torchao casts a float8 linear's input to bf16, so every product
    # (forward and both gradients) is written in bf16: half the fp32 step's bytes
    assert written["h100-sxm", "bf16-mixed"] * 2 == written["h100-sxm", "fp32"]


@pytest.mark.parametrize("argv, words", [
    (["zoo:mlp", "--float8", "rowwise"], "--float8 is a training recipe"),
    (["zoo:mlp", "--train", "--float8", "rowwise", "--batch", "4"],
     "multiplies 4 rows (the batch's tokens or samples); its weight-gradient product needs a "
     "multiple of 16"),
    (["zoo:mlp", "--train", "--float8", "rowwise", "--parallel", "tp=2"],
     "--float8 beside tensor parallelism: not modelled")])
def test_float8_refusals_are_one_line(argv, words):
    r = run_cli(*argv)
    assert r.returncode == 2 and not r.stdout and words in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
