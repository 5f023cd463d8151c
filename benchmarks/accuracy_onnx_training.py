"""The ONNX training ESTIMATE against the exact joint graph, on the zoo models (README table).

    python -m benchmarks.accuracy_onnx_training   (from the repository root)

Estimated: the zoo model's cached ONNX export with ``--train`` (passes/training/backward_estimate.py:
the backward synthesized from per-op save rules). Exact: the same model traced forward+backward
by AOTAutograd (what ``analyze("zoo:NAME", train=True)`` uses). Both at batch 2 and the zoo's
default dims; the training peak is ``passes.training.memory.training_memory`` on each joint graph —
the figure ``analyze(...).training.peak_bytes`` reports — so each graph is built once and
evaluated for every optimizer. Training FLOPs (forward + backward) are compared too.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("GRAPHCOST_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"
                                             / "zoo"))

from graphcost.analyzer.app.request import LoadOptions
from graphcost.analyzer.load.loading import load_graph
from graphcost.passes.costs import count_costs
from graphcost.passes.training.memory import training_memory

from graphcost import models_zoo

warnings.filterwarnings("ignore")
BATCH = 2
MODELS = ["small_cnn", "mnist_net", "three_conv", "resnet18", "mobilenet_v2", "unet", "gpt2",
          "bert", "llama_tiny"]
OPTIMIZERS = ["none", "sgd", "adam"]


def graphs(name: str, dynamo: bool = False):
    """(estimated joint graph from the ONNX export, exact FX joint graph)."""
    onnx_path = str(models_zoo.cached_export(name, dynamo=dynamo))
    est = load_graph(onnx_path, LoadOptions(batch=BATCH, dims=models_zoo.default_dims(name), train=True))
    exact = load_graph(f"zoo:{name}", LoadOptions(batch=BATCH, train=True))
    return est, exact


def measure(name: str, dynamo: bool = False) -> dict:
    """peak bytes per optimizer and training FLOPs, estimated and exact."""
    est, exact = graphs(name, dynamo)
    out = {"flops": (count_costs(est).totals.flops, count_costs(exact).totals.flops)}
    for opt in OPTIMIZERS:
        out[opt] = (training_memory(est, opt).peak_bytes, training_memory(exact, opt).peak_bytes)
    return out


def error(pair: tuple[int, int]) -> float:
    return 100.0 * (pair[0] / pair[1] - 1)


def main(models: list[str], dynamo: bool = False) -> None:
    print(f"{'dynamo' if dynamo else 'legacy'} ONNX exports, batch {BATCH}\n")
    print("| model | " + " | ".join(f"{o} (est / exact)" for o in OPTIMIZERS)
          + " | training FLOPs |")
    print("|---|" + "---:|" * (len(OPTIMIZERS) + 1))
    for name in models:
        m = measure(name, dynamo)
        cells = [f"{m[o][0]:,} / {m[o][1]:,} ({error(m[o]):+.1f}%)" for o in OPTIMIZERS]
        cells.append(f"{error(m['flops']):+.1f}%")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    # python -m benchmarks.accuracy_onnx_training [--dynamo] [MODEL ...]
    args = sys.argv[1:]
    use_dynamo = "--dynamo" in args
    main([a for a in args if a != "--dynamo"] or MODELS, use_dynamo)
