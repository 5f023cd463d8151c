"""What graphcost's per-rank details and PyTorch's trackers' categories mean, as the same items:
a rank's peak compared item by item (tests/test_parallel_reality.py, benchmarks/
accuracy_parallel.py) with what analyzer/measure/parallel.py measured."""
from __future__ import annotations

# (autograd's full-size gradients before a reduce-scatter are temporaries on both sides:
# FSDPMemTracker counts them as Temp; DDP's buckets are "Buckets", moved apart by
# analyzer/measure/parallel.py).
PREDICTED_ITEMS = {
    "params": ("params", "sharded_params"), "buffers": ("buffers",),
    "grads": ("grads", "sharded_grads"), "optimizer": ("optimizer_state", "step_temporaries"),
    "activations": ("activations",),
    "comm": ("ddp_buckets", "unsharded_params", "all_gather_buffers", "reduce_scatter_inputs"),
    "temps": ("backward_temporaries", "unsharded_grads", "offload_staging",
              "reduce_dtype_casts"),
}
MEASURED_ITEMS = {
    "params": ("Parameter", "Sharded Param"), "buffers": ("Buffer",),
    "grads": ("Gradient", "Sharded Grad"), "optimizer": ("Optstate", "OptState"),
    "activations": ("Activation", "Inputs"),
    "comm": ("Buckets", "Unsharded Param", "All Gather", "Reduce Scatter"),
    "temps": ("Temp", "Other", "Unsharded Grad"),
}


def items(detail: dict, measured: dict) -> dict[str, tuple[int, int]]:
    """(predicted, measured) bytes per item at the peak."""
    return {k: (sum(detail.get(d, 0) for d in PREDICTED_ITEMS[k]),
                sum(measured.get(c, 0) for c in MEASURED_ITEMS[k])) for k in PREDICTED_ITEMS}
