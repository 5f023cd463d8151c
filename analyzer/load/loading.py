"""The front door: a model argument and its LoadOptions in, the IR out.

``load(model, options, example_inputs, progress, serve=…) -> Loaded`` is all analyzer/app/
needs: the graph (with ``options.train``: the joint forward and backward), and for a serving
review the traces its pass reads. ``resolve_model`` names the model without tracing it
(verify runs it); ``load_graph`` lowers any accepted model; ``traced_once`` traces a PyTorch
model at a marker batch with ``b -> its graph at b`` for the batch search
(analyzer/app/by_batch.py). The options were checked when they were built
(analyzer/load/options.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from ...passes.choices import Exporter, Loss
from ...passes.errors import GraphcostError, opt
from ...passes.ir import Graph
from ...passes.serving.analysis import ServingTrace
from .checks import check_dtype_applies
from .options import LoadOptions
from .progress import Progress
from .rank_program import (
    in_context_parallel,
    in_expert_parallel,
    in_pipeline_stage,
    in_tensor_parallel,
)
from .recipes import in_dtype, in_float8, in_recipe_dtype
from .resolve import (
    Bindings,
    Resolved,
    batch_of,
    resolve,
)
from .serving import ServeSpec, load_serving
from .torch_trace import program_graph, torch_graph
from .trace_cache import cached_load


@dataclass(frozen=True)
class Loaded:
    """What loading a model gives the passes: its graph, and for a serving review the prefill
    and decode traces (``graph`` is then the prefill's, at the dtypes asked)."""
    graph: Graph
    serving: ServingTrace | None = None


def load(model, options: LoadOptions = LoadOptions(),
         example_inputs: Sequence[Any] | None = None, progress: Progress | None = None, *,
         serve: ServeSpec | None = None) -> Loaded:
    """``model`` loaded as ``options`` say (with ``serve``: traced for the serving review); a
    zoo or timm model loaded the same way before, its load kept (analyzer/load/
    trace_cache.py)."""
    if serve is None:
        return Loaded(load_graph(model, options, example_inputs, progress))
    def traced():
        return load_serving(model, example_inputs, batch=options.batch, serve=serve,
                            progress=progress, all_layers=options.all_layers,
                            dtype=options.dtype, tensor_parallel=options.tensor_parallel)
    graph, trace = cached_load(model, repr((options, serve)), example_inputs, traced)
    return Loaded(graph, trace)


def resolve_model(model, load: LoadOptions = LoadOptions(),
                  example_inputs: Sequence[Any] | None = None,
                  progress: Progress | None = None, *, materialize: bool = False) -> Resolved:
    """The model ``load`` names, resolved (nothing traced; ``materialize``: with real
    weights, for verify to run it)."""
    bindings = Bindings(load.batch, dict(load.dims),
                        {k: tuple(v) for k, v in load.input_shapes.items()},
                        dict(load.input_dtypes))
    r = resolve(model, example_inputs, bindings, fx=load.exporter == Exporter.FX,
                train=load.train, materialize=materialize, note=progress)
    r = in_dtype(check_dtype_applies(r, load.dtype), load.dtype, load.train)
    r = in_recipe_dtype(r, load.cast) if load.train else r
    r = in_float8(r, load.float8, load.float8_all_gather)
    whole = r
    r = in_pipeline_stage(r, load.pipeline_stage, load.stage_blocks,
                          beside=max(load.expert_parallel, load.context_parallel,
                                     load.tensor_parallel) > 1)
    r = in_expert_parallel(r, load.expert_parallel, load.pipeline_stage, whole,
                           load.tensor_parallel)
    r = in_context_parallel(r, load.context_parallel, load.pipeline_stage)
    return in_tensor_parallel(r, load.tensor_parallel, stage=load.pipeline_stage)


def load_graph(model, load: LoadOptions = LoadOptions(),
               example_inputs: Sequence[Any] | None = None,
               progress: Progress | None = None) -> Graph:
    """Lower any accepted model into the IR (with ``load.train``: its joint
    forward+backward); a zoo or timm model loaded the same way before, its graph kept
    (analyzer/load/trace_cache.py)."""
    return cached_load(model, repr(load), example_inputs,
                       lambda: _lowered(model, load, example_inputs, progress))


def _lowered(model, load: LoadOptions, example_inputs: Sequence[Any] | None,
             progress: Progress | None) -> Graph:
    r = resolve_model(model, load, example_inputs, progress)
    note = progress or (lambda _msg: None)
    if r.kind == "onnx":
        return _onnx_graph(r, load, note)
    if r.kind == "program":
        if load.batch is not None or load.input_shapes:
            raise GraphcostError("an exported program has fixed shapes: batch and "
                                 "input_shapes do not apply (re-export at the size you want)")
        return program_graph(r, note, load.train, dict(load.dims))
    try:
        return torch_graph(r, note, load)[0]
    except GraphcostError as e:
        if not (load.train and load.cast):
            raise
        raise GraphcostError(f"{e.raw}; the {opt('precision')} recipe runs the module cast to "
                             f"{load.cast}, and it does not run that way (an autocast recipe, "
                             "bf16-mixed, keeps it as built)") from None


def _onnx_graph(r: Resolved, load: LoadOptions, note: Progress) -> Graph:
    """An ONNX model lowered; for training, the step ESTIMATED from per-op save rules
    (passes/training/backward_estimate.py; labelled in the report's warnings): an ONNX file
    holds the forward only, where the PyTorch model gives the exact joint graph."""
    from ...passes.training.backward_estimate import estimate_joint
    from ..frontends.onnx.frontend import lower_onnx

    if load.autocast is not None:
        raise GraphcostError(f"{opt('precision')}: an autocast recipe is traced from the "
                             "PyTorch model (an ONNX graph's ops have no autocast); "
                             "bf16-master and bf16-true re-type an ONNX training estimate")
    if load.train and load.loss not in (Loss.AUTO, Loss.SUM):
        raise GraphcostError(f"{opt('loss', value=load.loss)}: an ONNX training step is "
                             "estimated from its forward, whose loss is the sum of its "
                             "outputs; trace the PyTorch model for its cross-entropy")
    note("inferring shapes")
    graph = lower_onnx(r.onnx, name=r.name, batch=load.batch, dims=r.dims,
                       input_shapes=r.input_shapes)
    if not load.train:
        return graph
    note("estimating the backward from per-op save rules")
    return replace(estimate_joint(graph), loss="the sum of the outputs (an ONNX estimate)")


def traced_once(model, load: LoadOptions,
                progress: Progress | None = None) -> tuple[Graph, Callable[[int], Graph]] | None:
    """``model`` traced at a marker batch, with ``b -> its graph at b`` (the trace re-run on
    fake tensors); None for a model that is not a PyTorch module with a batch of its own, whose
    forward takes another path at the marker, or whose trace has sizes the data decides."""
    from ..frontends.torch.fake_rerun import FIRST, marker_batch, model_sizes, same_path

    def at(b: int):
        return resolve_model(model, replace(load, batch=b), progress=progress)
    r = at(FIRST)
    if r.kind != "torch":
        return None
    marker = marker_batch(model_sizes(r.module, (*r.inputs, *r.kwargs.values())))
    if marker != FIRST:
        r = at(marker)
    small = at(2)
    if batch_of((*r.inputs, *r.kwargs.values())) != marker or \
            not same_path(r, small, train=load.train):
        return None
    graph, rerun = torch_graph(r, progress or (lambda _msg: None), load, rebindable=True)
    return None if rerun is None else (graph, rerun)
