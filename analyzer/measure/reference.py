"""Measurements on this machine, the reality graphcost's predictions are checked against:
this CPU's achievable FLOP/s and bandwidth (``measure_cpu``), and PyTorch's MemTracker over a
real forward (``measure_inference``) or a real training step (``measure_training``). The
tests and ``graphcost verify`` both measure with these. Nothing here prints.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from ...passes.choices import Optimizer
from ...passes.errors import GraphcostError


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

    from ...passes.device.roofline import DTYPES
    from ...passes.device_rates import DeviceRates
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

def training_loss_of(module, args, kwargs=None, loss: str = "auto"):
    """graphcost's training loss of ``module(*args)`` (``loss`` as ``--loss``:
    frontends/torch/lm_loss.py, the module graphcost's trace builds its loss with)."""
    return held_loss_of(module, args, kwargs, loss)[0]


def held_loss_of(module, args, kwargs=None, loss: str = "auto"):
    """(graphcost's training loss of ``module(*args)``, what the loop holds beside it through
    the backward: what the model returned beside its own loss; lm_loss.step_loss)."""
    from ..frontends.torch.lm_loss import step_loss

    call, plan, args, kwargs = loss_inputs(module, args, kwargs, loss)
    return step_loss(call, plan, args, kwargs)[:2]


def loss_inputs(module, args, kwargs=None, loss: str = "auto"):
    """(the module a step calls, its loss plan, its args, its kwargs with the labels the loss
    reads): what a real step needs to backpropagate the loss graphcost traces. A zoo
    KeywordCall (a model with its inputs, called with none) is its model and inputs."""
    from ...models_zoo.measurable import KeywordCall
    from ..frontends.torch.lm_loss import plan_loss, with_labels

    if isinstance(module, KeywordCall):
        module, args, kwargs = module.model, (), module.inputs
    plan = plan_loss(module, tuple(args), kwargs or {}, loss)
    return module, plan, tuple(args), with_labels(plan, tuple(args), kwargs or {})


class _NoHook:
    def remove(self) -> None:
        pass


def skip_frozen(tracker, module) -> None:
    """MemTracker hooks every parameter's gradient and fails on a frozen one (a tensor that
    does not require grad takes no hook): mark those as hooked already."""
    for p in module.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())


def eager_training_step(module, args, optimizer: str, kwargs=None, autocast=None,
                   loss: str = "auto", device_type: str = "cpu"):
    """(one training step as a function, the optimizer or None): gradients freed first by
    ``zero_grad(set_to_none=True)``, the loss graphcost's (``loss_inputs``: its labels made
    once, beside the inputs, as a loop's batch is); ``autocast`` on ``device_type``."""
    import contextlib

    import torch

    from ..frontends.torch.lm_loss import step_loss

    params = list(module.parameters())
    opt = {Optimizer.NONE: None,
           Optimizer.SGD: lambda: torch.optim.SGD(params, lr=0.01),
           Optimizer.MOMENTUM: lambda: torch.optim.SGD(params, lr=0.01, momentum=0.9),
           Optimizer.ADAM: lambda: torch.optim.Adam(params),
           Optimizer.ADAMW: lambda: torch.optim.AdamW(params)}[Optimizer(optimizer)]
    opt = opt() if opt else None

    call, plan, call_args, call_kwargs = loss_inputs(module, args, kwargs, loss)

    def step():
        module.zero_grad(set_to_none=True)
        with torch.autocast(device_type, autocast) if autocast else \
                contextlib.nullcontext():
            value, held, _ = step_loss(call, plan, call_args, call_kwargs)
        value.backward()
        del held   # (held through the backward, as graphcost holds it)
        if opt:
            opt.step()
    return step, opt


def measure_training(module, args, optimizer: str, kwargs=None, autocast=None,
                     loss: str = "auto"):
    """MemTracker's peak over the second training step (optimizer state already allocated,
    gradients freed by zero_grad(set_to_none=True) first), as graphcost models it:
    (total bytes, the peak by category). ``autocast`` (a torch dtype): the forward runs in
    ``torch.autocast("cpu", autocast)``, the backward and the step outside it, as Lightning's
    and the HF Trainer's loops run them. ``loss``: as ``--loss``. The tests measure with
    this too."""
    from torch.distributed._tools.mem_tracker import MemTracker

    step, opt = eager_training_step(module, args, optimizer, kwargs, autocast, loss)
    step()  # the first step allocates the optimizer state
    tracker = MemTracker()
    skip_frozen(tracker, module)
    tracker.track_external(module, *([opt] if opt else []))
    with tracker:
        step()
    peak = _snapshot_dict(next(iter(tracker.get_tracker_snapshot("peak").values()), {}))
    return peak.get("Total", 0), peak


def measure_training_unperturbed(module, args, optimizer: str, kwargs=None) -> int:
    """The second training step's peak as eager runs it, with no dispatch mode on: MemTracker
    is a TorchDispatchMode, and while one is on ATen treats every tensor as a subclass
    (``isTensorSubclassLike``), so the autograd engine adds gradients out of place where it
    adds them in place otherwise. Here torch.profiler's memory events (the CPU allocator's
    own reports) are summed and read at the end of each outermost ATen op of the second step:
    what the op leaves (its outputs beside everything still held), not the scratch a kernel
    frees before it returns (``mm``'s contiguous copy of an expanded gradient), which
    graphcost does not model. Plus the parameters and buffers, held before the step. The
    inputs are left out, as MemTracker leaves them.

    Both steps are profiled, the first's events summed too (its gradients and optimizer state
    are held into the second): the CPU allocator reports a block's size when it is freed
    from the size it recorded while a profiler was on, and it forgets a block freed while
    none is (c10's ProfiledCPUMemoryReporter) — a block the first step made unprofiled, at
    an address an earlier profiled block had, was freed in the second step at that block's
    size (one run under the suite's two workers measured 564,120 B for 1,612,696)."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    step, _ = eager_training_step(module, args, optimizer, kwargs)
    module.zero_grad(set_to_none=True)   # (an earlier step's, freed before the events start)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
        with record_function(SECOND_STEP):
            step()
    held = [*module.parameters(), *module.buffers()]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in held if hasattr(t, "untyped_storage")}
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    assert results is not None, "torch.profiler recorded nothing"
    events = results.events()
    second = min(e.start_ns() for e in events if e.name() == SECOND_STEP)
    return sum(storages.values()) + _peak_at_op_ends(events, since=second)


SECOND_STEP = "graphcost: the measured step"


def _peak_at_op_ends(events, since: int = 0) -> int:
    """The largest running sum of the allocator's events at the end of an outermost ATen op
    that starts at ``since`` (ns) or later."""
    import bisect
    import itertools

    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    ops = sorted(((e.start_ns(), -(e.start_ns() + e.duration_ns())) for e in events
                  if e.name().startswith("aten::") and e.start_ns() >= since))
    ends, reach = [], -1
    for start, neg_end in ops:
        if start >= reach:  # not inside the op before it
            ends.append(reach := -neg_end)
    times = [t for t, _ in memory]
    running = list(itertools.accumulate(n for _, n in memory))
    at = (bisect.bisect_right(times, end) for end in ends)
    return max((running[i - 1] for i in at if i), default=0)


# ----------------------------------------------------------------------------- dispatch
