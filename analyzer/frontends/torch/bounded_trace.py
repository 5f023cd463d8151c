"""Tracing a model whose sizes depend on the data (detection post-processing, NMS).

``torch.nonzero``, a boolean mask, ``torch.unique`` or a custom op whose fake kernel calls
``ctx.new_dynamic_size()`` (torchvision's ``nms``) return a tensor whose size torch.export
cannot know: an *unbacked symbol*, named ``u0``, ``u1``… in the order the trace creates them,
with a value range (``nonzero`` of 768 elements: [0, 768]). The trace keeps such sizes
symbolic; it fails only where the model's Python branches on one (torchvision's
``batched_nms``: ``if boxes.numel() == 0``, "Could not guard on data-dependent expression
Eq(4*u1, 0)").

``bounded_sizes`` traces such a model at its upper bounds:

* A branch on a data-dependent size is decided as the size's upper bound decides it, and the
  decision is kept as a runtime assertion in the graph (torch's own mechanism: the ShapeEnv's
  ``real_tensor_prop_unbacked_vals``, which ``torch.export.draft_export`` fills with the sizes
  of one real run; here every size stands at its maximum, so the trace is the path of the
  largest sizes and needs no data). Only sizes are decided this way; a value read from a
  tensor (``.item()``, ``if (x > 0).any()``) keeps failing: no bound says which way it goes
  — unless the example inputs alone decide it (input_values.py: their real values do) or
  it checks that values are finite (finite_checks.py: a healthy step's are).
* A fresh size without a finite maximum gets one from the op's rule when the rule declares it
  (``Rule.bound_shapes``: NMS keeps at most the boxes it is given), or from the user
  (``--dim u3=MAX``), as a ``torch._check(u3 <= MAX)``: torch's value ranges then carry it to
  everything computed from it (``keep[:100]`` is ``Min(100, u3)``).

The settings torch offers instead were tried on torch 2.13 and do not reach these models:
``prefer_deferred_runtime_asserts_over_guards`` and ``backed_size_oblivious`` concern backed
(input) sizes, ``capture_scalar_outputs`` / ``capture_dynamic_output_shape_ops`` are
``torch.compile`` options (non-strict export already captures ``nonzero``), and
``aggressive_guard_free_semantics`` only answers the guards torch itself writes with a
fallback (``guard_or_false``), never a model's ``if``.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Literal, Mapping

import torch
import torch.utils._pytree  # (torch.utils does not import it for the type checker)

from ....passes.errors import opt
from .compat import fake_safe, unbacked_vals_attr
from .dtype_names import dtype_name
from .finite_checks import FiniteChecks
from .input_values import InputValues
from .int_values import IntValues, op_name, overload

if TYPE_CHECKING:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

# torch's "no maximum": int_oo, or sys.maxsize − 1 where a meta kernel writes one
_NO_MAX = sys.maxsize - 1


def upper_of(env, symbol) -> int | None:
    """The finite upper end of ``symbol``'s range in ``env`` (a ShapeEnv), else None."""
    r = env.var_to_range.get(symbol)
    return None if r is None else finite(r.upper)


def finite(x) -> int | None:
    """A range end as an int; None for torch's infinities (int_oo, or sys.maxsize − 1)."""
    if getattr(x, "is_finite", True) is False:
        return None
    try:
        v = int(x)
    except Exception:  # noqa: BLE001 - sympy's infinities raise assorted errors
        return None
    return v if abs(v) < _NO_MAX else None


def is_unbacked(symbol) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    return bool(free_unbacked_symbols(symbol))


class _AtUpperBound(dict):
    """Stands in for the ShapeEnv's ``real_tensor_prop_unbacked_vals``: every data-dependent
    size with a finite maximum reads as that maximum when a guard needs its value."""

    def __init__(self, env, sizes: set):
        super().__init__()
        self._env = env
        self._sizes = sizes      # symbols seen as tensor sizes (beside env.size_like)

    def __bool__(self) -> bool:
        return True

    def _value(self, s) -> int | None:
        if not getattr(s, "is_Symbol", False) or not is_unbacked(s):
            return None
        if s not in self._env.size_like and s not in self._sizes:
            return None  # a value read from a tensor: its maximum decides nothing
        return upper_of(self._env, s)

    def __contains__(self, s) -> bool:
        return self._value(s) is not None

    def __getitem__(self, s):
        v = self._value(s)
        if v is None:
            raise KeyError(s)
        import sympy
        return sympy.Integer(v)

    def get(self, s, default=None):
        return self[s] if s in self else default


class BoundedSizes(torch.overrides.TorchFunctionMode):
    """Active around ``torch.export``: decides guards on data-dependent sizes at their upper
    bounds and caps fresh sizes by the op's rule or the user's ``maxima``. Afterwards
    ``origins`` names the op each symbol came from, ``capped`` how each got its maximum."""

    def __init__(self, maxima: Mapping[str, int] | None = None):
        super().__init__()
        self.maxima = dict(maxima or {})
        self.origins: dict[str, str] = {}     # symbol -> the op that made it
        self.capped: dict[str, str] = {}      # symbol -> where its maximum came from
        self._notes: list[str] = []           # warnings for the report (loops unrolled)
        # the trace's ShapeEnv once installed; False: left alone (draft_export's real values)
        self._env: ShapeEnv | Literal[False] | None = None
        self._sizes: set = set()
        self._values = IntValues()  # what torch.unique's count is bounded by besides sizes
        self.finite = FiniteChecks()  # a check that values are finite: answered as finite
        self.inputs = InputValues()   # values the example inputs alone decide: computed

    def __torch_function__(self, func, types, args=(), kwargs=None):
        func, args, kwargs = fake_safe(func, args, kwargs or {})
        if self._env is None:
            self._install()
        env = self._env
        if not env:
            return func(*args, **kwargs)
        answer = self.inputs.answer(func, args, kwargs)
        if answer is None:
            answer = self.finite.answer(func, args)
        if answer is not None:
            return answer
        rows = None  # an unbind unrolled over a data-dependent expression: its maximum
        if func in _LOOPS and args and isinstance(args[0], torch.Tensor) and args[0].dim():
            n = args[0].shape[_loop_dim(func, args, kwargs)]
            rows = self._loop(func, n)
            if rows is None or func is not torch.Tensor.unbind or n.node.expr.is_Symbol:
                rows = None
        known = len(env.var_to_range)  # a new symbol adds a range: look at outputs only then
        sized = self.inputs.sized(func, args, kwargs) if rows is None else None
        if rows is not None:
            out = _select_each(args[0], _loop_dim(func, args, kwargs), rows)
        elif sized is not None:
            out = sized
        else:
            out = func(*args, **kwargs)
        if len(env.var_to_range) != known:
            self._fresh(func, args, kwargs, out)
        self._values.record(func, args, kwargs, out)
        self.finite.record(func, args, kwargs, out)
        self.inputs.record(func, args, kwargs, out)
        return out

    @property
    def notes(self) -> list[str]:
        """Warnings for the report: loops unrolled, sizes read at their maximum, finiteness
        checks answered (finite_checks.py), values read from the inputs (input_values.py)."""
        asked, read = self.finite.asked, self.inputs.asked
        return self._notes + ([
            "the model checks that values are finite (torch.isfinite, isnan or isinf read by "
            f"its Python, at {', '.join(asked)}): costed as a step whose values are finite, "
            "the other branch not taken"] if asked else []) + ([
            f"the model branches on values of its inputs (at {', '.join(read)}): decided by "
            + (f"token ids {self.inputs.stood_in} (graphcost's for a config's model)"
               if self.inputs.stood_in else "the example inputs' values")
            + ", as an eager run of them decides" + (
                "; the sizes they decide are traced at their values, the few integer ops "
                "that compute them as constants (not costed)" if self.inputs.sized_any
                else "")] if read else [])

    def _install(self) -> None:
        from torch._guards import detect_fake_mode
        mode = detect_fake_mode()
        env = getattr(mode, "shape_env", None)
        if env is None:
            return
        attr = unbacked_vals_attr(env)
        if getattr(env, attr):  # draft_export's real values: leave them be
            self._env = False
            return
        self._env = env
        setattr(env, attr, _AtUpperBound(env, self._sizes))

    def _fresh(self, func, args, kwargs, out) -> None:
        """Cap the unbacked sizes ``func`` just created."""
        if not self._env:
            return
        leaves = [t for t in torch.utils._pytree.tree_leaves(out)
                  if isinstance(t, (torch.Tensor, torch.SymInt))]
        k = -1  # output k is the k-th tensor (a rule's bound_shapes lists tensors)
        for t in leaves:
            k += isinstance(t, torch.Tensor)
            dims = t.shape if isinstance(t, torch.Tensor) else (t,)
            for axis, d in enumerate(dims):
                if not isinstance(d, torch.SymInt):
                    continue
                s = d.node.expr
                if not getattr(s, "is_Symbol", False) or not is_unbacked(s) \
                        or str(s) in self.origins:
                    continue
                self.origins[str(s)] = op_name(func)
                if isinstance(t, torch.Tensor):
                    self._sizes.add(s)
                self._cap(str(s), d, func, args, kwargs, k, axis)

    def _cap(self, name: str, d: torch.SymInt, func, args, kwargs, k: int, axis: int) -> None:
        """``d`` (output ``k``'s dim ``axis``) is the fresh symbol ``name``: without a maximum
        it gets its op's rule's; the user's applies when it is lower."""
        s = d.node.expr
        if upper_of(self._env, s) is None:
            self._rule_cap(name, d, func, args, kwargs, k, axis)
        own = upper_of(self._env, s)
        if name in self.maxima:
            torch._check(d <= self.maxima[name])
            if own is None or self.maxima[name] < own:
                self.capped[name] = f"--dim {name}={self.maxima[name]}"

    def _loop(self, func, n) -> int | None:
        """A Python loop over a tensor whose length the data decides runs at the length's
        maximum: unrolled, if that is at most ``MAX_UNROLL`` (the iterations returned).
        ``len()`` or ``tolist()`` reads the length as a number: its maximum (said in a
        warning)."""
        if not isinstance(n, torch.SymInt) or not is_unbacked(n.node.expr):
            return None
        from torch.utils._sympy.value_ranges import bound_sympy
        assert self._env  # (only called once installed)
        hi = finite(bound_sympy(n.node.expr, self._env.var_to_range).upper)
        if hi is None:
            return None  # torch stops with the symbol; explain() names its flag
        text = str(n.node.expr)
        syms = ", ".join(opt("dims", s, "MAX") for s in sorted(map(str, n.node.expr.free_symbols)))
        where = "".join(f" (from {self.origins[s]})" for s in
                        sorted(map(str, n.node.expr.free_symbols)) if s in self.origins)
        if func not in _ITERATES:
            note = (f"the data-dependent size {text}{where} is read as a number "
                    f"({op_name(func)}): at its maximum, {hi}; what follows uses {hi}")
        elif hi > MAX_UNROLL:
            raise TooManyIterations(
                f"the forward loops over the data-dependent size {text}{where}, up to {hi} "
                f"times; graphcost unrolls at most {MAX_UNROLL}: pass {syms} (its real "
                "maximum, e.g. the number of classes)")
        else:
            # the loop's symbol is in no shape, so the report's sizes never list its source
            why = "; ".join(self.capped[s] for s in sorted(map(str, n.node.expr.free_symbols))
                            if s in self.capped)
            note = (f"a Python loop over the data-dependent size {text}{where} is unrolled at "
                    f"its maximum, {hi} iterations (an upper bound" + (f": {why})" if why else ")"))
        if note not in self._notes:
            self._notes.append(note)
        return hi if func in _ITERATES else None

    def _rule_cap(self, name: str, d: torch.SymInt, func, args, kwargs, k: int,
                  axis: int) -> None:
        from ....passes.costs.registry import lookup
        op = overload(func)
        if op is None and func in _UNIQUE:
            return self._unique_cap(name, d, args, kwargs)
        r = lookup(str(op)) if op is not None else None
        if r is None or r.bound_shapes is None:
            return
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs))
                   if isinstance(a, torch.Tensor)]
        outs = r.bound_shapes(_FakeView(tensors, op, args, kwargs))
        bound = outs[k] if k < len(outs) else None
        if bound is not None and bound[1] is not None and axis < len(bound[1]) \
                and isinstance(bound[1][axis], (int, torch.SymInt)):
            self._check_at_most(d, bound[1][axis])
            self.capped[name] = f"{str(op).rsplit('.', 1)[0]}: {r.bound}"

    def _unique_cap(self, name: str, d: torch.SymInt, args, kwargs) -> None:
        """torch.unique keeps at most its input's elements (along ``dim``: its slices), the
        ONNX Unique rule's bound. torch's fake kernel states it only for a static input; after
        NMS or a mask the input's size is itself data-dependent (batched_nms's class ids)."""
        from ....passes.costs.registry import lookup
        x = args[0] if args else kwargs.get("input")
        dim = kwargs.get("dim", args[4] if len(args) > 4 else None)
        if not isinstance(x, torch.Tensor):
            return
        self._check_at_most(d, x.numel() if dim is None else x.shape[dim])
        rule = lookup("Unique")
        self.capped[name] = f"torch.unique: {rule.bound if rule else 'every element distinct'}"
        known = self._values.get(x) if dim is None else None
        if known is None:
            return
        lo, hi, made = known
        most = upper_of(self._env, d.node.expr)
        if most is None or hi - lo + 1 < most:
            torch._check(d <= hi - lo + 1)
            self.capped[name] = (f"torch.unique: at most {hi - lo + 1} distinct values, its "
                                 f"input's lying in [{lo}, {hi}] ({made})")

    def _check_at_most(self, d: torch.SymInt, bound) -> None:
        """``d <= bound`` into torch's value ranges. torch refines a range from a relation of
        at most 5 symbols (ShapeEnv._maybe_guard_rel: RetinaNet's class ids after 5 levels'
        top-k are 6); beyond, ``bound``'s own maximum caps ``d``."""
        from torch.utils._sympy.value_ranges import bound_sympy
        torch._check(d <= bound)
        if isinstance(bound, torch.SymInt) and upper_of(self._env, d.node.expr) is None:
            assert self._env  # (only called once installed)
            hi = finite(bound_sympy(bound.node.expr, self._env.var_to_range).upper)
            if hi is not None:
                torch._check(d <= hi)


MAX_UNROLL = 256  # iterations of a Python loop over a data-dependent size, at its maximum
_ITERATES = frozenset({torch.Tensor.__iter__, torch.Tensor.unbind})
_LOOPS = _ITERATES | {torch.Tensor.__len__, torch.Tensor.tolist}
# the Python-level functions (no OpOverload to find a rule by) that reach aten's _unique2 /
# unique_dim: torch.unique is a boolean dispatch, Tensor.unique hands its call on to it
_UNIQUE = frozenset({torch.unique, torch.Tensor.unique})


class TooManyIterations(RuntimeError):
    """A Python loop over a data-dependent size whose maximum is too large to unroll."""


def _select_each(x: torch.Tensor, dim: int, rows: int) -> tuple:
    """``x.unbind(dim)`` at ``rows``, the maximum of a length like Min(100, u27): one select
    per row (each index's check decided as the maximum decides it). torch 2.14's own unbind of
    it (a tensor_split, then a squeeze) keeps the axis — pieces of Min(100, u27)//100 rows, so
    Mask R-CNN's ``for m, b in zip(masks, boxes)`` reads ``b[2]`` out of range — and takes
    seconds per hundred rows; of a plain ``u0`` it is right, and torch 2.8 refuses the select."""
    return tuple(x.select(dim, i) for i in range(rows))


def _loop_dim(func, args: tuple, kwargs: Mapping[str, Any]) -> int:
    """The axis a loop op runs over: ``unbind``'s ``dim`` (resize_boxes's ``boxes.unbind(1)``
    runs 4 times, whatever the number of boxes), else the first."""
    if func is not torch.Tensor.unbind:
        return 0
    return int(kwargs.get("dim", args[1] if len(args) > 1 else 0))


class _FakeView:
    """``registry.ShapeView`` over one call's fake tensors: a rule's ``bound_shapes`` reads
    the input sizes (ints or symbols) and the schema's arguments by name."""

    def __init__(self, tensors: list, op, args: tuple, kwargs: Mapping[str, Any]):
        self._t = tensors
        self.n_inputs = len(tensors)
        self._attrs = dict(kwargs)
        schema = getattr(op, "_schema", None)
        for a, v in zip(schema.arguments if schema is not None else (), args):
            self._attrs.setdefault(a.name, v)

    def has_input(self, i: int) -> bool:
        return i < len(self._t)

    def dtype(self, i: int) -> str | None:
        return dtype_name(self._t[i].dtype) if self.has_input(i) else None

    def shape(self, i: int):
        return tuple(self._t[i].shape) if self.has_input(i) else None

    def attr(self, name: str, default: Any = None) -> Any:
        return self._attrs.get(name, default)

    def const(self, i: int) -> Any:
        return None


def explain(exc: BaseException, mode: BoundedSizes | None) -> str | None:
    """A failed trace on a data-dependent expression as one line naming each symbol in it,
    where it came from and the flag that bounds it; None for any other failure."""
    from torch._subclasses.fake_tensor import DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    if isinstance(exc, DynamicOutputShapeException):  # AOTAutograd's static fake tensors
        return (f"{exc.func} returns a size the data decides, which the backward trace "
                f"(AOTAutograd) cannot follow: analyze the inference (without {opt('train')})")
    if isinstance(exc, TooManyIterations):
        return str(exc)
    if not isinstance(exc, GuardOnDataDependentSymNode):
        return None
    cond = getattr(exc, "cond", None)
    symbols = sorted((s for s in getattr(cond, "free_symbols", ()) if is_unbacked(s)),
                     key=lambda s: (len(str(s)), str(s)))
    origins = mode.origins if mode is not None else {}
    env = mode._env if mode is not None and mode._env else None
    parts = []
    for s in symbols:
        name = str(s)
        where = f" (from {origins[name]})" if name in origins else ""
        sized = env is not None and mode is not None and (s in env.size_like or s in mode._sizes)
        if sized or env is None:
            parts.append(f"the size {name}{where} has no upper bound: pass {opt('dims', name, 'MAX')}")
        else:
            parts.append(f"{name}{where} is a value read from a tensor, not a size: no bound "
                         "decides which way the branch goes")
    if not parts:
        return None
    return f"the forward branches on the data-dependent {cond}; " + "; ".join(parts)
