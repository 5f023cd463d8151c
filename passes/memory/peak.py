"""One peak shape: what a run holds on the device at its peak, as every memory pass reports it.

Each pass result that has a peak — inference liveness (``Liveness``), a training step
(``TrainingMemory``, the checkpointed step's under a checkpoint plan), one data-parallel rank
(``ParallelMemory``), a serving batch (``Serving``) — gives it as a ``Peak``, beside its own
fields, so the device fit (passes/device/fits.py) is one call whatever the run:
``peak.fit(device, overhead=..., allocator=...)``.

``by_category`` uses one vocabulary, with what each pass knows: params, buffers,
master_weights, gradients, optimizer_state, activations, temporaries, comm_buffers, and for
serving weights (parameters and buffers, not split) and kv_cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from ..device.fits import Fit, Flushing, Overhead, fit
from ..ir import INTERNAL

if TYPE_CHECKING:
    from ..device_rates import DeviceRates


@dataclass(frozen=True)
class Peak:
    """Bytes at the peak, where, when, by category, allocated and reserved."""
    allocated_bytes: int            # the tensors live at the peak (parameters included)
    # the caching-allocator replay's reserved peak (None: not replayed, e.g. a checkpoint
    # plan's step, whose fit is an estimate); a replay holds the cuBLAS workspaces
    reserved_bytes: int | None
    phase: str                      # inference | forward | backward | optimizer | prefill | decode
    node: str | None                # the node at the peak (None: none, as an optimizer step)
    by_category: Mapping[str, int] = field(default_factory=dict)  # empty: not split
    # threads running matrix products, one cuBLAS workspace each: 1 at inference and serving,
    # 2 in a training step (the autograd engine runs the backward on its own device thread)
    threads: int = 1
    world_size: int = 1             # data-parallel ranks, each this peak (NCCL's buffers beside)
    # the replay held to the device's memory, where the unlimited one reserves more than it
    # (passes/device/fits.py Flushing): the allocator empties its cache and goes on
    flushing: Flushing | None = field(default=None, metadata=INTERNAL)   # (the section's own)

    def fit(self, device: "DeviceRates", *, overhead: Overhead | None = None,
            allocator: str = "") -> Fit:
        """Whether this peak fits ``device`` (``allocator``: the replay's settings as
        PYTORCH_CUDA_ALLOC_CONF spells them)."""
        return fit(device, self.allocated_bytes, reserved_bytes=self.reserved_bytes,
                   threads=self.threads, overhead=overhead, allocator=allocator,
                   world=self.world_size, workspaces_replayed=self.reserved_bytes is not None,
                   flushing=self.flushing)
