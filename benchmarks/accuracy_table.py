"""Predicted vs measured inference activation peak for the zoo models (README's table).

    python -m benchmarks.accuracy_table   (from the repository root)

graphcost traces each model (eager lifetimes, graph inputs excluded as MemTracker excludes
them); torch.distributed._tools.mem_tracker.MemTracker measures a real CPU forward under
torch.no_grad(). Also prints graphcost's FX-vs-ONNX agreement on the same models.
"""
from __future__ import annotations

import warnings

from graphcost import analyze, models_zoo
from tests.test_fx_fidelity import measured_activation_peak

warnings.filterwarnings("ignore")
MODELS = ["small_cnn", "mnist_net", "resnet18", "resnet50", "mobilenet_v2", "unet", "gpt2",
          "bert", "llama_tiny"]


def main() -> None:
    print("| model | batch | predicted peak B | MemTracker peak B | error |")
    print("|---|---:|---:|---:|---:|")
    for name in MODELS:
        model = models_zoo.build_model(name)
        args = models_zoo.example_inputs(name, batch=2)
        r = analyze(model, args, include_inputs=False)
        m = measured_activation_peak(model, args)
        print(f"| {name} | 2 | {r.memory.peak_bytes:,} | {m:,} | "
              f"{100 * (r.memory.peak_bytes / m - 1):+.1f}% |")
    print()
    print("| model | params FX | params ONNX | MACs ONNX/FX | peak ONNX/FX (dataflow) |")
    print("|---|---:|---:|---:|---:|")
    for name in MODELS:
        kw = dict(batch=2, lifetimes="dataflow", include_inputs=False)
        fx = analyze(f"zoo:{name}", zoo_exporter="fx", **kw)
        ox = analyze(f"zoo:{name}", **kw)
        print(f"| {name} | {fx.totals.params:,} | {ox.totals.params:,} | "
              f"{100 * (ox.totals.macs / fx.totals.macs - 1):+.2f}% | "
              f"{100 * (ox.memory.peak_bytes / fx.memory.peak_bytes - 1):+.1f}% |")


if __name__ == "__main__":
    main()
