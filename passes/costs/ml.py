"""ai.onnx.ml: classic machine-learning operators (scikit-learn, XGBoost, LightGBM exports).

X is (N, F) (a 1-D X is one sample). Linear models: MACs = N · outputs · F, FLOPs = 2·MACs +
one intercept add per output score + the post transform per score (below). Tree ensembles: per
sample, one compare per level down the longest root-to-leaf path of every tree (an upper bound:
the path each sample takes depends on its features) and one add per tree and target for the
leaf weights. Their weights live in attributes, not initializers: they are not counted as
parameters.
"""
from __future__ import annotations

from typing import Sequence

from ..costs.registry import OpView, rule, zero_cost

# onnx infers no shapes for several ml ops (SVM*, LinearRegressor, Scaler, TreeEnsemble …):
# these give them (the frontend uses a rule's shapes for every ai.onnx.ml op that has one).


def _rows(v):
    x = v.shape(0)
    return None if x is None else (1 if len(x) == 1 else x[0])


def _labels(v) -> str:
    return "string" if v.attr("classlabels_strings") else "int64"


def _classes(v, default: int = 2) -> int:
    return len(v.attr("classlabels_int64s") or v.attr("classlabels_ints")
               or v.attr("classlabels_strings") or ()) or default


def _regressor(targets_attr: str):
    def fn(v):
        return [("float32", (_rows(v), int(v.attr(targets_attr, 1) or 1)))]
    return fn


def _classifier(v):
    return [(_labels(v), (_rows(v),)), ("float32", (_rows(v), _classes(v)))]


def _linear_classifier_shapes(v):
    x = v.shape(0)
    f = x[-1] if x else None
    c = len(v.attr("coefficients") or ()) // f if isinstance(f, int) and f else None
    return [(_labels(v), (_rows(v),)), ("float32", (_rows(v), c))]


_FLOAT_LIKE = lambda v: [("float32", v.shape(0))]  # noqa: E731

ML = "ai.onnx.ml::"
FAMILY = "ml"
# Post transforms per score: softmax (max, subtract, exp, sum, divide: 5), logistic
# 1/(1 + exp(−x)) (3), probit (an inverse-erf evaluation, counted as 1).
POST = {"NONE": 0, "SOFTMAX": 5, "SOFTMAX_ZERO": 5, "LOGISTIC": 3, "PROBIT": 1}


def _samples(op: OpView) -> tuple[int, int]:
    x = op.in_shape(0)
    return (1, x[0]) if len(x) == 1 else (x[0], x[-1])


def _post(op: OpView) -> int:
    return POST.get(str(op.attr("post_transform", "NONE")), 1)


@rule(ML + "LinearClassifier", saves="inputs", shapes=_linear_classifier_shapes)
def linear_classifier(op: OpView) -> tuple[int, int]:
    # C scores per sample (C = len(coefficients)/F): N·C·F MACs; intercepts, post transform
    # and the arg-max for the label (1 compare per score).
    n, f = _samples(op)
    c = max(1, len(op.attr("coefficients") or ()) // max(1, f))
    macs = n * c * f
    return macs, 2 * macs + n * c * (1 + _post(op) + 1)


@rule(ML + "LinearRegressor", saves="inputs", shapes=_regressor("targets"))
def linear_regressor(op: OpView) -> tuple[int, int]:
    n, f = _samples(op)
    t = int(op.attr("targets", 1) or 1)
    macs = n * t * f
    return macs, 2 * macs + n * t * (1 + _post(op))


@rule(ML + "Normalizer", saves="inputs", shapes=_FLOAT_LIKE)
def normalizer(op: OpView) -> tuple[int, int]:
    # MAX: compare + divide (2); L1: |x|, add, divide (3); L2: square, add, divide (3) and a
    # square root per row.
    n, _ = _samples(op)
    norm = str(op.attr("norm", "MAX"))
    per = 2 if norm == "MAX" else 3
    return 0, per * op.in_numel(0) + (n if norm == "L2" else 0)


def _per_element(k: int):
    def fn(op: OpView) -> tuple[int, int]:
        return 0, k * op.in_numel(0)
    return fn


rule(ML + "Binarizer", saves="nothing", same_shape=True)(_per_element(1))  # compare
rule(ML + "Scaler", saves="nothing", shapes=_FLOAT_LIKE)(_per_element(2))  # (x − offset)·scale
rule(ML + "Imputer", saves="nothing", same_shape=True, shapes=lambda v: [(v.dtype(0), v.shape(0))])(
    _per_element(2))  # compare + select

KERNEL = {"LINEAR": 0, "POLY": 3, "RBF": 2, "SIGMOID": 3}  # per (sample, support vector):
# poly (γ·k + c)^d: multiply, add, power; rbf exp(−γ·d²): multiply, exp; sigmoid tanh(γ·k + c)


def _svm(op: OpView, decision_per_sv: int) -> tuple[int, int]:
    n, f = _samples(op)
    svs = len(op.attr("support_vectors") or ()) // max(1, f)
    coeffs = len(op.attr("coefficients") or ())
    kernel = str(op.attr("kernel_type", "LINEAR"))
    if svs:
        # the kernel of x with every support vector (F MACs; RBF also subtracts, F), then the
        # decision functions weigh the kernel values (one MAC per coefficient)
        macs = n * svs * f + n * coeffs
        extra = n * svs * (KERNEL.get(kernel, 1) + (f if kernel == "RBF" else 0))
    else:  # a linear SVM: coefficients are (classes, F)
        macs = n * coeffs
        extra = 0
    outs = max(1, decision_per_sv)
    return macs, 2 * macs + extra + n * outs * (1 + _post(op))


@rule(ML + "SVMClassifier", saves="inputs", shapes=_classifier)
def svm_classifier(op: OpView) -> tuple[int, int]:
    # one rho add, post transform and vote per class score
    classes = len(op.attr("classlabels_ints") or op.attr("classlabels_strings") or ()) or 2
    return _svm(op, classes)


@rule(ML + "SVMRegressor", saves="inputs", shapes=lambda v: [("float32", (_rows(v), 1))])
def svm_regressor(op: OpView) -> tuple[int, int]:
    return _svm(op, 1)


def _depths(roots: Sequence[int], true_ids, false_ids, is_leaf) -> list[int]:
    """Longest path (internal nodes) from each root; ``is_leaf(side, i)`` says whether child
    ``side`` of internal node i is a leaf."""
    out = []
    for root in roots:
        best, stack = 0, [(root, 1)]
        while stack:
            i, d = stack.pop()
            best = max(best, d)
            if d > len(true_ids):  # a malformed (cyclic) tree: stop at the node count
                break
            for side, child in ((0, true_ids[i]), (1, false_ids[i])):
                if not is_leaf(side, i):
                    stack.append((child, d + 1))
        out.append(best)
    return out


def _classic_depths(op: OpView) -> list[int]:
    """TreeEnsembleClassifier / Regressor: nodes named by (tree id, node id)."""
    trees, ids = op.attr("nodes_treeids") or (), op.attr("nodes_nodeids") or ()
    modes = op.attr("nodes_modes") or ()
    index = {(t, i): k for k, (t, i) in enumerate(zip(trees, ids))}
    t_ids, f_ids = op.attr("nodes_truenodeids") or (), op.attr("nodes_falsenodeids") or ()
    true = [index.get((trees[k], t_ids[k]), k) for k in range(len(trees))]
    false = [index.get((trees[k], f_ids[k]), k) for k in range(len(trees))]
    roots = {}
    children = {c for k in range(len(trees)) if modes[k] != "LEAF" for c in (true[k], false[k])}
    for k, t in enumerate(trees):
        if k not in children and modes[k] != "LEAF":
            roots.setdefault(t, k)
    leaf = [m == "LEAF" for m in modes]
    return _depths(list(roots.values()), true, false,
                   lambda side, i: leaf[(true if side == 0 else false)[i]])


def _v5_depths(op: OpView) -> list[int]:
    """TreeEnsemble (opset 5): nodes indexed directly, leaves in separate arrays."""
    roots = op.attr("tree_roots") or ()
    t_leaf, f_leaf = op.attr("nodes_trueleafs") or (), op.attr("nodes_falseleafs") or ()
    return _depths(roots, op.attr("nodes_truenodeids") or (), op.attr("nodes_falsenodeids")
                   or (), lambda side, i: bool((t_leaf if side == 0 else f_leaf)[i]))


def _trees(op: OpView, depths: list[int], targets: int) -> tuple[int, int]:
    n, _ = _samples(op)
    op.bounded("every sample is counted down the longest path of every tree")
    return 0, n * (sum(depths) + len(depths) * targets) + n * targets * (1 + _post(op))


@rule(ML + "TreeEnsembleClassifier", saves="nothing", shapes=_classifier)
def tree_ensemble_classifier(op: OpView) -> tuple[int, int]:
    classes = len(op.attr("classlabels_int64s") or op.attr("classlabels_strings") or ()) or 1
    return _trees(op, _classic_depths(op), classes)


@rule(ML + "TreeEnsembleRegressor", saves="nothing", shapes=_regressor("n_targets"))
def tree_ensemble_regressor(op: OpView) -> tuple[int, int]:
    return _trees(op, _classic_depths(op), int(op.attr("n_targets", 1) or 1))


@rule(ML + "TreeEnsemble", saves="nothing",
      shapes=lambda v: [(v.dtype(0), (_rows(v), int(v.attr("n_targets", 1) or 1)))])
def tree_ensemble(op: OpView) -> tuple[int, int]:
    return _trees(op, _v5_depths(op), int(op.attr("n_targets", 1) or 1))


zero_cost(ML + "ArrayFeatureExtractor", reason="data movement: reads the selected columns and "
          "the indices", reads="outputs", index_inputs=(1,), family=FAMILY)
zero_cost(ML + "FeatureVectorizer", ML + "CastMap", ML + "DictVectorizer", ML + "ZipMap",
          reason="data movement: copies values between tensors and maps", family=FAMILY)
zero_cost(ML + "LabelEncoder", ML + "CategoryMapper", ML + "OneHotEncoder",
          reason="table lookups: no arithmetic", family=FAMILY)
