"""torchao's float8 training linears as torchtitan applies them, for a real measured step
(analyzer/measure/parallel.py, ``Case.float8``): the model converted before it is
parallelized (torchtitan's model converters run first), and with FSDP2's float8 all-gather
the weights' scales precomputed after each optimizer step
(``precompute_float8_dynamic_scale_for_fsdp``, torchtitan's post-optimizer hook). The
tensor-parallel styles of float8 linears are torchao's (tensor_plan.py)."""
from __future__ import annotations


def to_float8(model, recipe: str, all_gather: bool = False) -> None:
    """torchao's convert_to_float8_training as torchtitan's float8 converter calls it
    (components/quantization/float8.py: its module filter written out here, not graphcost's
    converter, so the measured model does not lean on what is being checked);
    ``all_gather``: ``enable_fsdp_float8_all_gather``."""
    from dataclasses import replace

    import torch
    from torchao.float8 import (  # pyright: ignore[reportMissingImports]
        Float8LinearConfig,
        convert_to_float8_training,
    )

    def eligible(module, fqn: str) -> bool:
        if not isinstance(module, torch.nn.Linear):
            return True
        return fqn.rpartition(".")[2] not in ("output", "lm_head") and \
            module.in_features % 16 == 0 and module.out_features % 16 == 0
    config = Float8LinearConfig.from_recipe_name(recipe)
    if all_gather:
        config = replace(config, enable_fsdp_float8_all_gather=True)
    convert_to_float8_training(model, config=config, module_filter_fn=eligible)


def after_step(model) -> None:
    """What torchtitan runs after the optimizer's step with the float8 all-gather: each
    weight's scale for the next all-gather, from its shards' amax."""
    from torchao.float8 import (  # pyright: ignore[reportMissingImports]
        precompute_float8_dynamic_scale_for_fsdp,
    )
    precompute_float8_dynamic_scale_for_fsdp(model)
