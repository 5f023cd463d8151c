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

from .api_checks import (check_arguments, check_checkpoint, check_unknown, device_of, overhead_of,
    parallel_spec)
from ...passes.errors import GraphcostError
from .api_wording import api_wording
from .report import Report
from .resolve import Bindings, Resolved, resolve
from ...passes.precision import canonical

Progress = Callable[[str], None]


def resolve_model(model, example_inputs: Sequence[Any] | None = None, *,
                  batch: int | None = None, dims: Mapping[str, int] | None = None,
                  input_shapes: Mapping[str, Sequence[int]] | None = None,
                  input_dtypes: Mapping[str, Any] | None = None, zoo_exporter: str = "onnx",
                  progress: Progress | None = None, train: bool = False,
                  all_layers: bool = False) -> Resolved:
    """``load_graph``'s arguments checked and the model they name resolved (nothing traced)."""
    check_arguments(batch=batch, dims=dims, input_shapes=input_shapes, input_dtypes=input_dtypes,
                    zoo_exporter=zoo_exporter, progress=progress,
                    flags={"train": train, "all_layers": all_layers})
    bindings = Bindings(batch, dict(dims or {}),
                        {k: tuple(v) for k, v in (input_shapes or {}).items()},
                        dict(input_dtypes or {}))
    return resolve(model, example_inputs, bindings, fx=zoo_exporter == "fx", train=train,
                   note=progress)


def load_graph(model, example_inputs: Sequence[Any] | None = None, *, batch: int | None = None,
               dims: Mapping[str, int] | None = None,
               input_shapes: Mapping[str, Sequence[int]] | None = None,
               input_dtypes: Mapping[str, Any] | None = None, zoo_exporter: str = "onnx",
               progress: Progress | None = None, train: bool = False, all_layers: bool = False):
    """Lower any accepted model into the IR (with ``train``: its joint forward+backward)."""
    r = resolve_model(model, example_inputs, batch=batch, dims=dims, input_shapes=input_shapes,
                      input_dtypes=input_dtypes, zoo_exporter=zoo_exporter, progress=progress,
                      train=train, all_layers=all_layers)
    note = progress or (lambda _msg: None)
    if r.kind == "onnx":
        from ..frontends.onnx.frontend import lower_onnx
        note("inferring shapes")
        graph = lower_onnx(r.onnx, name=r.name, batch=batch, dims=r.dims,
                           input_shapes=r.input_shapes)
        return _onnx_estimate(graph, note) if train else graph
    if r.kind == "program":
        if batch is not None or input_shapes:
            raise GraphcostError("an exported program has fixed shapes: batch and "
                                 "input_shapes do not apply (re-export at the size you want)")
        return _program_graph(r, note, train, dict(dims or {}))
    return torch_graph(r, note, train, all_layers)


def torch_graph(r: Resolved, note: Progress, train: bool, all_layers: bool = False,
                rebind: list | None = None):
    """A resolved PyTorch model's graph (``rebind``: see ``_torch_graph``)."""
    inner: list | None = [] if rebind is not None else None
    graph = _torch_graph(r.module, r.inputs, r.kwargs, r.name, note, train, r.maxima,
                         all_layers, inner)
    if inner:
        rebind.append(lambda b: _named(inner[0](b), r))
    return _named(graph, r)


def _named(graph, r: Resolved):
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
    from ..frontends.torch.pt2 import quiet_logging
    from ..frontends.torch.size_bounds import check_maxima

    program = r.program
    if train:  # (torch's unlifted program module also refuses .train())
        raise GraphcostError(f"--train: {r.name} is a forward traced by torch.export, not a "
                             "training step (BatchNorm on running statistics, dropout left "
                             "out): pass the nn.Module, or its file.py:Class, to trace one")
    note("lowering the exported program")
    user = [s.arg.name for s in program.graph_signature.input_specs
            if s.kind.name == "USER_INPUT"]
    vals = [n.meta.get("val") for n in program.graph.nodes
            if n.op == "placeholder" and n.name in user]
    with quiet_logging():  # torch logs a failing rebuild's traceback before raising it
        graph = lower_exported(program, name=r.name, batch=batch_of(vals), maxima=maxima)
    return check_maxima(graph, maxima)


def _torch_graph(model, args: tuple, kwargs: Mapping[str, Any], name: str, note: Progress,
                 train: bool, maxima: Mapping[str, int] = MappingProxyType({}),
                 all_layers: bool = False, rebind: list | None = None):
    """The model's graph, traced at the batch of its inputs. ``rebind`` (a list) receives
    ``b -> Graph``: the same trace at batch b, re-run on fake tensors (frontends/fake_rerun.py;
    the inputs' batch must be a marker batch), unless the trace has data-dependent sizes."""
    from ..frontends.torch.bounded_trace import BoundedSizes
    from ..frontends.torch.fake_rerun import rerun, reruns
    from ..frontends.torch.frontend import decompose_program, lower_exported
    from ..frontends.torch.repeat_layers import REPEAT_AT, trace_repeated
    from ..frontends.torch.size_bounds import check_maxima
    from ..frontends.torch.capture import call_defaults, export_module, traceable_experts

    batch_size = batch_of((*args, *kwargs.values()))
    kwargs = call_defaults(model, dict(kwargs))
    sizes = BoundedSizes(maxima)  # data-dependent sizes traced at their upper bounds
    lowers: list = []  # (traced ATen graph, batch -> its graph lowered)
    grown: list = []   # the IR growth of a stack traced as three layers
    with traceable_experts(model) as notes:
        if train:
            from ..frontends.torch.frontend import lower_joint
            from ..frontends.torch.capture import export_joint
            note(f"tracing {name}'s forward and backward (torch.export, then AOTAutograd)")
            gm, sig, prefix, scopes = export_joint(model, args, kwargs, name=name,
                                                   sizes=sizes)
            lowers.append((gm, lambda b: lower_joint(gm, sig, model, prefix, scopes,
                                                     name=name, batch=b, maxima=maxima,
                                                     capped=sizes.capped)))
            graph = lowers[-1][1](batch_size)
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
    if rebind is not None and not graph.size_bounds and reruns(lowers[-1][0]):
        gm, lower = lowers[-1]

        def at(b: int):
            rerun(gm, batch_size, b)
            g = lower(b)
            if grown:
                g = grown[-1](g)
                if g is None:
                    raise ValueError(f"the re-run at batch {b} does not repeat its layers")
            return finish(g)
        rebind.append(at)
    return finish(graph)


def batch_of(tensors) -> int:
    """Axis 0 of the first tensor with one (1 when there is none)."""
    for t in tensors:
        shape = getattr(t, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
    return 1


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
            all_layers: bool = False, _cli: bool = False, **unknown) -> Report:
    """Analyze ``model`` at the given bindings; see the module docstring for what it accepts.

    ONNX: ``batch`` binds axis 0 of the graph inputs (default 1), ``dims`` any other symbolic
    dim by name, ``input_shapes`` whole input shapes. PyTorch: ``example_inputs`` (real, fake
    or meta tensors) or ``input_shapes`` (+ ``input_dtypes``, default float32) by forward
    argument name; ``batch`` replaces axis 0 of ``input_shapes``. ``progress`` receives short
    stage messages (the CLI shows them; nothing is printed otherwise). ``train`` analyzes one
    training step of a PyTorch model (its joint forward+backward graph) with ``optimizer``
    (none, sgd, momentum, adam, adamw); ``checkpoint`` adds a checkpoint plan:
    ``{"names": [...]}``, ``{"every": N}``, ``{"sqrt": True}`` or ``{"budget": BYTES}`` (the
    plan with the least recompute that fits); ``precision`` fp16-mixed / bf16-mixed (training)
    analyzes half-precision weights, activations and gradients with fp32 master weights and
    optimizer state. ``device`` (a name such as "a100-40gb" or a passes.roofline.DeviceRates)
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
    report's ``traced_layers`` says so); ``all_layers=True`` traces every block. Raises
    GraphcostError, in these arguments' names (``_cli``: in the command line's).
    """
    # The IR is hundreds of thousands of small acyclic objects: the cyclic collector would
    # rescan them again and again (≈15% of the time on a 100k-node graph) and free nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        check_unknown(extra, unknown, ANALYZE_ARGS)
        overhead = overhead_of(overhead)
        precision = canonical(precision) if isinstance(precision, str) else precision
        if serve is not None and parallel:
            raise GraphcostError("--serve reviews one replica serving: leave out --parallel")
        if serve is not None:
            return _analyze_serving(model, example_inputs, serve, batch=batch, dims=dims,
                                    input_shapes=input_shapes, train=train,
                                    precision=precision, progress=progress, device=device,
                                    tf32=tf32, overhead=overhead, all_layers=all_layers,
                                    include_inputs=include_inputs, lifetimes=lifetimes)
        return _analyze(model, example_inputs, batch, dims, input_shapes, input_dtypes,
                        include_inputs, inplace, lifetimes, zoo_exporter, progress, train,
                        optimizer, checkpoint, precision, device, tf32, overhead, what_if,
                        parallel, optimizer_impl, all_layers)
    except GraphcostError as exc:
        if _cli:
            raise
        raise GraphcostError(api_wording(str(exc))) from None
    except Exception as exc:
        if _cli:  # the command line says "internal error" and exits 70
            raise
        # the API promises one exception type; the cause stays chained for the bug report
        raise GraphcostError(f"internal error ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:300] if str(exc) else ''}); please "
                             "report it with the model and graphcost --version") from exc
    finally:
        if was_enabled:
            gc.enable()


def _analyze(model, example_inputs, batch, dims, input_shapes, input_dtypes, include_inputs,
             inplace, lifetimes, zoo_exporter, progress, train, optimizer, checkpoint,
             precision, device, tf32, overhead, what_if, parallel, optimizer_impl,
             all_layers) -> Report:
    from .devices import default_optimizer_impl
    from .pipeline import run_passes
    from ...passes.precision import CHOICES

    check_arguments(flags={"include_inputs": include_inputs, "inplace": inplace, "train": train,
                           "tf32": tf32, "what_if": what_if},
                    choices={"lifetimes": (lifetimes, (None, "dataflow", "eager")),
                             "optimizer": (optimizer, ("none", "sgd", "momentum", "adam",
                                                       "adamw")),
                             "precision": (precision, CHOICES),
                             "optimizer_impl": (optimizer_impl, (None, "forloop", "foreach"))})
    checkpoint = check_checkpoint(checkpoint, train)
    if precision != "fp32" and not train:
        raise GraphcostError("--precision is a training recipe: add --train")
    device = device_of(device)
    spec = parallel_spec(parallel, train, precision)
    graph = load_graph(model, example_inputs, batch=batch, dims=dims,
                       input_shapes=input_shapes, input_dtypes=input_dtypes,
                       zoo_exporter=zoo_exporter, progress=progress, train=train,
                       all_layers=all_layers)
    if progress:
        progress("running the passes")
    return run_passes(graph, include_inputs=include_inputs, inplace=inplace,
                      lifetimes=lifetimes, optimizer=optimizer if train else None,
                      checkpoint=checkpoint,
                      precision=precision, device=device, tf32=tf32,
                      overhead=overhead, what_if=what_if and spec is None, parallel=spec,
                      optimizer_impl=optimizer_impl or default_optimizer_impl(device))


def _analyze_serving(model, example_inputs, serve, *, batch, dims, input_shapes, train,
                     precision, progress, device, tf32, overhead, include_inputs,
                     lifetimes, all_layers) -> Report:
    """The serving review (analyzer/app/serve.py): the report of the prefill step, with the
    ``serving`` section."""
    from .pipeline import run_passes
    from .serve import check_serve, load_serving

    serve = check_serve(serve)
    check_arguments(batch=batch, progress=progress,
                    flags={"train": train, "tf32": tf32, "all_layers": all_layers})
    if train:
        raise GraphcostError("--serve reviews inference (prefill and decode): leave out --train")
    if dims or input_shapes:
        raise GraphcostError("--serve sets the sequence lengths itself (--prompt, --generate): "
                             "leave out --dim and --input-shape")
    if precision != "fp32":
        raise GraphcostError("--serve prices dtypes with --weight-dtype and --kv-dtype, not "
                             "--precision")
    graph, trace = load_serving(model, example_inputs, batch=batch, serve=serve,
                                progress=progress, all_layers=all_layers)
    if progress:
        progress("running the passes")
    return run_passes(graph, include_inputs=include_inputs, lifetimes=lifetimes,
                      device=device_of(device), tf32=tf32, overhead=overhead, serving=trace)


# the keywords analyze takes, for the error naming one it does not
ANALYZE_ARGS = tuple(n for n, p in inspect.signature(analyze).parameters.items()
                     if p.kind is p.KEYWORD_ONLY)
