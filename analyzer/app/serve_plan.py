"""``graphcost plan MODEL --serve``: the serving setting of N GPUs that makes the most output
tokens per second and meets the latency targets.

The settings searched: each replica's tensor-parallel size (1, 2, 4, … up to a node, dividing
N: the GPUs make N / tp replicas, each serving its own requests), the weights' and the KV
cache's dtypes asked (default: the model's own), and the sequences a replica serves at once
(vLLM's ``--max-num-seqs``): 1, 2, 4, … up to what its memory holds. Each is the direct
analysis ``graphcost MODEL --serve --batch B --parallel tp=T --engine vllm`` gives: the steps
priced as vLLM runs them (compiled kernels, the decode step a CUDA graph's replay), memory
on PyTorch's caching allocator. Requests are of one shape (the prompt, the tokens
generated), and a replica serves them in waves of B: their prompts prefilled together (the
TTFT), then decoded together (the TPOT at the full context), so that a request takes
TTFT + G · TPOT and a replica makes B · G tokens in that time. Continuous batching of
requests of one shape does the same work per request; vLLM's chunked prefill, which
prefills a few requests a step and computes the logits of the last position alone, holds
less working memory: the sequences that fit here are a lower bound of what it holds.

Fast: a replica's rank program is traced at two batches (1 and 2) and every other batch is
that graph re-bound (analyzer/load/rebind.py), as ``--max-batch`` does; where the two traces
are not one family each batch is traced.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product
from typing import Any, Callable, Mapping

from ...passes.device_rates import DeviceRates
from ...passes.errors import GraphcostError, opt
from ...passes.parallel.layouts import tensor_sizes
from ...passes.serving.analysis import Serving
from ...passes.serving.dtypes import deployed
from ..load.loading import load
from ..load.progress import Progress, Step
from ..load.rebind import batch_family
from .devices import GPUS_PER_NODE
from .pipeline import run_passes
from .request import build_request
from .settings_analyses import collecting_less
from .units import human_time

MAX_SEQUENCES = 1024   # vLLM's largest default --max-num-seqs (V1 on an H100-class GPU)


@dataclass(frozen=True)
class ServePlanSpec:
    """What a serving plan searches: ``gpus`` GPUs of ``node`` a node, requests of
    ``prompt`` + ``generate`` tokens; the latency targets (seconds; None: none); the
    tensor-parallel sizes (None: every one up to a node) and dtypes (None: the model's)."""
    gpus: int
    prompt: int
    generate: int
    ttft: float | None = None
    tpot: float | None = None
    tp: tuple[int, ...] | None = None
    weight_dtypes: tuple[str | None, ...] = (None,)
    kv_dtypes: tuple[str | None, ...] = (None,)
    node: int = GPUS_PER_NODE


@dataclass(frozen=True)
class ServeSettings:
    """One replica's setting: its tensor-parallel size, the sequences it serves at once,
    the dtypes (None: the model's)."""
    tp: int
    batch: int
    weight_dtype: str | None = None
    kv_dtype: str | None = None

    def analyze_kwargs(self, spec: ServePlanSpec,
                       parallel: Mapping[str, Any]) -> dict:
        serve = {"prompt": spec.prompt, "generate": spec.generate, "engine": "vllm"}
        serve.update({k: v for k, v in (("weight_dtype", self.weight_dtype),
                                        ("kv_dtype", self.kv_dtype)) if v})
        # (what-ifs at other dtypes: not a candidate's figures)
        return {"batch": self.batch, "serve": serve, "what_if": False,
                "parallel": {"mesh": f"tp={self.tp}", **parallel} if self.tp > 1 else None}


@dataclass(frozen=True)
class ServeCandidate:
    """A setting and what its analysis said: ``status`` fits | slow (fits, misses a latency
    target: ``detail``) | over (the device's memory) | refused (``error``)."""
    settings: ServeSettings
    status: str
    replicas: int
    detail: str = ""
    error: GraphcostError | None = None
    serving: Serving | None = None

    @property
    def request_seconds(self) -> float | None:
        """A request's time in its wave: its prefill, then G decode steps."""
        s = self.serving
        t = s.time if s is not None else None
        return None if s is None or t is None else t.ttft_seconds + s.generate * t.tpot_seconds

    @property
    def tokens_per_second(self) -> float | None:
        """Output tokens/s of all the replicas."""
        s, seconds = self.serving, self.request_seconds
        if s is None or not seconds:
            return None
        return self.replicas * s.batch * s.generate / seconds

    @property
    def tokens_per_second_per_gpu(self) -> float | None:
        rate = self.tokens_per_second
        return None if rate is None else rate / (self.replicas * self.settings.tp)


@dataclass(frozen=True)
class ServePlan:
    model: str
    device: str
    device_bytes: int                         # the GPU's memory
    spec: ServePlanSpec
    candidates: tuple[ServeCandidate, ...]   # fitting ones first, by tokens/s per GPU
    # when none fits: the least-needing replica program with smaller weights, fitting one
    # sequence (smaller_weights); None: none fits so, or one fits already
    suggestion: ServeCandidate | None = None

    @property
    def best(self) -> ServeCandidate | None:
        first = self.candidates[0] if self.candidates else None
        return first if first is not None and first.status == "fits" else None


@collecting_less
def plan_serving(model, spec: ServePlanSpec, base: Mapping[str, Any],
                 progress: Progress | None = None) -> ServePlan:
    """The serving plan of ``model``: ``base`` holds ``analyze``'s other arguments (a GPU
    device; ``parallel``: the interconnect between nodes)."""
    base = dict(base)
    parallel = dict(base.pop("parallel", None) or {})
    rates = _check(spec, base, parallel)
    done: list[ServeCandidate] = []
    programs = list(product(_tp_sizes(spec), spec.weight_dtypes, spec.kv_dtypes))
    for i, (tp, weight, kv) in enumerate(programs, 1):
        if progress:
            progress(Step(i, len(programs), f"tp={tp}, {weight or 'the model'}'s weights, "
                                            f"{kv or 'its'} KV cache"))
        done += _replica(model, spec, ServeSettings(tp, 1, weight, kv), base, parallel,
                         progress)
    errors = [c.error for c in done if c.error is not None]
    if errors and len(errors) == len(done):
        raise errors[0]
    fits = any(c.status in ("fits", "slow") for c in done)
    smaller = _smaller_dtypes(spec, rates)
    return ServePlan(str(model), rates.name, rates.memory, spec,
                     tuple(sorted(done, key=_rank)),
                     None if fits else smaller_weights(model, spec, done, base, parallel,
                                                       smaller))


def _smaller_dtypes(spec: ServePlanSpec, rates: DeviceRates) -> tuple[str, ...]:
    """The weights' dtypes a plan that fits nothing tries, in order, but those it tried:
    vLLM's fp8 (``--quantization fp8``, on the fly from a 16-bit checkpoint; its kernels need
    an Ampere GPU or newer, or AMD's), then 4-bit (an AWQ or GPTQ checkpoint)."""
    fp8 = rates.rocm or (rates.capability or (0, 0)) >= (8, 0)
    return tuple(d for d in ("fp8", "int4")
                 if d not in spec.weight_dtypes and (d != "fp8" or fp8))


def smaller_weights(model, spec: ServePlanSpec, done: list[ServeCandidate],
                    base: Mapping[str, Any], parallel: Mapping[str, Any],
                    dtypes: tuple[str, ...]) -> ServeCandidate | None:
    """When nothing fits: the least-needing replica program (its tensor-parallel size) with
    the first of ``dtypes`` that makes one sequence fit — one analysis more each — or None."""
    least = least_needing(done)
    if least is None:
        return None
    for dtype in dtypes:
        s = replace(least.settings, batch=1, weight_dtype=dtype)
        try:
            c = _judged(spec, s, least.replicas, _by_batch(model, spec, s, base, parallel,
                                                            None)(1))
        except GraphcostError:
            continue
        if c.status in ("fits", "slow"):
            return c
    return None


def _check(spec: ServePlanSpec, base: Mapping[str, Any],
           parallel: Mapping[str, Any]) -> DeviceRates:
    from .api_checks import device_of
    rates = device_of(base.get("device"))
    if rates is None or not rates.is_gpu or base.get("device_profile") is not None:
        raise GraphcostError(f"a plan ranks by a GPU's time estimate: add a GPU "
                             f"{opt('device')} (without {opt('device_profile')})")
    if spec.gpus < 1:
        raise GraphcostError(f"{opt('gpus', value=spec.gpus)}: a whole number ≥ 1")
    bad = sorted(set(parallel) - {"interconnect", "gpus_per_node"})
    if bad:
        raise GraphcostError(f"{opt('parallel.' + bad[0])}: a plan searches the layout")
    for tp in spec.tp or ():
        if tp < 1 or spec.gpus % tp:
            raise GraphcostError(f"{opt('tp', value=tp)}: it must divide the {spec.gpus} GPUs")
    return rates


def least_needing(candidates) -> ServeCandidate | None:
    """The candidate over the memory that needs the least of it (None: none analyzed)."""
    def needs(c: ServeCandidate) -> int | None:
        return c.serving.fit.needs if c.serving is not None and c.serving.fit is not None \
            else None
    over = [c for c in candidates if c.status == "over" and needs(c) is not None]
    return min(over, key=lambda c: needs(c) or 0, default=None)


def _tp_sizes(spec: ServePlanSpec) -> tuple[int, ...]:
    return spec.tp or tuple(tensor_sizes(spec.gpus, spec.node))


def _replica(model, spec: ServePlanSpec, first: ServeSettings, base: Mapping[str, Any],
             parallel: Mapping[str, Any], progress: Progress | None) -> list[ServeCandidate]:
    """One replica program's candidates: batch 1, 2, 4, … up to what fits (or
    ``MAX_SEQUENCES``), then the most its memory holds."""
    replicas = spec.gpus // first.tp
    try:
        at = _by_batch(model, spec, first, base, parallel, progress)
    except GraphcostError as exc:
        return [ServeCandidate(first, "refused", replicas, error=exc)]
    out: list[ServeCandidate] = []
    batch: int | None = 1
    while batch is not None:
        s = replace(first, batch=batch)
        try:
            c = _judged(spec, s, replicas, at(batch))
        except GraphcostError as exc:
            return [*out, ServeCandidate(s, "refused", replicas, error=exc)]
        out.append(c)
        batch = _next_batch(batch, c, {x.settings.batch for x in out})
    return out


def _next_batch(batch: int, c: ServeCandidate, tried: set[int]) -> int | None:
    """Double the batch while it fits; past the last that fits, the most the replay says
    its memory holds (once)."""
    most = c.serving.max_concurrent_sequences if c.serving else None
    if c.status in ("over", "slow") or most is None:   # (a larger batch only waits longer)
        return None
    most = min(most, MAX_SEQUENCES)
    if batch * 2 <= most:
        return batch * 2
    return most if most > batch and most not in tried else None


def _by_batch(model, spec: ServePlanSpec, s: ServeSettings, base: Mapping[str, Any],
              parallel: Mapping[str, Any],
              progress: Progress | None) -> Callable[[int], Serving]:
    """``b -> the serving review at batch b`` of setting ``s``'s replica: traced at batches
    1 and 2, the others re-bound from those two (traced where they are not one family)."""
    def request(b: int):
        return build_request(**{**base, **replace(s, batch=b).analyze_kwargs(spec, parallel)})

    traced: dict[int, tuple] = {}   # batch -> (the report's graph, the serving trace)

    def traced_at(b: int) -> tuple:
        if b not in traced:
            r = request(b)
            loaded = load(model, r.load, progress=progress, serve=r.serve)
            traced[b] = (loaded.graph, loaded.serving)
        return traced[b]

    one, two = traced_at(1)[1], traced_at(2)[1]
    prefill = batch_family(one.prefill, 1, two.prefill, 2)
    decode = batch_family(one.decode, 1, two.decode, 2)

    def at(b: int) -> Serving:
        if b in (1, 2) or prefill is None or decode is None:
            graph, trace = traced_at(b)
        else:
            trace = replace(one, prefill=prefill(b), decode=decode(b))
            graph = deployed(trace.prefill, trace.prefill_cache, trace.weight_dtype,
                             trace.kv_dtype)
        report = run_passes(graph, request(b).passes, serving=trace)
        assert report.serving is not None
        return report.serving
    return at


def _judged(spec: ServePlanSpec, s: ServeSettings, replicas: int,
            serving: Serving) -> ServeCandidate:
    """Fits the device and meets the latency targets, or why not."""
    if serving.fit is None or not serving.fit.fits:
        return ServeCandidate(s, "over", replicas, "over the memory", serving=serving)
    t = serving.time
    assert t is not None   # (a GPU device and a PyTorch model)
    missed = [f"{name} {human_time(value)} > {human_time(target)}"
              for name, value, target in (("TTFT", t.ttft_seconds, spec.ttft),
                                          ("TPOT", t.tpot_seconds, spec.tpot))
              if target is not None and value > target]
    if missed:
        return ServeCandidate(s, "slow", replicas, "; ".join(missed), serving=serving)
    return ServeCandidate(s, "fits", replicas, serving=serving)


def _rank(c: ServeCandidate) -> tuple:
    order = ("fits", "slow", "over", "refused").index(c.status)
    return (order, -(c.tokens_per_second_per_gpu or 0.0))
