"""Per-rank peaks on more gloo ranks than the suite starts: layouts whose rank programs
graphcost traces (expert parallelism, context parallelism beside tensor parallelism), measured
by FSDPMemTracker on real CPU steps (analyzer/measure/parallel.py), the figures written to
benchmarks/results/parallel_ranks.json, which the suite checks graphcost against without
starting the ranks again (tests/test_expert_parallel.py, tests/test_context_parallel.py).

    python -m benchmarks.accuracy_ranks [--case NAME …]

Each case is its test module's model and step, on 4 ranks:

- ``ep``: zoo hf_mixtral grown to 8 experts of 256, ``dp_shard=4,ep=2`` (torchtitan's
  dispatcher, analyzer/measure/expert_plan.py), batch 2 × 128 a rank, fp32;
- ``cp_tp``: zoo hf_llama with SDPA and 4 key/value heads, ``dp_shard=1,cp=2,tp=2`` (PyTorch's
  ring attention, analyzer/measure/context_plan.py, inside DTensor's tensor-parallel plan,
  analyzer/measure/tensor_plan.py), batch 2 × 512, fp32 and bf16-master;
- ``cp_dp``: the same model, ``dp_shard=2,cp=2`` (fully_shard over dp_shard × cp flattened,
  torchtitan's dp_shard_cp; two batches, each sequence over a ring of 2), fp32;
- ``ep_hsdp``: the ``ep`` model, ``dp_replicate=2,dp_shard=2,ep=2`` (HSDP: the dense units on
  the 2 × 2 mesh, the experts on torchtitan's sparse mesh dp_replicate × efsdp), fp32 and
  bf16-master;
- ``cp_ep``: the ``ep`` model with SDPA, 4 key/value heads and top-4 routing,
  ``dp_shard=2,cp=2,ep=2`` (each ring's 2 ranks an ep group, carved out of dp_shard × cp;
  the experts sharded over efsdp 2), batch 2 × 256, fp32;
- ``cp4`` and ``cp4_alltoall``: the ``cp_tp`` model widened to d 256 (16 heads of 16,
  SwiGLU of 256) on a ring of 4, ``cp=4`` (fully_shard over the 4), batch 2 × 1,024, fp32: PyTorch's all-gather rotater (every rank's keys and
  values gathered into one buffer) and its all-to-all one (``set_rotate_method("alltoall")``:
  one rank's passed on at each step).

Every case: its own cross-entropy, Adam, steps 1 and 2, each block a fully_shard unit.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "parallel_ranks.json"
UNITS = ("model.layers.0", "model.layers.1")
# wider than the others' (d 256, 16 heads of 16): the step's peak in the ring's backward, where
# the rotate methods differ, not in the loss's
RING_OF_4 = (("attn", "sdpa"), ("hidden_size", 256), ("num_attention_heads", 16),
             ("num_key_value_heads", 16), ("intermediate_size", 256))
CASES = {
    "ep": dict(model="hf_mixtral", mesh="dp_shard=4,ep=2", batch=(2, 128),
               overrides=(("num_local_experts", 8), ("intermediate_size", 256)),
               precisions=("fp32",)),
    "cp_tp": dict(model="hf_llama", mesh="dp_shard=1,cp=2,tp=2", batch=(2, 512),
                  overrides=(("attn", "sdpa"), ("num_key_value_heads", 4)),
                  precisions=("fp32", "bf16-master")),
    "cp_dp": dict(model="hf_llama", mesh="dp_shard=2,cp=2", batch=(2, 512),
                  overrides=(("attn", "sdpa"), ("num_key_value_heads", 4)),
                  precisions=("fp32",)),
    "ep_hsdp": dict(model="hf_mixtral", mesh="dp_replicate=2,dp_shard=2,ep=2", batch=(2, 128),
                    overrides=(("num_local_experts", 8), ("intermediate_size", 256)),
                    precisions=("fp32", "bf16-master")),
    "cp_ep": dict(model="hf_mixtral", mesh="dp_shard=2,cp=2,ep=2", batch=(2, 256),
                  overrides=(("attn", "sdpa"), ("num_key_value_heads", 4),
                             ("num_local_experts", 8), ("intermediate_size", 256),
                             ("num_experts_per_tok", 4)),
                  precisions=("fp32",)),
    "cp4": dict(model="hf_llama", mesh="cp=4", batch=(2, 1024), overrides=RING_OF_4,
                precisions=("fp32",)),
    "cp4_alltoall": dict(model="hf_llama", mesh="cp=4", batch=(2, 1024), overrides=RING_OF_4,
                         precisions=("fp32",), rotate="alltoall"),
}


def measure(name: str) -> dict:
    """Each rank's step 1 and step 2 peaks for case ``name``, by precision recipe."""
    from graphcost.analyzer.measure.parallel import Case, measure_parallel
    from graphcost.passes.parallel.mesh import parse_mesh

    c = CASES[name]
    m = parse_mesh(str(c["mesh"]))
    size = {k: m.size(k) or 1 for k in ("dp_replicate", "dp_shard", "cp", "tp", "ep")}
    world = size["dp_replicate"] * size["dp_shard"] * size["cp"] * size["tp"]
    cases = [Case(str(c["model"]), "fsdp", c["batch"][0], (("input_ids", c["batch"]),), UNITS,
                  precision=p, tp=size["tp"], ep=size["ep"], cp=size["cp"],
                  replicate=size["dp_replicate"], overrides=c["overrides"],
                  cp_rotate=str(c.get("rotate", "allgather")))
             for p in c["precisions"]]
    rows = sorted(measure_parallel(cases, world), key=lambda r: r.rank)
    return {p: {str(s): [r.peak for r in rows if r.step == s and r.case.precision == p]
                for s in (1, 2)} for p in c["precisions"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    args = p.parse_args()
    import torch
    old = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else {}
    cases = dict(old.get("cases", {}))
    for name in args.case:
        c = CASES[name]
        cases[name] = {"model": c["model"], "mesh": c["mesh"], "batch": list(c["batch"]),
                       "overrides": dict(c["overrides"]), "peaks": measure(name),
                       **({"rotate": c["rotate"]} if "rotate" in c else {})}
    out = {"torch": torch.__version__.split("+")[0], "optimizer": "adam", "cases": cases}
    RESULTS.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
