"""The tensor-parallel plan a real measurement applies with DTensor (analyzer/measure/
parallel.py, Case.tp): the plan graphcost's rank program is rewritten by (frontends/torch/
tensor_parallel.py), in PyTorch's own ``parallelize_module`` styles, on the same module names.

* a transformers model: its own plan (``tensor_parallel.linear_style``) — the linears it
  names "colwise" ``ColwiseParallel()``, "rowwise" ``RowwiseParallel()``, the token embedding
  ``RowwiseParallel(input_layouts=Replicate())``, the head ``ColwiseParallel(output_layouts=
  Replicate())``;
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
        parallelize_module,
    )

    from ..frontends.torch.tensor_parallel import (
        is_tied,
        is_transformers,
        linear_style,
        vocab_layers,
    )
    from ..frontends.torch.tp_heads import local_head_counts

    gathers = sequence is not False   # (a serving engine's plan gathers no projection)
    if sequence is None:
        sequence = not is_transformers(model)
    seq = {"output_layouts": Shard(1)} if sequence else {}
    names = {id(m): n for n, m in model.named_modules()}
    tokens, head = vocab_layers(model)
    plan, parents, gathered, float8 = _block_plan(model, linear_style(model, gathers),
                                                  sequence, (tokens, head))
    tied = is_tied(tokens, head)
    if tokens is not None:
        plan[names[id(tokens)]] = RowwiseParallel(input_layouts=Replicate(), **seq)
    if head is not None:   # torchtitan's logits stay sharded for loss_parallel()
        plan[names[id(head)]] = ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False) \
            if sequence else ColwiseParallel(output_layouts=Replicate())
    parallelize_module(model, mesh, plan)
    if tied:   # (each style made its own shard of the table: re-tied, as torchtitan does)
        assert tokens is not None and head is not None
        tokens.weight = head.weight
    for parent in dict.fromkeys(parents) if sequence else ():
        model.get_submodule(parent).register_forward_pre_hook(
            _replicated_input(mesh, parent in float8))
    local_head_counts(model, mesh.size(), gathered - set(parents))
    _mla_rope_reduced(model, mesh)


def _mla_rope_reduced(model, mesh) -> None:
    """transformers' own ``"mla_kv_a_proj"`` style on the latent key/value projection its
    plan names so (left whole by the plan above): ``MlaKvAProjParallel``'s output transform,
    its rope key's gradient all-reduced over the mesh's group."""
    from ..frontends.torch.transformers_tp_plan import planned_style
    style = planned_style(model)
    for name, module in model.named_modules():
        if style(name) != "mla_kv_a_proj":
            continue
        from transformers.distributed.tensor_parallel import MlaKvAProjParallel
        config = model.get_submodule(name.rsplit(".", 1)[0]).config   # (the attention's)
        module.register_forward_hook(
            lambda m, _args, out: MlaKvAProjParallel().transform_output_post_forward(
                m, out, mesh, config))


def _block_plan(model, style, sequence: bool, vocab: tuple):
    """(DTensor's plan of the blocks' linears and norms, the modules holding column-wise
    linears, those whose column-wise outputs are gathered whole, those whose input is
    gathered in float8); ``style``: tensor_parallel.linear_style's lookup; the embedding and
    head (``vocab``) are the caller's."""
    import torch
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel

    seq = {"output_layouts": Shard(1)} if sequence else {}
    plan: dict = {}
    parents: list[str] = []
    gathered: set[str] = set()
    float8: set[str] = set()
    for name, module in model.named_modules():
        colwise, rowwise = _styles(module)
        kind = style(name) if isinstance(module, torch.nn.Linear) and \
            module not in vocab else None
        if kind == "colwise":
            plan[name] = colwise()
            parents += [name.rsplit(".", 1)[0]]
            if colwise is not ColwiseParallel:
                float8.add(parents[-1])
        elif kind == "colwise_gather_output":
            plan[name] = colwise(output_layouts=Replicate())
            gathered.add(name.rsplit(".", 1)[0])
        elif kind == "rowwise_split_input":
            plan[name] = rowwise(input_layouts=Replicate())
        elif kind == "rowwise":
            plan[name] = rowwise(**seq)
        elif sequence and type(module).__name__.endswith("Norm"):
            plan[name] = SequenceParallel()
    return plan, parents, gathered, float8


def _styles(module):
    """(column-wise style, row-wise style) for a q/k/v/o or MLP linear: torchao's float8
    styles for a float8 linear (torchtitan's float8 tensor-parallel plan, tensorwise), else
    PyTorch's."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from ..frontends.torch.float8_linears import float8_spec
    if float8_spec(module) is None:
        return ColwiseParallel, RowwiseParallel
    from torchao.float8.float8_tensor_parallel import (  # pyright: ignore[reportMissingImports]
        Float8ColwiseParallel,
        Float8RowwiseParallel,
    )
    return Float8ColwiseParallel, Float8RowwiseParallel


def _replicated_input(mesh, float8: bool = False):
    """``PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate())`` on
    the first input, the others left as they are; ``float8``: torchao's
    ``PrepareFloat8ModuleInput``, the shard cast to float8 (tensorwise) before the gather."""
    def hook(_module, args):
        from torch.distributed.tensor import DTensor, Replicate, Shard
        x = args[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, mesh, [Shard(1)], run_check=False)
        if float8:
            import torch
            from torchao.float8.float8_scaling_utils import (  # pyright: ignore[reportMissingImports]
                hp_tensor_to_float8_dynamic,
            )
            from torchao.float8.float8_training_tensor import (  # pyright: ignore[reportMissingImports]
                GemmInputRole,
                LinearMMConfig,
            )
            # (a DTensor of float8 shards, as torchao's PrepareFloat8ModuleInput makes it)
            x = hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, LinearMMConfig(),
                                            gemm_input_role=GemmInputRole.INPUT)
        assert isinstance(x, DTensor)
        return (x.redistribute(mesh, [Replicate()]), *args[1:])
    return hook
