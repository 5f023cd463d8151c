"""The command line's data-parallel options (--parallel, --world-size, --offload, …) and the
``parallel`` mapping analyze() takes from them."""
from __future__ import annotations

import argparse

from ...passes.choices import Offload, OptimizerImpl, Rotate, Strategy
from ...passes.errors import GraphcostError


def add_parallel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--optimizer-impl", choices=OptimizerImpl.words(), default=None,
                   help="with --train: the optimizer's implementation, which sets the step's "
                        "temporaries (default: foreach with a GPU --device, as PyTorch "
                        "picks there; forloop otherwise, PyTorch's CPU default)")
    p.add_argument("--parallel", metavar="STRATEGY|MESH",
                   help="with --train: one rank's memory under data parallelism: ddp "
                        "(replicated + gradient buckets), zero1 (DDP + ZeroRedundancyOptimizer)"
                        ", zero2 (FSDP2, reshard_after_forward=False), zero3/fsdp (FSDP2 "
                        "fully_shard per repeated block + root); or a device mesh by "
                        "torchtitan's names, e.g. dp_shard=8 (FSDP2), dp_replicate=8 "
                        "(DDP), dp_replicate=2,dp_shard=4 (HSDP), dp_shard=8,tp=8 (tensor "
                        "parallel), pp=4 (pipeline stages), dp_shard=8,ep=4 (expert parallel, "
                        "carved out of dp_shard), dp_shard=4,cp=2 (context parallel: each "
                        "sequence split, attention a ring). --batch is each rank's batch. With "
                        "--serve: tp=N, one replica on N tensor-parallel GPUs")
    p.add_argument("--microbatches", type=int, metavar="N",
                   help="with --parallel pp=P: micro-batches a step (default: the batch, one "
                        "sequence each, as torchtitan)")
    p.add_argument("--pp-schedule", choices=("1f1b", "gpipe", "interleaved-1f1b",
                                             "interleaved-zb", "zbv"),
                   help="with --parallel pp=P: the pipeline schedule (default 1f1b); "
                        "interleaved-1f1b and interleaved-zb (zero bubble: each backward "
                        "split into its input and weight halves) run --pp-stages-per-rank "
                        "stages on each rank; zbv (zero bubble, V-shaped) two stages a rank, "
                        "rank r the stages r and 2P - 1 - r")
    p.add_argument("--pp-stages-per-rank", type=int, metavar="V",
                   help="with an interleaved --pp-schedule: stages a rank runs (default 2, "
                        "torchtitan's); rank r runs stages r, r + P, …")
    p.add_argument("--cp-rotate", choices=Rotate.words(),
                   help="with --parallel …,cp=C: how the ring hands on keys and values: "
                        "allgather (default: all of them gathered once) or alltoall (one "
                        "rank's passed at each step; torchtitan's "
                        "context_parallel_rotate_method)")
    p.add_argument("--async-tp", action="store_true", default=None,
                   help="with a tp dimension: its collectives overlapped by the matmuls they "
                        "feed (torchtitan's async TP, Megatron's --tp-comm-overlap)")
    p.add_argument("--float8-all-gather", action="store_true", default=None,
                   help="with --float8 tensorwise and a dp_shard dimension: FSDP2 gathers "
                        "the float8 linears' weights in float8 (torchao's "
                        "enable_fsdp_float8_all_gather)")
    p.add_argument("--world-size", metavar="N|auto",
                   help="with --parallel: the number of ranks, or auto: the smallest that fits "
                        "--device")
    p.add_argument("--offload", choices=Offload.words(),
                   help="with --parallel: move the optimizer state and step (optimizer), or "
                        "also the sharded parameters and gradients (params: zero3/fsdp, "
                        "FSDP2's CPUOffloadPolicy) to host memory")
    p.add_argument("--bucket-cap-mb", type=float, default=None, metavar="MB",
                   help="with --parallel ddp/zero1: DDP's bucket_cap_mb (default 25)")
    p.add_argument("--fsdp-units", metavar="NAMES",
                   help="with --parallel zero2/zero3/fsdp: the modules fully_shard wraps "
                        "(comma-separated paths; default the repeated blocks), plus the root")
    p.add_argument("--nodes-of", type=int, default=None, metavar="G",
                   help="with --parallel: GPUs a node (default 8): a mesh dimension whose "
                        "group spans more crosses the network (--interconnect)")
    p.add_argument("--interconnect", metavar="NAME",
                   help="with --parallel: the link between ranks, for a lower bound on the "
                        "communication time (nvlink4, nvlink3, pcie5, pcie4, ib-ndr, ib-hdr, "
                        "eth-100g; `graphcost devices` lists them)")
def parallel_args(args) -> dict | None:
    """analyze()'s ``parallel`` mapping from --parallel and its options."""
    extra = [o for o, v in (("--world-size", args.world_size), ("--offload", args.offload),
                            ("--bucket-cap-mb", args.bucket_cap_mb),
                            ("--fsdp-units", args.fsdp_units),
                            ("--interconnect", args.interconnect),
                            ("--nodes-of", args.nodes_of),
                            ("--microbatches", args.microbatches),
                            ("--pp-schedule", args.pp_schedule),
                            ("--pp-stages-per-rank", args.pp_stages_per_rank),
                            ("--cp-rotate", args.cp_rotate),
                            ("--async-tp", args.async_tp),
                            ("--float8-all-gather", args.float8_all_gather)) if v is not None]
    if not args.parallel:
        if extra:
            raise GraphcostError(f"{extra[0]} goes with --parallel STRATEGY")
        return None
    if "=" in args.parallel:  # a mesh: its sizes are the world size
        if args.world_size is not None:
            raise GraphcostError("--world-size: a mesh's sizes give the world size "
                                 f"(--parallel {args.parallel})")
        out: dict = {"mesh": args.parallel}
    elif args.parallel in Strategy.words():
        out = {"strategy": args.parallel}
    else:
        raise GraphcostError(f"--parallel {args.parallel[:80]}: expected a strategy "
                             f"({', '.join(Strategy.words())}) or a mesh such as dp_shard=8")
    if args.world_size is not None:
        text = args.world_size.strip().lower()
        if text != "auto" and not text.lstrip("-").isdigit():
            raise GraphcostError(f"--world-size {args.world_size}: expected a whole number "
                                 "≥ 1 or auto")
        out["world_size"] = "auto" if text == "auto" else int(text)
    for key, value in (("offload", args.offload), ("bucket_cap_mb", args.bucket_cap_mb),
                       ("interconnect", args.interconnect), ("microbatches", args.microbatches),
                       ("gpus_per_node", args.nodes_of),
                       ("schedule", args.pp_schedule), ("async_tp", args.async_tp),
                       ("stages_per_rank", args.pp_stages_per_rank),
                       ("cp_rotate", args.cp_rotate),
                       ("float8_all_gather", args.float8_all_gather)):
        if value is not None:
            out[key] = value
    if args.fsdp_units:
        out["units"] = [n.strip() for n in args.fsdp_units.split(",") if n.strip()]
    return out

