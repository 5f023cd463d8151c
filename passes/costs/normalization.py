"""Normalization and softmax: FLOPs per element, documented per op. No MACs.

Each normalization's rule also says what its backward keeps (``saves="stat"``: the input plus a
float32 statistic of ``stat(shape, attrs) = (rows, groups)``: mean and 1/σ per normalized group,
1/rms alone for RMSNorm), that its output has its input's shape (``same_shape``), and, for the
per-channel ones, that a receptive field passes through (``rf="pointwise"``).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from ..costs.registry import AXIS_ATTRS, OpView, rule


def _channels(shape: tuple[int, ...], _attrs: Mapping[str, Any]) -> tuple[int, int]:
    return 2, shape[1]  # BatchNorm: one mean and 1/σ per channel


def _instances(shape: tuple[int, ...], _attrs: Mapping[str, Any]) -> tuple[int, int]:
    return 2, shape[0] * shape[1]  # InstanceNorm: per sample and channel


def _groups(shape: tuple[int, ...], attrs: Mapping[str, Any]) -> tuple[int, int]:
    # ONNX num_groups; aten native_group_norm's group argument
    return 2, shape[0] * int(attrs.get("num_groups", attrs.get("group", 1)) or 1)


def leading_stat(rows: int):
    """The ``stat`` of a norm over the axes from ``axis`` on (contrib.py's fused norms share it)."""
    def stat(shape: tuple[int, ...], attrs: Mapping[str, Any]) -> tuple[int, int]:
        # LayerNorm / RMSNorm normalize over the axes from ``axis`` on: one statistic per
        # position of the axes before it.
        axis = int(attrs.get("axis", -1)) % len(shape)
        return rows, math.prod(shape[:axis])
    return stat


def _mvn(shape: tuple[int, ...], attrs: Mapping[str, Any]) -> tuple[int, int]:
    axes = {int(i) % len(shape) for i in (attrs.get("axes") or (0, 2, 3))}
    return 2, math.prod(d for i, d in enumerate(shape) if i not in axes)


def _trains(op: OpView) -> bool:
    return bool(op.attr("training_mode", 0) or op.attr("training", False))


def _batch_norm_kernel(op: OpView) -> str | None:
    """Training's batch norm (its statistics computed) runs at its own pace (backward.py says
    why); inference's, folded to a multiply-add, at its bytes'."""
    return "batch_norm" if _trains(op) else None


@rule("BatchNormalization", "aten._native_batch_norm_legit_no_training.default",
      "aten._native_batch_norm_legit.default", "aten.native_batch_norm.default",
      "aten.batch_norm.default", buffer_inputs=(3, 4), saves="stat", stat=_channels,
      train_attrs={"training_mode": 1}, same_shape=True, rf="pointwise",
      kernel=_batch_norm_kernel)
def batch_norm(op: OpView) -> tuple[int, int]:
    # Inference folds (x − mean)/√(var+ε)·γ + β into x·s + t: 2 FLOPs per element (fvcore's
    # count). training_mode=1 computes the batch statistics too: ≈5 per element (design notes).
    # Inputs 3 and 4 (running mean/var) are buffers, not trainable parameters.
    per = 5 if _trains(op) else 2
    return 0, per * op.in_numel(0)


def _affine_norm(op: OpView) -> tuple[int, int]:
    # mean (1 add), subtract (1), square (1), variance sum (1), multiply by 1/σ (1) = 5 per
    # element, then scale (1) and bias (1) when given.
    n = op.in_numel(0)
    affine = sum(1 for i in (1, 2) if op.has_input(i))
    return 0, (5 + affine) * n


rule("LayerNormalization", "aten.native_layer_norm.default", saves="stat", stat=leading_stat(2),
     same_shape=True)(_affine_norm)
# per-channel statistics: a pixel's output depends on its own input (and the statistics)
rule("GroupNormalization", "aten.native_group_norm.default", saves="stat", stat=_groups,
     same_shape=True, rf="pointwise")(_affine_norm)
rule("InstanceNormalization", saves="stat", stat=_instances, same_shape=True,
     rf="pointwise")(_affine_norm)
rule("MeanVarianceNormalization", saves="stat", stat=_mvn, same_shape=True)(_affine_norm)


@rule("RMSNormalization", saves="stat", stat=leading_stat(1), same_shape=True)
def rms_norm(op: OpView) -> tuple[int, int]:
    # square (1), sum (1), multiply by 1/rms (1), scale (1) per element.
    return 0, 4 * op.in_numel(0)


@rule("LpNormalization", saves="inputs", same_shape=True)
def lp_norm(op: OpView) -> tuple[int, int]:
    return 0, 3 * op.in_numel(0)  # |x|^p (1), sum (1), divide (1)


@rule("Softmax", "LogSoftmax", "aten._softmax.default", "aten._log_softmax.default",
      "aten._safe_softmax.default", saves="outputs", same_shape=True, rf="softmax",
      attr_names=AXIS_ATTRS)
def softmax(op: OpView) -> tuple[int, int]:
    # max (1 compare), subtract max (1), exp (1), sum (1), divide / subtract log-sum (1).
    return 0, 5 * op.in_numel(0)


@rule("LRN", saves="inputs", same_shape=True, rf="pointwise")
def lrn(op: OpView) -> tuple[int, int]:
    size = int(op.attr("size", 1))
    return 0, (size + 3) * op.in_numel(0)  # window sum of squares, scale, pow, divide


@rule("Hardmax", saves="nothing", same_shape=True, attr_names=AXIS_ATTRS)
def hardmax(op: OpView) -> tuple[int, int]:
    return 0, op.in_numel(0)  # an argmax along the axis: one compare per element (+ a write)
