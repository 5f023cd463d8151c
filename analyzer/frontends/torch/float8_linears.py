"""torchao's float8 training linears (``torchao.float8.Float8Linear``), traced as torchao runs
them.

A Float8Linear multiplies through ``matmul_with_hp_or_float8_args``, an autograd function
whose forward casts the input and weight to float8 (scales from their amax), multiplies them
with ``torch._scaled_mm`` and saves the two high-precision tensors; its backward casts again
(the gradient to e5m2) for the two gradient products. Its float8 tensors are a tensor
subclass, which ``torch.export`` cannot trace (non-strict export stops at its reshape:
"Unable to cast NotImplemented to Tensor", torch 2.13 with torchao 0.18). AOTAutograd's joint
trace can: it runs the subclass's dispatch down to plain aten ops. So while the forward is
exported, each call is one opaque op (``graphcost::float8_matmul``, the config by a key);
when the joint graph is traced (exported_run.py), that op runs torchao's own function with
the module's own config — its casts, ``_scaled_mm`` calls and saved tensors as torchao's code
makes them.

``convert`` swaps a module's linears as torchtitan's float8 converter does (torchao's
``convert_to_float8_training`` with torchao's recipe; the output projection and any linear
with a dimension not divisible by 16 kept).

FSDP2's float8 all-gather (``all_gather=True``: torchao's ``enable_fsdp_float8_all_gather``,
tensorwise only): torchao's sharded weight casts its shard to float8 before FSDP2 gathers it
(``fsdp_pre_all_gather``, the scale precomputed after the optimizer's step) and wraps the
gathered bytes as a float8 tensor (``fsdp_post_all_gather``), so the product receives its
weight cast already and casts it neither in forward nor in backward. The joint trace does
the same: the weight reaches torchao's function through ``fsdp_float8_weight``, one node
that stands for the gathered float8 weight (its rule: a view of the parameter, which the
FSDP pass sizes at one byte an element: passes/parallel/units.py) with its scale, its
gradient passed through to the parameter as torchao's backward returns it.

Beside tensor parallelism (tensor_parallel.py, torchtitan's float8 plan: torchao's styles,
tensorwise): a rank's sharded linear multiplies its shard through the same product
(``float8_linear``), and an attention or MLP module's sequence-sharded input is cast to
float8 before it is gathered (``PrepareFloat8ModuleInput``): while exported one node
(``float8_gather_seq``), when the joint graph is traced torchao's cast and the gather of its
float8 bytes (``run_float8_gather``), the products then finding their input cast already.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from ....passes.errors import GraphcostError, first_line, opt

# the output projection torchtitan keeps in high precision (its filter_fqns), by the names
# transformers (``lm_head``) and torchtitan (``output``) give it
HEADS = ("lm_head", "output")
# key -> (torchao's function, the module's linear_mm_config, its Float8LinearConfig)
_CONFIGS: dict[int, tuple] = {}


@torch.library.custom_op("graphcost::float8_matmul", mutates_args=())
def float8_matmul(input: torch.Tensor, weight_t: torch.Tensor, key: int) -> torch.Tensor:
    """A Float8Linear's product (``input @ weight_t``) while the forward is exported; its
    float8 casts are traced later, by torchao's own function (``run_float8_matmul``)."""
    return input @ weight_t


@float8_matmul.register_fake
def _(input: torch.Tensor, weight_t: torch.Tensor, key: int) -> torch.Tensor:
    return input.new_empty((*input.shape[:-1], weight_t.shape[-1]))


def torchao_float8():
    """torchao's float8 package; GraphcostError where torchao is absent or does not import
    beside this torch."""
    from .optional_imports import torchao_problem

    problem = torchao_problem()
    if problem:
        raise GraphcostError(f"{opt('float8')}: {problem}")
    try:  # (quietly: this package's __init__.py)
        import torchao.float8 as float8  # pyright: ignore[reportMissingImports]
    except ImportError:
        raise GraphcostError(f"{opt('float8')}: float8 training linears are torchao's: pip "
                             "install 'graphcost[float8]' (torchao)") from None
    return float8


def convert(module: torch.nn.Module, recipe: str,
            all_gather: bool = False) -> tuple[int, int]:
    """Swap ``module``'s linears for torchao's Float8Linear in place, as torchtitan's float8
    converter does: (how many were swapped, of how many linears); GraphcostError: none.
    ``all_gather``: their weights reach the product gathered in float8 (FSDP2's float8
    all-gather), set on each linear's config after the swap (torchao's own converter would
    make the weights a tensor subclass, which the trace cannot take as a parameter)."""
    float8 = torchao_float8()
    if float8_linears(module):
        raise GraphcostError(f"{opt('float8', value=recipe)}: the model's linears are "
                             "torchao's float8 ones already; leave it out to trace them as "
                             "they are")
    linears = sum(isinstance(m, torch.nn.Linear) for m in module.modules())

    def eligible(mod: torch.nn.Module, fqn: str) -> bool:
        if not isinstance(mod, torch.nn.Linear):
            return True  # (a container: torchao walks into it)
        return fqn.rpartition(".")[2] not in HEADS and \
            mod.in_features % 16 == 0 and mod.out_features % 16 == 0
    config = float8.Float8LinearConfig.from_recipe_name(recipe)
    float8.convert_to_float8_training(module, config=config, module_filter_fn=eligible)
    swapped = float8_linears(module)
    if swapped and all_gather:
        _gather_in_float8(module)
    if not swapped:
        raise GraphcostError(f"{opt('float8', value=recipe)}: no linear of this model takes "
                             "float8 (torchtitan's rule: both dimensions divisible by 16, the "
                             "output projection kept)")
    return swapped, linears


def _gather_in_float8(module: torch.nn.Module) -> None:
    """Each Float8Linear's config with ``enable_fsdp_float8_all_gather`` (torchao's check
    refuses a recipe other than tensorwise: one line naming it)."""
    from dataclasses import replace

    from torchao.float8.float8_linear import Float8Linear  # pyright: ignore[reportMissingImports]
    for m in module.modules():
        if isinstance(m, Float8Linear):
            try:
                m.config = replace(m.config, enable_fsdp_float8_all_gather=True)
            except AssertionError as exc:
                raise GraphcostError(f"{opt('parallel.float8_all_gather')}: torchao says: "
                                     f"{first_line(exc, 160)}") from None


def float8_linears(module: torch.nn.Module) -> int:
    """How many of ``module``'s linears are torchao's Float8Linear (0 without torchao)."""
    import sys
    if "torchao.float8.float8_linear" not in sys.modules:
        return 0
    kind = sys.modules["torchao.float8.float8_linear"].Float8Linear
    return sum(isinstance(m, kind) for m in module.modules())


@contextmanager
def float8_exported() -> Iterator[None]:
    """While ``torch.export`` traces: each Float8Linear's product one ``float8_matmul`` node
    (nothing changes where torchao is not imported)."""
    import sys
    linear = sys.modules.get("torchao.float8.float8_linear")
    if linear is None:
        yield
        return
    own = linear.matmul_with_hp_or_float8_args

    class Opaque:
        @staticmethod
        def apply(input, weight_t, linear_mm_config, config):
            key = id(config)
            _CONFIGS[key] = (own, linear_mm_config, config)
            return float8_matmul(input, weight_t, key)
    setattr(linear, "matmul_with_hp_or_float8_args", Opaque)  # (read as a global there)
    try:
        yield
    finally:
        setattr(linear, "matmul_with_hp_or_float8_args", own)


def is_float8_matmul(target) -> bool:
    return target is torch.ops.graphcost.float8_matmul.default


def run_float8_matmul(args, kwargs) -> torch.Tensor:
    """The exported ``float8_matmul`` node run as torchao runs the product (its autograd
    function, with the module's config)."""
    input, weight_t, key = (*args, *kwargs.values())
    own, linear_mm_config, config = _CONFIGS[key]
    rows = input.numel() // max(1, input.shape[-1])
    if rows % 16:  # (torch._scaled_mm's rule for the weight gradient's inner dimension)
        raise GraphcostError(f"{opt('float8')}: a float8 linear multiplies {rows} rows (the "
                             "batch's tokens or samples); its weight-gradient product needs "
                             "a multiple of 16 (torch._scaled_mm's rule)")
    if config.enable_fsdp_float8_all_gather:
        weight_t = _Gathered.apply(weight_t, linear_mm_config)
    return own.apply(input, weight_t, linear_mm_config, config)


def float8_spec(module: torch.nn.Module) -> tuple | None:
    """A Float8Linear's (linear_mm_config, config), which a tensor-parallel rank's linear
    built from it multiplies with (tensor_parallel.py); None for any other module."""
    import sys
    linear = sys.modules.get("torchao.float8.float8_linear")
    if linear is None or not isinstance(module, linear.Float8Linear):
        return None
    return module.linear_mm_config, module.config


def float8_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  spec: tuple) -> torch.Tensor:
    """``Float8Linear.forward`` on a rank's weight shard: torchao's product (its autocast
    rule, its function: one opaque node while exported) and the bias added after."""
    import sys
    if torch.is_autocast_enabled():   # (torchao reads CUDA autocast's dtype)
        input = input.to(torch.get_autocast_gpu_dtype())
    linear = sys.modules["torchao.float8.float8_linear"]
    out = linear.matmul_with_hp_or_float8_args.apply(input, weight.t(), *spec)
    return out if bias is None else out + bias.to(out.dtype)


@torch.library.custom_op("graphcost::float8_gather_seq", mutates_args=())
def float8_gather_seq(x: torch.Tensor, group: int, key: int) -> torch.Tensor:
    """While torch.export traces: torchao's ``PrepareFloat8ModuleInput`` — a sequence
    shard cast to float8, then gathered (dim 1) from the ``group`` ranks — one node; its cast
    and gather are traced later (``run_float8_gather``)."""
    return x.repeat(1, group, *([1] * (x.dim() - 2)))


@float8_gather_seq.register_fake
def _(x: torch.Tensor, group: int, key: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], x.shape[1] * group, *x.shape[2:]))


def gather_seq_in_float8(x: torch.Tensor, group: int, spec: tuple) -> torch.Tensor:
    """The module input's all-gather in float8 (``float8_gather_seq``, keyed by the
    config its products run)."""
    key = id(spec[1])
    _CONFIGS.setdefault(key, (None, *spec))
    return torch.ops.graphcost.float8_gather_seq(x, group, key)


def is_float8_gather(target) -> bool:
    return target is torch.ops.graphcost.float8_gather_seq.default


def run_float8_gather(args, kwargs) -> torch.Tensor:
    """The exported ``float8_gather_seq`` node as torchao runs it: the shard cast to float8
    (torchao's tensorwise cast), its float8 bytes gathered, the products' input a float8
    tensor they need not cast; the gradient reduce-scattered back onto the shard."""
    x, group, key = (*args, *kwargs.values())
    return _Float8Gather.apply(x, group, _CONFIGS[key][1])


class _Float8Gather(torch.autograd.Function):
    """torchao's ``PrepareFloat8ModuleInput`` on one rank: the shard cast to float8
    (tensorwise), its bytes gathered on dim 1; the gradient (high precision, the products'
    inputs' gradients summed) reduce-scattered back onto the shard."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: int, linear_mm_config):  # pyright: ignore[reportIncompatibleMethodOverride]
        from torchao.float8.float8_scaling_utils import (  # pyright: ignore[reportMissingImports]
            hp_tensor_to_float8_dynamic,
        )
        from torchao.float8.float8_training_tensor import (  # pyright: ignore[reportMissingImports]
            Float8TrainingTensor,
            GemmInputRole,
        )

        from .tp_collectives import tp_gather_seq
        ctx.group = group
        shard = hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, linear_mm_config,
                                            gemm_input_role=GemmInputRole.INPUT)
        return Float8TrainingTensor(tp_gather_seq(shard._data, group), shard._scale, x.dtype,
                                    linear_mm_config, GemmInputRole.INPUT)

    @staticmethod
    def backward(ctx, grad):  # pyright: ignore[reportIncompatibleMethodOverride]
        from .tp_collectives import tp_scatter_seq
        return tp_scatter_seq(grad, ctx.group), None, None


@torch.library.custom_op("graphcost::fsdp_float8_weight", mutates_args=())
def fsdp_float8_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight as FSDP2's float8 all-gather hands it to the product: float8 bytes of the
    same shape and layout (the kernel casts; the rule says it is the parameter itself,
    gathered outside the graph)."""
    return weight.to(torch.float8_e4m3fn)


@fsdp_float8_weight.register_fake
def _(weight: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(weight, dtype=torch.float8_e4m3fn)


class _Gathered(torch.autograd.Function):
    """torchao's ``fsdp_post_all_gather``: the gathered float8 bytes wrapped with their
    (precomputed) scale as a float8 weight; the gradient reaches the parameter unchanged."""

    @staticmethod
    def forward(ctx, weight_t: torch.Tensor, linear_mm_config):  # pyright: ignore[reportIncompatibleMethodOverride]
        from torchao.float8.float8_training_tensor import (  # pyright: ignore[reportMissingImports]
            Float8TrainingTensor,
            GemmInputRole,
        )
        data = torch.ops.graphcost.fsdp_float8_weight(weight_t)
        scale = torch.ones((), dtype=torch.float32, device=weight_t.device)
        return Float8TrainingTensor(data, scale, weight_t.dtype, linear_mm_config,
                                    GemmInputRole.WEIGHT)

    @staticmethod
    def backward(ctx, grad):  # pyright: ignore[reportIncompatibleMethodOverride]
        return grad, None
