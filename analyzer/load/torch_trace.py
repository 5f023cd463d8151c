"""The torch trace driver: a resolved PyTorch module (or exported program) lowered into the IR.

``torch_graph`` traces a module with torch.export (with ``train``: its joint forward and
backward through AOTAutograd), grows a stack of identical blocks traced as three
(frontends/torch/repeat_layers.py), retries a transformers model whose trace read a missing
attention mask with the all-ones mask eager makes, and, asked to, hands back ``b -> the
graph at batch b`` re-run on fake tensors (frontends/torch/fake_rerun.py). ``program_graph``
lowers a torch.export program as it is. What the model is, and its inputs, come from
analyzer/load/resolve.py.
"""
from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ...passes.errors import GraphcostError, opt
from ...passes.graph.attention_dispatch import AttentionTarget
from ...passes.ir import AttentionKernel, Graph
from .options import LoadOptions
from .progress import Progress
from .resolve import Resolved, batch_of


def torch_graph(r: Resolved, note: Progress, load: LoadOptions, rebindable: bool = False
                ) -> tuple[Graph, Callable[[int], Graph] | None]:
    """A resolved PyTorch model's graph as ``load`` asks (with ``load.train``: its training
    step, with the loss, attention target and autocast region it names) and, when
    ``rebindable``, ``b -> the graph at b`` (None when it cannot be re-run: ``_Trace``)."""
    if load.attention.torch is None:  # the dispatcher rules of the torch this step runs on
        import torch
        release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        load = replace(load, attention=replace(load.attention, torch=release))
    if load.context_parallel > 1:   # (each attention call a ring over the cp ranks)
        load = replace(load, attention=replace(load.attention, ring=load.context_parallel,
                                               rotate=load.cp_rotate))
    try:
        graph, at = _Trace(r, r.kwargs, note, load).run(rebindable)
    except GraphcostError as failure:
        graph, at = _with_eager_mask(r, failure, note, load, rebindable)
    kernels = load.attention if not load.train else None  # (a joint graph has them traced)
    return _named(graph, r, kernels), (None if at is None else
                                       lambda b: _named(at(b), r, kernels))


def _with_eager_mask(r: Resolved, failure: GraphcostError, note: Progress, load: LoadOptions,
                     rebindable: bool):
    """A transformers model given no attention mask whose trace failed as a missing mask
    makes it fail, traced with the all-ones mask its eager forward makes
    (transformers_tracing.eager_default_mask), said in a warning; where that does not apply or fails too, ``failure`` (the first) is raised."""
    from ..frontends.torch.capture import TraceFailure
    from ..frontends.torch.transformers_tracing import eager_default_mask

    # (a failure a missing mask causes; any other is raised at once, not after a second trace
    # that would fail the same way: the export runs a path eager never runs — LongT5's stack
    # reads the None, its transient-global attention concatenates a batch-1 bias beside the
    # batch's, or makes the batch's mask on the CPU beside meta weights)
    retried = isinstance(failure, TraceFailure) and (
        ("'NoneType'" in failure.said and issubclass(failure.raised, (AttributeError, TypeError)))
        or (issubclass(failure.raised, RuntimeError)
            and any(w in failure.said for w in ("must match", "same device"))))
    kwargs = eager_default_mask(r.module, r.inputs, r.kwargs) if retried else None
    if kwargs is None:
        raise failure
    note("tracing again with the all-ones attention_mask eager makes")
    try:
        graph, at = _Trace(r, kwargs, note, load).run(rebindable)
    except GraphcostError:
        raise failure from None
    said = (f"{r.name} was traced with an all-ones attention_mask, the one its eager forward "
            "makes when none is given (under torch.export it makes none and fails)",)

    def told(g: Graph) -> Graph:
        return replace(g, warnings=g.warnings + said)
    return told(graph), (None if at is None else lambda b: told(at(b)))


def _named(graph, r: Resolved, attention: AttentionTarget | None = None):
    from ...passes.graph.attention_dispatch import name_kernels

    graph = name_kernels(graph, attention) if attention is not None else graph
    return replace(graph, name=r.name, dims=MappingProxyType({**graph.dims, **r.dims}))


def program_graph(r: Resolved, note: Progress, train: bool, maxima: Mapping[str, int]):
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


class _Trace:
    """One trace of a module at the batch of its inputs: the forward (torch.export) or the
    training step (AOTAutograd's joint graph), a stack of identical blocks traced as three and
    grown in the IR, and the lowering kept so the trace can be re-run at another batch on fake
    tensors (frontends/fake_rerun.py; the inputs' batch must be a marker batch)."""

    def __init__(self, r: Resolved, kwargs: Mapping[str, Any], note: Progress,
                 load: LoadOptions):
        from ..frontends.torch.bounded_trace import BoundedSizes
        from ..frontends.torch.transformers_tracing import call_defaults

        self.model, self.args, self.name, self.note, self.load = \
            r.module, r.inputs, r.name, note, load
        self.resolved_notes = r.notes
        self.maxima: Mapping[str, int] = r.maxima or MappingProxyType({})
        self.batch = batch_of((*r.inputs, *kwargs.values()))
        self.kwargs = call_defaults(r.module, dict(kwargs))
        self.sizes = BoundedSizes(self.maxima)  # data-dependent sizes at their upper bounds
        self.lowers: list = []  # (traced ATen graph, batch -> its graph lowered)
        self.grown: list = []   # the IR growth of a stack traced as three layers

    def run(self, rebindable: bool) -> tuple[Graph, Callable[[int], Graph] | None]:
        """(the graph, ``b -> the graph re-run at b`` or None: not asked, or the trace has
        sizes the data decides, or ops fake_rerun cannot re-run)."""
        from ..frontends.torch.fake_rerun import reruns
        from ..frontends.torch.layer_stack import REPEAT_AT
        from ..frontends.torch.repeat_joint import repeat_joint
        from ..frontends.torch.repeat_layers import trace_repeated
        from ..frontends.torch.transformers_tracing import (
            every_layer_runs,
            traceable_experts,
        )

        at_least = 0 if self.load.all_layers else REPEAT_AT
        with traceable_experts(self.model) as notes:
            if self.load.train:
                with every_layer_runs(self.model) as dropped:
                    graph = trace_repeated(self.model, self.joint, at_least=at_least,
                                           grown=self.grown, repeat=repeat_joint)
                notes += dropped
            else:
                graph = trace_repeated(self.model, self.forward, at_least=at_least,
                                       grown=self.grown)
        self.notes = [*self.resolved_notes, *notes, *self.sizes.notes]
        if rebindable and not graph.size_bounds and reruns(self.lowers[-1][0]):
            return self.finish(graph), self.rebound
        return self.finish(graph), None

    def joint(self) -> Graph:
        """The training step traced (``trace_repeated`` may call it for three layers first)."""
        from ...passes.graph.cpu_dropout import cpu_dropout
        from ..frontends.torch.bounded_trace import BoundedSizes
        from ..frontends.torch.capture import export_joint
        from ..frontends.torch.context_parallel import why_no_sdpa
        from ..frontends.torch.frontend import lower_joint
        from ..frontends.torch.lm_loss import plan_loss

        load, name, model = self.load, self.name, self.model
        self.sizes = BoundedSizes(self.maxima)  # afresh for each trace
        self.note(f"tracing {name}'s forward and backward (torch.export, then AOTAutograd)")
        jt = export_joint(model, self.args, self.kwargs, name=name, sizes=self.sizes,
                          attention=load.attention, autocast=load.autocast,
                          loss=plan_loss(model, self.args, self.kwargs, load.loss))
        if load.context_parallel > 1 and not jt.kernels:
            raise GraphcostError(
                f"{opt('parallel', value=f'cp={load.context_parallel}')}: PyTorch's context "
                f"parallelism rings scaled_dot_product_attention calls, and {name} makes none "
                f"({why_no_sdpa(model)})")
        calls = tuple(AttentionKernel(path, kernel, why, load.attention.words)
                      for path, kernel, why in jt.kernels)
        capped, maxima = self.sizes.capped, self.maxima
        # this CPU's dropout keeps a noise tensor, not a byte mask (passes/graph/cpu_dropout.py)
        on_cpu = cpu_dropout if load.attention.backend == "cpu" else (lambda g: g)
        self.lowers.append((jt.gm, lambda b: on_cpu(replace(lower_joint(
            jt, model, name=name, batch=b, maxima=maxima, capped=capped),
            attention=calls, loss=jt.loss))))
        return self.lowers[-1][1](self.batch)

    def forward(self) -> Graph:
        """The forward traced with torch.export and lowered."""
        from ..frontends.torch.bounded_trace import BoundedSizes
        from ..frontends.torch.capture import export_module
        from ..frontends.torch.frontend import decompose_program, lower_exported

        name, maxima = self.name, self.maxima
        self.sizes = BoundedSizes(maxima)  # afresh for each trace
        self.note(f"tracing {name} with torch.export")
        refs: dict[str, str] = {}  # how long the model's Python holds each tensor
        ep = export_module(self.model, self.args, self.kwargs, name=name, references=refs,
                           sizes=self.sizes)
        self.note("decomposing and lowering")
        dec, capped = decompose_program(ep, name), self.sizes.capped
        self.lowers.append((dec.graph_module, lambda b: lower_exported(
            dec, name=name, batch=b, decomposed=True, exported=ep, references=refs,
            maxima=maxima, capped=capped)))
        return self.lowers[-1][1](self.batch)

    def rebound(self, b: int) -> Graph:
        """The last trace re-run on fake tensors at batch ``b``, lowered and grown."""
        from ..frontends.torch.fake_rerun import rerun

        gm, lower = self.lowers[-1]
        rerun(gm, self.batch, b)
        g = lower(b)
        if self.grown:
            g = self.grown[-1](g)
            if g is None:
                raise ValueError(f"the re-run at batch {b} does not repeat its layers")
        return self.finish(g)

    def finish(self, g: Graph) -> Graph:
        from ..frontends.torch.size_bounds import check_maxima

        if self.notes:
            g = replace(g, warnings=g.warnings + tuple(self.notes))
        return check_maxima(g, self.maxima, traced=self.sizes.origins)
