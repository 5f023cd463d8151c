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


PARSE = r"""
import json, sys
from torchtitan.config import ConfigManager
c = ConfigManager().parse_args(json.loads(sys.argv[1]))
p = c.parallelism
print(json.dumps([p.data_parallel_replicate_degree, p.data_parallel_shard_degree,
                  p.tensor_parallel_degree, c.training.local_batch_size, c.training.seq_len,
                  c.loss.num_chunks, c.compile.enable, c.compile.enable_async_tensor_parallel,
                  type(c.activation_checkpoint).__qualname__,
                  c.training.mixed_precision_param]))
"""


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                    reason="torchtitan is not installed here (.ci/run installs it in the "
                           "newest-torch venv)")
@pytest.mark.parametrize("checkpoint, mode", [("full", "FullAC.Config"),
                                              ("sac", "SelectiveAC.Config")])
def test_torchtitans_config_manager_reads_the_line(checkpoint, mode, tmp_path):
    args = torchtitan_args("zoo:llama3_70b", MESH, 16, checkpoint, BASE)
    out = subprocess.run([sys.executable, "-c", PARSE, json.dumps(args)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    assert parsed == [1, 32, 8, 16, 8192, 1, True, True, mode, "bfloat16"]


PARSE_PP = r"""
import json, sys
from torchtitan.config import ConfigManager
p = ConfigManager().parse_args(json.loads(sys.argv[1])).parallelism
print(json.dumps([p.pipeline_parallel_degree, p.pipeline_parallel_schedule,
                  p.pipeline_parallel_microbatch_size, p.data_parallel_shard_degree,
                  p.tensor_parallel_degree]))
"""


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                    reason="torchtitan is not installed here (.ci/run installs it in the "
                           "newest-torch venv)")
@pytest.mark.parametrize("schedule, named", [("1f1b", "1F1B"),
                                             ("interleaved-1f1b", "Interleaved1F1B")])
def test_torchtitans_config_manager_reads_a_pipeline(schedule, named, tmp_path):
    """A 70B pipeline of 8 stages beside FSDP 8 × TP 8, local batch 32: 1F1B or interleaved
    1F1B (torchtitan's two stages a rank, graphcost's default too) with one sequence a
    micro-batch, as graphcost analyzes it. (torchtitan's 405B config gets no line: it builds
    float8 linears, which graphcost does not model.)"""
    assert torchtitan_args("zoo:llama3_405b", MESH, 32, "full", BASE) is None
    args = torchtitan_args("zoo:llama3_70b", {"pp": 8, "dp_shard": 8, "tp": 8}, 32, "full",
                           {**BASE, "compile": False}, schedule)
    out = subprocess.run([sys.executable, "-c", PARSE_PP, json.dumps(args)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [8, named, 1, 8, 8]


PARSE_CP = r"""
import json, sys
from torchtitan.config import ConfigManager
c = ConfigManager().parse_args(json.loads(sys.argv[1]))
p = c.parallelism
print(json.dumps([p.context_parallel_degree, p.context_parallel_load_balancer,
                  p.data_parallel_shard_degree, c.training.seq_len]))
"""


@pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                    reason="torchtitan is not installed here (.ci/run installs it in the "
                           "newest-torch venv)")
def test_torchtitans_config_manager_reads_context_parallelism(tmp_path):
    """A 64k-token Llama 3.1 8B over FSDP 2 × cp 4 (docs/plan.md's long-sequence plan): the
    degree as graphcost analyzed it, with torchtitan's head-tail load balancing (its
    default, and the shard graphcost traces)."""
    args = torchtitan_args("zoo:llama3_8b", {"dp_shard": 2, "cp": 4}, 1, "full",
                           {**BASE, "dims": {"seq": 65536}})
    out = subprocess.run([sys.executable, "-c", PARSE_CP, json.dumps(args)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [4, "headtail", 2, 65536]
