"""The breadth sweep's training step: ``python -m benchmarks.sweep_breadth --train ...``.

Each model (built as sweep_breadth.py builds it) takes one SGD step: the loss is the sum of
its floating outputs (graphcost's training loss), in train mode (dropout on: CPU's dropout
keeps a noise tensor, which graphcost models). Measured against graphcost's analysis of the
same step (``train=True, optimizer="sgd"``, the inputs left out as MemTracker leaves them):

* FLOPs: FlopCounterMode over the eager step's forward and backward, on the kernels it has
  formulas for (sweep_breadth's swaps; flop_formulas.py where it has none or counts wrong),
  against graphcost's 2·MACs (within 1%?);
* memory: MemTracker's peak over the second step (``analyzer.measure.reference
  .measure_training``: the kernels this CPU dispatches, no swaps) against graphcost's
  training peak (within 5%? within 1%?); where it is more than 1% off, also the peak of the
  step with no dispatch mode on (``measure_training_unperturbed``, torch.profiler's memory
  events: MemTracker's mode makes the engine's gradient sums out of place).

A model whose step fails in eager (a forward that returns no floating tensor to sum, a
backward the module refuses) is a failure of the stage "step", not graphcost's.
"""
from __future__ import annotations

from typing import Any, Callable


def reference_step(model, args: tuple, kwargs: dict, kernels: Callable) -> int:
    """FlopCounterMode's total over one training step's forward and backward (train mode,
    ``kernels(model)`` around both); the gradients dropped after, the mode put back."""
    import torch
    from graphcost.analyzer.measure.reference import training_loss_of
    from torch.utils.flop_counter import FlopCounterMode

    from .flop_formulas import conv_backward_flops, solve_triangular_flops

    was = model.training
    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten.linalg_solve_triangular: solve_triangular_flops,
        torch.ops.aten.convolution_backward: conv_backward_flops})
    try:
        model.train()
        with counter, kernels(model):
            training_loss_of(model, args, kwargs).backward()
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was)
    return int(counter.get_total_flops())


def compare_peak(model, args: Any, report, rec: dict) -> None:
    """MemTracker's peak over the model's second SGD step beside graphcost's (``report``)."""
    from graphcost.analyzer.measure.reference import measure_training

    was = model.training
    try:
        model.train()
        if isinstance(args, dict):
            measured = measure_training(model, (), "sgd", kwargs=args)[0]
        else:
            measured = measure_training(model, tuple(args), "sgd")[0]
    except Exception as exc:  # MemTracker's failure is no verdict on graphcost
        rec["peak_error"] = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
        return
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was)
    ours = report.training.peak_bytes
    rec.update(peak_gc=ours, peak_ref=measured)
    rec["peak_ok"] = measured > 0 and abs(ours / measured - 1) <= 0.05
    rec["peak_exact"] = measured > 0 and abs(ours / measured - 1) <= 0.01
    if not rec["peak_exact"]:
        _compare_unperturbed(model, args, rec)


def _compare_unperturbed(model, args: Any, rec: dict) -> None:
    """Where MemTracker's peak is more than 1% off, the step's peak with no dispatch mode on
    (``measure_training_unperturbed``: MemTracker's mode makes the autograd engine's
    gradient sums out of place) beside it: ``peak_eager``."""
    from graphcost.analyzer.measure.reference import measure_training_unperturbed

    was = model.training
    try:
        model.train()
        kwargs = args if isinstance(args, dict) else None
        rec["peak_eager"] = measure_training_unperturbed(
            model, () if kwargs is not None else tuple(args), "sgd", kwargs=kwargs)
    except Exception as exc:  # the profiler's failure is no verdict either
        rec["peak_eager_error"] = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was)


def peak_cell(rec: dict) -> str:
    """The table's memory cell: graphcost's peak against MemTracker's."""
    ref, ours = rec.get("peak_ref", 0), rec.get("peak_gc", 0)
    if not ref:
        return ""
    return f"{'ok' if rec.get('peak_ok') else 'OFF'} {100 * (ours / ref - 1):+.1f}%"


def _eager_words(rec: dict) -> str:
    """``; the step with no dispatch mode on: +0.0%`` where that peak was measured."""
    eager = rec.get("peak_eager")
    if not eager:
        return ""
    return f"; the step with no dispatch mode on: {100 * (rec['peak_gc'] / eager - 1):+.1f}%"


def peak_counts(records: list[dict]) -> list[tuple[str, str]]:
    """The count rows of the memory comparison."""
    measured = [r for r in records if r.get("peak_ref")]
    return [("training peak within 5% of MemTracker's",
             f"{sum(bool(r.get('peak_ok')) for r in measured)} of {len(measured)}"),
            ("training peak within 1% of MemTracker's",
             f"{sum(bool(r.get('peak_exact')) for r in measured)} of {len(measured)}"),
            ("within 5% of MemTracker's or of the step with no mode on",
             f"{sum(bool(r.get('peak_ok')) or _within(r, 0.05) for r in measured)} of "
             f"{len(measured)}"),
            ("within 1% of MemTracker's or of the step with no mode on",
             f"{sum(bool(r.get('peak_exact')) or _within(r, 0.01) for r in measured)} of "
             f"{len(measured)}")]


def _within(rec: dict, tolerance: float) -> bool:
    eager = rec.get("peak_eager")
    return bool(eager) and abs(rec["peak_gc"] / eager - 1) <= tolerance


def print_peak_misses(records: list[dict]) -> None:
    """The models whose peak is off by more than 5%, or that MemTracker could not measure."""
    off = [r for r in records if r.get("peak_ref") and not r.get("peak_ok")]
    if off:
        print(f"\nAnalyzed, training peak off by more than 5% ({len(off)}):\n")
        for r in off:
            print(f"* {r['name']}: {r['peak_gc']:,} B vs MemTracker's {r['peak_ref']:,} B "
                  f"({peak_cell(r).split()[-1]}){_eager_words(r)}")
    between = [r for r in records if r.get("peak_ok") and not r.get("peak_exact")]
    if between:
        print(f"\nAnalyzed, training peak off by 1% to 5% ({len(between)}):\n")
        for r in between:
            print(f"* {r['name']}: {peak_cell(r).split()[-1]}{_eager_words(r)}")
    failed = [r for r in records if r.get("peak_error")]
    if failed:
        print(f"\nMemTracker failed ({len(failed)}):\n")
        for r in failed:
            print(f"* {r['name']}: {r['peak_error'][:120]}")
