"""Capturing PyTorch models for the FX frontend: nn.Module, fx.GraphModule, a class in a file.

Inputs are fake tensors (FakeTensorMode) on the model's own device, or meta tensors when the
model lives on the meta device, so no activation and no weight is ever allocated; a model
built under ``torch.device("meta")`` (a 7B decoder) is never materialized. ``torch.export``
runs the model's forward on those fakes and leaves the module as it was (no hooks, no
attributes added).

Shapes are static: binding another batch or sequence length re-exports (the module is traced
again, ~1 s for ResNet-50), which keeps every model exportable without dynamic-shape guards.
"""
from __future__ import annotations

import importlib.util
import io
import logging
import inspect
import sys
import warnings
from contextlib import contextmanager, redirect_stderr
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from graphcost.analyzer.errors import GraphcostError


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
            raise GraphcostError(f"--input-shape names no argument {name!r} of "
                                 f"{type(model).__name__}.forward; its arguments are: "
                                 + ", ".join(names))
    missing = [p.name for p in params if p.default is p.empty and p.name not in input_shapes]
    if missing:
        raise GraphcostError(f"{type(model).__name__}.forward needs {', '.join(missing)}: pass "
                             + " ".join(f"--input-shape {m}=..." for m in missing))
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
                  name: str = "model") -> "torch.export.ExportedProgram":
    """``torch.export`` (non-strict) with errors turned into one clear line."""
    try:
        with warnings.catch_warnings(), quiet_torch_logs():
            warnings.simplefilter("ignore", FutureWarning)  # torch-internal deprecations
            return torch.export.export(model, tuple(args), kwargs=kwargs or {}, strict=False)
    except GraphcostError:
        raise
    except Exception as exc:
        raise GraphcostError(f"{name}: torch.export could not trace the forward "
                             f"({_one_line(exc)})") from None


def _one_line(exc: Exception) -> str:
    """An exception as 'Type: first non-empty line' (torch's messages run to pages)."""
    first = next((line for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first[:300]}"


@contextmanager
def quiet_torch_logs():
    """torch.export logs warnings and whole graph dumps to stderr when a trace fails; the
    failure is reported as one line instead, so torch's loggers are silenced and its stderr
    writes captured meanwhile (a library call prints nothing)."""
    names = ["torch", *(n for n in logging.root.manager.loggerDict if n.startswith("torch."))]
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        with redirect_stderr(io.StringIO()):
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


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


class _SumLoss(torch.nn.Module):
    """Every floating output of the model summed to one scalar: a loss whose backward reaches
    every parameter the outputs depend on, with no large tensors of its own."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        leaves = [t for t in torch.utils._pytree.tree_leaves(out)
                  if isinstance(t, torch.Tensor) and t.is_floating_point()]
        loss = leaves[0].sum()
        for t in leaves[1:]:
            loss = loss + t.sum()
        return (loss,)


def export_joint(model: torch.nn.Module, args: tuple = (), kwargs: dict | None = None, *,
                 name: str = "model"):
    """The joint forward+backward graph of one training step (AOTAutograd on fake tensors).

    Returns ``(graph_module, signature, wrapper_prefix)``: parameter names in the signature carry
    the wrapper's ``model.`` prefix. The model is switched to train mode for the trace and put
    back in the mode it had."""
    from torch._functorch.aot_autograd import aot_export_module

    from graphcost.analyzer.frontends.fx_frontend import training_decompositions

    was_training = model.training
    model.train()
    scopes: dict[str, str] = {}
    hooks = _scope_hooks(model, scopes)
    try:
        with warnings.catch_warnings(), quiet_torch_logs():
            warnings.simplefilter("ignore", FutureWarning)
            if kwargs:
                raise GraphcostError("training analysis takes positional inputs only")
            with _no_stack_traces(), _one_fake_mode(args):
                gm, sig = aot_export_module(_SumLoss(model), tuple(args), trace_joint=True,
                                            output_loss_index=0,
                                            decompositions=training_decompositions())
    except GraphcostError:
        raise
    except Exception as exc:
        raise GraphcostError(f"{name}: tracing forward+backward failed "
                             f"({_one_line(exc)})") from None
    finally:
        for h in hooks:  # the user's module is left without hooks
            h.remove()
        model.train(was_training)
    return gm, sig, "model.", scopes


@contextmanager
def _no_stack_traces():
    """The tracer records a Python stack trace on every node (``meta["stack_trace"]``): 4 s of
    the 21 s the 7B joint trace took. Nothing here reads it; the graph is otherwise the same."""
    import torch.fx.config as fx_config

    before = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = before


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


def _scope_hooks(model: torch.nn.Module, scopes: dict[str, str]) -> list:
    """Forward hooks that name the module of every forward node of the joint trace.

    AOTAutograd's joint graph carries no ``nn_module_stack``: each module call is bracketed by
    the tracer graph's last node at entry and at exit, and the nodes in between get the module
    path (the innermost module first, since inner calls return first). Removed by the caller.
    """
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    entries: dict[str, list] = {}

    def last_node():
        mode = get_proxy_mode()
        if mode is None:
            return None, None
        graph = mode.tracer.graph
        return next(iter(reversed(graph.nodes)), None), graph

    def pre(name):
        def hook(_mod, _inp):
            node, _ = last_node()
            entries.setdefault(name, []).append(node)
        return hook

    def post(name):
        def hook(_mod, _inp, _out):
            node, graph = last_node()
            stack = entries.get(name)
            if graph is None or not stack:
                return
            stop = stack.pop()
            for n in reversed(graph.nodes):
                if n is stop:
                    break
                scopes.setdefault(n.name, name)
        return hook

    hooks = []
    for name, mod in model.named_modules():
        if name:
            hooks.append(mod.register_forward_pre_hook(pre(name)))
            hooks.append(mod.register_forward_hook(post(name)))
    return hooks
