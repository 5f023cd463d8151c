"""Capturing PyTorch models for the FX frontend: nn.Module, fx.GraphModule, a class in a file.

Inputs are fake tensors (FakeTensorMode) on the model's own device, or meta tensors when the
model lives on the meta device, so no activation and no weight is ever allocated; a model
built under ``torch.device("meta")`` (a 7B decoder) is never materialized. ``torch.export``
runs the model's forward on those fakes and leaves the module as it was (no hooks, no
attributes added).

Shapes are static: binding another batch or sequence length re-exports (the module is traced
again, ~1 s for ResNet-50), which keeps every model exportable without dynamic-shape guards.

Inference exports under ``torch.no_grad()`` and records how long the model's own Python holds
each tensor (python_references.py). Training exports the model in train mode and traces the
backward with AOTAutograd through the exported graph (``export_joint``, exported_run.py), so
code that branches on ``torch.export`` (transformers' masks) is traced the way it exports.
What a transformers model needs to be traced as it runs (no KV cache, traceable experts,
the masks eager code builds) is transformers_tracing.py's.
"""
from __future__ import annotations

import importlib.util
import inspect
import io
import logging
import sys
import warnings
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import torch
import torch.utils._pytree  # (torch.utils does not import it for the type checker)

from ....passes.errors import GraphcostError, first_line, opt
from .accumulate_grad import copied_in_place, obey_layout_contract, summed_in_place
from .compat import eager_view_strides, no_stack_traces
from .eager_saved import held_by_backward
from .lifted_constants import lifted_fakes_kept
from .lm_loss import OWN_OR_SUM, LossPlan, step_loss, with_labels
from .python_references import PythonReferences, saved_as_run
from .transformers_tracing import eager_paths


def _device_of(model: torch.nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def fake_inputs(model: torch.nn.Module, input_shapes: Mapping[str, Sequence[int]],
                input_dtypes: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Keyword inputs for ``model.forward`` with the given shapes, allocating nothing."""
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)]
    names = [p.name for p in params]
    for name in input_shapes:
        if name not in names:
            raise GraphcostError(f"{opt('input_shapes')} names no argument {name!r} of "
                                 f"{type(model).__name__}.forward; its arguments are: "
                                 + ", ".join(names))
    missing = [p.name for p in params if p.default is p.empty and p.name not in input_shapes]
    if missing:
        raise GraphcostError(f"{type(model).__name__}.forward needs {', '.join(missing)}: pass "
                             + " ".join(opt("input_shapes", m, "...") for m in missing))
    return make_fakes(model, input_shapes, input_dtypes)


def make_fakes(model: torch.nn.Module, input_shapes: Mapping[str, Sequence[int]],
               input_dtypes: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Fake (or, for a meta model, meta) tensors of the given shapes; nothing is allocated."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    device = _device_of(model)
    dtypes = dict(input_dtypes or {})
    out: dict[str, torch.Tensor] = {}
    if device.type == "meta":
        for name, shape in input_shapes.items():
            out[name] = _empty(shape, dtypes.get(name), "meta")
        return out
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        for name, shape in input_shapes.items():
            out[name] = _empty(shape, dtypes.get(name), device)
    return out


def _empty(shape, dtype, device) -> torch.Tensor:
    dtype = _as_dtype(dtype) if dtype is not None else torch.float32
    if dtype in (torch.int64, torch.int32):
        return torch.zeros(tuple(shape), dtype=dtype, device=device)
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def _as_dtype(d: Any) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    dt = getattr(torch, str(d).removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise GraphcostError(f"unknown dtype {d!r}")
    return dt


def export_module(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
                  name: str = "model",
                  references: dict[str, str] | None = None,
                  sizes=None) -> "torch.export.ExportedProgram":
    """``torch.export`` (non-strict) with errors turned into one clear line.

    With ``references`` (a dict to fill), the forward is traced under ``torch.no_grad()`` (as
    an inference runs: autograd would hold every saved tensor) and the dict receives, for
    each traced tensor the model's Python code let go of, the node the trace had reached
    then (python_references.PythonReferences). Data-dependent sizes:
    bounded_trace.BoundedSizes."""
    from .bounded_trace import BoundedSizes, explain

    sizes = sizes if sizes is not None else BoundedSizes()
    try:
        with warnings.catch_warnings(), quiet_torch_logs(), sizes, no_stack_traces(), \
                eager_paths(), eager_view_strides():
            warnings.simplefilter("ignore", FutureWarning)  # torch-internal deprecations
            with sizes.inputs.of(model, tuple(args), kwargs or {}):
                if references is None:
                    return torch.export.export(model, tuple(args), kwargs=kwargs or {},
                                               strict=False)
                with torch.no_grad(), PythonReferences(references):
                    return torch.export.export(model, tuple(args), kwargs=kwargs or {},
                                               strict=False)
    except GraphcostError:
        raise
    except Exception as exc:
        raise TraceFailure(f"{name}: torch.export could not trace the forward "
                           f"({explain(exc, sizes) or _one_line(exc)})", exc) from None


class TraceFailure(GraphcostError):
    """A trace the model's own code stopped, in one line, with what it raised: ``raised``
    (its exception type) and ``said`` (its message), for a caller that may trace again
    another way where that failure says it would help (repeat_layers.trace_repeated,
    load/torch_trace.py's eager mask) and must not where it would fail the same way again."""

    def __init__(self, message: str, exc: BaseException):
        super().__init__(message)
        self.raised, self.said = type(exc), str(exc)


def _one_line(exc: Exception) -> str:
    """An exception as 'Type: first non-empty line' (torch's messages run to pages)."""
    return f"{type(exc).__name__}: {first_line(exc, 300)}"


@contextmanager
def quiet_torch_logs():
    """torch.export logs warnings and whole graph dumps to stderr when a trace fails; the
    failure is reported as one line instead, so torch's loggers are silenced and its stderr
    writes captured meanwhile (a library call prints nothing). Every logger is disabled for
    the trace's duration at once: setting the level of each of torch's few hundred loggers
    cleared every logger's cache each time (2% of a plan's time, quadratic in the loggers)."""
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(before)


def load_class(spec: str) -> tuple[type, str]:
    """'path/to/net.py:Net' -> the class (importing, i.e. running, the file)."""
    path_text, _, cls_name = spec.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise GraphcostError(f"{path}: no such file")
    mod_name = f"_graphcost_user_{path.stem}"
    loader = importlib.util.spec_from_file_location(mod_name, path)
    if loader is None or loader.loader is None:
        raise GraphcostError(f"{path}: cannot import as a Python module")
    module = importlib.util.module_from_spec(loader)
    sys.modules[mod_name] = module
    try:
        loader.loader.exec_module(module)
    except Exception as exc:
        raise GraphcostError(f"{path}: importing it failed ({type(exc).__name__}: {exc})") \
            from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        classes = sorted(n for n, v in vars(module).items()
                         if isinstance(v, type) and issubclass(v, torch.nn.Module)
                         and v.__module__ == mod_name)
        raise GraphcostError(f"{path} has no class {cls_name!r}; nn.Module classes there: "
                             + (", ".join(classes) or "none"))
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise GraphcostError(f"{spec}: {cls_name} is not an nn.Module class")
    return cls, cls_name


def build_on_meta(cls: type, name: str) -> torch.nn.Module:
    """Instantiate with no arguments on the meta device: no weight memory is allocated."""
    try:
        with torch.device("meta"):
            return cls().eval()
    except Exception as exc:
        raise GraphcostError(f"{name}(): constructing it with no arguments failed "
                             f"({type(exc).__name__}: {exc})") from None


def build_seeded(cls: type, name: str) -> torch.nn.Module:
    """Instantiate with no arguments and seeded random weights (verify runs it for real)."""
    torch.manual_seed(0)
    try:
        return cls()
    except Exception as exc:
        raise GraphcostError(f"{name}(): constructing it with no arguments failed "
                             f"({type(exc).__name__}: {exc})") from None


def real_inputs(shapes: Mapping[str, Sequence[int]], dtypes: Mapping[str, Any],
                int_ranges: Mapping[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Seeded random CPU tensors; integer inputs in their range (default [0, 2))."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, shape in shapes.items():
        dtype = _as_dtype(dtypes.get(name, torch.float32))
        if dtype.is_floating_point:
            out[name] = torch.randn(tuple(shape), generator=gen, dtype=dtype)
        elif dtype == torch.bool:
            out[name] = torch.ones(tuple(shape), dtype=dtype)
        else:
            lo, hi = int_ranges.get(name, (0, 2))
            out[name] = torch.randint(lo, hi, tuple(shape), generator=gen, dtype=dtype)
    return out


class _Said:
    """What the loss was, in words, once the forward ran: an object of its own, as
    torch.export puts a module's list and dict attributes back after tracing."""
    words = ""


class StepLoss(torch.nn.Module):
    """The model with the loss a training step backpropagates as its first output
    (lm_loss.step_loss: the plan's, or the model's own, else its floating outputs summed),
    then what the training loop holds beside it through the backward (ExportedRun holds
    them). ``said.words`` receives what the loss was when the forward runs."""

    def __init__(self, model: torch.nn.Module, plan: LossPlan | None = None):
        super().__init__()
        self.model = model
        self.plan = plan or OWN_OR_SUM
        self.said = _Said()

    def forward(self, *args, **kwargs):
        loss, held, self.said.words = step_loss(self.model, self.plan, args, kwargs)
        return (loss, *held)


class JointTrace(NamedTuple):
    """A training step traced by ``export_joint``, as lower_joint takes it."""
    gm: "torch.fx.GraphModule"
    sig: Any                    # AOTAutograd's signature: parameter names carry ``prefix``
    prefix: str
    scopes: dict[str, str]      # each forward node of the joint graph -> its module path
    kernels: tuple              # each attention call's (module path, kernel, why)
    held: dict[str, str]        # how long the model's Python held forward tensors (a local
    #                             past its last use, a list of chunks: PythonReferences)
    written: dict[str, str]     # what the model ran in place (``core[:, i] = x``, ``relu_``)
    loss: str = ""              # the loss the step backpropagates, in words (lm_loss.py)


def export_joint(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
                 name: str = "model", sizes=None, attention=None, autocast=None,
                 loss: LossPlan | None = None):
    """The joint forward+backward graph of one training step, traced from the model's
    ``torch.export`` program (AOTAutograd on fake tensors).

    The forward is exported first, in train mode, then AOTAutograd runs the exported graph
    (not the eager module) to trace the backward: code that takes another branch when it
    sees ``torch.export`` (transformers' attention masks, which would otherwise call
    ``.item()`` on a fake tensor) is traced the way it exports.

    ``attention`` (an AttentionTarget): each ``scaled_dot_product_attention`` is traced as
    the kernel PyTorch would dispatch on that target (attention_kernels.py); None: as this
    machine dispatches it. ``autocast`` (an AutocastSpec): the forward runs in
    ``torch.autocast``, its casts traced (autocast_casts.py). ``loss`` (lm_loss.plan_loss's):
    the loss backpropagated, its labels added to the inputs (None: the model's own, else the
    sum of its outputs). Returns a :class:`JointTrace`; the model is put back in its mode."""
    from .bounded_trace import BoundedSizes, explain
    from .exported_run import ExportedRun
    from .float8_linears import float8_exported
    from .frontend import kept_whole

    was_training = model.training
    model.train()
    sizes = sizes if sizes is not None else BoundedSizes()  # data-dependent sizes
    wrapped = StepLoss(model, loss)
    kwargs = with_labels(wrapped.plan, tuple(args), kwargs or {})
    try:
        with warnings.catch_warnings(), quiet_torch_logs(), sizes:
            warnings.simplefilter("ignore", FutureWarning)
            with no_stack_traces(), eager_paths(), kept_whole(), eager_view_strides(), \
                    float8_exported(), lifted_fakes_kept():
                refs: dict[str, str] = {}  # how long the model's Python holds each tensor
                with PythonReferences(refs), saved_as_run(autocast), \
                        sizes.inputs.of(model, tuple(args), kwargs or {}):
                    program = torch.export.export(wrapped, tuple(args),
                                                  kwargs=kwargs or {}, strict=False)
                runner = ExportedRun(program, attention, autocast, refs)
                inputs = _fake(runner.flat_inputs(args, kwargs))
                try:
                    gm, sig = _trace_joint(runner, inputs)
                except AssertionError as exc:  # (AOTAutograd's words, torch 2.8 to 2.14)
                    if "did not receive a gradient" not in str(exc):
                        raise
                    with runner.unreached_frozen():  # as eager leaves them: grad_reach.py
                        gm, sig = _trace_joint(runner, inputs)
    except GraphcostError:
        raise
    except Exception as exc:
        raise TraceFailure(f"{name}: tracing forward+backward failed "
                           f"({explain(exc, sizes) or _one_line(exc)})", exc) from None
    finally:
        model.train(was_training)
    assert isinstance(gm, torch.fx.GraphModule)  # (a joint trace is one)
    obey_layout_contract(gm, sig)  # AccumulateGrad's copies (accumulate_grad.py)
    held, written = runner.python_facts(gm.graph)
    written.update(summed_in_place(gm.graph) | copied_in_place(gm.graph))  # accumulate_grad
    held.update(held_by_backward(gm.graph))  # (a point in the backward: after Python's)
    return JointTrace(gm, sig, "gm.model.", runner.scopes(gm.graph), tuple(runner.kernels),
                      held, written, wrapped.said.words)


def _trace_joint(runner, inputs: tuple):
    """AOTAutograd's joint trace of ``runner`` (the loss its first output): (gm, signature),
    its backward nodes marked with the autograd node that made each (aot_joint.py)."""
    from .aot_joint import aot_joint
    from .frontend import training_decompositions

    with _one_fake_mode(inputs):
        return aot_joint(runner, inputs, training_decompositions())


def _fake(inputs: tuple) -> tuple:
    """Real input tensors as fake ones: the backward is traced without computing anything
    (and a GPU's attention kernel, which has no CPU implementation, can be traced)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    if any(isinstance(t, FakeTensor) or t.is_meta for t in inputs):
        return inputs
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    return tuple(mode.from_tensor(t, static_shapes=True) for t in inputs)


@contextmanager
def _one_fake_mode(args):
    """On a meta model the trace's values are meta tensors, not fake ones, and torch's tracer
    builds a brand-new FakeTensorMode (with a Python stack capture) to describe every one of
    them: a seconds-long cost on a 7B graph. A tracing context holding one mode makes torch's
    ``detect_fake_mode`` find it instead; the values it describes are the same."""
    if not any(getattr(a, "is_meta", False) for a in args):
        yield
        return
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    with tracing(TracingContext(FakeTensorMode(allow_non_fake_inputs=True))):
        yield
