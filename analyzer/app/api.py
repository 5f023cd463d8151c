"""The Python entry point: ``analyze(model, ...) -> Report``. Never prints.

Accepted models (analyzer/app/resolve.py): an ONNX path, ``zoo:NAME``, ``path/to/file.py:Class``
(imports and runs that file, builds the class on the meta device), an ``onnx.ModelProto``, a
``torch.export.ExportedProgram``, an ``fx.GraphModule`` or any ``nn.Module`` (with
``example_inputs`` or ``input_shapes``). The ONNX paths never import torch.
"""
from __future__ import annotations

import gc
import inspect
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from ...passes.attention_dispatch import AttentionTarget
from ...passes.choices import Exporter
from ...passes.errors import GraphcostError, opt
from ...passes.ir import AttentionKernel, Graph
from ...passes.precision import AutocastSpec
from .api_checks import check_arguments, check_dtype, check_dtype_applies, check_unknown
from .report import Report
from .request import LoadOptions, Request, build_request
from .resolve import Bindings, Resolved, in_dtype, in_recipe_dtype, resolve

Progress = Callable[[str], None]


def resolve_model(model, load: LoadOptions = LoadOptions(),
                  example_inputs: Sequence[Any] | None = None,
                  progress: Progress | None = None, *, materialize: bool = False) -> Resolved:
    """``load`` checked and the model it names resolved (nothing traced; ``materialize``:
    with real weights, for verify to run it)."""
    check_arguments(batch=load.batch, dims=load.dims, input_shapes=load.input_shapes,
                    input_dtypes=load.input_dtypes, zoo_exporter=load.exporter,
                    progress=progress, flags={"train": load.train, "all_layers": load.all_layers})
    bindings = Bindings(load.batch, dict(load.dims),
                        {k: tuple(v) for k, v in load.input_shapes.items()},
                        dict(load.input_dtypes))
    check_dtype(load.dtype, load.train)
    r = resolve(model, example_inputs, bindings, fx=load.exporter == Exporter.FX,
                train=load.train, materialize=materialize, note=progress)
    r = in_dtype(check_dtype_applies(r, load.dtype), load.dtype, load.train)
    return in_recipe_dtype(r, load.cast) if load.train else r


def load_graph(model, load: LoadOptions = LoadOptions(),
               example_inputs: Sequence[Any] | None = None, progress: Progress | None = None):
    """Lower any accepted model into the IR (with ``load.train``: its joint
    forward+backward)."""
    r = resolve_model(model, load, example_inputs, progress)
    note = progress or (lambda _msg: None)
    if r.kind == "onnx":
        from ..frontends.onnx.frontend import lower_onnx
        if load.autocast is not None:
            raise GraphcostError(f"{opt('precision')}: an autocast recipe is traced from the "
                                 "PyTorch model (an ONNX graph's ops have no autocast); "
                                 "bf16-master and bf16-true re-type an ONNX training estimate")
        note("inferring shapes")
        graph = lower_onnx(r.onnx, name=r.name, batch=load.batch, dims=r.dims,
                           input_shapes=r.input_shapes)
        return _onnx_estimate(graph, note) if load.train else graph
    if r.kind == "program":
        if load.batch is not None or load.input_shapes:
            raise GraphcostError("an exported program has fixed shapes: batch and "
                                 "input_shapes do not apply (re-export at the size you want)")
        return _program_graph(r, note, load.train, dict(load.dims))
    try:
        return torch_graph(r, note, load.train, load.all_layers, attention=load.attention,
                           autocast=load.autocast)[0]
    except GraphcostError as e:
        if not (load.train and load.cast):
            raise
        raise GraphcostError(f"{e.raw}; the {opt('precision')} recipe runs the module cast to "
                             f"{load.cast}, and it does not run that way (an autocast recipe, "
                             "bf16-mixed, keeps it as built)") from None


def torch_graph(r: Resolved, note: Progress, train: bool, all_layers: bool = False,
                rebindable: bool = False, attention: AttentionTarget = AttentionTarget(),
                autocast: AutocastSpec | None = None,
                ) -> tuple[Graph, Callable[[int], Graph] | None]:
    """A resolved PyTorch model's graph and, when ``rebindable``, ``b -> the graph at b``
    (see ``_torch_graph``; None when it cannot be re-run). ``attention``: the target whose
    attention kernels a training step is traced with; ``autocast``: the autocast region its
    forward runs in."""
    if attention.torch is None:  # the dispatcher rules of the torch this step runs on
        import torch
        release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        attention = replace(attention, torch=release)
    try:
        graph, at = _torch_graph(r.module, r.inputs, r.kwargs, r.name, note, train, r.maxima,
                                 all_layers, rebindable, attention, autocast)
    except GraphcostError as failure:
        graph, at = _with_eager_mask(r, failure, note, train, all_layers, rebindable,
                                     attention, autocast)
    kernels = attention if not train else None  # (a joint graph has them from its trace)
    return _named(graph, r, kernels), (None if at is None else
                                       lambda b: _named(at(b), r, kernels))


def _with_eager_mask(r: Resolved, failure: GraphcostError, note: Progress, train: bool,
                     all_layers: bool, rebindable: bool, attention: AttentionTarget,
                     autocast: AutocastSpec | None):
    """A transformers model whose trace failed reading None without an attention mask, traced
    with the all-ones mask its eager forward makes (transformers_tracing.eager_default_mask),
    said in a warning; where that does not apply or fails too, ``failure`` (the first) is
    raised."""
    from ..frontends.torch.capture import TraceFailure
    from ..frontends.torch.transformers_tracing import eager_default_mask

    # (a missing mask fails as reading None does: any other failure is raised at once,
    # not after a second trace that would fail the same way)
    none_read = isinstance(failure, TraceFailure) and "'NoneType'" in failure.said \
        and issubclass(failure.raised, (AttributeError, TypeError))
    kwargs = eager_default_mask(r.module, r.inputs, r.kwargs) if none_read else None
    if kwargs is None:
        raise failure
    note("tracing again with the all-ones attention_mask eager makes")
    try:
        graph, at = _torch_graph(r.module, r.inputs, kwargs, r.name, note, train, r.maxima,
                                 all_layers, rebindable, attention, autocast)
    except GraphcostError:
        raise failure from None
    said = (f"{r.name} was traced with an all-ones attention_mask, the one its eager forward "
            "makes when none is given (under torch.export it makes none and fails)",)

    def told(g: Graph) -> Graph:
        return replace(g, warnings=g.warnings + said)
    return told(graph), (None if at is None else lambda b: told(at(b)))


def _named(graph, r: Resolved, attention: AttentionTarget | None = None):
    from ...passes.attention_dispatch import name_kernels

    graph = name_kernels(graph, attention) if attention is not None else graph
    return replace(graph, name=r.name, dims=MappingProxyType({**graph.dims, **r.dims}))


def _onnx_estimate(graph, note: Progress):
    """An ONNX graph has no backward: the training step is ESTIMATED from per-op save rules
    (passes/backward_estimate.py; labelled in the report's warnings). The PyTorch model gives
    the exact joint graph instead (AOTAutograd)."""
    from ...passes.backward_estimate import estimate_joint
    note("estimating the backward from per-op save rules")
    return estimate_joint(graph)


def _program_graph(r: Resolved, note: Progress, train: bool, maxima: Mapping[str, int]):
    from ..frontends.torch.frontend import lower_exported
    from ..frontends.torch.pt2 import as_is, exported_on, quiet_logging
    from ..frontends.torch.size_bounds import check_maxima

    program = r.program
    if train:  # (torch's unlifted program module also refuses .train())
        raise GraphcostError(f"{opt('train')}: {r.name} is a forward traced by torch.export, not a "
                             "training step (BatchNorm on running statistics, dropout left "
                             "out): pass the nn.Module, or its file.py:Class, to trace one")
    note("lowering the exported program")
    user = [s.arg.name for s in program.graph_signature.input_specs
            if s.kind.name == "USER_INPUT"]
    vals = [n.meta.get("val") for n in program.graph.nodes
            if n.op == "placeholder" and n.name in user]
    with quiet_logging():  # torch logs a failing rebuild's traceback before raising it
        graph = lower_exported(program, name=r.name, batch=batch_of(vals), maxima=maxima,
                               decomposed=as_is(program, r.name))
    graph = replace(graph, warnings=graph.warnings + exported_on(program))
    return check_maxima(graph, maxima)


# long: the trace, its re-run and the repeated-layer growth share the lowering closures
def _torch_graph(model, args: tuple, kwargs: Mapping[str, Any], name: str, note: Progress,
                 train: bool, maxima: Mapping[str, int] = MappingProxyType({}),
                 all_layers: bool = False, rebindable: bool = False,
                 attention: AttentionTarget = AttentionTarget(),
                 autocast: AutocastSpec | None = None):
    """(the model's graph traced at the batch of its inputs, ``b -> Graph`` or None). With
    ``rebindable``, the second is the same trace at batch b, re-run on fake tensors
    (frontends/fake_rerun.py; the inputs' batch must be a marker batch), unless the trace has
    data-dependent sizes."""
    from ...passes.cpu_dropout import cpu_dropout
    from ..frontends.torch.bounded_trace import BoundedSizes
    from ..frontends.torch.capture import export_module
    from ..frontends.torch.fake_rerun import rerun, reruns
    from ..frontends.torch.frontend import decompose_program, lower_exported
    from ..frontends.torch.layer_stack import REPEAT_AT
    from ..frontends.torch.repeat_layers import trace_repeated
    from ..frontends.torch.size_bounds import check_maxima
    from ..frontends.torch.transformers_tracing import (
        call_defaults,
        every_layer_runs,
        traceable_experts,
    )

    batch_size = batch_of((*args, *kwargs.values()))
    kwargs = call_defaults(model, dict(kwargs))
    sizes = BoundedSizes(maxima)  # data-dependent sizes traced at their upper bounds
    lowers: list = []  # (traced ATen graph, batch -> its graph lowered)
    grown: list = []   # the IR growth of a stack traced as three layers
    with traceable_experts(model) as notes:
        if train:
            from ..frontends.torch.capture import export_joint
            from ..frontends.torch.frontend import lower_joint
            from ..frontends.torch.repeat_joint import repeat_joint

            def trace_joint():
                nonlocal sizes
                sizes = BoundedSizes(maxima)  # afresh: a trace of three layers may come first
                note(f"tracing {name}'s forward and backward (torch.export, then AOTAutograd)")
                jt = export_joint(model, args, kwargs, name=name, sizes=sizes,
                                  attention=attention, autocast=autocast)
                calls = tuple(AttentionKernel(path, kernel, why, attention.words)
                              for path, kernel, why in jt.kernels)
                capped = sizes.capped
                # this CPU's dropout keeps a noise tensor, not a byte mask (passes/cpu_dropout.py)
                on_cpu = cpu_dropout if attention.backend == "cpu" else (lambda g: g)
                lowers.append((jt.gm, lambda b: on_cpu(replace(lower_joint(
                    jt, model, name=name, batch=b, maxima=maxima, capped=capped),
                    attention=calls))))
                return lowers[-1][1](batch_size)
            with every_layer_runs(model) as dropped:
                graph = trace_repeated(model, trace_joint,
                                       at_least=0 if all_layers else REPEAT_AT,
                                       grown=grown, repeat=repeat_joint)
            notes += dropped
        else:
            def trace():
                nonlocal sizes
                sizes = BoundedSizes(maxima)  # afresh: a trace of three layers may come first
                note(f"tracing {name} with torch.export")
                refs: dict[str, str] = {}  # how long the model's Python holds each tensor
                ep = export_module(model, args, kwargs, name=name, references=refs,
                                   sizes=sizes)
                note("decomposing and lowering")
                dec, capped = decompose_program(ep, name), sizes.capped
                lowers.append((dec.graph_module, lambda b: lower_exported(
                    dec, name=name, batch=b, decomposed=True, exported=ep, references=refs,
                    maxima=maxima, capped=capped)))
                return lowers[-1][1](batch_size)
            graph = trace_repeated(model, trace, at_least=0 if all_layers else REPEAT_AT,
                                   grown=grown)
    notes = [*notes, *sizes.notes]

    def finish(g):
        if notes:
            g = replace(g, warnings=g.warnings + tuple(notes))
        return check_maxima(g, maxima, traced=sizes.origins)
    at = None
    if rebindable and not graph.size_bounds and reruns(lowers[-1][0]):
        gm, lower = lowers[-1]

        def rebound(b: int):
            rerun(gm, batch_size, b)
            g = lower(b)
            if grown:
                g = grown[-1](g)
                if g is None:
                    raise ValueError(f"the re-run at batch {b} does not repeat its layers")
            return finish(g)
        at = rebound
    return finish(graph), at


def batch_of(tensors) -> int:
    """Axis 0 of the first tensor with one (1 when there is none)."""
    for t in tensors:
        shape = getattr(t, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return 1


# long: the API's docstring is most of it
def analyze(model, example_inputs: Sequence[Any] | None = None, *extra,
            batch: int | None = None,
            dims: Mapping[str, int] | None = None,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            input_dtypes: Mapping[str, Any] | None = None,
            include_inputs: bool = True, inplace: bool = False, lifetimes: str | None = None,
            zoo_exporter: str = "onnx", progress: Progress | None = None,
            train: bool = False, optimizer: str = "adam",
            checkpoint: Mapping[str, Any] | None = None, precision: str = "fp32",
            device: Any = None, tf32: bool = False, overhead: Any = None,
            what_if: bool = True, parallel: Mapping[str, Any] | None = None,
            optimizer_impl: str | None = None, serve: Mapping[str, Any] | None = None,
            all_layers: bool = False, attention: str = "auto", allocator: str | None = None,
            dtype: str | None = None, **unknown) -> Report:
    """Analyze ``model`` at the given bindings; see the module docstring for what it accepts.

    ONNX: ``batch`` binds axis 0 of the graph inputs (default 1), ``dims`` any other symbolic
    dim by name, ``input_shapes`` whole input shapes. PyTorch: ``example_inputs`` (real, fake
    or meta tensors) or ``input_shapes`` (+ ``input_dtypes``, default float32) by forward
    argument name; ``batch`` replaces axis 0 of ``input_shapes``. ``progress`` receives short
    stage messages (the CLI shows them; nothing is printed otherwise). ``train`` analyzes one
    training step of a PyTorch model (its joint forward+backward graph) with ``optimizer``
    (none, sgd, momentum, adam, adamw); ``checkpoint`` adds a checkpoint plan:
    ``{"names": [...]}``, ``{"every": N}``, ``{"sqrt": True}`` or ``{"budget": BYTES}`` (the
    plan with the least recompute that fits); ``precision`` (training; Lightning's names):
    bf16-mixed / 16-mixed trace the forward under torch.autocast, bf16-master / 16-master
    re-type weights, activations and gradients to half with fp32 master weights and optimizer
    state, bf16-true / 16-true re-type everything to half. ``device`` (a name such as "a100-40gb" or a passes.roofline.DeviceRates)
    adds the roofline time per node and whether the peak fits with ``overhead``
    (passes.roofline.Overhead); ``tf32`` uses the TF32 rate for fp32 matmuls.
    ``what_if=False`` skips the training what-ifs (each re-runs the training passes).
    ``optimizer_impl`` ("forloop" | "foreach") sets the optimizer step's temporaries; default
    what PyTorch uses on the target: foreach on a GPU ``device``, the for-loop otherwise.
    ``parallel`` (with ``train``) divides the step across data-parallel ranks:
    ``{"strategy": "ddp"|"zero1"|"zero2"|"zero3"|"fsdp", "world_size": N or "auto"}`` (auto:
    the smallest N that fits ``device``), optionally ``"offload": "optimizer"|"params"``,
    ``"bucket_cap_mb"`` (DDP, default 25), ``"units"`` (module paths to shard as FSDP units;
    default the repeated blocks), ``"interconnect"`` (a name from analyzer.app.devices
    INTERCONNECTS). The batch is each rank's (global = batch × world size); the report's
    ``parallel`` section and ``peak_bytes`` are then one rank's; the what-ifs are skipped.
    ``serve={"prompt": P, "generate": G}`` (+ ``kv_dtype``, ``weight_dtype``) reviews a decoder
    for serving (analyzer/app/serve.py): prefill and one decode step traced with the KV cache, the
    report's ``serving`` section; ``batch`` is the number of sequences. A PyTorch model's
    stack of 8+ identical blocks is traced as three, the middle one repeated in the IR (the
    report's ``traced_layers`` says so); ``all_layers=True`` traces every block.
    ``attention`` (auto, flash, efficient, cudnn, math): the kernel a training step's
    ``scaled_dot_product_attention`` is traced as; auto is the one PyTorch's dispatcher picks
    on ``device`` (none: this CPU) in the ``precision`` recipe's dtype. ``allocator``: the
    CUDA caching allocator's settings as ``PYTORCH_CUDA_ALLOC_CONF`` spells them
    (``"expandable_segments:True"``, ``"max_split_size_mb:128"``), for the reserved replay
    and the fit. ``dtype`` (fp32, fp16, bf16) casts a PyTorch model's weights for inference
    and serving; default the published weights' dtype where the zoo knows it (zoo:llama7b:
    float16), a hub model's config.json's, else as built. Raises
    GraphcostError, in these arguments' names. The arguments become one typed Request
    (analyzer/app/request.py), which the command line builds too.
    """
    try:
        check_unknown(extra, unknown, ANALYZE_ARGS)
        request = build_request(
            batch=batch, dims=dims, input_shapes=input_shapes, input_dtypes=input_dtypes,
            include_inputs=include_inputs, inplace=inplace, lifetimes=lifetimes,
            zoo_exporter=zoo_exporter, train=train, optimizer=optimizer, checkpoint=checkpoint,
            precision=precision, device=device, tf32=tf32, overhead=overhead, what_if=what_if,
            parallel=parallel, optimizer_impl=optimizer_impl, serve=serve,
            all_layers=all_layers, attention=attention, allocator=allocator, dtype=dtype)
        return run_request(model, request, example_inputs, progress)
    except GraphcostError:  # (its message names this face's arguments)
        raise
    except Exception as exc:
        # the API promises one exception type; the cause stays chained for the bug report
        raise GraphcostError(f"internal error ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:300] if str(exc) else ''}); please "
                             "report it with the model and graphcost's version") from exc


def run_request(model, request: Request, example_inputs: Sequence[Any] | None = None,
                progress: Progress | None = None) -> Report:
    """The analysis ``request`` asks for (both faces come here)."""
    from .pipeline import run_passes

    if progress is not None and not callable(progress):
        raise GraphcostError(f"progress must be callable, got {type(progress).__name__}")
    # The IR is hundreds of thousands of small acyclic objects: the cyclic collector would
    # rescan them again and again (≈15% of the time on a 100k-node graph) and free nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if request.serve is not None:
            from .serve import load_serving
            check_dtype(request.load.dtype, False)
            graph, trace = load_serving(model, example_inputs, batch=request.load.batch,
                                        serve=request.serve, progress=progress,
                                        all_layers=request.load.all_layers,
                                        dtype=request.load.dtype)
        else:
            graph, trace = load_graph(model, request.load, example_inputs, progress), None
        if progress:
            progress("running the passes")
        return run_passes(graph, request.passes, serving=trace)
    finally:
        if was_enabled:
            gc.enable()


# the keywords analyze takes, for the error naming one it does not
ANALYZE_ARGS = tuple(n for n, p in inspect.signature(analyze).parameters.items()
                     if p.kind is p.KEYWORD_ONLY)
