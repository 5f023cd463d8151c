"""A plan's candidate as torchtitan's command line (analyzer/cli/engine_args.py), parsed by
torchtitan's own ConfigManager where torchtitan is installed (.ci/run's newest-torch venv)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from graphcost.analyzer.cli.engine_args import torchrun_line, torchtitan_args

# torchtitan's published 70B layout (FSDP 32 × TP 8, local batch 16, full AC, compiled with
# async TP) as graphcost's plan names it
BASE = dict(train=True, optimizer="adamw", precision="bf16-master", dims={"seq": 8192},
            compile=True, parallel={"async_tp": True})
MESH = {"dp_shard": 32, "tp": 8}


def test_the_70b_layout_as_torchtitan_spells_it():
    args = torchtitan_args("zoo:llama3_70b", MESH, 16, "full", BASE)
    assert args == [
        "--module", "llama3", "--config", "llama3_70b",
        "--parallelism.data-parallel-replicate-degree", "1",
        "--parallelism.data-parallel-shard-degree", "32",
        "--parallelism.tensor-parallel-degree", "8",
        "--training.local-batch-size", "16", "--training.seq-len", "8192",
        "--loss.num-chunks", "1", "--training.disable-cuda-graphs", "--compile.enable",
        "--compile.enable-async-tensor-parallel", "activation-checkpoint:full"]
    # 256 GPUs: 32 nodes of 8
    line = torchrun_line(256, args)
    assert line is not None
    assert line.startswith("torchrun --nnodes=32 --nproc-per-node=8 -m torchtitan.train ")
    assert torchrun_line(12, args) is None   # (not whole nodes)


@pytest.mark.parametrize("model, base", [
    ("zoo:llama_tiny", BASE),                               # no torchtitan config
    ("zoo:llama3_8b", {**BASE, "precision": "bf16-true"}),  # no such recipe there
    ("zoo:llama3_8b", {**BASE, "optimizer": "sgd"}),        # its configs run AdamW
    ("zoo:llama3_8b", {**BASE, "float8": "rowwise"}),       # converters: its Python config
])
def test_what_torchtitan_cannot_say_gets_no_line(model, base):
    assert torchtitan_args(model, MESH, 2, "sac", base) is None


# Every line below parsed in one process (torchtitan's import is most of the time: 13-16 s a
# process on the newest-torch venv): {name: the ConfigManager's fields graphcost wrote}
PARSE = r"""
import json, sys
from torchtitan.config import ConfigManager
out = {}
for name, args in json.loads(sys.stdin.read()).items():
    c = ConfigManager().parse_args(args)
    p, t = c.parallelism, c.training
    out[name] = dict(
        replicate=p.data_parallel_replicate_degree, shard=p.data_parallel_shard_degree,
        tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
        schedule=p.pipeline_parallel_schedule, microbatch=p.pipeline_parallel_microbatch_size,
        cp=p.context_parallel_degree, balancer=p.context_parallel_load_balancer,
        batch=t.local_batch_size, seq=t.seq_len, chunks=c.loss.num_chunks,
        compile=c.compile.enable, async_tp=c.compile.enable_async_tensor_parallel,
        checkpoint=type(c.activation_checkpoint).__qualname__,
        param_dtype=t.mixed_precision_param)
print(json.dumps(out))
"""
PIPELINE = {"pp": 8, "dp_shard": 8, "tp": 8}
LINES = {   # (the 70B layout's, its pipelines' (local batch 32), the 8B's at 64k tokens)
    "full": ("zoo:llama3_70b", MESH, 16, "full", BASE),
    "sac": ("zoo:llama3_70b", MESH, 16, "sac", BASE),
    "1f1b": ("zoo:llama3_70b", PIPELINE, 32, "full", {**BASE, "compile": False}, "1f1b"),
    "interleaved-1f1b": ("zoo:llama3_70b", PIPELINE, 32, "full", {**BASE, "compile": False},
                         "interleaved-1f1b"),
    "interleaved-zb": ("zoo:llama3_70b", PIPELINE, 32, "full", {**BASE, "compile": False},
                       "interleaved-zb"),
    "zbv": ("zoo:llama3_70b", PIPELINE, 32, "full", {**BASE, "compile": False}, "zbv"),
    "cp": ("zoo:llama3_8b", {"dp_shard": 2, "cp": 4}, 1, "full",
           {**BASE, "dims": {"seq": 65536}}),
}
needs_torchtitan = pytest.mark.skipif(
    importlib.util.find_spec("torchtitan") is None,
    reason="torchtitan is not installed here (.ci/run installs it in the newest-torch venv)")


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict:
    """torchtitan's ConfigManager's reading of each of ``LINES``."""
    lines = {name: torchtitan_args(*spec) for name, spec in LINES.items()}
    assert all(lines.values()), lines
    out = subprocess.run([sys.executable, "-c", PARSE], input=json.dumps(lines),
                         cwd=tmp_path_factory.mktemp("torchtitan"), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_torchtitan
@pytest.mark.parametrize("checkpoint, mode", [("full", "FullAC.Config"),
                                              ("sac", "SelectiveAC.Config")])
def test_torchtitans_config_manager_reads_the_line(checkpoint, mode, parsed):
    c = parsed[checkpoint]
    assert [c[k] for k in ("replicate", "shard", "tp", "batch", "seq", "chunks", "compile",
                           "async_tp", "checkpoint", "param_dtype")] == \
        [1, 32, 8, 16, 8192, 1, True, True, mode, "bfloat16"]


@needs_torchtitan
@pytest.mark.parametrize("schedule, named", [("1f1b", "1F1B"),
                                             ("interleaved-1f1b", "Interleaved1F1B"),
                                             ("interleaved-zb", "InterleavedZeroBubble"),
                                             ("zbv", "ZBVZeroBubble")])
def test_torchtitans_config_manager_reads_a_pipeline(schedule, named, parsed):
    """A 70B pipeline of 8 stages beside FSDP 8 × TP 8, local batch 32: 1F1B or interleaved
    1F1B (torchtitan's two stages a rank, graphcost's default too) with one sequence a
    micro-batch, as graphcost analyzes it. (torchtitan's 405B config gets no line: it builds
    float8 linears, which graphcost does not model.)"""
    assert torchtitan_args("zoo:llama3_405b", MESH, 32, "full", BASE) is None
    c = parsed[schedule]
    assert [c[k] for k in ("pp", "schedule", "microbatch", "shard", "tp")] == \
        [8, named, 1, 8, 8]


def test_each_schedules_torchtitan_name_is_the_class_graphcost_models():
    # torchtitan builds the schedule PyTorch's get_schedule_class names: each name graphcost
    # writes is the class it reads its rank's order off (frontends/torch/pipeline_stages.py)
    from graphcost.analyzer.cli.engine_args import TORCHTITAN_SCHEDULES
    from torch.distributed.pipelining.schedules import get_schedule_class
    assert {s: get_schedule_class(n).__name__ for s, n in TORCHTITAN_SCHEDULES.items()} == {
        "1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B",
        "gpipe": "ScheduleGPipe", "interleaved-zb": "ScheduleInterleavedZeroBubble",
        "zbv": "ScheduleZBVZeroBubble"}


@needs_torchtitan
def test_torchtitans_config_manager_reads_context_parallelism(parsed):
    """A 64k-token Llama 3.1 8B over FSDP 2 × cp 4 (docs/plan.md's long-sequence plan): the
    degree as graphcost analyzed it, with torchtitan's head-tail load balancing (its
    default, and the shard graphcost traces)."""
    c = parsed["cp"]
    assert [c[k] for k in ("cp", "balancer", "shard", "seq")] == [4, "headtail", 2, 65536]
