"""Per-stage peaks of real pipelined steps (analyzer/measure/pipeline.py: torch.distributed.
pipelining on 4 or 8 gloo ranks, fully_shard, DTensor's tensor-parallel plan, torchtitan's expert
dispatcher, PyTorch's ring attention, as each run asks), written to benchmarks/results/
pipeline_stages.json, which tests/test_pipeline_parallel.py checks graphcost's per-stage
figures against without starting the ranks again. The suite still runs two of them live on
every torch it covers (a plain 1F1B pipeline and one with context parallelism: the harness
itself), and these are measured here on the torch of this environment.

    python -m benchmarks.accuracy_pipelines [--run N …]

Each run is a ``PipelineRun`` (its fields are the record's key); its peaks are each stage's
ranks' in steps 1 to 4 (the CPU allocator's count as the profiler records it).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from graphcost.analyzer.measure.pipeline import PipelineRun

RESULTS = Path(__file__).parent / "results" / "pipeline_stages.json"
_LLAMA_SDPA = (("attn", "sdpa"), ("num_key_value_heads", 4))
RUNS = (
    PipelineRun("hf_llama", "1f1b", 2, 8, 4),
    PipelineRun("llama_tiny", "1f1b", 2, 8, 4, dp_shard=2),
    PipelineRun("llama_tiny", "1f1b", 2, 8, 4, dp_shard=2, checkpoint=True),
    PipelineRun("llama_tiny", "gpipe", 2, 8, 4, dp_shard=2, master=True),
    PipelineRun("llama_tiny", "1f1b", 2, 8, 4, tp=2),
    PipelineRun("llama_tiny", "1f1b", 2, 8, 4, dp_shard=2, tp=2, master=True),
    PipelineRun("llama_tiny", "interleaved-1f1b", 2, 8, 4, stages_per_rank=2, layers=4),
    PipelineRun("hf_mixtral", "1f1b", 2, 8, 4, dp_shard=2, ep=2),
    PipelineRun("hf_mixtral", "1f1b", 2, 8, 4, dp_shard=2, master=True, ep=2),
    # expert parallelism beside tp and pp at once (8 ranks): ep carved out of each stage's
    # dp_shard × tp ranks, each tp rank dispatching its share of the tokens
    PipelineRun("hf_mixtral", "1f1b", 2, 8, 4, dp_shard=2, tp=2, ep=2),
    PipelineRun("hf_mixtral", "1f1b", 2, 8, 4, dp_shard=2, tp=2, master=True, ep=2),
    PipelineRun("hf_llama", "1f1b", 2, 8, 4, master=True, cp=2, overrides=_LLAMA_SDPA,
                seq=128),
    # transformers' GPT-2, split by PyTorch's tracer (pipeline()): 4 blocks a stage (traced
    # short and grown), GPipe, and beside fully_shard (fp32: under the master recipe the
    # tracer's stage fails, its dtype asserts against MixedPrecisionPolicy's bf16)
    PipelineRun("hf_gpt2", "1f1b", 2, 8, 4, overrides=(("n_layer", 8),)),
    PipelineRun("hf_gpt2", "gpipe", 2, 8, 4, overrides=(("n_layer", 4),)),
    PipelineRun("hf_gpt2", "1f1b", 2, 8, 4, dp_shard=2, overrides=(("n_layer", 4),)),
    # the interleaved zero-bubble schedule (each backward split into its input and weight
    # halves: passes/parallel/zero_bubble.py), alone and beside fully_shard
    PipelineRun("llama_tiny", "interleaved-zb", 2, 8, 4, stages_per_rank=2, layers=4),
    PipelineRun("llama_tiny", "interleaved-zb", 2, 8, 4, dp_shard=2, stages_per_rank=2,
                layers=4),
    PipelineRun("llama_tiny", "interleaved-zb", 2, 8, 4, dp_shard=2, master=True,
                stages_per_rank=2, layers=4),
    PipelineRun("llama_tiny", "interleaved-zb", 2, 8, 4, tp=2, stages_per_rank=2, layers=4),
    # the V-shaped zero bubble (ScheduleZBVZeroBubble: rank 0 the first and the last stage)
    PipelineRun("llama_tiny", "zbv", 2, 8, 4, stages_per_rank=2, layers=4),
    PipelineRun("llama_tiny", "zbv", 2, 8, 4, dp_shard=2, master=True, stages_per_rank=2,
                layers=4),
    # zero bubble with every block checkpointed, which graphcost refuses: measured to hold
    # more than without checkpoints (the reason its refusal gives)
    PipelineRun("llama_tiny", "interleaved-zb", 2, 8, 4, checkpoint=True, stages_per_rank=2,
                layers=4),
)


def key(run: PipelineRun) -> str:
    """The record's key of ``run``: its fields as JSON (tuples as lists)."""
    return json.dumps(asdict(run), sort_keys=True)


def main() -> None:
    from graphcost.analyzer.measure.pipeline import measure_pipeline

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", nargs="+", type=int, choices=range(len(RUNS)),
                   default=list(range(len(RUNS))), help="indices into RUNS")
    args = p.parse_args()
    import torch
    old = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else {}
    runs = dict(old.get("runs", {}))
    for i in args.run:
        measured = measure_pipeline(RUNS[i])
        runs[key(RUNS[i])] = {str(stage): peaks for stage, peaks in sorted(measured.items())}
        print(key(RUNS[i]), runs[key(RUNS[i])], flush=True)
    out = {"torch": torch.__version__.split("+")[0], "optimizer": "adam", "runs": runs}
    RESULTS.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
