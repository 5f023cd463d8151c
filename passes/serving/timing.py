"""The time of a serving review's two steps on a GPU (passes/serving/analysis.py): each step's
time estimate (passes/device/time_estimate.py at the datasheet's rates and published kernel
shares, passes/device/gpu_engine.py) as its engine runs it, and a tensor-parallel replica's
collectives (passes/costs/collectives.py), counted once and priced on the link its ranks
share."""
from __future__ import annotations

from dataclasses import dataclass

from ..costs import CostReport
from ..costs.collectives import ring_seconds, ring_wire, tp_collectives
from ..device.gpu_engine import datasheet_band, datasheet_engine
from ..device.profile import EngineProfile
from ..device.time_estimate import estimate_time
from ..device_rates import DeviceRates
from ..ir import Graph


@dataclass(frozen=True)
class ServingTime:
    """The two steps estimated on a GPU (passes/device/gpu_engine.py: the datasheet's rates
    at published kernel shares), as ``engine`` runs them — eager PyTorch as transformers'
    generate does (host time per op included), or vLLM's way: torch.compile's kernels, the
    decode step replayed from a CUDA graph (no host time per op) — time to the first token
    (the prefill), time per output token (one decode step at the full context), with the
    band of the published runs. A tensor-parallel replica's collectives sit between the
    matmuls that need them: each step's are added, exposed (``*_communication_seconds``)."""
    ttft_seconds: float
    tpot_seconds: float
    tokens_per_second: float         # the batch's output tokens: batch / TPOT
    band: float
    host_bound: bool                 # the decode step waits on eager PyTorch's host
    engine: str = "eager"
    prefill_communication_seconds: float = 0.0
    decode_communication_seconds: float = 0.0
    # the calibrated profile the eager steps were priced with (graphcost calibrate --device:
    # its measured kernels and its validation's band); None: the datasheet's rates
    profile: str | None = None


@dataclass(frozen=True)
class Collectives:
    """A tensor-parallel replica's collectives in each step, per rank (passes/costs/
    collectives.py): the all-reduced and all-gathered bytes and the calls."""
    tensor_parallel: int
    prefill_all_reduce_bytes: int
    prefill_all_gather_bytes: int
    prefill_calls: int
    decode_all_reduce_bytes: int
    decode_all_gather_bytes: int
    decode_calls: int

    def seconds(self, link_bandwidth: float) -> tuple[float, float]:
        """Each step's collectives on a link of ``link_bandwidth`` bytes/s each way (the
        serving plan has no sequence parallelism: no reduce-scatter)."""
        def priced(all_reduce: int, all_gather: int, calls: int) -> float:
            counts = {"all_reduce": all_reduce, "all_gather": all_gather, "reduce_scatter": 0}
            return ring_seconds(ring_wire(counts, self.tensor_parallel), calls, link_bandwidth)
        return (priced(self.prefill_all_reduce_bytes, self.prefill_all_gather_bytes,
                       self.prefill_calls),
                priced(self.decode_all_reduce_bytes, self.decode_all_gather_bytes,
                       self.decode_calls))


def count_collectives(prefill: Graph, decode: Graph, tp: int) -> Collectives | None:
    """The collectives of a tensor-parallel replica's two steps (None: one GPU)."""
    if tp <= 1:
        return None
    p, d = tp_collectives(prefill), tp_collectives(decode)
    return Collectives(tp, p["all_reduce"], p["all_gather"], p["calls"], d["all_reduce"],
                       d["all_gather"], d["calls"])


def serving_time(prefill: Graph, prefill_costs: CostReport, decode: Graph,
                 decode_costs: CostReport, device: DeviceRates, engine: str,
                 collectives: Collectives | None,
                 link_bandwidth: float | None,
                 calibrated: tuple[str, EngineProfile] | None = None) -> ServingTime:
    """Both steps' estimate on the GPU ``device`` as ``engine`` (eager | vllm) runs them, a
    tensor-parallel replica's collectives exposed on its link; ``calibrated``: (a profile's
    name, its eager PyTorch engine) measured on that GPU, which prices the eager steps (vLLM's
    compiled kernels keep the datasheet's: the profile timed eager ones)."""
    vllm = engine == "vllm"
    sheet = datasheet_engine(device, compiled=vllm)
    profile, rates = calibrated if calibrated is not None and not vllm else (None, sheet)
    ttft, tpot = (estimate_time(graph, costs.nodes, rates, profile=profile or device.name,
                                engine_name="torch",
                                basis="profile" if profile else "datasheet", compiled=vllm)
                  for graph, costs in ((prefill, prefill_costs), (decode, decode_costs)))
    # a CUDA graph's replay launches the decode step's kernels without the host
    kernels = tpot.arithmetic_seconds + tpot.memory_seconds + tpot.launch_seconds if vllm \
        else tpot.seconds
    comm = (0.0, 0.0)
    if collectives is not None:
        if link_bandwidth is None:
            raise ValueError("a tensor-parallel replica's time needs the link its ranks share")
        comm = collectives.seconds(link_bandwidth)
    step = kernels + comm[1]
    band = rates.band if profile and rates.band is not None else datasheet_band(sheet)
    return ServingTime(ttft.seconds + comm[0], step, prefill.batch / step, band,
                       tpot.host_bound and not vllm, engine, *comm, profile=profile)
