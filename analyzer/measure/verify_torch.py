"""``graphcost verify`` for PyTorch: MemTracker over a real CPU forward or training step,
against graphcost's peak overall and per module (analyzer.measure.reference takes the measurements).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...passes.choices import Optimizer
from ...passes.errors import GraphcostError
from ..app.report import Report
from .reference import measure_inference, measure_training


@dataclass(frozen=True)
class ModulePeak:
    path: str                      # "" is the whole model
    type: str
    depth: int
    predicted_bytes: int           # max of the timeline over the module's nodes
    measured_bytes: int | None     # MemTracker's activations at the module's local peak
    calls: int

    @property
    def rel_error(self) -> float | None:
        return _rel(self.predicted_bytes, self.measured_bytes)


@dataclass(frozen=True)
class PeakPart:
    """One category of the training peak, graphcost's breakdown beside MemTracker's."""
    category: str
    predicted_bytes: int
    measured_bytes: int

    @property
    def rel_error(self) -> float | None:
        return _rel(self.predicted_bytes, self.measured_bytes)


# graphcost's training breakdown keys -> MemTracker's reference types. Only parameters,
# buffers and gradients mean the same on both sides; the rest is compared as one sum, since
# the two classify it differently (MemTracker tags the optimizer step's temporaries
# "Optstate" and everything the backward allocates "Temp"; graphcost splits by tensor role).
_PARTS = (("parameters", ("params",), ("Parameter",)),
          ("buffers", ("buffers",), ("Buffer",)),
          ("gradients", ("gradients",), ("Gradient",)),
          ("optimizer state, activations, temporaries",
           ("master_weights", "optimizer_state", "activations", "temporaries"),
           ("Optstate", "Activation", "Temp", "Other")))


@dataclass(frozen=True)
class TorchVerification:
    model: str
    batch: int
    mode: str                      # "inference" or "training"
    optimizer: str | None
    predicted_peak_bytes: int
    measured_peak_bytes: int
    modules: tuple[ModulePeak, ...]
    measured_breakdown: dict[str, int] = field(default_factory=dict)  # MemTracker's at peak
    note: str = ""
    parts: tuple[PeakPart, ...] = ()   # training: the peak by category, both sides

    @property
    def rel_error(self) -> float | None:
        return _rel(self.predicted_peak_bytes, self.measured_peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "torch", "model": self.model, "batch": self.batch, "mode": self.mode,
                "optimizer": self.optimizer,
                "peak": {"predicted_bytes": self.predicted_peak_bytes,
                         "measured_bytes": self.measured_peak_bytes,
                         "rel_error": self.rel_error},
                "measured_breakdown": dict(self.measured_breakdown), "note": self.note,
                "parts": [{"category": p.category, "predicted_bytes": p.predicted_bytes,
                           "measured_bytes": p.measured_bytes, "rel_error": p.rel_error}
                          for p in self.parts],
                "modules": [{"path": m.path, "type": m.type, "depth": m.depth,
                             "calls": m.calls, "predicted_bytes": m.predicted_bytes,
                             "measured_bytes": m.measured_bytes, "rel_error": m.rel_error}
                            for m in self.modules]}


def _rel(predicted: int, measured: int | None) -> float | None:
    return predicted / measured - 1.0 if measured else None


OPTIMIZERS = Optimizer.words()


def verify_torch(module, example_inputs: Sequence[Any] | Mapping[str, Any], *,
                 name: str | None = None, train: bool = False, optimizer: str = "adam",
                 depth: int = 1, lifetimes: str | None = None,
                 progress: Callable[[str], None] | None = None,
                 all_layers: bool = False) -> TorchVerification:
    """Measure ``module`` (real weights, CPU) on ``example_inputs`` (positional tuple, or
    keyword inputs by forward argument name) with MemTracker and compare with analyze().

    Inference: activations at the peak of one forward under torch.no_grad(), overall and per
    module down to ``depth`` (0 = overall only). Graph inputs are excluded on both sides (they
    exist before the tracker starts). Training: the peak of the second step (optimizer state
    already allocated; gradients set to None first), as graphcost models a steady-state step.
    The module's weights change in training (two optimizer steps)."""

    from ..app.api import analyze

    if optimizer not in OPTIMIZERS:
        raise GraphcostError(f"optimizer must be one of {', '.join(OPTIMIZERS)}")
    kwargs = dict(example_inputs) if isinstance(example_inputs, Mapping) else {}
    args = () if isinstance(example_inputs, Mapping) else tuple(example_inputs)
    inputs = kwargs or args  # analyze() takes either; measured with the same call
    label = name or type(module).__name__
    batch = next((int(t.shape[0]) for t in (*args, *kwargs.values())
                  if getattr(t, "ndim", 0)), 1)
    if train:
        was = module.training
        module.train()
        # (analyze's annotation omits the keyword-inputs Mapping it takes: app/api.py's to fix)
        report = analyze(module, inputs, train=True, optimizer=optimizer, progress=progress,  # pyright: ignore[reportArgumentType]
                         include_inputs=False, what_if=False, all_layers=all_layers)
        assert report.training is not None  # (train=True)
        measured, breakdown = measure_training(module, args, optimizer, kwargs)
        module.train(was)
        predicted = report.training.breakdown_at_peak
        parts = tuple(PeakPart(cat, sum(predicted.get(k, 0) for k in ours),
                               sum(breakdown.get(k, 0) for k in theirs))
                      for cat, ours, theirs in _PARTS)
        return TorchVerification(label, batch, "training", optimizer,
                                 report.training.peak_bytes, measured, (), breakdown,
                                 "one steady-state step (the second), graph inputs excluded "
                                 "on both sides; predicted peak in the "
                                 f"{report.training.peak_phase} phase; per-module figures "
                                 "are compared for inference only", parts)
    module.eval()
    report = analyze(module, inputs, include_inputs=False, lifetimes=lifetimes,  # pyright: ignore[reportArgumentType]
                     progress=progress, all_layers=all_layers)
    measured, breakdown, per_module = measure_inference(module, args, kwargs)
    rows = [_module_peak(m, report, per_module) for m in report.modules if m.depth <= depth]
    b = report.bounds  # data-dependent sizes: the prediction is their upper bound
    bounded = "" if b is None else (
        f"; predicted with {len(b.sizes)} data-dependent size(s) at their maxima (at their "
        f"minima: {b.lower_activation_peak:,} B), measured on this run's data")
    return TorchVerification(label, batch, "inference", None, report.memory.peak_bytes,
                             measured, tuple(rows), breakdown,
                             f"activations, {report.memory.lifetimes} lifetimes, graph inputs "
                             "excluded on both sides" + bounded)


def _module_peak(row, report: Report, measured: Mapping[str, tuple[int, int]]) -> ModulePeak:
    """Predicted: the largest timeline entry over the nodes whose scope is the module or lies
    inside it — bytes live anywhere in the program while one of the module's nodes runs, the
    quantity MemTracker records at the module's local peak."""
    path = row.path
    tl = report.memory.timeline
    inside = [tl[n.index] for n in report.nodes
              if not path or n.scope == path or n.scope.startswith(path + ".")]
    got = measured.get(path)
    return ModulePeak(path, row.type, row.depth, max(inside, default=0),
                      got[0] if got else None, got[1] if got else 0)
