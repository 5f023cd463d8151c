"""Whether a run fits a GPU: what the process needs there against what the device offers it.

A GPU runs out of what PyTorch's caching allocator has *reserved*, not of the bytes its
tensors hold, and the process holds more than the allocator's segments. ``needs`` is:

- **the reserved peak**: the run's allocations replayed through the caching allocator
  (passes/memory/caching_allocator.py): an inference run over its liveness timeline, a training step
  over two steps, one data-parallel rank over two steps of its strategy's tensors and streams
  (passes/parallel/reserved.py), a serving batch over its prefill and last decode step
  (passes/serving/reserved.py), a pipeline stage's rank over its schedule
  (passes/parallel/pipeline_reserved.py), a checkpoint plan's step as it runs; where nothing
  is replayed, the tensors × (1 + 10%), labelled an estimate. ``--overhead allocator=P`` replaces either with tensors × (1 + P).
- **cuBLAS workspaces**, allocated through the caching allocator and kept: one per thread
  that runs matrix products (CublasHandlePool.cpp keys them by handle and stream, and a
  handle by thread) — one for inference, two for training (the autograd engine runs the
  backward on its own device thread). 32 MiB each on sm90, sm100 and sm120 parts, else
  8 MiB + 128 KiB (``parseChosenWorkspaceSize``: ":4096:8" / ":4096:2:16:8"); on ROCm
  32 MiB, 128 MiB on the MI300/MI325/MI355 (gfx94x/gfx95x). ``CUBLAS_WORKSPACE_CONFIG``
  changes them in PyTorch; here ``--overhead context=`` covers everything outside the
  tensors.
- **NCCL's buffers** (data-parallel ranks, world size > 1), outside the allocator and an
  estimate: NCCL (2.22 and later) allocates, per channel of the ring it connects, receive
  buffers for its three protocols — LL 512 KiB, LL128 4.6875 MiB, Simple 4 MiB
  (``computeBuffSizes`` in src/init.cc; ``NCCL_BUFFSIZE``) — rounded up to 2 MiB IPC
  allocations (10 MiB) and 2 MiB on the sending side (src/transport/p2p.cc): 12 MiB per
  channel. Channels: 24 in one node of 8 GPUs, 16 across nodes with a tree beside the ring
  as many again (NCCL_DEBUG=INFO logs of 8×H100 and 2×8 H100 jobs, NVIDIA/nccl issues 2094
  and 1538); NVLink SHARP on NVSwitch systems (H100 SXM, H200, B200, GB200) adds 16 channels
  × 2 × 128 KiB × 8 steps × 8 heads = 256 MiB (src/transport/nvls.cc). 8 H100 SXM ranks:
  24 × 12 + 256 = 544 MiB each. Not measured here (one GPU).
- **the CUDA context and kernel modules**, outside the allocator: 726,466,560 B (692.8 MiB)
  measured on an H100 80GB HBM3 (driver 580.159.04, CUDA 13.0, PyTorch 2.11+cu130, cuDNN 9.19;
  ``cudaMemGetInfo``'s used bytes − ``memory_reserved()`` after CUDA's start, 526.8 MiB, and
  after the first fp32 and fp16 matmuls, a convolution and an SDPA call, which load their
  kernels: benchmarks/accuracy_cuda.py's ``runtime`` case). Other GPUs take this figure
  until measured; ``--overhead context=SIZE`` sets yours.

``offers``: the memory the driver gives a process, where measured or printed
(``DeviceRates.usable_memory``: ``cudaMemGetInfo``'s total), else the nominal size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..device_rates import DeviceRates

MiB = 1 << 20
CONTEXT_BYTES = 726_466_560
CONTEXT_SOURCE = ("measured on an H100 (CUDA 13.0, PyTorch 2.11): CUDA's context and the "
                  "kernels the first matmuls, convolution and attention load")
ESTIMATE_FRACTION = 0.10
NCCL_CHANNEL_BYTES = 12 * MiB       # per ring (or tree) channel: see the module docstring
NCCL_NVLS_BYTES = 256 * MiB
NVLS_PARTS = frozenset({"h100-sxm", "h200", "b200", "gb200"})   # NVSwitch with NVLink SHARP
GPUS_PER_NODE = 8
GIVEN = "the overhead given"


@dataclass(frozen=True)
class Overhead:
    """``--overhead``: figures a user measured on their own stack, replacing the model's.
    ``context_bytes``: everything the process holds beyond the tensors and the allocator's
    cache (None: the cuBLAS workspaces and the measured context above); ``allocator_fraction``:
    the allocator as tensors × (1 + fraction) (None: replayed where the run is modelled, else
    the 10% estimate)."""
    context_bytes: int | None = None
    allocator_fraction: float | None = None


@dataclass(frozen=True)
class FitPart:
    """One line of what a run needs on the device."""
    what: str
    bytes: int
    source: str


@dataclass(frozen=True)
class Fit:
    """The report's one answer to "does it fit": ``needs`` (the parts' sum, the allocator's
    first) against ``offers``; ``margin`` = offers − needs (negative: short by that much);
    ``tensor_room``: the tensor bytes the device has room for at the allocator part's ratio
    to ``tensor_bytes`` (the cuBLAS workspaces a replay holds taken out of that ratio: they do
    not grow with the tensors; what a chart of tensor memory draws as the limit)."""
    needs: int
    offers: int
    offers_source: str
    parts: tuple[FitPart, ...]
    tensor_room: int
    flushes: int = 0    # the allocator's cache flushes that keep the run on the device
    JSON_PROPERTIES = ("margin", "fits")

    @property
    def margin(self) -> int:
        return self.offers - self.needs

    @property
    def fits(self) -> bool:
        return self.needs <= self.offers


def cublas_workspace_bytes(device: "DeviceRates") -> int:
    """PyTorch's default cuBLAS workspace for one handle on ``device``
    (CublasHandlePool.cpp ``parseChosenWorkspaceSize``)."""
    if device.rocm:
        return 128 * MiB if device.name.startswith("mi3") else 32 * MiB
    if device.capability is not None and device.capability[0] in (9, 10, 12):
        return 4096 * 8 * 1024
    return 4096 * 1024 * 2 + 16 * 1024 * 8


def offers(device: "DeviceRates") -> tuple[int, str]:
    """(the bytes a process is offered on ``device``, where the figure comes from)."""
    if device.usable_memory:
        return device.usable_memory, "what the driver offers a process (measured or printed)"
    return device.memory, "the nominal size (what the driver offers was not measured)"


def nccl_part(device: "DeviceRates", world: int) -> FitPart | None:
    """NCCL's own buffers on each of ``world`` data-parallel ranks (None: one rank)."""
    if world <= 1:
        return None
    one_node = world <= GPUS_PER_NODE
    channels = 24 if one_node else 2 * 16
    nvls = NCCL_NVLS_BYTES if device.name in NVLS_PARTS else 0
    what = (f"{'RCCL' if device.rocm else 'NCCL'} buffers ({channels} channels × 12 MiB"
            + (" + NVLS 256 MiB" if nvls else "") + ")")
    return FitPart(what, channels * NCCL_CHANNEL_BYTES + nvls,
                   "an estimate from NCCL's buffer sizes and channel counts (not measured "
                   "here), outside PyTorch's allocator")


@dataclass(frozen=True)
class Flushing:
    """A replay held to what the device leaves the allocator (``allocator_capacity``): past it
    PyTorch's allocator frees its cached segments and retries the cudaMalloc
    (``release_cached_blocks``; torch.cuda.memory_stats' num_alloc_retries), and the run goes
    on, slower, where the unlimited replay's reserved peak would not fit."""
    reserved_bytes: int     # the reserved peak of the replay held to the capacity
    retries: int            # the cache flushes in the steps replayed


def allocator_capacity(device: "DeviceRates", *, threads: int = 1,
                       overhead: Overhead | None = None, world: int = 1) -> int | None:
    """The bytes PyTorch's caching allocator can reserve on ``device``: what the device offers
    less what the process holds outside it (NCCL's buffers, the CUDA context and kernels, or
    the context given); None where the allocator is not replayed (``--overhead allocator=``)."""
    if overhead is not None and overhead.allocator_fraction is not None:
        return None
    outside = fit(device, 0, reserved_bytes=0, threads=threads, overhead=overhead, world=world,
                  workspaces_replayed=True)
    return outside.offers - outside.needs


def fit(device: "DeviceRates", tensor_bytes: int, *, reserved_bytes: int | None = None,
        threads: int = 1, overhead: Overhead | None = None, allocator: str = "",
        world: int = 1, workspaces_replayed: bool = False,
        flushing: Flushing | None = None) -> Fit:
    """What a run whose tensors peak at ``tensor_bytes`` (``reserved_bytes``: the caching
    allocator's replayed reserved peak, None where not modelled; ``allocator``: its settings
    as PYTORCH_CUDA_ALLOC_CONF spells them, "" for the default) needs on ``device`` with
    ``threads`` threads running matrix products (inference 1, training 2), as one of
    ``world`` data-parallel ranks. ``workspaces_replayed``: the replay holds the cuBLAS
    workspaces and the kernels' temporaries where the run allocates them
    (passes.device.gpu_workspaces), so no cuBLAS part is added beside it. ``flushing``: the
    replay held to the device (Flushing), which decides where the unlimited one does not
    fit."""
    overhead = overhead or Overhead()
    inside = workspaces_replayed and reserved_bytes is not None and \
        overhead.allocator_fraction is None
    parts = [_allocator_part(tensor_bytes, reserved_bytes, overhead, allocator, inside)]
    flushes = 0
    if flushing is not None and inside and reserved_bytes is not None and \
            flushing.reserved_bytes < reserved_bytes:
        parts, flushes = [_flushing_part(flushing, allocator)], flushing.retries
    if overhead.context_bytes is None:
        ws = cublas_workspace_bytes(device)
        parts += [] if inside else [
            FitPart(f"cuBLAS workspaces ({threads} × {ws / MiB:g} MiB)", threads * ws,
                    "PyTorch's default per matmul thread, inside the allocator")]
        nccl = nccl_part(device, world)
        parts += [nccl] if nccl else []
        parts.append(FitPart("CUDA context and kernels", CONTEXT_BYTES, CONTEXT_SOURCE))
    elif overhead.context_bytes:
        parts.append(FitPart("context and workspaces", overhead.context_bytes, GIVEN))
    have, source = offers(device)
    others = sum(p.bytes for p in parts[1:])
    replayed = reserved_bytes is not None and overhead.allocator_fraction is None
    # the workspaces a replay holds do not grow with the tensors: out of the ratio
    fixed = threads * cublas_workspace_bytes(device) if inside else 0
    ratio = (reserved_bytes - fixed) / tensor_bytes \
        if replayed and reserved_bytes and tensor_bytes and reserved_bytes > fixed \
        else 1 + _fraction(overhead)
    return Fit(others + parts[0].bytes, have, source, tuple(parts),
               max(0, int((have - others - fixed) / ratio)), flushes)


def _flushing_part(flushing: Flushing, allocator: str) -> FitPart:
    n = flushing.retries
    times = {1: "once", 2: "twice"}.get(n, f"{n} times")
    return FitPart(f"reserved by PyTorch's caching allocator, held to the device by emptying "
                   f"its cache {times} in two steps (cudaMalloc retries, each slowing its step)",
                   flushing.reserved_bytes,
                   "the run's allocations replayed through the allocator's rules, held to "
                   "the device's memory" + (f" ({allocator})" if allocator else ""))


def _fraction(overhead: Overhead) -> float:
    f = overhead.allocator_fraction
    return ESTIMATE_FRACTION if f is None else f


def _allocator_part(tensor_bytes: int, reserved_bytes: int | None,
                    overhead: Overhead, allocator: str = "", inside: bool = False) -> FitPart:
    if overhead.allocator_fraction is not None:
        f = overhead.allocator_fraction
        return FitPart(f"tensors × (1 + {100 * f:g}%)", scaled_bytes(tensor_bytes, f), GIVEN)
    if reserved_bytes is not None:
        return FitPart("reserved by PyTorch's caching allocator"
                       + (" (workspaces, kernel temporaries in it)" if inside else ""), reserved_bytes,
                       "the run's allocations replayed through the allocator's rules"
                       + (f" ({allocator})" if allocator else ""))
    return FitPart(f"tensors × (1 + {100 * ESTIMATE_FRACTION:g}%)",
                   scaled_bytes(tensor_bytes, ESTIMATE_FRACTION),
                   "an estimate of the allocator's rounding and cache (not replayed here)")


def scaled_bytes(nbytes: int, fraction: float) -> int:
    try:
        return int(nbytes * (1.0 + fraction))
    except OverflowError:  # past 2^1024 B (labelled absurd): the fraction in integers
        return nbytes + nbytes * round(fraction * 10 ** 6) // 10 ** 6


def tensor_room(device: "DeviceRates", *, threads: int = 1,
                overhead: Overhead | None = None) -> float:
    """The tensor bytes that fit ``device`` by the estimate (no replay): a first guess for
    searches that then check ``fit`` itself."""
    return fit(device, 0, threads=threads, overhead=overhead).tensor_room
