"""Attention traced as the kernel PyTorch dispatches on the target (issue 22).

The dispatcher's rules are checked case by case against what PyTorch's own checks say
(``sdp_utils.cpp``, ``sdp_utils_cpp.cpp``); the memory of each choice against MemTracker on
this CPU (the default kernel, and the math kernel forced with ``sdpa_kernel``); the GPU
kernels' memory by how the activation peak grows with the sequence (linear: no S×S tensor is
kept); their FLOPs against FlopCounterMode's formulas for the fused kernels."""
from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch
from graphcost.analyzer.measure.reference import measure_training
from graphcost.models_zoo.llama import Llama, LlamaConfig
from graphcost.passes.graph.attention_dispatch import (
    AttentionCall,
    AttentionTarget,
    choose,
)
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from graphcost import GraphcostError, analyze
from tests.cli_runner import run_cli
from tests.test_step_as_run import Decoder

H100 = AttentionTarget("cuda", (9, 0), device="h100-sxm")  # PyTorch 2.14's rules
# what the installed torch's rules give an analysis with --device h100-sxm (bf16, no mask)
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
H100_BF16 = "cudnn" if TORCH >= (2, 11) else "flash"
H100_MASKED = "cudnn" if TORCH >= (2, 11) else "efficient"   # (flash takes no mask)
A100 = AttentionTarget("cuda", (8, 0), device="a100-80gb")
BHSD = (2, 32, 1024, 128)  # batch, heads, sequence, head dim
GROUPED = (2, 8, 1024, 128)  # 8 key/value heads under 32 query heads


def call(dtype="bfloat16", q=BHSD, k=BHSD, v=BHSD, **kw) -> AttentionCall:
    return AttentionCall(q, k, v, dtype, **kw)


@pytest.mark.parametrize("target, c, kernel", [
    # bf16 on sm90 from PyTorch 2.11: cuDNN first (check_prefer_cudnn_attention: cuDNN >
    # 9.15, which the 2.11+ wheels bring; measured: an H100 with 2.11+cu130 ran it)
    (H100, call(), "cudnn"),
    # PyTorch 2.10's wheel has cuDNN 9.10: flash first, as on an A100 (sm80) at any release
    (replace(H100, torch=(2, 10)), call(), "flash"),
    (A100, call(), "flash"),
    # fp32: check_dtypes_low_precision refuses cuDNN and flash; efficient runs fp32 from sm50
    (H100, call("float32"), "efficient"),
    # an explicit mask: cuDNN takes it (check_attn_mask_shape); check_for_attn_mask refuses
    # flash, efficient takes a bias
    (H100, call(mask=True), "cudnn"),
    (A100, call(mask=True), "efficient"),
    # T4 is sm75: flash needs sm80 (check_flash_attention_hardware_support); efficient runs
    # fp16 there, but bf16 only from sm80: math
    (AttentionTarget("cuda", (7, 5)), call("float16"), "efficient"),
    (AttentionTarget("cuda", (7, 5)), call("bfloat16"), "math"),
    # head dim 72 in fp16 on sm80: flash takes it (≤ 256); efficient would need a multiple
    # of 8 (minimum_gemm_alignment: 128 bits of fp16) — fp32 needs 4: 72 passes, 70 fails
    (A100, call("float16", q=(1, 8, 64, 72), k=(1, 8, 64, 72), v=(1, 8, 64, 72)), "flash"),
    (H100, call("float32", q=(1, 8, 64, 70), k=(1, 8, 64, 70), v=(1, 8, 64, 70)), "math"),
    # causal with Sq ≠ Sk: check_flash_causal_non_square_seqlens
    (A100, call(q=(1, 8, 1, 128), causal=True), "efficient"),
    # RTX 4090 (sm89), training at head dim 200: the sm86–89 backward limit
    (AttentionTarget("cuda", (8, 9)), call(q=(1, 8, 64, 200), k=(1, 8, 64, 200),
                                           v=(1, 8, 64, 200)), "efficient"),
    # cuDNN's dropout comes in steps of 1/16 (check_cudnn_dropout): 0.1 goes to flash
    (H100, call(dropout=0.1), "flash"),
    # head dim 256: cuDNN > 9.22 (2.14's wheel) on sm90 takes it, forward and backward;
    # 2.11's cuDNN stops at 128
    (H100, call(q=(1, 8, 64, 256), k=(1, 8, 64, 256), v=(1, 8, 64, 256)), "cudnn"),
    (replace(H100, torch=(2, 11)), call(q=(1, 8, 64, 256), k=(1, 8, 64, 256),
                                        v=(1, 8, 64, 256)), "flash"),
    # grouped-query heads (enable_gqa): flash and cuDNN read them; the efficient kernel
    # from 2.14 (PyTorch PR 191085): fp32 with grouped heads is math before it (measured:
    # transformers' Llama with GQA ran math on an H100 with 2.11)
    (A100, call(k=GROUPED, v=GROUPED, gqa=True), "flash"),
    (H100, call(k=GROUPED, v=GROUPED, gqa=True), "cudnn"),
    (H100, call("float32", k=GROUPED, v=GROUPED, gqa=True), "efficient"),
    (replace(H100, torch=(2, 13)), call("float32", k=GROUPED, v=GROUPED, gqa=True), "math"),
    # this CPU: the CPU flash kernel unless there is dropout (check_for_dropout); grouped
    # heads from 2.9 (PyTorch PR 157893; 2.8's kernel returns gradients of the query's heads)
    (AttentionTarget(), call("float32", mask=True), "flash"),
    (AttentionTarget(), call("float32", k=GROUPED, v=GROUPED, gqa=True), "flash"),
    (AttentionTarget(torch=(2, 8)), call("float32", k=GROUPED, v=GROUPED, gqa=True), "math"),
    (AttentionTarget(), call("float32", dropout=0.1), "math"),
])
def test_the_dispatchers_choice(target, c, kernel):
    assert choose(target, c)[0] == kernel


def test_a_forced_kernel_runs_and_says_when_pytorch_would_refuse_it():
    kernel, why = choose(AttentionTarget("cuda", (8, 0), kernel="flash"), call(mask=True))
    assert kernel == "flash" and "refuse" in why and "mask" in why
    assert choose(AttentionTarget("cuda", (9, 0), kernel="math"), call()) == ("math", "")


def _peak(seq: int, **kw) -> tuple[int, int, set[str]]:
    """(graphcost's step peak, MemTracker's, the attention ops) for the 2-block decoder."""
    torch.manual_seed(0)
    model, x = Decoder(), torch.randn(1, seq, 256)
    forced = kw.get("attention") == "math"
    with sdpa_kernel([SDPBackend.MATH]) if forced else contextlib.nullcontext():
        measured, _ = measure_training(model, (x,), "none")
    with torch.device("meta"):  # analyzed on the meta device: nothing allocated
        meta = Decoder()
    r = analyze(meta, (torch.empty(1, seq, 256, device="meta"),), train=True,
                optimizer="none", what_if=False, **kw)
    return r.training.peak_bytes, measured, {n.op for n in r.nodes if "softmax" in n.op
                                             or "attention" in n.op}


@pytest.mark.parametrize("seq", [256, 1024])
def test_a_meta_model_is_traced_with_the_kernel_this_cpu_runs(seq):
    predicted, measured, ops = _peak(seq)
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward.default" in ops
    assert abs(predicted / measured - 1) <= 0.05, (predicted, measured)


@pytest.mark.parametrize("seq", [256, 1024])
def test_the_math_kernel_forced_matches_pytorch_forced_to_it(seq):
    # measured here: 1024 keeps S×S probabilities, 99.9 MB against 44.1 MB with the fused
    # kernel (2048: 325 MB against 83 MB)
    predicted, measured, ops = _peak(seq, attention="math")
    assert ops == {"aten._safe_softmax.default"}  # the math kernel's softmax, kept whole
    assert abs(predicted / measured - 1) <= 0.05, (predicted, measured)


class _MaskedLayers(torch.nn.Module):
    """Four attention layers reading one boolean mask, as transformers hands a sliding-window
    mask to each of Gemma's sliding layers."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(dim, 3 * dim) for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape
        i = torch.arange(s)
        mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < 16)   # a window of 16
        for qkv in self.qkv:
            q, k, v = qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            x = x + torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask).transpose(1, 2).reshape(b, s, d)
        return x


def test_a_boolean_mask_is_converted_by_each_call_and_kept_by_its_backward():
    # SDPA hands the CPU's flash kernel the mask as 0 / -inf in the query's dtype, a copy
    # each call makes, which the kernel's backward keeps: 4 layers hold 4 · 128·128·4 B =
    # 256 KiB where the boolean mask they share is 16 KiB. Measured (2026-12-06, torch
    # 2.13): 2,384,936 B predicted, MemTracker 2,384,936 (before: the boolean mask handed
    # to the kernel, 2,139,176 B, -10.3%; Gemma 4's five sliding layers of six -1.2% at
    # 2 × 64 tokens, now +2,048 B)
    torch.manual_seed(0)
    x = torch.randn(2, 128, 64)
    r = analyze(_MaskedLayers(), (x,), train=True, optimizer="adamw", what_if=False,
                include_inputs=False)
    measured = measure_training(_MaskedLayers(), (x,), "adamw")[0]
    assert abs(r.training.peak_bytes / measured - 1) <= 0.005, (r.training.peak_bytes, measured)


@pytest.mark.parametrize("case", ["mistral-window", "llama-padding"])
def test_transformers_masked_attention_against_memtracker(case):
    # every layer's SDPA call converts the model's one mask (Mistral's sliding window of 32,
    # a padded batch's attention_mask) and keeps its copy. Measured (2026-12-06, torch 2.13,
    # 4 layers, 2 × 128 tokens): Mistral 13,029,348 B against 13,025,252 (+0.03%; -3.87%
    # when the kernel got the shared boolean mask), Llama with a padding mask the same
    # (-3.74% before); Gemma-3, Cohere-2, Qwen2 with windows +0.03% (-2.7%, -3.2%, -1.9%)
    transformers = pytest.importorskip("transformers")
    dims = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=256)
    ids = torch.randint(0, 1024, (2, 128), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids}
    if case == "mistral-window":
        config, cls = transformers.MistralConfig(sliding_window=32, **dims), \
            transformers.MistralForCausalLM
    else:
        config, cls = transformers.LlamaConfig(**dims), transformers.LlamaForCausalLM
        inputs["attention_mask"] = (torch.arange(128) >= torch.tensor([[0], [16]])).long()
    torch.manual_seed(0)
    r = analyze(cls(config), inputs, train=True, optimizer="adamw", include_inputs=False,
                what_if=False)
    measured = measure_training(cls(config), (), "adamw", inputs)[0]
    assert abs(r.training.peak_bytes / measured - 1) <= 0.005, (r.training.peak_bytes, measured)


def test_a_gpu_kernel_gets_its_own_copy_of_the_mask_each_call():
    # on an H100 in bf16 the mask goes to cuDNN (from torch 2.11) or the efficient kernel,
    # each converting it per call (convert_boolean_attn_mask_cudnn, convert_boolean_attn_mask):
    # four 0/-inf copies of the 128×128 mask in bf16, one a layer, for four layers
    r = analyze(_MaskedLayers(), input_shapes={"x": (2, 128, 64)}, train=True,
                optimizer="adamw", precision="bf16-mixed", device="h100-sxm", what_if=False)
    assert r.attention and r.attention[0].kernel == H100_MASKED
    copies = [n for n in r.nodes if n.op == "aten.where.self" and n.output_shapes == ("128×128",)]
    assert len(copies) == 4 and all(n.output_bytes == 128 * 128 * 2 for n in copies)


SEVEN_B = LlamaConfig(n_layer=1)  # Llama-2-7B's dims (d 4096, 32 heads of 128), one block


def _gpu_step(seq: int, attention: str = "auto"):
    with torch.device("meta"):
        model = Llama(SEVEN_B)
    return analyze(model, input_shapes={"input_ids": (1, seq)},
                   input_dtypes={"input_ids": torch.int64}, train=True, optimizer="adamw",
                   precision="bf16-mixed", device="h100-sxm", what_if=False,
                   attention=attention)


SEQS = (4096, 8192, 16384)


@pytest.fixture(scope="module")
def h100_steps():
    return {**{(seq, a): _gpu_step(seq, a) for seq in SEQS for a in ("auto", "math")},
            (16384, "flash"): _gpu_step(16384, "flash")}


def _growth(steps, attention: str) -> float:
    """How much more the activation peak grows from 8192 to 16384 than from 4096 to 8192:
    2 when it grows linearly, 4 for an S×S term (a little above 2 here: the peak moves
    between places whose growth differs, the embedding's dense gradient staying put)."""
    act = [steps[s, attention].memory.peak_bytes for s in SEQS]
    return (act[2] - act[1]) / (act[1] - act[0])


def _square(r, seq: int) -> list[str]:
    """The values with a seq × seq pair in their shape (the math kernel's scores)."""
    return [row.name for row in r.nodes
            if any(shape.count(str(seq)) >= 2 for shape in
                   (s.split("×") for s in row.output_shapes))]


def test_h100_bf16_runs_a_fused_kernel_and_keeps_no_scores(h100_steps):
    r = h100_steps[16384, "auto"]
    assert [(u.kernel, u.calls, u.reason) for u in r.attention] == [(H100_BF16, 1, "")]
    assert f"aten._scaled_dot_product_{H100_BF16}_attention_backward.default" in \
        {n.op for n in r.nodes}
    assert _square(r, 16384) == []
    flash = h100_steps[16384, "flash"]  # asked for: the same O(S) memory, no scores
    assert _square(flash, 16384) == []
    assert abs(flash.memory.peak_bytes / r.memory.peak_bytes - 1) < 0.05
    assert _growth(h100_steps, "auto") < 2.5
    # the math kernel, asked for, keeps the scores: they show, and the peak grows as S²
    assert _square(h100_steps[16384, "math"], 16384)
    assert _growth(h100_steps, "math") > 3.5


def test_fused_kernel_flops_follow_flop_counter_mode(h100_steps):
    # FlopCounterMode's formulas for the fused kernels: forward 4·b·h·Sq·Sk·d, backward
    # 10·b·h·Sq·Sk·d FLOPs, counted here on the kernel itself (meta tensors, bf16)
    b, h, s, d = 1, 32, 16384, 128
    q = torch.empty(b, h, s, d, device="meta", dtype=torch.bfloat16, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True)[0]
        out.sum().backward()
    by_op = counter.get_flop_counts()["Global"]
    fwd = by_op[torch.ops.aten._scaled_dot_product_flash_attention]
    bwd = by_op[torch.ops.aten._scaled_dot_product_flash_attention_backward]
    assert (fwd, bwd) == (4 * b * h * s * s * d, 10 * b * h * s * s * d)
    nodes = h100_steps[16384, "flash"].nodes
    got = {n.op: 2 * n.macs for n in nodes if "flash" in n.op}
    assert got == {"aten._scaled_dot_product_flash_attention.default": fwd,
                   "aten._scaled_dot_product_flash_attention_backward.default": bwd}


def test_the_cli_names_the_kernel_of_the_7b_step():
    done = run_cli("zoo:llama7b", "--train", "--dim", "seq=4096", "--precision", "bf16-mixed",
                   "--device", "h100-sxm", "--optimizer", "adamw", env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert f"{H100_BF16} kernel ×32 (dispatched on h100-sxm (sm90), bfloat16)" \
        in done.stdout


def test_an_unknown_kernel_is_refused():
    with pytest.raises(GraphcostError, match="attention"):
        analyze(Decoder(), (torch.randn(1, 8, 256),), train=True, attention="fast")


def test_an_inference_graph_names_the_kernel_of_each_call():
    # llama_tiny: 2 blocks, 4 query heads over 2 key/value heads (transformers-style repeat
    # in the model, so the call itself is 4-D with equal heads), head dim 32, causal, no mask
    cpu = analyze("zoo:llama_tiny", zoo_exporter="fx")
    assert [(u.kernel, u.calls, u.target) for u in cpu.attention] == [("flash", 2, "this CPU")]
    # fp32 on a V100 (sm70): no flash before sm80; efficient's fp32 alignment there is 1
    v100 = analyze("zoo:llama_tiny", zoo_exporter="fx", device="v100")
    assert [(u.kernel, u.reason) for u in v100.attention] == [
        ("efficient", "not flash: float32 (flash runs fp16/bf16)")]


def test_forcing_a_kernel_is_for_a_training_step():
    with pytest.raises(GraphcostError, match="attention.*train"):
        analyze("zoo:llama_tiny", zoo_exporter="fx", attention="math")


def _hf_llama():
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=256, intermediate_size=688, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, use_cache=False,
            attn_implementation="sdpa"))


def test_transformers_attention_is_traced_as_eager_code_calls_it():
    # Eager, with no padding mask and unpacked rows, transformers calls SDPA with
    # is_causal=True, no mask and the 2 key/value heads as they are (enable_gqa); under
    # torch.export it would build the mask. Measured on an H100 with PyTorch 2.11
    # (benchmarks/results/cuda_h100_sxm.json): bf16 autocast ran cuDNN's kernel, fp32 the
    # math kernel (the efficient one takes grouped heads from 2.14 only).
    ids = (torch.empty(2, 256, dtype=torch.long, device="meta"),)
    def kernels(**kw):
        r = analyze(_hf_llama(), ids, train=True, optimizer="none", what_if=False, **kw)
        return [(u.kernel, u.calls) for u in r.attention]
    assert kernels(precision="bf16-mixed", device="a100-80gb") == [("flash", 1)]
    assert kernels(precision="bf16-mixed", device="h100-sxm") == [(H100_BF16, 1)]
    assert kernels(device="h100-sxm") == [("efficient" if TORCH >= (2, 14) else "math", 1)]
