"""Measurements on this machine, the reality graphcost's predictions are checked against:
this CPU's achievable FLOP/s and bandwidth (``measure_cpu``), and PyTorch's MemTracker over a
real forward (``measure_inference``) or a real training step (``measure_training``). The
tests and ``graphcost verify`` both measure with these. Nothing here prints.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from ...passes.choices import Optimizer
from ...passes.errors import GraphcostError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CpuSpec:
    """This CPU's achievable rates, measured with numpy (see measure_cpu)."""
    peak_flops: float           # FLOP/s: one thread's float32 matmul rate × cores
    bandwidth: float            # bytes/s (read + written) of one thread's large copy
    memory: int                 # bytes of physical memory
    cores: int
    thread_flops: float         # one thread's float32 matmul FLOP/s



@lru_cache(maxsize=1)
def measure_cpu(budget: float = 0.3) -> CpuSpec:
    """Achievable (not datasheet) rates of this CPU, ~1 s: the best single-threaded float32
    512³ matmul (2·n³ FLOPs) times the usable cores, and the best single-threaded copy of a
    128 MiB array (bytes read + written), each repeated for ``budget`` seconds."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    try:
        out = subprocess.run([sys.executable, "-m", "graphcost.analyzer.measure.cpu_probe",
                              str(budget)], env=env,
                             capture_output=True, text=True, timeout=120, check=True).stdout
        rates = json.loads(out.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        raise GraphcostError(f"measuring this CPU's peak failed ({type(exc).__name__})") \
            from None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        memory = 0
    return CpuSpec(rates["flops"] * cores, rates["bandwidth"], int(memory), cores,
                   rates["flops"])


def cpu_device(cpu: CpuSpec):
    """This CPU as a device for the roofline: one measured fp32 rate for every dtype (no
    tensor cores; numpy measures fp32 only)."""
    from types import MappingProxyType

    from ...passes.roofline import DTYPES, DeviceRates
    label = (f"this CPU (measured: {cpu.peak_flops / 1e9:.1f} GFLOP/s fp32 matmul, "
             f"{cpu.bandwidth / 1e9:.1f} GB/s copy)")
    return DeviceRates("this-cpu", label, MappingProxyType({d: cpu.peak_flops for d in DTYPES}),
                       cpu.bandwidth, cpu.memory)


def _snapshot_dict(snap) -> dict[str, int]:
    """MemTracker's {ref type enum: bytes} with readable keys ("Activation", "Total")."""
    return {getattr(k, "value", str(k)): int(v) for k, v in snap.items()}


def measure_inference(module, args, kwargs=None):
    """MemTracker over one forward under no_grad: (activation peak, the peak by category,
    per module fqn: (activation bytes at its own peak, calls)). The tests measure with this
    too. ``kwargs``: keyword inputs (a transformers model's)."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker, _ModState

    tracker = MemTracker()
    tracker.track_external(module)
    with torch.no_grad(), tracker:
        module(*args, **(kwargs or {}))
    peak = _snapshot_dict(next(iter(tracker.get_tracker_snapshot("peak").values()), {}))
    # Per module: the activations live at the module's own peak (whatever was allocated
    # before it and still alive counts too, as in graphcost's timeline), max over its calls.
    per_module: dict[str, tuple[int, int]] = {}
    for stats in tracker.memory_tracking.values():
        fqn = stats.mod_fqn.split(".", 1)[1] if "." in stats.mod_fqn else ""
        snaps = stats.snapshots.get(_ModState.PEAK_FW, [])
        best = max((_snapshot_dict(d).get("Activation", 0) for s in snaps for d in s.values()),
                   default=0)
        per_module[fqn] = (best, len(snaps))
    return peak.get("Activation", 0), peak, per_module

def float_output_sum(module, args, kwargs=None) -> torch.Tensor:
    """graphcost's training loss: the sum of every floating output of ``module(*args)``."""
    import torch
    import torch.utils._pytree

    leaves = [t for t in torch.utils._pytree.tree_leaves(module(*args, **(kwargs or {})))
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    loss = sum(t.sum() for t in leaves)
    assert isinstance(loss, torch.Tensor), "no floating output to sum"
    return loss


class _NoHook:
    def remove(self) -> None:
        pass


def skip_frozen(tracker, module) -> None:
    """MemTracker hooks every parameter's gradient and fails on a frozen one (a tensor that
    does not require grad takes no hook): mark those as hooked already."""
    for p in module.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())


def measure_training(module, args, optimizer: str, kwargs=None, autocast=None):
    """MemTracker's peak over the second training step (optimizer state already allocated,
    gradients freed by zero_grad(set_to_none=True) first), as graphcost models it:
    (total bytes, the peak by category). ``autocast`` (a torch dtype): the forward runs in
    ``torch.autocast("cpu", autocast)``, the backward and the step outside it, as Lightning's
    and the HF Trainer's loops run them. The tests measure with this too."""
    import contextlib

    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    params = list(module.parameters())
    opt = {Optimizer.NONE: None,
           Optimizer.SGD: lambda: torch.optim.SGD(params, lr=0.01),
           Optimizer.MOMENTUM: lambda: torch.optim.SGD(params, lr=0.01, momentum=0.9),
           Optimizer.ADAM: lambda: torch.optim.Adam(params),
           Optimizer.ADAMW: lambda: torch.optim.AdamW(params)}[Optimizer(optimizer)]
    opt = opt() if opt else None

    def step():
        module.zero_grad(set_to_none=True)
        with torch.autocast("cpu", autocast) if autocast else contextlib.nullcontext():
            loss = float_output_sum(module, args, kwargs)
        loss.backward()
        if opt:
            opt.step()

    step()  # the first step allocates the optimizer state
    tracker = MemTracker()
    skip_frozen(tracker, module)
    tracker.track_external(module, *([opt] if opt else []))
    with tracker:
        step()
    peak = _snapshot_dict(next(iter(tracker.get_tracker_snapshot("peak").values()), {}))
    return peak.get("Total", 0), peak


# ----------------------------------------------------------------------------- dispatch
