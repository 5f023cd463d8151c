"""Predicted vs measured training-step peak for the zoo models (README's training table).

    python -m benchmarks.accuracy_training   (from the repository root)

graphcost: the joint forward+backward graph (AOTAutograd) + optimizer model. Measured:
MemTracker over the second real CPU training step (after zero_grad(set_to_none=True)).
"""
from __future__ import annotations

import warnings

from graphcost import analyze, models_zoo
from tests.test_training import BATCH, OPTIMIZERS, measured_step_peak

warnings.filterwarnings("ignore")
MODELS = ["small_cnn", "mnist_net", "resnet18", "mobilenet_v2", "unet", "gpt2", "bert",
          "llama_tiny"]


def main() -> None:
    print("| model | " + " | ".join(OPTIMIZERS) + " |")
    print("|---|" + "---:|" * len(OPTIMIZERS))
    for name in MODELS:
        cells = []
        for opt in OPTIMIZERS:
            model = models_zoo.build_model(name)
            r = analyze(model, models_zoo.example_inputs(name, batch=BATCH), train=True,
                        optimizer=opt)
            m = measured_step_peak(name, opt)
            cells.append(f"{r.training.peak_bytes:,} / {m:,} ({100 * (r.training.peak_bytes / m - 1):+.1f}%)")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
