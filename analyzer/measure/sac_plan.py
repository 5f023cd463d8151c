"""torchtitan's selective activation checkpointing as a real measurement applies it
(analyzer/measure/parallel.py, ``Case.sac``): each block of the model's layer list run under
``torch.utils.checkpoint`` with ``create_selective_checkpoint_contexts`` and torchtitan's op
policy (torchtitan/distributed/activation_checkpoint.py ``_get_custom_policy``): save the
outputs of the ops of its list — the same names graphcost's SAC reads,
passes/costs/sac_policy.py ``TORCHTITAN_SAC`` — except every second ``mm`` of a block,
recompute the rest."""
from __future__ import annotations

import functools


def titan_context():
    """A fresh ``context_fn`` pair of torchtitan's policy (its mm count per checkpoint call)."""
    from collections import defaultdict

    import torch
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        create_selective_checkpoint_contexts,
    )

    from ...passes.costs.sac_policy import MM, TORCHTITAN_SAC

    def op(name: str):   # (None: an op this torch build lacks)
        namespace, packet, overload = name.split(".")
        try:
            return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
        except (AttributeError, RuntimeError):
            return None

    save = {f for f in map(op, TORCHTITAN_SAC) if f is not None}
    mm = op(MM)
    meta: dict = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == mm:
            meta[f"{mode}_mm_count"] += 1
        keep = func in save and not (func == mm and meta[f"{mode}_mm_count"] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def apply_sac(model) -> None:
    """Each module of the model's block list (its first ``ModuleList``) checkpointed with
    torchtitan's policy, in place."""
    import torch
    from torch.utils.checkpoint import checkpoint

    blocks = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList))
    for block in blocks:
        f = block.forward
        block.forward = functools.partial(
            lambda *a, f=f, **k: checkpoint(f, *a, use_reentrant=False,
                                            context_fn=titan_context, **k))
