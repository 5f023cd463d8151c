"""Per-rank memory of real data-parallel training on this CPU, measured by PyTorch's own
trackers: what graphcost's per-rank predictions (passes/parallel/step.py) are checked against.

``measure_parallel(cases, world)`` starts ``world`` processes (torch.multiprocessing, gloo on
127.0.0.1) and runs every case in each of them: the zoo model with seeded weights, wrapped as
the strategy says — DistributedDataParallel (``ddp``), DDP + ZeroRedundancyOptimizer
(``zero1``), ``fully_shard`` on each unit and on the root (``fsdp``/``zero3``; ``zero2`` with
``reshard_after_forward=False``), HSDP on a 2-D mesh (``replicate``), DTensor tensor
parallelism (``tp``) — trained with Adam for steps 1 and 2 (zero_grad(set_to_none), graphcost's
loss — lm_loss.py: a language model's cross-entropy, else the sum of the floating outputs —,
backward, step; step 2 is the lower of steps 2 and 3 under fully_shard, see ``_run_case``),
each step under a fresh tracker:
FSDPMemTracker for fully_shard, MemTracker for the others (tracking the model and the optimizer
that holds the state: ZeroRedundancyOptimizer's local one). ``fake=True`` runs one process
with PyTorch's fake process group (collectives are no-ops), which lets fully_shard run at any
world size in one process.

DDP's gradient buckets live in C++; MemTracker counts them where it first sees them (as
``Temp`` in step 1, ``Activation`` in step 2, where DDP rebuilds them in forward), so a comm
hook records the real bucket tensors and they are reported apart, as ``Buckets``.
Nothing here prints; results are plain dicts (category → bytes at each rank's peak).
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
from dataclasses import asdict, dataclass, field

from ...passes.choices import OptimizerImpl, Strategy
from .case_meshes import case_mesh, data_mesh, expert_ranks, fully_shard_case
from .float8_plan import after_step, to_float8


@dataclass(frozen=True)
class Case:
    model: str                               # a zoo model
    strategy: str                            # ddp | zero1 | zero2 | zero3 | fsdp
    batch: int = 2                           # per rank
    input_shapes: tuple = ()                 # ((name, shape), …) instead of the zoo's
    units: tuple[str, ...] = ()              # module paths to fully_shard (then the root)
    optimizer_impl: str = "forloop"
    # a precision recipe (passes/training/precision.py): bf16-mixed runs the forward under CPU
    # autocast; bf16-true casts the module (and float inputs) to bf16; bf16-master is FSDP2's
    # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) over fp32 shards
    precision: str = "fp32"
    # HSDP: fully_shard on a (dp_replicate, dp_shard) mesh of this many replica groups
    replicate: int = 1
    # tensor parallel over this many ranks (innermost): DTensor's plan for a Llama-style
    # decoder (tensor_plan.py); the data strategy over the rest (ddp over 1: none)
    tp: int = 1
    # expert parallel over this many of the dp_shard × cp ranks (expert_plan.py: torchtitan's
    # all-to-all dispatch); each experts module fully_shard over the rest (efsdp), HSDP
    # beside ``replicate``
    ep: int = 1
    # ((name, value), …) for the zoo model's builder (a transformers config's fields)
    overrides: tuple = ()
    # context parallel over this many ranks (context_plan.py: PyTorch's ring attention), each
    # holding its head-tail shard of the same sequences; fully_shard over every rank
    # (torchtitan's dp_shard × cp)
    cp: int = 1
    cp_rotate: str = "allgather"   # how the ring hands on keys and values (PyTorch's)
    # torchao's float8 linears of this recipe (+ FSDP2's float8 all-gather): float8_plan.py
    float8: str = ""
    float8_all_gather: bool = False
    # torchtitan's selective activation checkpointing of each block (sac_plan.py)
    sac: bool = False


@dataclass(frozen=True)
class Measured:
    case: Case
    world: int
    rank: int
    step: int
    peak: int
    categories: dict = field(default_factory=dict)


# The ranks are forked from a fork server that imported torch and graphcost once: a spawned
# rank spent about 4.5 s of CPU importing them again, most of a small case's time on 2 cores.
# Not forked from the measuring process itself: once it has run a backward, a CUDA build's
# autograd keeps device threads a forked child cannot use ("Unable to handle autograd's
# threading in combination with fork-based multiprocessing"). Each rank sets one intra-op
# thread before any work.
PRELOAD = ["torch", "torch.distributed.fsdp", "torch.distributed.pipelining",
           "torch.distributed.tensor", "graphcost.models_zoo",
           "graphcost.analyzer.measure.parallel", "graphcost.analyzer.measure.pipeline"]


def start_ranks(worker, args: tuple, nprocs: int) -> None:
    """``worker(rank, *args)`` in ``nprocs`` processes from the fork server; raises what a
    rank raised."""
    import torch.multiprocessing as mp

    mp.get_context("forkserver").set_forkserver_preload(PRELOAD)
    # (documented, but torch.multiprocessing's __all__ omits it)
    mp.start_processes(worker, args=args, nprocs=nprocs, start_method="forkserver")  # pyright: ignore[reportPrivateImportUsage]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_parallel(cases: list[Case], world: int, *, fake: bool = False,
                     steps: tuple[int, ...] = (1, 2)) -> list[Measured]:
    """Run every case on ``world`` ranks; one Measured per case, rank and step."""
    with tempfile.TemporaryDirectory() as out:
        payload = json.dumps([asdict(c) for c in cases])
        port, nprocs = (0, 1) if fake else (free_port(), world)
        start_ranks(_worker, (world, payload, out, port, fake, steps), nprocs)
        results = []
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name)) as fh:
                for row in json.load(fh):
                    c = row.pop("case")
                    c["input_shapes"] = tuple((k, tuple(v)) for k, v in c["input_shapes"])
                    c["units"] = tuple(c["units"])
                    c["overrides"] = tuple(tuple(kv) for kv in c["overrides"])
                    results.append(Measured(Case(**c), **row))
    return results


def _worker(rank: int, world: int, payload: str, out: str, port: int, fake: bool,
            steps: tuple[int, ...]) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    if fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    else:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    _freeze_imports()
    rows = []
    try:
        for c in json.loads(payload):
            case = Case(**{**c, "input_shapes": tuple((k, tuple(v))
                                                      for k, v in c["input_shapes"]),
                           "units": tuple(c["units"]),
                           "overrides": tuple(tuple(kv) for kv in c["overrides"])})
            for step, peak, cats in _run_case(case, rank, steps):
                rows.append(dict(case=asdict(case), world=world, rank=rank, step=step,
                                 peak=peak, categories=cats))
            dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank:04d}.json"), "w") as fh:
        json.dump(rows, fh)


def _freeze_imports() -> None:
    """Import what the cases use, then gc.freeze() what is alive: those ~290,000 objects
    (torch, torch._dynamo through capture.py, sympy) live as long as the process, and the
    full collection before each tracked step (_run_case) then scans only what the cases
    made (scanning them took ~0.2 s a step)."""
    import gc

    import torch.distributed._tools.fsdp2_mem_tracker  # noqa: F401
    import torch.distributed._tools.mem_tracker  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.optim  # noqa: F401

    from ... import models_zoo  # noqa: F401
    from ..frontends.torch import capture  # noqa: F401
    from . import reference  # noqa: F401
    gc.freeze()


STEADY_REPEATS = 2


def _run_case(case: Case, rank: int, steps):
    import gc

    import torch

    from .reference import held_loss_of
    from .tensor_plan import loss_context

    model, args = _model_and_inputs(case, rank)
    model, opt, tracker_for, buckets = _wrap(model, case, case_mesh(case))
    autocast = case.precision == "bf16-mixed"
    out = []
    # Under fully_shard, steps 2 and 3 are the same steady state (Adam's state exists): step 2
    # is reported as the lower of the two, because on a loaded machine gloo's thread may free
    # a collective's buffer late in one of them and lift that step's peak by a buffer it does
    # not hold. (Not DDP: from step 3 its gradients are views into the buckets. Tensor
    # parallelism alone has no DDP wrapper: its steps 2 and 3 are alike too.)
    import torch.distributed as dist
    alone = case.tp > 1 and case.strategy == Strategy.DDP and dist.get_world_size() == case.tp
    sharded = Strategy(case.strategy).shards_gradients or alone
    last = max(steps) + (STEADY_REPEATS - 1 if sharded and max(steps) == 2 else 0)
    for step in range(1, last + 1):
        tracker = tracker_for()
        # Cyclic garbage is collected before the step and the collector paused during it:
        # when it ran inside a tracked step, the tracker's peak for some rank and step grew
        # by about one unit's buffers, at random. Pausing it can only keep more memory alive
        # (cycles wait), yet every rank then measures the same, lower peak: those larger
        # peaks were the tracker's, not memory the step holds.
        gc.collect()
        gc.disable()
        try:
            with tracker:
                opt.zero_grad(set_to_none=True)
                # the loop holds what the model returned beside its own loss (a transformers
                # LM's logits) through the backward, as graphcost's step does (lm_loss.py)
                with loss_context(model, case.tp):
                    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                        loss, held = held_loss_of(model, args)
                    loss.backward()
                    del loss, held
                opt.step()
                if case.float8_all_gather:
                    after_step(model)
        finally:
            gc.enable()
        snap = next(iter(tracker.get_tracker_snapshot("peak").values()), {})
        cats = {getattr(k, "value", str(k)): int(v) for k, v in snap.items() if v}
        if buckets:
            _move_buckets(tracker, cats, buckets)
        total = cats.pop("Total", 0)
        if step in steps:
            out.append((step, total, cats))
        elif step > 2 and out and out[-1][0] == 2 and total < out[-1][1]:
            out[-1] = (2, total, cats)
    return out


def _model_and_inputs(case: Case, rank: int):
    """The zoo model (seeded; built with the case's overrides) and the rank's inputs (seeded
    by rank), cast for bf16-true."""
    import torch

    from ... import models_zoo
    from ..frontends.torch.capture import real_inputs

    spec = models_zoo.get(case.model)
    if case.overrides:
        torch.manual_seed(0)
        model = spec.build(**dict(case.overrides)).train()
    else:
        model = models_zoo.build_model(case.model, eval=False)
    shapes = dict(case.input_shapes) or models_zoo.input_shapes(case.model, case.batch)
    gen_ranges = {k: (int(v[0]), int(v[1])) for k, v in spec.int_ranges.items()}
    # (a context-parallel group's ranks, and their tensor-parallel ones, share sequences; so
    # do an expert-parallel case's tensor-parallel ones, whose tokens the router sees alike)
    torch.manual_seed(rank // (case.cp * case.tp) if case.cp > 1 or case.ep > 1 else rank)
    args = tuple(real_inputs(shapes, spec.input_dtypes, gen_ranges).values())
    if case.cp > 1:
        from .context_plan import sequence_shard
        args = tuple(sequence_shard(a, rank // case.tp % case.cp, case.cp) for a in args)
    if case.precision == "bf16-true":
        model = model.to(torch.bfloat16)
        args = tuple(a.to(torch.bfloat16) if a.is_floating_point() else a for a in args)
    if case.float8:
        to_float8(model, case.float8, case.float8_all_gather)
    return model, args


def _wrap(model, case: Case, mesh=None):
    """The model and optimizer as the strategy wraps them, a tracker factory, and (DDP) the
    list its comm hook fills with the gradient buckets."""
    import torch

    from .reference import skip_frozen

    if mesh is not None and case.tp > 1:
        from .tensor_plan import apply_tensor_parallel
        apply_tensor_parallel(model, mesh["tp"])
    experts, experts_mesh = expert_ranks(
        model, case, mesh["tp"].get_group() if mesh is not None and case.tp > 1 else None)
    if case.cp > 1:
        from .context_plan import apply_context_parallel
        assert mesh is not None   # (case_mesh makes one with cp)
        apply_context_parallel(model, mesh["cp"], case.cp_rotate)
    if case.sac:   # (torchtitan: after tp and cp, before fully_shard)
        from .sac_plan import apply_sac
        apply_sac(model)
    mesh = data_mesh(mesh) if mesh is not None else None
    if case.tp > 1:
        if mesh is None and case.strategy == Strategy.DDP:   # tp alone: no wrapper
            from torch.distributed._tools.mem_tracker import MemTracker
            opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad],
                                   foreach=case.optimizer_impl == OptimizerImpl.FOREACH)

            def alone():
                t = MemTracker()
                t.track_external(model, opt)
                return t
            return model, opt, alone, None
    trainable = [p for p in model.parameters() if p.requires_grad]
    foreach = case.optimizer_impl == OptimizerImpl.FOREACH
    if Strategy(case.strategy).shards_gradients:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        fully_shard_case(model, case, mesh, experts, experts_mesh)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad],
                               foreach=foreach)
        return model, opt, lambda: FSDPMemTracker(model, opt), None
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(model)
    buckets: list = []
    ddp.register_comm_hook(buckets, _recording_allreduce)
    if case.strategy == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(trainable, optimizer_class=torch.optim.Adam,
                                      foreach=foreach)
        holder = opt.optim        # the local optimizer holds this rank's state
    else:
        opt = holder = torch.optim.Adam(trainable, foreach=foreach)

    def tracker():
        t = MemTracker()
        skip_frozen(t, ddp)
        t.track_external(ddp, holder)
        return t
    return ddp, opt, tracker, buckets


def _recording_allreduce(state: list, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    state.append(bucket.buffer().untyped_storage())
    # None: the default group (torch's annotation says a ProcessGroup is required)
    return allreduce_hook(None, bucket)  # pyright: ignore[reportArgumentType]


def _move_buckets(tracker, cats: dict, buckets: list) -> None:
    """Report DDP's bucket storages apart from the category MemTracker counted them in."""
    seen = {}
    for st in buckets:
        winfo = tracker._WINFO.get(st, (None, None))[0]
        if winfo is not None:
            seen[id(winfo)] = winfo
    buckets.clear()
    for winfo in seen.values():
        key = getattr(winfo.reftype, "value", str(winfo.reftype))
        moved = min(winfo.mem_consumed, cats.get(key, 0))
        if moved:
            cats[key] -= moved
            cats["Buckets"] = cats.get("Buckets", 0) + moved
