"""A plan's candidate as the engine users run it: torchtitan's training command line.

torchtitan 0.3 configures a run with a Python config of its registry (``--module llama3
--config llama3_8b``) overridden on the command line, which its ``ConfigManager`` parses
(tyro): ``tests/test_engine_args.py`` parses these lines with it where torchtitan is installed
(.ci/run's newest-torch venv). Only what graphcost analyzed is set, each to the value the
analysis assumed:

- the mesh: ``--parallelism.data-parallel-replicate-degree``, ``…-shard-degree``,
  ``--parallelism.tensor-parallel-degree`` (sequence parallel on: torchtitan's default and
  graphcost's tensor-parallel plan), ``…context-parallel-degree`` (head-tail load balancing,
  torchtitan's default, and PyTorch's all-gather ring, as graphcost traces them), and for a
  pipeline ``…pipeline-parallel-degree`` with
  its schedule (1F1B or Interleaved1F1B, whose two stages a rank are torchtitan's default and
  graphcost's) and one sequence a micro-batch (torchtitan's default, as analyzed);
- ``--training.local-batch-size`` (per data rank) and ``--training.seq-len``;
- the checkpoint plan: ``activation-checkpoint:none|selective|full`` (selective is its op
  policy, as graphcost's ``sac``);
- ``--loss.num-chunks 1``: graphcost analyzes cross-entropy over the whole logits, as the
  published runs computed it; torchtitan 0.3 defaults to 8 chunks, each backpropagated at once,
  which holds less than graphcost's figure;
- precision: bf16-master is its default (bf16 parameters, fp32 reduction in FSDP2's
  MixedPrecisionPolicy); fp32 ``--training.mixed-precision-param float32``;
- ``--compile.enable`` and ``--compile.enable-async-tensor-parallel`` as asked;
- ``--training.disable-cuda-graphs``: torchtitan 0.3 captures the step in a CUDA graph by
  default (not beside a pipeline, which it refuses); graphcost prices each kernel's launch,
  as an uncaptured step pays it.

A model torchtitan has no config of, or a setting it does not spell (another precision
recipe, another optimizer than AdamW, float8 linears), gets no line: None.
"""
from __future__ import annotations

import re
import shlex
from typing import Any, Mapping

from ..app.devices import GPUS_PER_NODE

# graphcost's models that are torchtitan's (the zoo's torchtitan-style Llama 3.1 decoders).
# Not 405B: torchtitan 0.3's llama3_405b config builds its model with float8 linears (its
# converters, fixed when the config loads, not settable on the command line): its line would
# not run a step analyzed without them, and one analyzed with them gets no line (above).
TORCHTITAN_CONFIGS = {"zoo:llama3_8b": "llama3_8b", "zoo:llama3_70b": "llama3_70b"}
AC_MODES = {"none": "activation-checkpoint:none", "sac": "activation-checkpoint:selective",
            "full": "activation-checkpoint:full"}
PRECISIONS = {"bf16-master": [], "fp32": ["--training.mixed-precision-param", "float32"]}
# graphcost's schedules -> torchtitan's names (torch.distributed.pipelining's classes); an
# interleaved schedule runs 2 stages a rank there unless told otherwise, as graphcost's
TORCHTITAN_SCHEDULES = {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                        "gpipe": "GPipe", "interleaved-zb": "InterleavedZeroBubble",
                        "zbv": "ZBVZeroBubble"}


def torchtitan_args(model: str, mesh: Mapping[str, int], batch: int, checkpoint: str,
                    base: Mapping[str, Any], schedule: str = "1f1b") -> list[str] | None:
    """``torchtitan.train``'s arguments for a setting (``mesh``: the dimensions' sizes;
    ``base``: the analysis's other arguments), or None where torchtitan cannot say it."""
    config = TORCHTITAN_CONFIGS.get(model)
    precision = str(base.get("precision", "fp32"))
    seq = dict(base.get("dims") or {}).get("seq")
    parallel = dict(base.get("parallel") or {})
    # (float8 linears: torchtitan sets its converters in the Python config, not on the
    # command line, and its 8B and 70B configs build none)
    if (config is None or precision not in PRECISIONS or base.get("optimizer") != "adamw"
            or checkpoint not in AC_MODES or seq is None or base.get("float8")):
        return None
    args = ["--module", "llama3", "--config", config,
            "--parallelism.data-parallel-replicate-degree", str(mesh.get("dp_replicate", 1)),
            "--parallelism.data-parallel-shard-degree", str(mesh.get("dp_shard", 1)),
            "--parallelism.tensor-parallel-degree", str(mesh.get("tp", 1)),
            "--training.local-batch-size", str(batch), "--training.seq-len", str(seq),
            "--loss.num-chunks", "1", "--training.disable-cuda-graphs",
            *PRECISIONS[precision]]
    if mesh.get("cp", 1) > 1:   # (its defaults: head-tail load balancing, PyTorch's
        #                              all-gather rotater, as graphcost's ring)
        args += ["--parallelism.context-parallel-degree", str(mesh["cp"])]
        if parallel.get("cp_rotate", "allgather") != "allgather":
            args += ["--parallelism.context-parallel-rotate-method", parallel["cp_rotate"]]
    if mesh.get("pp", 1) > 1:
        args += ["--parallelism.pipeline-parallel-degree", str(mesh["pp"]),
                 "--parallelism.pipeline-parallel-schedule", TORCHTITAN_SCHEDULES[schedule],
                 "--parallelism.pipeline-parallel-microbatch-size", "1"]
    if base.get("compile"):
        args.append("--compile.enable")
        if parallel.get("async_tp"):
            args.append("--compile.enable-async-tensor-parallel")
    return [*args, AC_MODES[checkpoint]]


def torchrun_line(gpus: int, args: list[str] | None,
                  node: int = GPUS_PER_NODE) -> str | None:
    """The torchrun command that starts ``args``' run on ``gpus`` GPUs, ``node`` a node (run
    on each node, with its rendezvous options added); None without arguments, or for GPUs
    that are not whole nodes."""
    if args is None or (gpus > node and gpus % node):
        return None
    nodes = max(gpus // node, 1)
    return shlex.join(["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={gpus // nodes}",
                       "-m", "torchtitan.train", *args])


# The published checkpoints the zoo's Llama 3.1 decoders have the shapes of (vLLM serves a
# checkpoint by its hub id); a hub id names itself
HUB_IDS = {"zoo:llama3_8b": "meta-llama/Llama-3.1-8B",
           "zoo:llama3_70b": "meta-llama/Llama-3.1-70B",
           "zoo:llama3_405b": "meta-llama/Llama-3.1-405B",
           "zoo:llama7b": "meta-llama/Llama-2-7b-hf"}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# graphcost's dtypes -> vLLM's --kv-cache-dtype, and the weight-only quantization vLLM runs
# for a weight dtype (fp8: its dynamic fp8 quantization; int8/int4 need a quantized checkpoint)
VLLM_KV = {"fp8": "fp8"}
VLLM_QUANT = {"fp8": "fp8"}


def vllm_args(model: str, *, tp: int, sequences: int, context: int, batched_tokens: int,
              memory_share: float, weight_dtype: str | None,
              kv_dtype: str | None) -> list[str] | None:
    """``vllm serve`` arguments for a replica (vLLM's EngineArgs names): its checkpoint, the
    tensor-parallel size, ``--max-num-seqs``, ``--max-model-len``, ``--max-num-batched-tokens``
    (a wave's prompts prefilled in one step, as graphcost prices it), the share of the GPU's
    memory it may hold, the KV cache's and the weights' types; None where vLLM cannot say it
    (not a hub checkpoint, a dtype it has no flag for)."""
    repo = HUB_IDS.get(model, model if HUB_ID.match(model) else None)
    if repo is None or (kv_dtype and kv_dtype not in VLLM_KV) or \
            (weight_dtype and weight_dtype not in VLLM_QUANT | {"bf16": "", "fp16": ""}):
        return None
    args = [repo, "--tensor-parallel-size", str(tp), "--max-num-seqs", str(sequences),
            "--max-model-len", str(context), "--max-num-batched-tokens", str(batched_tokens),
            "--gpu-memory-utilization", f"{memory_share:.2f}"]
    if weight_dtype in ("bf16", "fp16"):
        args += ["--dtype", {"bf16": "bfloat16", "fp16": "float16"}[weight_dtype]]
    elif weight_dtype:
        args += ["--quantization", VLLM_QUANT[weight_dtype]]
    if kv_dtype:
        args += ["--kv-cache-dtype", VLLM_KV[kv_dtype]]
    return args


def vllm_line(args: list[str] | None) -> str | None:
    return None if args is None else shlex.join(["vllm", "serve", *args])
