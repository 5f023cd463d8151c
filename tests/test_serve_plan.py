"""``graphcost plan MODEL --serve``: the serving setting with the most output tokens/s that
fits and meets the latency targets; each candidate the direct analysis of its settings."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from graphcost.analyzer.app.serve_plan import ServePlanSpec, plan_serving
from graphcost.analyzer.cli.engine_args import vllm_args
from graphcost.analyzer.load.progress import Step

from tests.cli_runner import run_cli

PROMPT, GENERATE = 64, 16
# (one replica program: the fixture searches both)
ARGS = ["zoo:llama_tiny", "--serve", "--gpus", "2", "--device", "h100", "--prompt",
        str(PROMPT), "--generate", str(GENERATE), "--tp", "2"]


NOTES: list[str] = []


@pytest.fixture(scope="module")
def plan():
    spec = ServePlanSpec(2, PROMPT, GENERATE, ttft=1e-3, tp=(1, 2))
    return plan_serving("zoo:llama_tiny", spec, {"device": "h100"}, NOTES.append)


def test_the_progress_counts_the_replica_programs(plan):
    # a progress bar's steps (analyzer/load/resolve.py Step: text to any other callback)
    steps = [n for n in NOTES if isinstance(n, Step)]
    assert [(s.done, s.total) for s in steps] == [(1, 2), (2, 2)]
    assert steps[1] == "tp=2, the model's weights, its KV cache (2 of at most 2)"


def _direct(command: str) -> dict:
    words = command.split()[1:] + ["--format", "json"]
    out = run_cli(*words)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["serving"]


def test_the_best_is_the_direct_analysis_of_its_settings(plan):
    best = plan.best
    # the best batch is one the plan re-bound from its traces at 1 and 2, never traced
    assert best is not None and best.settings.batch > 2
    b = best.settings
    direct = _direct(f"graphcost zoo:llama_tiny --serve --prompt {PROMPT} --generate "
                     f"{GENERATE} --batch {b.batch} --engine vllm --device h100"
                     + (f" --parallel tp={b.tp}" if b.tp > 1 else ""))
    s = best.serving
    assert direct["time"]["ttft_seconds"] == pytest.approx(s.time.ttft_seconds, rel=1e-9)
    assert direct["time"]["tpot_seconds"] == pytest.approx(s.time.tpot_seconds, rel=1e-9)
    assert direct["fit"]["needs"] == s.fit.needs
    assert direct["kv_cache_bytes"] == s.kv_cache_bytes


def test_the_targets_and_the_throughput(plan):
    fitting = [c for c in plan.candidates if c.status == "fits"]
    slow = [c for c in plan.candidates if c.status == "slow"]
    assert fitting and slow
    assert all(c.serving.time.ttft_seconds <= 1e-3 for c in fitting)
    assert all(c.serving.time.ttft_seconds > 1e-3 and "TTFT" in c.detail for c in slow)
    # the best makes the most tokens: replicas × B sequences × G tokens over a request's
    # prefill and its G decode steps
    best = plan.best
    t = best.serving.time
    assert best.tokens_per_second == pytest.approx(
        best.replicas * best.settings.batch * GENERATE / (t.ttft_seconds + GENERATE
                                                          * t.tpot_seconds))
    assert best.tokens_per_second_per_gpu == max(c.tokens_per_second_per_gpu for c in fitting)
    # a larger batch of the best's replica waits longer for its first token
    larger = [c for c in plan.candidates if c.settings.tp == best.settings.tp
              and c.settings.batch > best.settings.batch]
    assert larger and all(c.status in ("slow", "over") for c in larger)


def test_the_command_line_ends_on_the_answer_in_one_screen():
    out = run_cli("plan", *ARGS, "--ttft", "1ms", env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) <= 24
    assert all(len(x) <= 80 for x in lines if not x.startswith("run:"))
    assert lines[-4].startswith("best: tp=2 × 1 replica, ")
    assert lines[-1].startswith("run: graphcost zoo:llama_tiny --serve --prompt 64")
    # zoo:llama_tiny is no published checkpoint: no vLLM line
    assert not any(x.startswith("vllm:") for x in lines)


def test_json_lists_every_candidate():
    out = run_cli("plan", *ARGS, "--format", "json")
    body = json.loads(out.stdout)
    assert body["kind"] == "serve_plan"
    statuses = {c["status"] for c in body["candidates"]}
    assert "fits" in statuses
    assert all(c["command"].startswith("graphcost zoo:llama_tiny --serve")
               for c in body["candidates"])


def test_vllm_arguments_name_its_engine_args():
    args = vllm_args("zoo:llama3_8b", tp=2, sequences=64, context=2304, batched_tokens=131072,
                     memory_share=0.5, weight_dtype=None, kv_dtype="fp8")
    assert args == ["meta-llama/Llama-3.1-8B", "--tensor-parallel-size", "2",
                    "--max-num-seqs", "64", "--max-model-len", "2304",
                    "--max-num-batched-tokens", "131072", "--gpu-memory-utilization", "0.50",
                    "--kv-cache-dtype", "fp8"]
    # vLLM has no flag for an int8 KV cache, nor a checkpoint for a model that names none
    assert vllm_args("zoo:llama3_8b", tp=1, sequences=1, context=8, batched_tokens=8,
                     memory_share=0.5, weight_dtype=None, kv_dtype="int8") is None
    assert vllm_args("zoo:llama_tiny", tp=1, sequences=1, context=8, batched_tokens=8,
                     memory_share=0.5, weight_dtype=None, kv_dtype=None) is None


def _vllm_python() -> str:
    """A Python with vLLM: GRAPHCOST_VLLM_PYTHON (its own venv, as .ci/run makes it), else this
    one where vLLM is installed beside graphcost."""
    import importlib.util
    named = os.environ.get("GRAPHCOST_VLLM_PYTHON")
    if named:
        return named
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("no vLLM here: it installs in a venv of its own (vLLM 0.33 pins torch "
                    "2.14.0 and transformers < 5.21, below graphcost's floor); .ci/run makes "
                    "one and names its Python in GRAPHCOST_VLLM_PYTHON")
    return sys.executable


def test_vllm_parses_the_arguments():
    # the arguments after `vllm serve` of an fp8 replica and a bf16 one, read by vLLM's own
    # serve subcommand parser (tests/vllm_serve_args.py, in vLLM's venv)
    cases = [("fp8", "fp8"), ("bf16", None)]
    lines = [vllm_args("zoo:llama3_8b", tp=2, sequences=64, context=2304,
                       batched_tokens=131072, memory_share=0.5, weight_dtype=w, kv_dtype=kv)
             for w, kv in cases]
    out = subprocess.run([_vllm_python(), str(Path(__file__).parent / "vllm_serve_args.py")],
                         input=json.dumps(lines), capture_output=True, text=True, timeout=300,
                         env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    parsed = json.loads(out.stdout.strip().splitlines()[-1])
    assert parsed == [{"model_tag": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 2,
                       "max_num_seqs": 64, "max_model_len": 2304,
                       "max_num_batched_tokens": 131072, "gpu_memory_utilization": 0.5,
                       "dtype": "bfloat16" if w == "bf16" else "auto",
                       "quantization": "fp8" if w == "fp8" else None,
                       "kv_cache_dtype": kv or "auto"} for w, kv in cases]


def test_a_concatenating_cache_is_said_to_be_above_vllms():
    # transformers' DynamicCache copies the whole cache every decode step; vLLM's paged cache
    # appends in place: the plan prices the model as traced and says so (a TPOT no batch
    # meets ends the search at its first)
    out = run_cli("plan", "zoo:hf_llama", "--serve", "--gpus", "1", "--device", "h100",
                  "--prompt", "32", "--generate", "8", "--tpot", "1us", "--top", "1",
                  env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    assert "its cache concatenates (transformers' DynamicCache): each decode step copies" \
        in out.stdout


def test_when_nothing_fits_it_names_the_smaller_weights_that_do():
    """Llama 3 8B's bf16 weights (14.96 GiB) and a 4k context are over a 16 GiB T4:
    nothing fits, and the plan says which smaller weights make one sequence fit — the
    least-needing replica program analyzed once more, that analysis the direct one of its
    settings. A T4 (Turing) runs no fp8 kernels of vLLM's: 4-bit weights are offered."""
    from graphcost.analyzer.render.serve_plan import serve_plan_json, serve_plan_lines

    spec = ServePlanSpec(1, 4096, 256)
    plan = plan_serving("zoo:llama3_8b", spec, {"device": "t4"})
    assert plan.best is None and all(c.status == "over" for c in plan.candidates)
    smaller = plan.suggestion
    assert smaller is not None and smaller.settings.weight_dtype == "int4"
    assert smaller.serving is not None and smaller.serving.fit is not None
    direct = _direct("graphcost zoo:llama3_8b --serve --prompt 4096 --generate 256 --batch 1 "
                     "--weight-dtype int4 --engine vllm --device t4")
    assert direct["fit"]["needs"] == smaller.serving.fit.needs
    lines = serve_plan_lines(plan, lambda c: f"{c.settings.weight_dtype} at tp={c.settings.tp}")
    assert lines[-3].startswith("nothing fits 1 × t4: tp=1 needs ")
    assert lines[-2].startswith("  with int4 weights it fits: ")
    assert lines[-1] == "run: int4 at tp=1"   # (the command that analyzes it alone)
    body = json.loads(serve_plan_json(plan, lambda c: "", lambda c: None))
    assert body["schema_version"] == 2 and body["suggestion"]["status"] == "fits"
    assert body["suggestion"]["weight_dtype"] == "int4"
