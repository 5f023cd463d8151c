"""The serving review of a decoder: KV cache, prefill and decode, memory and tokens per second.

Inputs are two traced graphs (analyzer/load/serving.py): the **prefill** of P prompt tokens, whose
outputs include the cache the model keeps for them, and **one decode step** of the last token
generated, whose inputs are the cache the model keeps after P + G − 1 tokens. The KV cache is
read off those tensors, never computed from a config:

* ``kv_cache_bytes`` — the cache after P + G tokens, for the whole batch: the decode step's
  output cache (a step that concatenates returns it whole: transformers' ``DynamicCache``,
  ONNX ``present.*``), or its input cache plus the keys and values the step appends (an engine
  appending in place: the zoo's decoders);
* ``kv_bytes_per_token`` — what the last step added, per sequence (a sliding-window layer whose
  window is full adds nothing).

**Memory** on a device is weights + KV cache + the larger of the two steps' working peaks
(``peak_bytes``: activations live at the step's peak beyond the weights and the cache, from the
liveness pass; a cache tensor is counted once, as an engine appending in place holds it),
fitted on the device as passes/device/fits.py answers it (an estimate of the allocator: the serving
steps are not replayed). Activations and caches grow linearly with the batch, so
``max_concurrent_sequences`` is the largest n for which weights + n/B · (cache + working peak)
fits; ``max_context`` the longest context whose cache fits at the batch traced, the cache
growing by the last step's growth per token (a sliding window that was not yet full at
P + G − 1 is taken to keep growing: an upper bound of its memory), and no longer than a
model with learned positions (GPT-2's ``n_positions``) takes.

**Time** is the roofline of each step (passes/device/roofline.py): prefill is compute-bound (P tokens
per weight read), decode memory-bound (one token per weight read): at batch 1 a decode step
cannot take less than ``bandwidth_bound_seconds`` = (weight bytes + KV bytes) / bandwidth —
every weight and every cached byte read once. ``tokens_per_second`` is the batch's: B tokens
per step. Attention FLOPs are given dense (what the graph computes: every score of the P × P
matrix) and for a causal mask (the useful scores, (P + 1) / 2P of them).

Dtypes (passes/serving/dtypes.py): the review is priced at ``weight_dtype`` / ``kv_dtype`` and
the what-ifs re-price the same two graphs with int8, int4 and fp8 weights and fp8 and int8
caches. Pure: the graphs in, a ``Serving`` out.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..costs import CostReport, count_costs
from ..device.fits import Fit, Overhead, fit
from ..device.profile import EngineProfile
from ..device.roofline import roofline
from ..device_rates import DeviceRates
from ..graph.params import count_params
from ..ir import FLOAT_DTYPES, Graph, ValueKind
from ..memory.allocator_events import PhaseReserve
from ..memory.caching_allocator import AllocatorConfig
from ..memory.peak import Peak
from ..serving import dtypes as sd
from .capacity import ServingRoom, Tensors
from .reserved import ServingEvents, serving_events, serving_reserved
from .timing import Collectives, ServingTime, count_collectives, serving_time
from .working_memory import working_peak

WHAT_IFS = (("int8", None), ("int4", None), ("fp8", None), (None, "fp8"), (None, "int8"))
CURVE_POINTS = 16


@dataclass(frozen=True)
class ServingTrace:
    """What the frontend traced (analyzer/load/serving.py): the two steps, as traced, and which of
    their inputs and outputs are the KV cache."""
    prefill: Graph
    decode: Graph
    prompt: int
    generate: int
    prefill_cache: tuple[str, ...]   # prefill outputs: the cache kept for the prompt
    decode_past: tuple[str, ...]     # decode inputs: the cache after P + G − 1 tokens
    decode_cache: tuple[str, ...]    # decode outputs: the keys/values appended, or the cache
    appends: bool                    # decode_cache is what the step appends (else the cache)
    weight_dtype: str | None = None  # as analyzed (None: as traced)
    kv_dtype: str | None = None
    traced_layers: str | None = None  # how a repeated stack was traced, if it was
    positions: int | None = None     # learned positions: no context beyond them
    tensor_parallel: int = 1         # the steps are one of this many ranks' programs
    engine: str = "eager"            # eager (transformers' generate) | vllm: how time is priced


@dataclass(frozen=True)
class Prefill:
    tokens: int                      # batch × prompt
    kv_cache_bytes: int              # the cache the prefill leaves (the prompt's, batch)
    flops: int
    macs: int
    bytes_read: int
    bytes_written: int
    peak_bytes: int                  # working peak: beyond the weights and the KV cache
    seconds: float | None            # roofline lower bound (None: no device)
    compute_seconds: float | None
    memory_seconds: float | None
    bound: str | None                # the larger share: "compute" | "memory"
    attention_flops_dense: int       # 2 · MACs of attention scores and values, every score
    attention_flops_causal: int      # … only the scores a causal mask keeps


@dataclass(frozen=True)
class Decode:
    context: int                     # tokens the last step attends over: P + G
    flops_per_token: float
    macs_per_token: float
    bytes_per_token: float           # bytes read + written by the step / batch
    peak_bytes: int                  # working peak: beyond the weights and the KV cache
    seconds_per_token: float | None  # the step's roofline: each sequence's time per token
    tokens_per_second: float | None  # the batch's: batch / step time
    compute_seconds: float | None
    memory_seconds: float | None
    bound: str | None
    bandwidth_bound_seconds: float | None  # (weight bytes + KV bytes) / bandwidth


@dataclass(frozen=True)
class DtypeWhatIf:
    weight_dtype: str
    kv_dtype: str
    weight_bytes: int
    kv_cache_bytes: int
    decode_seconds_per_token: float | None   # the decode step's bytes / bandwidth
    max_concurrent_sequences: int | None


@dataclass(frozen=True)
class ContextPoint:
    context: int
    memory_bytes: int                        # weights + cache + working peak (no overhead)
    decode_bound_seconds: float | None       # (weights + cache) / bandwidth


@dataclass(frozen=True)
class Serving:
    """The report's ``serving`` section."""
    prompt: int
    generate: int
    batch: int
    weight_dtype: str
    kv_dtype: str
    weight_bytes: int
    kv_bytes_per_token: int          # per sequence, added by the last token
    kv_cache_bytes: int              # the batch's cache after P + G tokens
    cache_tensors: int
    cache_update: str                # "append" (in place) | "concat" (copied every step)
    prefill: Prefill
    decode: Decode
    reserved_peak_bytes: int         # the batch replayed through the CUDA caching allocator
    reserved_by_phase: tuple[PhaseReserve, ...]  # by the end of: weights, cache, prefill, decode
    fit: Fit | None                  # weights + KV cache + working peak on the device
    max_concurrent_sequences: int | None
    max_context: int | None          # the longer context memory allows, capped by ``positions``
    positions: int | None            # the model's learned positions (None: not limited)
    what_if: tuple[DtypeWhatIf, ...]
    curve: tuple[ContextPoint, ...]
    traced_layers: str | None
    uncosted_decode_nodes: int = 0
    time: ServingTime | None = None  # a GPU device and a PyTorch model: the estimate
    collectives: Collectives | None = None   # a tensor-parallel replica's (per rank)
    JSON_PROPERTIES = ("peak",)

    @property
    def peak(self) -> Peak:
        """The batch's peak (passes/memory/peak.py), the one its ``fit`` judges."""
        return serving_peak(self.weight_bytes, self.kv_cache_bytes, self.prefill.peak_bytes,
                            self.decode.peak_bytes, self.reserved_peak_bytes)


def serving_peak(weights: int, cache: int, prefill_work: int, decode_work: int,
                 reserved: int | None) -> Peak:
    """Weights + the cache after P + G tokens + the larger of the two steps' working peaks
    (``phase``: that step's; the decode step's on a tie), against the batch's reserved replay."""
    work = max(prefill_work, decode_work)
    return Peak(allocated_bytes=weights + cache + work, reserved_bytes=reserved,
                phase="prefill" if prefill_work > decode_work else "decode", node=None,
                by_category={"weights": weights, "kv_cache": cache, "activations": work})


@dataclass(frozen=True)
class _Phase:
    graph: Graph
    costs: CostReport | None         # None: a what-if's prefill (not costed)
    work: int                        # working peak
    roof: object | None


def serving_review(trace: ServingTrace, device: DeviceRates | None = None,
                   overhead: Overhead | None = None, allocator: AllocatorConfig = AllocatorConfig(),
                   link_bandwidth: float | None = None, what_if: bool = True,
                   calibrated: tuple[str, EngineProfile] | None = None) -> Serving:
    """The serving review of ``trace`` on ``device``: ``link_bandwidth`` (bytes/s each way) a
    tensor-parallel replica's link, ``what_if`` other dtypes, ``calibrated`` (timing.py)."""
    overhead = overhead or Overhead()
    prefill, peaks = trace.prefill, {}
    b = prefill.batch
    pre, dec, weights, kv = _priced(prefill, trace, trace.weight_dtype, trace.kv_dtype, device,
                                    peaks)
    collectives = count_collectives(pre.graph, dec.graph, trace.tensor_parallel)  # (re-typed)
    before, after = _cache_bytes(dec.graph, trace)
    growth = after - before                      # the batch's cache growth per token
    work = max(pre.work, dec.work)
    t0 = trace.prompt + trace.generate
    dense = _attention_macs(pre.graph, pre.costs) * 2
    p = trace.prompt
    prefill_out = Prefill(
        tokens=b * p, flops=pre.costs.totals.flops, macs=pre.costs.totals.macs,
        kv_cache_bytes=sum(pre.graph.spec(n).nbytes or 0 for n in trace.prefill_cache),
        bytes_read=pre.costs.totals.bytes_read, bytes_written=pre.costs.totals.bytes_written,
        peak_bytes=pre.work, **_times(pre.roof), attention_flops_dense=dense,
        attention_flops_causal=dense * (p + 1) // (2 * p))
    t = dec.costs.totals
    times = _times(dec.roof)
    step = times["seconds"]
    decode_out = Decode(
        context=t0, flops_per_token=t.flops / b, macs_per_token=t.macs / b,
        bytes_per_token=(t.bytes_read + t.bytes_written) / b, peak_bytes=dec.work,
        seconds_per_token=step, tokens_per_second=b / step if step else None,
        compute_seconds=times["compute_seconds"], memory_seconds=times["memory_seconds"],
        bound=times["bound"],
        bandwidth_bound_seconds=(weights + after) / device.bandwidth if device else None)
    ev = _events(pre.graph, dec.graph, trace, after, device)
    reserved, phases = serving_reserved(ev, allocator)
    answer = serving_peak(weights, after, pre.work, dec.work, reserved).fit(
        device, overhead=overhead, allocator=allocator.words) if device else None
    room = ServingRoom.of(answer, allocator, overhead.allocator_fraction) if answer else None
    tensors = Tensors(weights, after, work)
    max_context = room.context(ev, growth, t0, tensors) if room else None
    if max_context is not None and trace.positions is not None:
        max_context = min(max_context, trace.positions)
    return Serving(
        prompt=trace.prompt, generate=trace.generate, batch=b,
        weight_dtype=sd.short(sd.plan(prefill, trace.weight_dtype, trace.kv_dtype)[0]),
        kv_dtype=sd.short(kv), weight_bytes=weights, kv_bytes_per_token=growth // b,
        kv_cache_bytes=after, cache_tensors=len(trace.decode_past),
        cache_update="append" if trace.appends else "concat",
        prefill=prefill_out, decode=decode_out, reserved_peak_bytes=reserved,
        reserved_by_phase=phases, fit=answer,
        max_concurrent_sequences=room.sequences(ev, b, tensors) if room else None,
        max_context=max_context, positions=trace.positions,
        what_if=_what_ifs(prefill, trace, device, room, peaks) if what_if else (),
        curve=_curve(weights + work, after, growth, t0, weights, device, max_context),
        traced_layers=trace.traced_layers,
        uncosted_decode_nodes=sum(1 for nc in dec.costs.nodes if nc.status != "ok"),
        time=_serving_time(pre, dec, device, trace, collectives, link_bandwidth, calibrated),
        collectives=collectives)


def _serving_time(pre: _Phase, dec: _Phase, device: DeviceRates | None, trace: ServingTrace,
                  collectives: Collectives | None, link_bandwidth: float | None,
                  calibrated: tuple[str, EngineProfile] | None) -> ServingTime | None:
    """The estimate of both steps (a GPU, a traced PyTorch model)."""
    if device is None or not device.is_gpu or pre.graph.source == "onnx":
        return None
    assert pre.costs is not None and dec.costs is not None   # (the whole review costs both)
    return serving_time(pre.graph, pre.costs, dec.graph, dec.costs, device, trace.engine,
                        collectives, link_bandwidth, calibrated)


def _priced(prefill: Graph, trace: ServingTrace, weight: str | None, kv: str | None,
            device: DeviceRates | None, peaks: dict, *, whole: bool = True):
    """Both steps re-typed to (weight, kv) and costed: (prefill, decode, weight bytes, the
    cache's IR dtype). The working peaks depend on the activations' type and the cache's (a
    concatenating cache's old layer beside its copy is work; weights are not activations):
    ``peaks`` keeps them by those types. Without
    ``whole`` (a what-if) the prefill is not costed."""
    w, compute, kv_type = sd.plan(prefill, weight, kv)
    phases = []
    for k, (graph, cache) in enumerate(((prefill, trace.prefill_cache),
                                        (trace.decode, trace.decode_past + trace.decode_cache))):
        names = sd.cache_values(graph, cache)
        g = sd.retype(graph, w, compute, kv_type, names)
        costs = count_costs(g) if whole or k == 1 else None
        key = (compute, kv_type, k)
        if key not in peaks:   # (the cache tensors themselves: their views'
            # storages are theirs; a copied cache's old tensors dropped as their copies come)
            copied = set(trace.decode_past) if k == 1 and not trace.appends else set()
            peaks[key] = working_peak(g, set(cache), copied)
        roof = roofline(g, costs.nodes, device, tensor_bytes=0, fit=fit(device, 0)) \
            if device and costs else None
        phases.append(_Phase(g, costs, peaks[key], roof))
    params = count_params(phases[0].graph)
    return phases[0], phases[1], params.param_bytes + params.buffer_bytes, kv_type


def _cache_bytes(decode: Graph, trace: ServingTrace) -> tuple[int, int]:
    """The batch's cache before the last step (P + G − 1 tokens) and after it (P + G)."""
    before = sum(decode.values[n].spec.nbytes or 0 for n in trace.decode_past)
    out = sum(decode.values[n].spec.nbytes or 0 for n in trace.decode_cache)
    return before, before + out if trace.appends else out


def _times(roof) -> dict:
    if roof is None:
        return dict(seconds=None, compute_seconds=None, memory_seconds=None, bound=None)
    return dict(seconds=roof.total_seconds, compute_seconds=roof.compute_seconds,
                memory_seconds=roof.memory_seconds,
                bound="compute" if roof.compute_seconds >= roof.memory_seconds else "memory")


def _attention_macs(graph: Graph, costs) -> int:
    """MACs of the products of two activations (scores Q·Kᵀ and weights·V, or a fused
    attention op): every other multiply-accumulate reads a weight. Only floating operands
    count: a grouped matmul's integer offsets (a mixture of experts') are no activation."""
    from_weights: set[str] = set()
    for name, v in graph.values.items():
        if v.kind in (ValueKind.PARAM, ValueKind.BUFFER, ValueKind.CONST):
            from_weights.add(name)
    total = 0
    for node, nc in zip(graph.nodes, costs.nodes):
        data = [x for x in node.inputs if x]
        if all(x in from_weights for x in data):  # a weight transposed, cast; a constant
            from_weights.update(o for o in node.outputs if o)
            continue
        floating = [x for x in data[:3]
                    if getattr(graph.spec(x), "dtype", None) in FLOAT_DTYPES]
        if nc.cost.macs and sum(1 for x in floating if x not in from_weights) >= 2:
            total += nc.cost.macs
    return total


def _events(prefill: Graph, decode: Graph, trace: ServingTrace, after: int,
            device: DeviceRates | None) -> ServingEvents:
    """The batch's allocations (passes/serving/reserved.py) in the steps ``prefill`` and
    ``decode``, as traced or re-typed."""
    return serving_events(prefill, decode, sd.cache_values(prefill, trace.prefill_cache),
                          list(trace.decode_past), sd.cache_values(decode, trace.decode_cache),
                          trace.appends, after, device)


def _curve(fixed: int, after: int, growth: int, t0: int, weights: int, device,
           max_context: int | None) -> tuple[ContextPoint, ...]:
    """Memory and the decode bound from 0 to twice the traced context, or past the longest
    context that fits (up to 64 times the traced one)."""
    end = 2 * t0 if max_context is None else min(max(2 * t0, max_context * 5 // 4), 64 * t0)
    points = []
    for k in range(CURVE_POINTS + 1):
        ctx = round(end * k / CURVE_POINTS)
        cache = max(0, after + growth * (ctx - t0))
        points.append(ContextPoint(ctx, fixed + cache,
                                   (weights + cache) / device.bandwidth if device else None))
    return tuple(points)


def _what_ifs(prefill: Graph, trace: ServingTrace, device, room: ServingRoom | None, peaks: dict
              ) -> tuple[DtypeWhatIf, ...]:
    def setting(weight, kv) -> tuple[str, str]:
        w, _, kv_type = sd.plan(prefill, weight, kv)
        return sd.short(w), sd.short(kv_type)
    out, seen = [], {setting(trace.weight_dtype, trace.kv_dtype)}  # the chosen one: no what-if
    for weight, kv in WHAT_IFS:
        weight = weight or trace.weight_dtype
        kv = kv or trace.kv_dtype
        key = setting(weight, kv)
        if key in seen:
            continue  # the setting chosen, or one already listed: never twice
        seen.add(key)
        pre, dec, weights, kv_type = _priced(prefill, trace, weight, kv, None, peaks,
                                             whole=False)
        _, after = _cache_bytes(dec.graph, trace)
        sequences = room.sequences(_events(pre.graph, dec.graph, trace, after, device),
                                   prefill.batch, Tensors(weights, after,
                                                          max(pre.work, dec.work))) \
            if room else None
        t = dec.costs.totals
        out.append(DtypeWhatIf(
            weight_dtype=sd.short(sd.plan(prefill, weight, kv)[0]), kv_dtype=sd.short(kv_type),
            weight_bytes=weights, kv_cache_bytes=after,
            decode_seconds_per_token=(t.bytes_read + t.bytes_written) / device.bandwidth
            if device else None,
            max_concurrent_sequences=sequences))
    return tuple(out)
