"""The tensor-parallel plan a real measurement applies with DTensor (analyzer/measure/
parallel.py, Case.tp): the plan graphcost's rank program is rewritten by (frontends/torch/
tensor_parallel.py), in PyTorch's own ``parallelize_module`` styles, on the same module names.

* a transformers model: its ``base_model_tp_plan`` — q/k/v, gate/up ``ColwiseParallel()``,
  o, down ``RowwiseParallel()``, the token embedding ``RowwiseParallel(input_layouts=
  Replicate())``, the head ``ColwiseParallel(output_layouts=Replicate())``;
* any other (torchtitan's ``parallelize_llama``): sequence parallel — the embedding's output
  ``Shard(1)``, the norms ``SequenceParallel()``, each attention/MLP module's first input
  redistributed ``Shard(1) -> Replicate()`` (``PrepareModuleInput``, here a pre-hook: the
  zoo's modules take (x, cos, sin) positionally), o and down ``RowwiseParallel(
  output_layouts=Shard(1))``, the head ``ColwiseParallel(input_layouts=Shard(1),
  output_layouts=Shard(-1), use_local_output=False)``, its loss under ``loss_parallel()``
  (``loss_context``).
"""
from __future__ import annotations


def loss_context(model, tp: int):
    """What the step's loss and backward run under: ``loss_parallel()`` for torchtitan's
    plan (its cross-entropy on the sharded logits), else nothing."""
    import contextlib

    from ..frontends.torch.tensor_parallel import is_transformers
    if tp == 1 or is_transformers(model):
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel
    return loss_parallel()


def apply_tensor_parallel(model, mesh, *, sequence: bool | None = None) -> None:
    """``model`` parallelized over the 1-D ``mesh`` in place, its head counts the rank's;
    ``sequence`` False: the plan without sequence parallelism whatever the model (a serving
    engine's, frontends/torch/tensor_parallel.py)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from ..frontends.torch.tensor_parallel import (
        COLWISE,
        ROWWISE,
        is_transformers,
        local_head_counts,
        vocab_layers,
    )

    if sequence is None:
        sequence = not is_transformers(model)
    seq = {"output_layouts": Shard(1)} if sequence else {}
    names = {id(m): n for n, m in model.named_modules()}
    plan: dict = {}
    parents = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in COLWISE:
            plan[name] = ColwiseParallel()
            parents += [name.rsplit(".", 1)[0]]
        elif leaf in ROWWISE:
            plan[name] = RowwiseParallel(**seq)
        elif sequence and type(module).__name__.endswith("Norm"):
            plan[name] = SequenceParallel()
    tokens, head = vocab_layers(model)
    if tokens is not None:
        plan[names[id(tokens)]] = RowwiseParallel(input_layouts=Replicate(), **seq)
    if head is not None:   # torchtitan's logits stay sharded for loss_parallel()
        plan[names[id(head)]] = ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False) \
            if sequence else ColwiseParallel(output_layouts=Replicate())
    parallelize_module(model, mesh, plan)
    for parent in dict.fromkeys(parents) if sequence else ():
        model.get_submodule(parent).register_forward_pre_hook(_replicated_input(mesh))
    local_head_counts(model, mesh.size())


def _replicated_input(mesh):
    """``PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())`` on
    the first input, the others left as they are."""
    def hook(_module, args):
        from torch.distributed.tensor import DTensor, Replicate, Shard
        x = args[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
        return (x.redistribute(mesh, [Replicate()]), *args[1:])
    return hook
