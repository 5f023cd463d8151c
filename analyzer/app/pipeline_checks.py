"""What a pipeline-parallel analysis (analyzer/app/pipeline_stages.py) is asked, checked
before any stage is traced: its data dimension fully_shard's, its loss the schedule's, and what
the schedules model (a zero-bubble schedule beside checkpointing is refused, with why)."""
from __future__ import annotations

from ...passes.choices import Loss, Strategy
from ...passes.errors import GraphcostError, opt
from ...passes.parallel.schedules import zero_bubble
from ...passes.parallel.spec import ParallelSpec
from .request import Request

SHARDING = (Strategy.FSDP, Strategy.ZERO3, Strategy.ZERO2)   # fully_shard's


def check_pipeline(request: Request, spec: ParallelSpec) -> None:
    """Refused (GraphcostError): what a pipeline's analysis does not model."""
    _check_data(spec)
    _check_step(request, spec)


def _check_step(request: Request, spec: ParallelSpec) -> None:
    """A pipeline's loss is its schedule's, on the last stage: torchtitan's cross-entropy of
    fp32 logits (``ce``, what ``auto`` gives a decoder); the other stages backpropagate the
    gradient they receive. A checkpoint budget's search runs on one program, the whole
    model's, where a stage's rank runs another."""
    plan = request.passes.checkpoint
    if plan is not None and plan.budget is not None:
        raise GraphcostError(f"{opt('checkpoint.budget')} beside pipeline stages: its search "
                             "runs on one program, the whole model's, not each stage's: give "
                             f"the plan itself ({opt('checkpoint.every')}, or a selective one)")
    asked = request.load.loss
    if asked not in (Loss.AUTO, Loss.CE):
        raise GraphcostError(f"{opt('loss', value=asked)} beside pipeline stages: the last "
                             "stage computes the schedule's loss, torchtitan's cross-entropy of "
                             f"fp32 logits ({opt('loss', value=Loss.CE)}); modelled only so")
    _check_zero_bubble(request, spec)


def _check_zero_bubble(request: Request, spec: ParallelSpec) -> None:
    """A zero-bubble schedule's split backward is modelled on a plain stage program:
    checkpointed blocks recompute in its I and hold what W needs, which is not modelled —
    measured, they hold more than without checkpoints (benchmarks/accuracy_pipelines.py:
    llama_tiny's 4 blocks, 2 ranks of 2 stages, 18.6 and 29.8 MB a rank against 14.9 and
    21.8), which the refusal says."""
    if zero_bubble(spec.schedule) and request.passes.checkpoint is not None:
        raise GraphcostError(f"{opt('checkpoint')} beside "
                             f"{opt('parallel.schedule', value=spec.schedule)}: what "
                             "a checkpointed block recomputes in the input half of its "
                             "backward and keeps for the weight half is not modelled (PyTorch "
                             "holds it: measured, 25-37% more a rank than without checkpoints)")


def _check_data(spec: ParallelSpec) -> None:
    """A pipeline's data dimension is fully_shard's (torchtitan's), or none."""
    if spec.world_size is None:
        raise GraphcostError(f"{opt('parallel.world_size', value='auto')} with pipeline "
                             "stages: give the data dimension's size")
    if spec.strategy not in SHARDING and spec.world_size * spec.replicate > 1:
        raise GraphcostError(f"{opt('parallel', value=spec.strategy)} beside pipeline stages: "
                             "modelled for fully_shard (dp_shard, HSDP), as torchtitan runs "
                             "pipelines; ddp and zero1 are not")
    # (a stage's fully_shard keeps everything on the device, each block and the stage a unit)
    for name, value in (("parallel.offload", spec.offload),
                        ("parallel.units", ",".join(spec.units or ()))):
        if value:
            raise GraphcostError(f"{opt(name, value=value)} beside pipeline stages: not "
                                 "modelled (a stage shards each block and itself, on the "
                                 "device, as torchtitan does)")
