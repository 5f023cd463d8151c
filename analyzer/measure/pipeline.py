"""Per-stage memory of real pipeline-parallel training on this CPU (``torch.distributed.
pipelining`` on gloo ranks, 127.0.0.1): what graphcost's per-stage predictions (passes/
parallel/pipeline.py) are checked against.

Each rank builds the zoo model with seeded weights, cuts its stage as graphcost does
(frontends/torch/pipeline_stages.py), wraps it in ``PipelineStage`` and runs ``ScheduleGPipe``
or ``Schedule1F1B`` with torchtitan's loss (fp32 cross-entropy) and Adam, steps 1 to 3.
MemTracker cannot watch a pipelined step (its module hooks meet the schedule's
``autograd.grad`` and raise), so ``LiveBytes`` counts instead: a dispatch mode that adds
every storage an op makes while it is active, drops it when the storage is freed, and starts
from the parameters, buffers and optimizer state — the peak of what is alive. What the
library allocated in an earlier step and keeps (its receive buffers) is not counted.
"""
from __future__ import annotations

import json
import os
import tempfile
import weakref

from .parallel import free_port


class LiveBytes:
    """A dispatch mode's peak of the bytes alive (see the module docstring)."""

    def __init__(self, known=()):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        tracker = self
        self.seen: dict[int, int] = {}
        self.live = 0
        for t in known:
            self._add(t)
        self.peak = self.live

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                        tracker._add(t)
                tracker.peak = max(tracker.peak, tracker.live)
                return out
        self.mode = _Mode()

    def _add(self, t) -> None:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self.seen or st.nbytes() == 0:
            return
        self.seen[key] = st.nbytes()
        self.live += st.nbytes()
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self.seen.pop(key, 0)


def measure_pipeline(model: str, schedule: str, stages: int, batch: int,
                     microbatches: int) -> dict[int, list[int]]:
    """Each stage's peak bytes in steps 1, 2 and 3: {stage: [peak, peak, peak]}."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(stages, free_port(), out, model, schedule, batch,  # pyright: ignore[reportPrivateImportUsage]
                                microbatches), nprocs=stages)
        result = {}
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name)) as fh:
                row = json.load(fh)
            result[row["stage"]] = row["peaks"]
    return result


def _worker(rank: int, stages: int, port: int, out: str, model: str, schedule: str,
            batch: int, micro: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from ... import models_zoo
    from ..frontends.torch.pipeline_stages import pipeline_stage

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=stages)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    whole = models_zoo.build_model(model, eval=False)
    module = pipeline_stage(whole, rank, stages)
    stage = PipelineStage(module, rank, stages, torch.device("cpu"))
    kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    sched = kind(stage, micro, loss_fn=_loss)
    opt = torch.optim.Adam(module.parameters(), foreach=False)
    shapes = models_zoo.input_shapes(model, batch)
    ids = torch.randint(0, 100, tuple(next(iter(shapes.values()))))
    peaks = []
    try:
        for _ in range(3):
            known = [*module.parameters(), *module.buffers(),
                     *(v for st in opt.state.values() for v in st.values()
                       if isinstance(v, torch.Tensor))]
            live = LiveBytes(known)
            with live.mode:
                opt.zero_grad(set_to_none=True)
                if rank == 0:
                    sched.step(ids)
                elif rank == stages - 1:
                    sched.step(target=ids, losses=[])
                else:
                    sched.step()
                opt.step()
            peaks.append(live.peak)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"stage{rank:03d}.json"), "w") as fh:
        json.dump({"stage": rank, "peaks": peaks}, fh)


def _loss(pred, labels):
    """torchtitan's cross_entropy_loss: the logits upcast to fp32."""
    import torch.nn.functional as F
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
