"""One analysis request, typed: how to load the model and what the passes are asked.

Both faces build it with ``build_request``: ``analyze(**kw)`` from its keyword arguments, the
command line from its options (analyzer/cli/main.py). ``run_request`` (analyzer/app/api.py),
``analyze_by_batch`` and ``max_batch_search`` (analyzer/app/by_batch.py), ``verify_request``
(analyzer/measure/verify.py) and ``run_passes`` (analyzer/app/pipeline.py) read it. The choice
lists are the Enums of passes/choices.py; the checkpoint and parallel specs are the passes'
own (passes/training/checkpoint.py, passes/parallel/step.py), the load options
and the serve spec analyzer/load/'s (options.py, serving.py), checked when built.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from ...passes.choices import Attention, Lifetimes, Optimizer, OptimizerImpl
from ...passes.device.fits import Overhead
from ...passes.device.profile import DeviceProfile
from ...passes.device_rates import DeviceRates
from ...passes.errors import GraphcostError, opt
from ...passes.graph.attention_dispatch import AttentionTarget
from ...passes.memory.caching_allocator import AllocatorConfig
from ...passes.parallel.comm import InterconnectRates
from ...passes.parallel.spec import ParallelSpec
from ...passes.training.checkpoint import CheckpointSpec
from ...passes.training.precision import AutocastSpec
from ..load.checks import check_arguments, plain_arguments
from ..load.options import NONE, LoadOptions
from ..load.serving import ServeSpec, check_serve
from .api_checks import (
    allocator_of,
    check_checkpoint,
    device_of,
    overhead_of,
    parallel_spec,
    profile_of,
    run_budget,
)


@dataclass(frozen=True)
class PassOptions:
    """What the passes are asked (analyzer/app/pipeline.py)."""
    include_inputs: bool = True
    inplace: bool = False
    lifetimes: str | None = None        # Lifetimes; None: eager for a torch forward
    optimizer: str | None = None        # Optimizer; None: an inference graph
    checkpoint: CheckpointSpec | None = None
    precision: str = "fp32"             # passes/training/precision.py RECIPES
    device: DeviceRates | None = None
    tf32: bool = False
    overhead: Overhead | None = None
    what_if: bool = True
    parallel: ParallelSpec | None = None
    optimizer_impl: str = OptimizerImpl.FORLOOP
    allocator: AllocatorConfig = AllocatorConfig()   # the caching allocator's settings
    profile: DeviceProfile | None = None             # the time estimate's (graphcost calibrate)
    compiled: bool = False   # the time of the kernels torch.compile launches (a GPU's estimate)
    run_tokens: int | None = None   # a training run's tokens, priced by the time estimate
    price: float | None = None      # per GPU-hour, for the run's cost
    # a tensor-parallel serving replica: the link its collectives cross (None: one GPU)
    serve_link: InterconnectRates | None = None
    # a training step's one-device allocator replay (training.reserved_peak_bytes): left out
    # where a layout's ranks are replayed instead — with ``parallel``, and a pipeline's whole
    # model and stage programs (analyzer/app/pipeline_stages.py), whose ranks are replayed
    # by passes/parallel/pipeline_reserved.py
    one_device_replay: bool = True


@dataclass(frozen=True)
class Request:
    """One analysis asked for: how the model is loaded, what the passes are asked, and the
    serving review when there is one. ``build_request`` makes it from analyze's arguments."""
    load: LoadOptions = LoadOptions()
    passes: PassOptions = PassOptions()
    serve: ServeSpec | None = None

    def at_batch(self, batch: int) -> "Request":
        """The same request at another batch (``--max-batch`` looks at many)."""
        return replace(self, load=replace(self.load, batch=batch))


@plain_arguments  # (the values as builtins first: a caller's object runs no code past it)
def build_request(*, batch: int | None = None, dims: Mapping[str, int] | None = None,
                  input_shapes: Mapping[str, Sequence[int]] | None = None,
                  input_dtypes: Mapping[str, Any] | None = None, include_inputs: bool = True,
                  inplace: bool = False, lifetimes: str | None = None,
                  zoo_exporter: str = "onnx", train: bool = False, optimizer: str = "adam",
                  checkpoint: Mapping[str, Any] | None = None, precision: str = "fp32",
                  device: Any = None, tf32: bool = False, overhead: Any = None,
                  what_if: bool = True, parallel: Mapping[str, Any] | None = None,
                  optimizer_impl: str | None = None, serve: Mapping[str, Any] | None = None,
                  all_layers: bool = False, attention: str = "auto",
                  allocator: str | None = None, dtype: str | None = None,
                  loss: str = "auto", device_profile: Any = None,
                  compile: bool = False, tokens: int | None = None,  # noqa: A002
                  price: float | None = None, float8: str | None = None) -> Request:
    """The request ``analyze``'s keyword arguments ask for, every one checked (a
    GraphcostError naming it, in the command line's words: analyze rewords them)."""
    from ...passes.training.precision import canonical

    overhead = overhead_of(overhead)
    precision = canonical(precision) if isinstance(precision, str) else precision
    check_arguments(choices={"attention": (attention, Attention.words())})
    if attention != Attention.AUTO and not train:
        raise GraphcostError(f"{opt('attention')} sets the kernel a training step is traced "
                             f"with: add {opt('train')} (an inference graph keeps attention "
                             "whole, costed as a fused kernel)")
    rates, profile = device_of(device), profile_of(device_profile)
    _gpu_profile_on_a_gpu(rates, profile)
    load = LoadOptions(batch, _raw(dims), _raw(input_shapes), _raw(input_dtypes),
                       zoo_exporter, train, all_layers,
                       attention_target(rates, precision, attention),
                       autocast_spec(rates, precision) if train else None, dtype,
                       cast_dtype(precision) if train else None, loss, float8=float8)
    if serve is not None:
        r = _serve_request(serve, load, precision, include_inputs=include_inputs,
                           lifetimes=lifetimes, device=device, tf32=tf32, overhead=overhead)
        tp, link = serve_parallel(parallel, rates)
        return replace(r, load=replace(r.load, tensor_parallel=tp),
                       passes=replace(r.passes, allocator=allocator_of(allocator),
                                      profile=profile, serve_link=link,
                                      what_if=what_if))
    passes = _pass_options(
        include_inputs=include_inputs, inplace=inplace, lifetimes=lifetimes, train=train,
        optimizer=optimizer, checkpoint=checkpoint, precision=precision, device=device,
        tf32=tf32, overhead=overhead, what_if=what_if, parallel=parallel,
        optimizer_impl=optimizer_impl)
    passes = replace(passes, compiled=_compiled(compile, rates, profile),
                     **run_budget(tokens, price, rates, profile))
    if passes.parallel is not None:  # traced as one rank's program
        if float8 not in (None, "tensorwise") and passes.parallel.tp > 1:
            raise GraphcostError(f"{opt('float8', value=float8)} beside tensor parallelism: "
                                 "torchao's float8 tensor-parallel styles are the tensorwise "
                                 f"recipe's: {opt('float8', value='tensorwise')}")
        load = replace(load, tensor_parallel=passes.parallel.tp,
                       expert_parallel=passes.parallel.ep,
                       context_parallel=passes.parallel.cp,
                       cp_rotate=passes.parallel.cp_rotate,
                       float8_all_gather=_float8_all_gather(passes.parallel, float8))
    return Request(load, replace(passes, allocator=allocator_of(allocator), profile=profile))


def _float8_all_gather(spec, float8: str | None) -> bool:
    """FSDP2's float8 all-gather, asked for beside torchao's tensorwise recipe (torchao
    gathers weights in float8 for that recipe alone)."""
    if spec.float8_all_gather and float8 != "tensorwise":
        raise GraphcostError(f"{opt('parallel.float8_all_gather')} gathers float8 linears' "
                             f"weights: add {opt('float8', value='tensorwise')} (torchao "
                             "gathers in float8 for the tensorwise recipe only)")
    if spec.float8_all_gather and spec.pp > 1:
        raise GraphcostError(f"{opt('parallel.float8_all_gather')} beside pipeline stages: not "
                             "modelled yet (beside fsdp, zero2, zero3 and HSDP it is)")
    return spec.float8_all_gather


def attention_target(device: DeviceRates | None, precision: str,
                     kernel: str = "auto") -> AttentionTarget:
    """The target a training step's attention kernels are chosen for: ``device`` (None: this
    CPU) computing in the precision recipe's half dtype (fp32: the traced dtype)."""
    from ...passes.training.precision import compute_dtype

    dtype = compute_dtype(precision) if isinstance(precision, str) else None
    if device is None:
        return AttentionTarget("cpu", None, Attention(kernel), dtype, "this CPU")
    sm = device.capability
    words = device.name + (f" (sm{sm[0]}{sm[1]})" if sm else "")
    return AttentionTarget("rocm" if device.rocm else "cuda", sm, Attention(kernel), dtype,
                           words)


def autocast_spec(device: DeviceRates | None, precision: str) -> AutocastSpec | None:
    """The autocast region an autocast recipe (bf16-mixed, 16-mixed) puts around the forward:
    on a GPU ``device`` autocast's CUDA op lists, else the CPU's."""
    from ...passes.training.precision import AUTOCAST

    dtype = AUTOCAST.get(precision) if isinstance(precision, str) else None
    if dtype is None:
        return None
    return AutocastSpec("cpu" if device is None else "cuda", dtype)


def cast_dtype(precision: str) -> str | None:
    """The dtype a re-typing recipe (bf16-true, 16-true, bf16-master, 16-master) casts the
    module to; None for the others (and for a name the argument checks will refuse)."""
    from ...passes.training.precision import PRECISIONS

    return PRECISIONS.get(precision) if isinstance(precision, str) else None


def _gpu_profile_on_a_gpu(rates, profile) -> None:
    """A profile ``graphcost calibrate --device`` measured on a GPU prices that GPU's steps:
    it needs a GPU device, whose row sets the attention kernel and the autocast a step is
    traced with (without one the step is traced as this CPU runs it)."""
    if profile is not None and profile.gpu and (rates is None or not rates.is_gpu):
        raise GraphcostError(f"{opt('device_profile')} {profile.name!r} was measured on a "
                             f"GPU ({profile.gpu}): add {opt('device')} with that GPU's row "
                             "(graphcost devices)")


def _compiled(compile: bool, rates, profile) -> bool:  # noqa: A002
    """torch.compile's kernels are priced by a GPU's datasheet estimate (a calibrated profile
    measured eager kernels, and a CPU device has no estimate)."""
    check_arguments(flags={"compile": compile})
    if compile and (profile is not None or rates is None or not rates.is_gpu):
        raise GraphcostError(f"{opt('compile')} prices the kernels torch.compile launches on a "
                             f"GPU: give a GPU {opt('device')} without {opt('device_profile')}")
    return compile


def _raw(mapping):
    """A mapping argument kept as given (LoadOptions checks it); None as empty."""
    return NONE if mapping is None else mapping


def _pass_options(*, include_inputs, inplace, lifetimes, train, optimizer, checkpoint,
                  precision, device, tf32, overhead, what_if, parallel,
                  optimizer_impl) -> PassOptions:
    from ...passes.training.precision import CHOICES
    from .devices import default_optimizer_impl

    check_arguments(flags={"include_inputs": include_inputs, "inplace": inplace, "train": train,
                           "tf32": tf32, "what_if": what_if},
                    choices={"lifetimes": (lifetimes, (None, *Lifetimes.words())),
                             "optimizer": (optimizer, Optimizer.words()),
                             "precision": (precision, CHOICES),
                             "optimizer_impl": (optimizer_impl,
                                                (None, *OptimizerImpl.words()))})
    plan = check_checkpoint(checkpoint, train)
    if precision != "fp32" and not train:
        raise GraphcostError(f"{opt('precision')} is a training recipe: add {opt('train')}")
    rates = device_of(device)
    spec = parallel_spec(parallel, train)
    return PassOptions(
        include_inputs=include_inputs, inplace=inplace,
        lifetimes=Lifetimes(lifetimes) if lifetimes else None,
        optimizer=Optimizer(optimizer) if train else None, checkpoint=plan,
        precision=precision, device=rates, tf32=tf32, overhead=overhead,
        what_if=what_if and spec is None, parallel=spec,
        optimizer_impl=OptimizerImpl(optimizer_impl or default_optimizer_impl(rates)))


def serve_parallel(parallel: Mapping[str, Any] | None,
                   device: DeviceRates | None) -> tuple[int, InterconnectRates | None]:
    """A serving replica's tensor-parallel size and the link its collectives cross (on a
    GPU ``device``) from ``parallel``: a mesh of ``tp`` alone ({'mesh': 'tp=4'}) and an
    ``interconnect`` between nodes."""
    from ...passes.parallel.mesh import parse_mesh
    from ...passes.parallel.step_time import dim_link
    from .api_checks import node_size
    from .devices import GPUS_PER_NODE, get_interconnect, node_links

    if not parallel:
        return 1, None
    if not isinstance(parallel, Mapping):
        raise GraphcostError(f"{opt('parallel')}: expected a mapping such as {{'mesh': 'tp=2'}}")
    parallel = dict(parallel)
    mesh = parallel.pop("mesh", None)
    interconnect = parallel.pop("interconnect", None)
    per_node = node_size(parallel.pop("gpus_per_node", GPUS_PER_NODE))
    m = parse_mesh(mesh if isinstance(mesh, str) else
                   ",".join(f"{k}={v}" for k, v in dict(mesh or {}).items())) if mesh else None
    if parallel or m is None or set(dict(m.dims)) != {"tp"}:
        raise GraphcostError(f"{opt('parallel', value=m.words if m else '')}: a serving replica "
                             "shards by tensor parallelism alone (tp=N); its replicas each "
                             "serve their own requests")
    tp = m.size("tp") or 1   # (parse_mesh refuses tp=auto)
    if device is None or not device.is_gpu:
        return tp, None
    links = node_links(device, get_interconnect(interconnect) if interconnect else None,
                       per_node)
    return tp, dim_link({"tp": tp}, "tp", links)


def _serve_request(serve, load: LoadOptions, precision: str, *, include_inputs, lifetimes,
                   device, tf32, overhead) -> Request:
    spec = check_serve(serve)
    check_arguments(batch=load.batch,
                    flags={"train": load.train, "tf32": tf32, "all_layers": load.all_layers})
    if load.train:
        raise GraphcostError(f"{opt('serve')} reviews inference (prefill and decode): leave out {opt('train')}")
    if load.dims or load.input_shapes:
        raise GraphcostError(f"{opt('serve')} sets the sequence lengths itself ({opt('serve.prompt')}, "
                             f"{opt('serve.generate')}): leave out {opt('dims')} and {opt('input_shapes')}")
    if precision != "fp32":
        raise GraphcostError(f"{opt('serve')} prices dtypes with {opt('serve.weight_dtype')} and "
                             f"{opt('serve.kv_dtype')}, not {opt('precision')}")
    return Request(load, PassOptions(include_inputs=include_inputs, lifetimes=lifetimes,
                                     device=device_of(device), tf32=tf32, overhead=overhead),
                   spec)
