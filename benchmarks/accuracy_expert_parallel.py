"""Expert parallelism's per-rank peaks on more ranks than the suite runs: graphcost's
prediction against FSDPMemTracker on gloo ranks running torchtitan's dispatcher
(analyzer/measure/expert_plan.py), the measurements written to
benchmarks/results/expert_parallel_ranks.json, which tests/test_expert_parallel.py checks
graphcost against without starting the ranks again.

    python -m benchmarks.accuracy_expert_parallel [--mesh dp_shard=4,ep=2]

The model and step are tests/test_expert_parallel.py's: zoo hf_mixtral grown to 8 experts of
256, batch 2 × 128 tokens a rank, its own cross-entropy, Adam, fp32; each block a
fully_shard unit, each layer's experts one over efsdp (dp_shard / ep ranks).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "expert_parallel_ranks.json"
GROWN = (("num_local_experts", 8), ("intermediate_size", 256))
UNITS = ("model.layers.0", "model.layers.1")


def measure(mesh: str) -> dict:
    """Each rank's step 1 and step 2 peaks at ``mesh`` (``dp_shard=D,ep=E``)."""
    from graphcost.analyzer.measure.parallel import Case, measure_parallel
    from graphcost.passes.parallel.mesh import parse_mesh

    m = parse_mesh(mesh)
    world, ep = m.size("dp_shard") or 1, m.size("ep") or 1
    case = Case("hf_mixtral", "fsdp", 2, (("input_ids", (2, 128)),), UNITS, ep=ep,
                overrides=GROWN)
    rows = measure_parallel([case], world)
    return {"mesh": mesh, "steps": {str(s): [r.peak for r in sorted(rows, key=lambda r: r.rank)
                                             if r.step == s] for s in (1, 2)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mesh", nargs="+", default=["dp_shard=4,ep=2"])
    args = p.parse_args()
    import torch
    runs = {"torch": torch.__version__.split("+")[0], "model": "hf_mixtral",
            "overrides": dict(GROWN), "batch": [2, 128], "optimizer": "adam",
            "runs": [measure(m) for m in args.mesh]}
    RESULTS.write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
