"""The time estimate: each node priced at what a device profile measured its kind of kernel
to achieve (passes/device/profile.py), not at the datasheet's peak — an estimate with the error
band the profile's validation runs give, where the roofline (roofline.py) is a lower bound.

Per node, per call (a node's cost covers its ``repeat`` calls):

    time = launch + max(FLOPs / achieved FLOP/s (its kind, its dtype, at its FLOPs),
                        bytes moved / achieved bytes/s (at its bytes))

The kind is the rule's ``kernel`` (conv, grouped_conv, attention, pool, random: dropout's
draws, batch_norm: a training step's), else a GEMM when the op multiplies and accumulates,
else memory-bound work only. An eager forward's node adds the profile's ``python`` (the
model's Python around the op); a backward's does not (autograd's engine runs it from C++),
but each autograd node of an eager step (a backward node's ``autograd`` number: consecutive
nodes of one formula), and each trainable parameter's AccumulateGrad, adds the profile's
``autograd`` once (recorded in the forward, run by the engine). A node that moves nothing (a
view) costs the profile's ``view``; a node without a rule its ``launch`` alone, and the
estimate lists its op as unpriced (never silently zero).

Every kernel part is multiplied by the profile's ``scale`` (fitted on its validation runs);
a GPU's host time is not (calibrate_cuda.py measures it on models, not on kernels).

On a GPU (a profile with ``host_s``: gpu_engine.py's datasheet engine, or a GPU that
analyzer/measure/calibrate_cuda.py measured) the host runs ahead of the kernels, so the forward
and backward take the longer of the kernels' time and the host's (``host_s`` per op, and a
training step's ``autograd`` per autograd node: the engine's work runs on the host). ``compiled`` prices torch.compile's kernels instead (fusion.py): each
run of pointwise and reduction nodes between library kernels one launch moving what enters
and leaves it.

A training step adds the optimizer's step, which no graph node holds: PyTorch's for-loop
implementation (the default off a GPU) runs a few elementwise kernels per parameter tensor,
each over the whole tensor (torch/optim/adam.py ``_single_tensor_adam``, sgd.py): their count
and the bytes they move per parameter byte are ``OPTIMIZER_KERNELS``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Collection, Mapping, Sequence

from ..costs import OK, lookup
from ..costs.registry import OpView, kernel_class
from ..ir import Graph
from .fusion import FusedKernel, fused_kernels
from .profile import EngineProfile
from .roofline import node_dtype

# optimizer -> (kernels per parameter tensor, bytes moved per parameter byte) in the for-loop
# step: adam's lerp_ (exp_avg: reads 2, writes 1), mul_ + addcmul_ (exp_avg_sq: 1 + 1, 2 + 1),
# sqrt, div, add_ (denominator: 1 + 1 each), addcdiv_ (param: 3 + 1), and the step count;
# adamw's decoupled weight decay is one mul_ more (1 + 1); sgd's add_ (2 + 1); momentum's
# buffer mul_ + add_ (1 + 1, 2 + 1) and the param's add_ (2 + 1)
OPTIMIZER_KERNELS: Mapping[str, tuple[int, int]] = {
    "sgd": (1, 3), "momentum": (3, 8), "adam": (8, 18), "adamw": (9, 20)}


@dataclass(frozen=True)
class TimeEstimate:
    """The report's ``time`` section: one step (training) or one forward (inference)."""
    profile: str                 # the profile's name
    engine: str                  # torch | onnxruntime
    seconds: float               # the estimate
    band: float | None           # ± this fraction (None: the profile was never validated)
    runs: int                    # validation runs the band comes from
    arithmetic_seconds: float    # nodes whose arithmetic outlasts their bytes
    memory_seconds: float        # nodes whose bytes outlast their arithmetic
    launch_seconds: float        # the kernel calls' own cost (the views', autograd's nodes')
    optimizer_seconds: float     # the optimizer step (training)
    recompute_seconds: float     # a checkpoint plan's recompute (scaled: see with_recompute)
    kernels: int                 # kernel calls priced (views included)
    unpriced: Mapping[str, int]  # op -> nodes without a rule, priced at the launch alone
    # a GPU's host (eager PyTorch's Python and dispatch): the step waits on it where it
    # outlasts the kernels (``seconds`` holds the longer); 0 on a CPU, which runs both
    host_seconds: float = 0.0
    # "profile": measured on the machine (graphcost calibrate); "datasheet": a GPU's datasheet
    # rates at published shares (passes/device/gpu_engine.py)
    basis: str = "profile"
    # a parallel rank's step (passes/parallel/step_time.py): the collectives' time left
    # exposed, what ran under the compute, a pipeline's bubble; tokens/s per GPU and the
    # model (and hardware) FLOP utilisation where the step's tokens and peak are known
    communication_seconds: float = 0.0
    overlapped_seconds: float = 0.0
    bubble_seconds: float = 0.0
    tokens_per_second: float | None = None
    mfu: float | None = None
    hfu: float | None = None
    gpus: int = 1                       # the GPUs the step runs on (a parallel layout's world)
    # a training run of ``run_tokens`` tokens at this pace (``--tokens``): its days and
    # GPU-hours, and at ``price`` per GPU-hour its cost (``--price``)
    run_tokens: int | None = None
    price: float | None = None
    JSON_PROPERTIES = ("low_seconds", "high_seconds", "gpu_hours", "days", "cost")

    @property
    def low_seconds(self) -> float | None:
        return None if self.band is None else self.seconds * (1 - self.band)

    @property
    def high_seconds(self) -> float | None:
        return None if self.band is None else self.seconds * (1 + self.band)

    @property
    def host_bound(self) -> bool:
        """The kernels wait on the host (a GPU's eager PyTorch outlasting a small model)."""
        return self.host_seconds > self.arithmetic_seconds + self.memory_seconds \
            + self.launch_seconds

    @property
    def gpu_hours(self) -> float | None:
        """GPU-hours ``run_tokens`` take at this pace (tokens/s per GPU)."""
        if not self.run_tokens or not self.tokens_per_second:
            return None
        return self.run_tokens / self.tokens_per_second / 3600

    @property
    def days(self) -> float | None:
        """Days ``run_tokens`` take on ``gpus`` GPUs."""
        hours = self.gpu_hours
        return None if hours is None else hours / self.gpus / 24

    @property
    def cost(self) -> float | None:
        hours = self.gpu_hours
        return None if hours is None or self.price is None else hours * self.price


@dataclass
class _Sums:
    arithmetic: float = 0.0
    memory: float = 0.0
    launch: float = 0.0
    host: float = 0.0
    kernels: int = 0


def _price(sums: _Sums, graph: Graph, node, cost, engine: EngineProfile,
           python: float) -> None:
    calls = max(1, node.repeat)
    flops, moved = cost.flops / calls, (cost.bytes_read + cost.bytes_written) / calls
    sums.kernels += calls
    sums.host += calls * engine.host_s
    if flops == 0 and moved == 0:
        sums.launch += calls * (engine.view_s + python)
        return
    rule = lookup(node.op)
    kind = kernel_class(rule, OpView(node, graph, rule), cost.macs) if rule is not None \
        else None
    t_flops = 0.0
    if kind is not None and flops:
        t_flops = flops / engine.flops_rate(kind, node_dtype(graph, node, cost.macs, False),
                                            flops)
    t_bytes = moved / engine.memory.rate(moved) if moved else 0.0
    sums.launch += calls * (engine.launch_s + python)
    if t_flops >= t_bytes:
        sums.arithmetic += calls * t_flops
    else:
        sums.memory += calls * t_bytes


def _price_generated(sums: _Sums, kernel: FusedKernel, engine: EngineProfile) -> None:
    """One kernel torch.compile generates: a launch and its bytes, ``repeat`` calls."""
    calls, moved = kernel.repeat, kernel.bytes_moved
    if not kernel.launches:
        return
    sums.kernels += calls
    sums.host += calls * engine.host_s
    sums.launch += calls * engine.launch_s
    if moved:
        sums.memory += calls * moved / engine.memory.rate(moved)


def optimizer_seconds(engine: EngineProfile, optimizer: str | None,
                      param_bytes: Sequence[int]) -> float:
    """The for-loop optimizer step over parameter tensors of these sizes (bytes), its
    Python per tensor the profile's ``optimizer`` where it timed one; on a GPU
    PyTorch's default foreach step moves the same bytes in fewer launches (counted here as
    the for-loop's: a few milliseconds at most)."""
    kernels, moved = OPTIMIZER_KERNELS.get(optimizer or "", (0, 0))
    python = engine.optimizer_s.get(optimizer or "", 0.0)
    total = python * len(param_bytes)
    for size in param_bytes:
        per_kernel = moved * size / max(1, kernels)
        total += kernels * (engine.launch_s + per_kernel / engine.memory.rate(per_kernel))
    return total


def optimizer_launch_seconds(engine: EngineProfile, optimizer: str | None,
                             tensors: int) -> float:
    """The part of ``optimizer_seconds`` that the tensors' sizes do not change: each one's
    Python and kernel launches (its sum, kept apart from that function's, whose order of
    additions the recorded reports' figures are of)."""
    kernels, _ = OPTIMIZER_KERNELS.get(optimizer or "", (0, 0))
    return tensors * (engine.optimizer_s.get(optimizer or "", 0.0) + kernels * engine.launch_s)


def estimate_time(graph: Graph, node_costs, engine: EngineProfile, *, profile: str,
                  engine_name: str, optimizer: str | None = None,
                  param_bytes: Sequence[int] = (),
                  forward: Collection[int] | None = None,
                  basis: str = "profile", compiled: bool = False) -> TimeEstimate:
    """``node_costs``: the cost pass's, aligned with ``graph.nodes``; ``optimizer`` and
    ``param_bytes`` (the trainable parameters' sizes): a training step's optimizer;
    ``forward``: a training step's forward nodes (by index), which alone pay the eager
    forward's Python (None: every node, an inference graph); ``compiled``: the kernels
    torch.compile launches instead (fusion.py: each run of pointwise and reduction nodes one
    kernel, moving what enters and leaves it)."""
    sums, unpriced = _Sums(), Counter()
    if forward is not None and not compiled:   # (a compiled step is one autograd node)
        formulas = {n.autograd for n in graph.nodes
                    if n.autograd is not None and n.index not in forward}
        # and each parameter's AccumulateGrad, which hands its gradient to .grad; on a GPU
        # (host_s) the host does this work while the kernels run
        autograd = engine.autograd_s * (len(formulas) + len(param_bytes))
        if engine.host_s:
            sums.host += autograd
        else:
            sums.launch += autograd
    fused = fused_kernels(graph, node_costs) if compiled else []
    generated = {i for k in fused for i in k.nodes}
    for kernel in fused:
        _price_generated(sums, kernel, engine)
    for node, nc in zip(graph.nodes, node_costs):
        if node.index in generated:
            continue
        python = engine.python_s if forward is None or node.index in forward else 0.0
        if nc.status != OK:   # no rule, or shapes it could not read: no cost to price
            unpriced[node.op] += 1
            sums.kernels += max(1, node.repeat)
            sums.host += max(1, node.repeat) * engine.host_s
            sums.launch += max(1, node.repeat) * (engine.launch_s + python)
            continue
        _price(sums, graph, node, nc.cost, engine, python)
    # every kernel part, so that the parts still sum to the whole; not a GPU's host time,
    # which calibrate measures on models (their Python and dispatch) rather than on kernels
    k = engine.scale
    opt = k * optimizer_seconds(engine, optimizer, param_bytes)
    parts = (k * sums.arithmetic, k * sums.memory, k * sums.launch)
    return TimeEstimate(profile, engine_name, max(sum(parts), sums.host) + opt,
                        engine.band, len(engine.validation), *parts, opt, 0.0, sums.kernels,
                        dict(sorted(unpriced.items())), host_seconds=sums.host,
                        basis=basis)


def with_recompute(estimate: TimeEstimate, recompute_flops: int, step_flops: int) -> TimeEstimate:
    """The estimate with a checkpoint plan's recompute added: the recomputed share of the
    step's FLOPs at the step's own average pace (the recomputed forward nodes are not priced
    one by one: the plan keeps their FLOPs, not their list)."""
    if not step_flops:
        return estimate
    work = estimate.arithmetic_seconds + estimate.memory_seconds + estimate.launch_seconds
    extra = work * recompute_flops / step_flops
    return replace(estimate, seconds=estimate.seconds + extra, recompute_seconds=extra)
