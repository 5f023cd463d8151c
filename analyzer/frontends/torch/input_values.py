"""A branch on a value the example inputs decide, decided by them (``InputValues``, used by
bounded_trace.BoundedSizes while torch.export traces).

torch.export traces on fake tensors, which have no values, so a model's Python that reads one
(``if not padding_mask.any()``, Longformer's ``is_global_attn = mask.flatten().any().item()``)
stops the trace. When that value is made from the example inputs alone (the ids, the masks,
the model's buffers and constants it makes with ``torch.ones`` or ``arange``), it is what it
would be in an eager run of those inputs: graphcost computes it beside the trace, on the
real tensors, and the model's Python reads the real value — the branch the user's inputs
take. A value a weight reaches is never known (its tensor has no real twin); nor is one past
``MAX_ELEMENTS`` (a 2048² attention mask is not worth its copy), or on the meta device —
but for the token ids graphcost makes for a config's model (built on meta): those stand for
ids of one ordinary token, no padding nor any other special token (``stand_in``, registered
by the loader), and what the model makes from them alone is computed on the CPU. For those
stand-ins alone, a size their values decide (a boolean mask's selection) is traced at the size
they give (``InputValues.sized``): a training trace cannot follow a data-dependent size, and
the ids are graphcost's choice, said; a user's inputs' sizes stay data-dependent, traced at
their bound (bounded_trace.py). The report says which lines of the model read such a value,
and whose values decided it.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import torch
import torch.utils._pytree  # (torch.utils does not import it for the type checker)
from torch.utils.weak import WeakIdKeyDictionary

from .finite_checks import asking_line
from .int_values import written_by

# The largest tensor computed for real beside the trace (elements): masks and ids, not
# activations; a larger one (and all made from it) is left unknown.
MAX_ELEMENTS = 1 << 20
# The reads a fake tensor cannot answer, which stop the trace: a truth value (``if``,
# ``assert``, ``not``: ``__bool__``; ``.item()`` of a boolean, Longformer's
# ``is_global_attn``) and a Python number (``int(n)``, an index). ``.item()`` of a number
# stays a symbol, a data-dependent size as bounded_trace.py traces it.
_READS = (torch.Tensor.__bool__, torch.Tensor.item, torch.Tensor.__int__,
          torch.Tensor.__index__)


# the calls whose output's size their inputs' values decide (``InputValues.sized``)
_SIZED_BY_VALUES = frozenset({"nonzero", "argwhere", "unique", "unique_consecutive",
                              "masked_select", "repeat_interleave", "arange"})
# the methods that take sizes after the tensor, which a known 0-d tensor may give
_TAKING_SIZES = frozenset({"new_zeros", "new_ones", "new_empty", "new_full", "view", "reshape",
                           "expand", "repeat", "narrow"})
# meta example input -> (the CPU values it stands for, what they are: ``stand_in``)
_STAND_INS = WeakIdKeyDictionary()
ORDINARY = "with no padding or other special token"


def stand_in(meta: torch.Tensor, values: torch.Tensor, words: str = ORDINARY) -> None:
    """Branches on the meta tensor ``meta`` (an example input graphcost made) are decided by
    ``values`` (CPU, its shape and dtype): token ids ``words`` (the report's)."""
    _STAND_INS[meta] = (values, words)


def stand_in_of(meta: torch.Tensor) -> torch.Tensor:
    """The values ``stand_in`` paired with ``meta``."""
    return _STAND_INS[meta][0]


class InputValues:
    """Fake tensor -> its real twin, for the tensors made from the example inputs alone."""

    def __init__(self):
        self._real = WeakIdKeyDictionary()
        self._on = False  # within ``of``: torch.export's run of the model, not what follows
        self.asked: list[str] = []  # "modeling_fsmt.py:266", one per line that read one
        self.sized_any = False   # a size the stand-ins decide was traced as constants
        self.stood_in = ""   # what the stand-ins paired are (graphcost's ids, not the user's)

    @contextmanager
    def of(self, model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any]) -> Iterator:
        """Meanwhile, the fake inputs ``model`` is called with get the real ``args`` and
        ``kwargs`` as twins (matched by position and keyword, shape and dtype), and its fake
        buffers their real ones (by name: a quantizer's running range, position ids)."""
        buffers = dict(model.named_buffers())

        def seen(module, fake_args, fake_kwargs):
            self._pair(args, fake_args)
            for key, value in fake_kwargs.items():
                if key in kwargs:
                    self._pair(kwargs[key], value)
            for name, fake in module.named_buffers():
                if name in buffers:
                    self._pair(buffers[name], fake)

        handle = model.register_forward_pre_hook(seen, with_kwargs=True)
        self._on = True
        try:
            yield
        finally:
            handle.remove()
            self._on = False
            self._real.clear()

    def _pair(self, real, fake) -> None:
        reals = torch.utils._pytree.tree_leaves(real)
        fakes = torch.utils._pytree.tree_leaves(fake)
        if len(reals) != len(fakes):
            return
        for r, f in zip(reals, fakes):
            if type(r) is torch.Tensor and r.device.type == "meta":
                stood = _STAND_INS.get(r)
                if stood is None:
                    continue
                r, words = stood
                if not self.stood_in or words != ORDINARY:   # (the ids ending in eos, said)
                    self.stood_in = words
            if type(r) is torch.Tensor and r.device.type != "meta" and _small(r) \
                    and isinstance(f, torch.Tensor) and f is not r \
                    and r.shape == f.shape and r.dtype == f.dtype:  # (not fake: real values)
                self._real[f] = r  # (no op on it here: the trace would record one)

    def answer(self, func, args: tuple, kwargs: Mapping[str, Any]) -> Any:
        """The value a read of a tensor with a real twin returns; None otherwise."""
        if func not in _READS or not args or not isinstance(args[0], torch.Tensor) \
                or args[0] not in self._real \
                or (func is torch.Tensor.item and args[0].dtype != torch.bool):
            return None
        try:
            value = _eager(func, (self._real[args[0]], *args[1:]), kwargs)
        except Exception:  # noqa: BLE001 - as unknown as before
            return None
        self._asking()
        return value

    def _asking(self, sized: bool = False) -> None:
        """The model's line that reads a value (``sized``: a size its values decide, made
        constants of the trace): the report names it."""
        self.sized_any = self.sized_any or sized
        where = asking_line()
        if where not in self.asked:
            self.asked.append(where)

    def sized(self, func, args: tuple, kwargs: Mapping[str, Any]) -> Any:
        """For graphcost's stand-in ids only (``stood_in``): a call whose output's size the
        data decides, made of the stand-ins' values, traced at the size they give — which
        AOTAutograd's backward trace can follow, as it cannot a data-dependent size. Such a
        call (``_SIZED_BY_VALUES``) of known tensors alone is its result, constants of the
        trace: BART's and T5's sequence classifiers check ``unique_consecutive(eos_mask
        .sum(1))``, Longformer's global attention takes ``nonzero`` of its mask.
        ``hidden[eos_mask, :]`` (BART's pooling at each sequence's eos token) indexes
        ``hidden`` by the known mask's positions, constant index tensors, as eager's boolean
        indexing gathers them. None otherwise (traced as before: a data-dependent size at
        its bound)."""
        if not self._on or not self.stood_in or not args:
            return None
        name = getattr(func, "__name__", "")
        if name in _SIZED_BY_VALUES:
            return self._constants(func, args, kwargs)
        if name in _TAKING_SIZES:   # (Longformer's new_zeros(max_num_global_attn_indices, …))
            sizes = [self._number(a) for a in args[1:]]
            if any(n is not None for n in sizes):
                self._asking(sized=True)
                return func(args[0], *(a if n is None else n for a, n in zip(args[1:], sizes)),
                            **kwargs)
        if name == "__getitem__" and len(args) == 2:   # (TensorBase's slot)
            index = self._positions(args[1], args[0])
            if index is not None:
                self._asking(sized=True)
                return func(args[0], index)
        return None

    def _number(self, a) -> int | None:
        """A size given as a known 0-d integer tensor: its value (an eager call reads it
        so); None for anything else."""
        if isinstance(a, torch.Tensor) and a in self._real and a.dim() == 0 \
                and not a.dtype.is_floating_point and a.dtype != torch.bool:
            return int(_eager(torch.Tensor.item, (self._real[a],), {}))
        return None

    def _constants(self, func, args: tuple, kwargs: Mapping[str, Any]) -> Any:
        """``func``'s result on the twins as constants of the trace, each with its twin;
        None where a tensor it reads has none."""
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs))
                   if isinstance(a, torch.Tensor)]
        if not tensors or not all(t in self._real for t in tensors):
            return None
        try:
            real = _eager(func, *torch.utils._pytree.tree_map(self._twin, (args, kwargs)))
        except Exception:  # noqa: BLE001 - what eager refuses stays unknown
            return None
        device = tensors[0].device
        self._asking(sized=True)
        return torch.utils._pytree.tree_map(
            lambda r: self._constant(r, device) if isinstance(r, torch.Tensor) else r, real)

    def _constant(self, real: torch.Tensor, device) -> torch.Tensor:
        """A constant of the trace holding ``real``'s values (read outside the trace's
        modes), on ``device``; ``real`` its twin."""
        if real.numel() == 0:
            out = torch.empty(real.shape, dtype=real.dtype, device=device)
        else:
            out = torch.tensor(_eager(torch.Tensor.tolist, (real,), {}), dtype=real.dtype,
                               device=device)
        self._real[out] = real
        return out

    def _positions(self, index, x) -> tuple | None:
        """``index`` with each boolean tensor in it (a known mask) as the integer index
        tensors of its positions (``nonzero``); None when it holds none or an unknown one."""
        parts = index if isinstance(index, tuple) else (index,)
        masks = [p for p in parts if isinstance(p, torch.Tensor) and p.dtype == torch.bool]
        if not masks or not all(m in self._real for m in masks):
            return None
        out: list = []
        for p in parts:
            if isinstance(p, torch.Tensor) and p.dtype == torch.bool:
                at = _eager(torch.Tensor.nonzero, (self._real[p],), {"as_tuple": True})
                out += [self._constant(i, x.device) for i in at]
            else:
                out.append(p)
        return tuple(out)

    def record(self, func, args: tuple, kwargs: Mapping[str, Any], out) -> None:
        """``out``'s twins, computed from the twins of ``func``'s inputs when every tensor it
        reads has one (a factory reads none; an in-place write updates the twin it writes);
        where one is missing, the tensors it may write lose theirs (int_values.written_by)."""
        if not self._on or (not self._real and not _is_factory(args, kwargs)):
            return
        ins = [a for a in torch.utils._pytree.tree_leaves((args, kwargs))
               if isinstance(a, torch.Tensor)]
        outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if all(a in self._real for a in ins) and (ins or outs) \
                and all(_small(t) and (t.device.type != "meta" or self.stood_in)
                        for t in outs):
            real_args, real_kwargs = torch.utils._pytree.tree_map(self._twin, (args, kwargs))
            try:
                real = _eager(func, real_args, real_kwargs)
            except Exception:  # noqa: BLE001 - what eager refuses stays unknown
                return self._forget(written_by(func, args, kwargs, out))
            reals = [t for t in torch.utils._pytree.tree_leaves(real)
                     if isinstance(t, torch.Tensor)]
            for fake, r in zip(outs, reals) if len(reals) == len(outs) else ():
                if fake.shape == r.shape and fake.dtype == r.dtype:
                    self._real[fake] = r
            return
        self._forget(written_by(func, args, kwargs, out))

    def _twin(self, a):
        """An argument as the twin computation takes it: a tensor's twin, the meta device
        the CPU (a stand-in's twins are computed there)."""
        if isinstance(a, torch.Tensor):
            return self._real[a]
        if self.stood_in and (a == "meta" or (isinstance(a, torch.device)
                                              and a.type == "meta")):
            return torch.device("cpu")
        return a

    def _forget(self, written: list) -> None:
        """The twins of every tensor written without its twin being written too (views
        sharing its storage included): theirs are stale."""
        if not written or not self._real:
            return
        storages = set()
        for t in written:
            try:
                storages.add(t.untyped_storage()._cdata)
            except Exception:  # noqa: BLE001 - no storage to compare: forget everything
                self._real.clear()
                return
        for t in [t for t in self._real if t.untyped_storage()._cdata in storages]:
            del self._real[t]


def _small(t: torch.Tensor) -> bool:
    n = t.numel()
    return isinstance(n, int) and n <= MAX_ELEMENTS


def _is_factory(args: tuple, kwargs: Mapping[str, Any]) -> bool:
    """A call that reads no tensor (``torch.ones(shape)``, ``arange(n)``)."""
    if args and isinstance(args[0], torch.Tensor):  # (most calls: no tree walk for them)
        return False
    return not any(isinstance(a, torch.Tensor)
                   for a in torch.utils._pytree.tree_leaves((args, kwargs)))


def _eager(func, args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """``func`` run eagerly on real tensors, outside the trace's torch-function and dispatch
    modes (the fake and proxy modes would take real tensors for constants)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch._C.DisableTorchFunction():
        return func(*args, **kwargs)
