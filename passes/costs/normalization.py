"""Normalization and softmax: FLOPs per element, documented per op. No MACs."""
from __future__ import annotations

from graphcost.passes.costs.registry import OpView, rule


@rule("BatchNormalization", "aten.batch_norm.default",
      "aten._native_batch_norm_legit_no_training.default", "aten._native_batch_norm_legit.default",
      "aten.native_batch_norm.default", buffer_inputs=(3, 4), saves="stat")
def batch_norm(op: OpView) -> tuple[int, int]:
    # Inference folds (x − mean)/√(var+ε)·γ + β into x·s + t: 2 FLOPs per element (fvcore's
    # count). training_mode=1 computes the batch statistics too: ≈5 per element (design notes).
    # Inputs 3 and 4 (running mean/var) are buffers, not trainable parameters.
    per = 5 if op.attr("training_mode", 0) or op.attr("training", False) else 2
    return 0, per * op.in_numel(0)


def _affine_norm(op: OpView) -> tuple[int, int]:
    # mean (1 add), subtract (1), square (1), variance sum (1), multiply by 1/σ (1) = 5 per
    # element, then scale (1) and bias (1) when given.
    n = op.in_numel(0)
    affine = sum(1 for i in (1, 2) if op.has_input(i))
    return 0, (5 + affine) * n


rule("LayerNormalization", "GroupNormalization", "InstanceNormalization",
     "MeanVarianceNormalization", "aten.layer_norm.default", "aten.native_layer_norm.default",
     "aten.group_norm.default", "aten.native_group_norm.default",
     "aten.instance_norm.default", saves="stat")(_affine_norm)


@rule("RMSNormalization", "aten.rms_norm.default", saves="stat")
def rms_norm(op: OpView) -> tuple[int, int]:
    # square (1), sum (1), multiply by 1/rms (1), scale (1) per element.
    return 0, 4 * op.in_numel(0)


@rule("LpNormalization", saves="inputs")
def lp_norm(op: OpView) -> tuple[int, int]:
    return 0, 3 * op.in_numel(0)  # |x|^p (1), sum (1), divide (1)


@rule("Softmax", "LogSoftmax", "aten._softmax.default", "aten.softmax.int",
      "aten._log_softmax.default", "aten.log_softmax.int", saves="outputs")
def softmax(op: OpView) -> tuple[int, int]:
    # max (1 compare), subtract max (1), exp (1), sum (1), divide / subtract log-sum (1).
    return 0, 5 * op.in_numel(0)


@rule("LRN", saves="inputs")
def lrn(op: OpView) -> tuple[int, int]:
    size = int(op.attr("size", 1))
    return 0, (size + 3) * op.in_numel(0)  # window sum of squares, scale, pow, divide
