"""Per-rank memory of data-parallel training (passes/parallel/step.py): hand-checked invariants,
communication volume, offload, the smallest world size that fits, frozen weights and LoRA
against MemTracker, and the options' bad input. The multi-process checks against PyTorch's
trackers are in tests/test_parallel_reality.py."""
from __future__ import annotations

import json

import pytest
import torch
from graphcost.analyzer.app.pipeline import run_passes
from graphcost.analyzer.app.request import PassOptions
from graphcost.analyzer.cli.main import main
from graphcost.passes.device.fits import Overhead
from graphcost.passes.device_rates import DeviceRates
from graphcost.passes.parallel.comm import InterconnectRates
from graphcost.passes.parallel.spec import ParallelSpec
from torch import nn

from graphcost import GraphcostError, analyze
from tests.shared import joint_graph, measured_step, train_report

# zoo mlp: 4 blocks of Linear(256→512), Linear(512→256), head Linear(256→10)
#   4·(256·512 + 512 + 512·256 + 256) + 256·10 + 10 = 4·262,912 + 2,570 = 1,054,218
P_MLP = 1_054_218
T_MLP = 18          # parameter tensors: 4 blocks × 2 Linear × (weight, bias) + head's 2
BLOCK_BYTES = 262_912 * 4


def per_rank(name: str, strategy: str, world: int, **kw):
    return run_passes(joint_graph(name), PassOptions(optimizer="adam", include_inputs=False, what_if=False, parallel=ParallelSpec(strategy, world, **kw))).parallel


@pytest.mark.parametrize("strategy", ["zero3", "fsdp"])
@pytest.mark.parametrize("world, padded", [
    (2, P_MLP),                   # every dim 0 divides by 2
    # head weight 10 rows -> 12 (+2·256), bias 10 -> 12 (+2): P + 514
    (4, P_MLP + 514),
    # head weight 10 rows -> 16 (+6·256), bias 10 -> 16 (+6): P + 1,542
    (8, P_MLP + 1_542),
])
def test_sharded_params_grads_adam_are_16P_over_N(strategy, world, padded):
    # at the optimizer step a rank holds its shards of the parameters (4 B each), their
    # gradients (4 B) and Adam's exp_avg + exp_avg_sq (8 B): 16·P/N, padded, plus Adam's
    # 4-byte step counter per tensor
    d = per_rank("mlp", strategy, world).detail_at_step
    assert d["sharded_params"] + d["sharded_grads"] + d["optimizer_state"] == \
        16 * padded // world + 4 * T_MLP


def test_zero1_optimizer_state_is_8P_over_N():
    # four equal tensors of 64·64: ZeroRedundancyOptimizer gives each rank the same number,
    # so Adam's state per rank is 8·P/N (+ 4 B per owned tensor)
    model = nn.Sequential(*[nn.Linear(64, 64, bias=False) for _ in range(4)])
    x = torch.randn(2, 64)
    p = 4 * 64 * 64
    for world in (1, 2, 4):
        r = analyze(model, (x,), train=True, parallel={"strategy": "zero1", "world_size": world})
        assert r.parallel.detail_at_step["optimizer_state"] == 8 * p // world + 4 * (4 // world)


def test_zero1_reports_the_rank_that_owns_the_largest_tensor():
    # weights of 1,024, 4,096, 256 and 64 elements on 2 ranks, largest first to the emptiest
    # rank: rank 0 gets the 4,096, rank 1 the other three (1,344 elements)
    model = nn.Sequential(nn.Linear(4, 256, bias=False), nn.Linear(256, 16, bias=False),
                          nn.Linear(16, 16, bias=False), nn.Linear(16, 4, bias=False))
    r = analyze(model, (torch.randn(2, 4),), train=True,
                parallel={"strategy": "zero1", "world_size": 2})
    # the worst rank's Adam state: 8·4,096 + 4 (one tensor) = 32,772 B, 1.5× the even share
    # 8·P/2 = 8·5,440/2 = 21,760 B
    assert r.parallel.worst_rank == 0
    assert r.parallel.detail_at_step["optimizer_state"] == 8 * 4_096 + 4


def test_ddp_is_the_single_device_step_plus_buckets():
    p = per_rank("mlp", "ddp", 2)
    single = train_report("mlp", "adam", what_if=False).training
    assert p.detail_at_peak["ddp_buckets"] == 4 * P_MLP      # as large as the gradients
    assert p.per_rank_peak_bytes == single.peak_bytes + 4 * P_MLP
    # cap 25 MiB: the first bucket is capped at 1 MiB (the head and blocks.3 come first in
    # reverse order, 1,061,928 B > 1 MiB), then one bucket holds the rest (3,154,944 B)
    assert p.ddp_buckets == 2
    assert per_rank("mlp", "ddp", 2, bucket_cap_mb=1).ddp_buckets == 4


def test_comm_volume_and_bound():
    link = InterconnectRates("test", "test link", 100e9)
    ddp = per_rank("mlp", "ddp", 4, interconnect=link).comm
    # all-reduce of the gradients: ring wire bytes 2·(N−1)/N · 4P
    assert ddp.all_reduce_bytes == 4 * P_MLP
    assert ddp.wire_bytes == round(2 * 3 / 4 * 4 * P_MLP)
    assert ddp.seconds == pytest.approx(ddp.wire_bytes / 100e9)
    fsdp = per_rank("mlp", "fsdp", 2).comm
    # forward gathers every unit (4P at N=2, nothing padded), backward the 4 blocks again;
    # the gradients are reduce-scattered once; wire: (N−1)/N of both
    assert fsdp.all_gather_bytes == 4 * P_MLP + 4 * BLOCK_BYTES
    assert fsdp.reduce_scatter_bytes == 4 * P_MLP
    assert fsdp.wire_bytes == (fsdp.all_gather_bytes + fsdp.reduce_scatter_bytes) // 2
    assert fsdp.seconds is None                       # no interconnect named
    assert per_rank("mlp", "fsdp", 1).comm.wire_bytes == 0


def test_units_and_padding():
    units = per_rank("mlp", "fsdp", 4).units
    assert [u.name for u in units] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3", "(root)"]
    assert all(u.padded_bytes == BLOCK_BYTES for u in units[:4])   # 512 and 256 rows: /4
    assert units[-1].padded_bytes == (12 * 256 + 12) * 4            # head padded to 12 rows
    assert units[0].post_backward_deferred                          # its input is the data
    assert not units[1].post_backward_deferred
    assert [u.name for u in per_rank("gpt2_lora", "fsdp", 2).units] == ["h.0", "h.1", "(root)"]


def test_offload_params_moves_shards_state_and_step_to_the_host():
    p = per_rank("mlp", "fsdp", 2, offload="params")
    # host: parameter shards 4P/2 + gradient shards 4P/2 + Adam 8P/2 + 4·18, and the
    # for-loop step's temporaries on shards: previous + 2 × current, largest where a block's
    # first bias shard (512/2·4 = 1,024 B) precedes its second weight's (256·512/2·4)
    temps = 1_024 + 2 * 256 * 512 // 2 * 4
    assert p.host_bytes == 16 * P_MLP // 2 + 4 * T_MLP + temps
    assert p.breakdown_at_peak["params"] == p.breakdown_at_peak["optimizer_state"] == 0
    opt = per_rank("mlp", "zero1", 2, offload="optimizer")
    assert opt.breakdown_at_peak["optimizer_state"] == 0 and opt.host_bytes > 0


def test_world_size_auto_is_the_smallest_that_fits():
    def peak(n):
        return per_rank("mlp", "fsdp", n).per_rank_peak_bytes
    budget = peak(3)
    assert peak(2) > budget
    device = DeviceRates("test", "test", {"fp32": 1e12}, 1e12, budget)
    r = run_passes(joint_graph("mlp"), PassOptions(optimizer="adam", include_inputs=False, what_if=False, parallel=ParallelSpec("fsdp", None), device=device, overhead=Overhead(0, 0.0)))
    assert r.parallel.world_size == 3 and r.roofline.fit.fits
    assert dict(r.parallel.world_size_search)[2] > budget


def test_lora_has_no_gradient_or_state_for_frozen_weights():
    t = train_report("gpt2_lora", "adam", what_if=False).training
    # adapters per block: c_attn A 8×128 + B 384×8, c_proj A 8×128 + B 128×8 = 6,144;
    # 2 blocks: 12,288 trainable parameters in 8 tensors
    assert t.grad_bytes == 12_288 * 4
    assert t.optimizer_state_bytes == 2 * 12_288 * 4 + 4 * 8
    assert t.frozen_param_bytes == 541_184 * 4                   # the whole zoo gpt2


@pytest.mark.parametrize("optimizer", ["none", "adam"])
def test_lora_step_vs_memtracker(optimizer):
    predicted = train_report("gpt2_lora", optimizer, what_if=False).training.peak_bytes
    measured = measured_step("gpt2_lora", optimizer)
    assert abs(predicted / measured - 1) <= 0.10, (predicted, measured)


def test_frozen_first_layer_has_no_backward():
    from graphcost.analyzer.measure.reference import measure_training

    from graphcost import models_zoo

    def frozen_cnn():
        m = models_zoo.build_model("small_cnn", eval=False)
        for p in m.features[0].parameters():
            p.requires_grad_(False)
        return m
    args = models_zoo.example_inputs("small_cnn", batch=2)
    r = analyze(frozen_cnn(), args, train=True, include_inputs=False, what_if=False)
    # the first conv's input is the data and its weights are frozen: no backward for it
    convs = [n for n in r.nodes if n.op == "aten.convolution_backward.default"]
    assert len(convs) == 1
    measured = measure_training(frozen_cnn(), args, "adam")[0]
    assert abs(r.training.peak_bytes / measured - 1) <= 0.10


def test_report_sections():
    r = analyze("zoo:mlp", batch=2, train=True, device="h100-80gb",
                parallel={"strategy": "fsdp", "world_size": 4, "interconnect": "nvlink4"})
    d = json.loads(r.to_json())
    p = d["parallel"]
    assert {"strategy", "world_size", "per_rank_peak_bytes", "breakdown_at_peak", "host_bytes",
            "timeline", "comm"} <= set(p)
    assert set(p["breakdown_at_peak"]) >= {"params", "grads", "optimizer_state", "activations",
                                           "comm_buffers", "temporaries"}
    assert d["peak_bytes"] == p["per_rank_peak_bytes"] == r.peak_bytes
    assert len(p["timeline"]) == len(d["training"]["timeline"])
    assert p["optimizer_impl"] == "foreach"          # a GPU's default
    assert p["comm"]["seconds"] > 0 and p["global_batch"] == 8
    assert d["roofline"]["tensor_bytes"] == r.peak_bytes   # fits per rank
    from graphcost.analyzer.render.html import html_report
    from graphcost.analyzer.render.plot import timeline_svg
    assert "per rank (fsdp x4)" in timeline_svg(r)
    assert "Data parallel: one rank" in html_report(r)


def _cli(capsys, *argv) -> tuple[int, str]:
    code = main(["zoo:mlp", "--batch", "2", *argv])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("argv, message", [
    (["--parallel", "fsdp", "--world-size", "2"], "add --train"),
    (["--train", "--parallel", "fsdp", "--world-size", "0"], "--world-size 0: must be"),
    (["--train", "--parallel", "fsdp", "--world-size", "two"], "--world-size two: expected"),
    (["--train", "--world-size", "2"], "--world-size goes with --parallel"),
    (["--train", "--parallel", "fsdp"], "needs --world-size"),
    (["--train", "--parallel", "fsdp", "--world-size", "auto"], "needs --device"),
    (["--train", "--parallel", "ddp", "--world-size", "2", "--offload", "optimizer"],
     "ddp keeps everything on the device"),
    (["--train", "--parallel", "zero1", "--world-size", "2", "--offload", "params"],
     "needs zero3 or fsdp"),
    (["--train", "--parallel", "ddp", "--world-size", "2", "--fsdp-units", "blocks.0"],
     "--fsdp-units goes with"),
    (["--train", "--parallel", "fsdp", "--world-size", "2", "--interconnect", "nvlink6"],
     "did you mean nvlink"),
    (["--train", "--parallel", "fsdp", "--world-size", "2", "--fsdp-units", "blocks.9"],
     "close matches: blocks.3"),
    (["--train", "--parallel", "ddp", "--world-size", "2", "--precision", "bf16-master"],
     "modelled for fully_shard's MixedPrecisionPolicy"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    code, err = _cli(capsys, *argv)
    assert code == 2 and message in err and "\n" not in err, err


def test_api_says_it_in_the_api_words():
    with pytest.raises(GraphcostError, match=r"parallel\['world_size'\]=0"):
        analyze("zoo:mlp", train=True, parallel={"strategy": "fsdp", "world_size": 0})
    with pytest.raises(GraphcostError, match=r"add train=True"):
        analyze("zoo:mlp", parallel={"strategy": "fsdp", "world_size": 2})
    with pytest.raises(GraphcostError, match="unknown key"):
        analyze("zoo:mlp", train=True, parallel={"strategy": "fsdp", "ranks": 2})
    # a mesh is named as it was given (it was "parallel={'strategy': 'ep=2'}")
    with pytest.raises(GraphcostError, match=r"^parallel=\{'mesh': 'ep=2'\}: expert paral"):
        analyze("zoo:llama_tiny", train=True, parallel={"mesh": "dp_shard=2,ep=2"})


def test_check_max_peak_is_per_rank(capsys):
    from graphcost.analyzer.cli.main import main as cli
    code = cli(["check", "zoo:mlp", "--batch", "2", "--train", "--parallel", "fsdp",
                "--world-size", "4", "--max-peak", "1GiB"])
    out = capsys.readouterr().out
    assert code == 0 and "peak memory per rank (fsdp×4)" in out
    # a mesh named as it was asked: it said "fsdp×4" for dp_shard=2 × tp=2
    code = cli(["check", "zoo:llama_tiny", "--train", "--parallel", "dp_shard=2,tp=2",
                "--max-peak", "1GiB"])
    out = capsys.readouterr().out
    assert code == 0 and "peak memory per rank (dp_shard=2,tp=2)" in out, out


def test_what_a_plan_asks_of_one_graph_is_derived_once_and_not_by_a_changed_graph():
    # origins, the repeated blocks and the FSDP units are computed once per graph (a plan
    # prices many layouts of one trace): the second call returns the first's result, and a
    # graph made from it by dataclasses.replace (another batch, other values) starts afresh
    from dataclasses import replace

    from graphcost.passes.parallel.units import fsdp_units, origins
    from graphcost.passes.training.checkpoint import _repeated_blocks, repeated_blocks
    from graphcost.passes.training.memory import forward_set

    graph = joint_graph("llama_tiny")
    fwd = forward_set(graph)
    assert origins(graph) is origins(graph)
    blocks = repeated_blocks(graph, fwd)
    assert blocks == _repeated_blocks(graph, fwd) == repeated_blocks(graph, fwd)
    assert blocks == ["layers.0", "layers.1"]               # (the small llama_tiny's two)
    units, unit_of = fsdp_units(graph, fwd, blocks)
    again, _ = fsdp_units(graph, fwd, blocks)
    assert units == again and units is not again and len(units) == 3   # 2 blocks + root
    unit_of.clear()                                      # (a caller's copy: the kept one stays)
    assert fsdp_units(graph, fwd, blocks)[1]
    changed = replace(graph, batch=graph.batch + 1)
    assert changed._derived == {} and origins(changed) is not origins(graph)
    assert origins(changed) == origins(graph)
