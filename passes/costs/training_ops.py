"""Losses and the optimizers of ai.onnx.preview.training: FLOPs per element, no MACs."""
from __future__ import annotations

from ..costs.registry import OpView, rule, zero_cost

TRAINING = "ai.onnx.preview.training::"


def _nll(op: OpView, target_at: int, weight_at: int) -> int:
    # per target element: pick and negate (1), weight multiply (1 with weights), the sum of a
    # reduction (1); a weighted mean also sums the weights (1).
    t = op.in_numel(target_at)
    weighted = 1 if op.has_input(weight_at) else 0
    reduction = str(op.attr("reduction", "mean"))
    reduced = 0 if reduction == "none" else 1
    mean_weights = weighted if reduction == "mean" else 0
    return t * (1 + weighted + reduced + mean_weights)


@rule("NegativeLogLikelihoodLoss", saves=(1,))
def nll_loss(op: OpView) -> tuple[int, int]:
    return 0, _nll(op, 1, 2)  # (input (N, C, …), target (N, …), weight (C,))


@rule("SoftmaxCrossEntropyLoss", saves="outputs")
def softmax_cross_entropy(op: OpView) -> tuple[int, int]:
    # log-softmax over the classes (5 per score, normalization.py) + the NLL above
    return 0, 5 * op.in_numel(0) + _nll(op, 1, 2)


def _optimizer(per_element: int, tensors_per_param: int):
    def fn(op: OpView) -> tuple[int, int]:
        # (R, T, X1…Xn, G1…Gn, state…): per_element FLOPs for every element of every X
        n = (op.n_inputs - 2) // tensors_per_param
        return 0, per_element * sum(op.in_numel(2 + i) for i in range(n))
    return fn


# Adagrad: regularized gradient g + λx (2), H += g² (2), √H + ε (2), x − r·g/… (3) = 9
rule(TRAINING + "Adagrad", config_inputs=(0, 1), saves="nothing")(_optimizer(9, 3))


@rule(TRAINING + "Momentum", config_inputs=(0, 1), saves="nothing")
def momentum(op: OpView) -> tuple[int, int]:
    # regularized gradient (2), v = α·v + β·g (3), x − r·v (2) = 7; Nesterov's look-ahead
    # x − r·(g + α·v) adds a multiply and an add (9)
    per = 9 if op.attr("mode", "standard") == "nesterov" else 7
    return _optimizer(per, 3)(op)


# Adam: regularized gradient (2), v = α·v + (1−α)·g (3), h = β·h + (1−β)·g² (4), √h + ε (2),
# divide (1), scale by the bias-corrected rate (1), subtract (1), post-update decay (2) = 16
rule(TRAINING + "Adam", config_inputs=(0, 1), saves="nothing")(_optimizer(16, 4))
zero_cost(TRAINING + "Gradient", reason="a placeholder a training runtime replaces with the "
          "backward of the graph between its xs and y: that backward is not in the file, so "
          "its cost is not counted (graphcost --train estimates a backward instead)",
          family="training_ops")
