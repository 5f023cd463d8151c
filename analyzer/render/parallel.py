"""The data-parallel section of a report as summary entries (label, items), shared by the
terminal, Markdown and HTML views. Reads ``Report.parallel`` only; computes nothing."""
from __future__ import annotations

from ...passes.choices import Strategy
from ...passes.parallel.schedules import SCHEDULE_WORDS, zero_bubble
from ..app.report import Report
from ..app.units import human_bytes, human_time

_STRATEGY: dict[str, str] = {
    Strategy.DDP: "DDP (replicated, gradient buckets)",
    Strategy.ZERO1: "ZeRO-1 (DDP + ZeroRedundancyOptimizer)",
    Strategy.ZERO2: "ZeRO-2 (FSDP2, reshard_after_forward=False)",
    Strategy.ZERO3: "ZeRO-3 (FSDP2 fully_shard)",
    Strategy.FSDP: "FSDP2 (fully_shard)",
}


def _items(mapping) -> list[str]:
    return [f"{k.replace('_', ' ')} {human_bytes(v)}," for k, v in mapping.items() if v]


def _per_rank(p, brief: bool) -> list[str]:
    """One rank's peak, where, its first step, its reserved bytes (not brief: the fit shows
    them) and one device's peak at this batch beside it."""
    where = p.peak_phase + (f" at {p.peak_event}" if p.peak_event else
                            f" at {p.peak_node}" if p.peak_node else " step")
    rank = f" (rank {p.worst_rank}, the worst)" if p.strategy == "zero1" else ""
    return ([f"peak {human_bytes(p.per_rank_peak_bytes)} ({p.per_rank_peak_bytes:,} B){rank} "
             f"in {where}", "(steady state);", f"first step {human_bytes(p.first_step_peak_bytes)};"]
            + ([] if brief else [f"reserved {human_bytes(p.reserved_peak_bytes)} (caching "
                                 "allocator,", "two steps);"])
            + ([f"its program alone {human_bytes(p.single_device_peak_bytes)}"]
               if {"tp", "cp", "ep"} & set(p.mesh) else
               [f"one device at this batch {human_bytes(p.single_device_peak_bytes)}"]))


def _layout(p) -> str:
    """The strategy's name; tensor parallel alone (no data-parallel wrapper) as itself (its
    plan, torchtitan's or transformers' own, is the model's: docs/parallel.md)."""
    if set(p.mesh) == {"tp"}:
        return "tensor parallel alone (no data-parallel wrapper)"
    return _STRATEGY[p.strategy]


def _mesh_words(mesh) -> str:
    """``dp_replicate 2 × dp_shard 4``: the mesh's dimensions, outer to inner; the ep group
    carved out of dp_shard (``dp_shard 8 in ep groups of 4``), no factor of the world."""
    words = " × ".join(f"{k} {n:,}" for k, n in mesh.items() if k != "ep")
    return f"{words} in ep groups of {mesh['ep']:,}" if mesh.get("ep", 1) > 1 else words


def parallel_summary(r: Report, brief: bool = False) -> list[tuple[str, list[str]]]:
    """The strategy, one rank's peak and what it holds, the communication; ``brief``: the
    rank's line without the reserved bytes (the fit shows them: analyzer/render/summary.py)."""
    if r.pipeline is not None:
        return _pipeline_summary(r, brief)
    p = r.parallel
    if p is None:
        return []
    out = [
        ("parallel", [f"{_layout(p)} over {p.world_size:,} ranks"
                      + (f" ({_mesh_words(p.mesh)}):" if len(p.mesh) > 1 else ":"),
                      f"batch {p.per_rank_batch:,} per rank, {p.global_batch:,} global"
                      + (f", each sequence split over cp's {p.mesh['cp']:,} ranks (ring "
                         "attention);" if p.mesh.get("cp", 1) > 1 else ";"),
                      f"optimizer {r.training.optimizer if r.training else ''} "
                      f"({p.optimizer_impl} step)"
                      + (f"; {p.offload} offloaded to the host" if p.offload else "")]),
        ("per rank", _per_rank(p, brief)),
        ("rank peak", _items(p.breakdown_at_peak)),
    ]
    comm_parts = {k: v for k, v in p.detail_at_peak.items()
                  if k in ("ddp_buckets", "unsharded_params", "all_gather_buffers",
                           "reduce_scatter_inputs")}
    if comm_parts:
        out.append(("comm bufs", _items(comm_parts)))
    if p.host_bytes:
        out.append(("host", [f"{human_bytes(p.host_bytes)} offloaded:"]
                    + _items(p.host_breakdown)))
    if p.units:
        blocks = [u for u in p.units if u.name != "(root)"]
        root = p.units[-1]
        biggest = max(p.units, key=lambda u: u.padded_bytes)
        names = [u.name for u in blocks[:3]] + ([f"… {blocks[-1].name}"]
                                                 if len(blocks) > 3 else [])
        out.append(("units", [f"{len(blocks)} fully_shard block(s) + root:"]
                    + [f"{n}," for n in names[:-1]] + [f"{n};" for n in names[-1:]]
                    + [f"largest {biggest.name} {human_bytes(biggest.padded_bytes)}",
                       f"gathered ({human_bytes(biggest.shard_bytes)} per rank);",
                       f"root {human_bytes(root.padded_bytes)}"]))
    elif p.ddp_buckets:
        out.append(("buckets", [f"{p.ddp_buckets} DDP gradient bucket(s)"]))
    out.append(("comm", _comm(r, p.comm, brief)))
    if p.world_size_search:
        tried = ", ".join(f"{n}: {human_bytes(b)}" for n, b in p.world_size_search)
        size = p.mesh.get("dp_shard", p.world_size) if len(p.mesh) > 1 else p.world_size
        out.append(("world size", [f"auto: {size} is the smallest that fits",
                                   f"(per-rank peaks tried: {tried})"]))
    return out


def _comm(r: Report, c, brief: bool) -> list[str]:
    """The rank's communication per step: the volumes, the link's bytes (by mesh dimension),
    and with an interconnect a lower bound on their time."""
    vol = [f"{name} {human_bytes(v)}," for name, v in (
        ("all-gather", c.all_gather_bytes), ("reduce-scatter", c.reduce_scatter_bytes),
        ("all-reduce", c.all_reduce_bytes)) if v]
    if set(c.by_dim) == {"pp"}:
        return [f"{human_bytes(c.wire_bytes)} each way per rank per step: the stages'",
                f"sends and receives ({c.collectives})"]
    if not vol:
        return ["none (one rank)"]
    dims = ", ".join(f"{k} {human_bytes(v)}" for k, v in c.by_dim.items())
    if brief:   # the link's bytes (by dimension); the volumes in --details
        by_dim = f": {dims};" if len(c.by_dim) > 1 else ","
        line = [f"{human_bytes(c.wire_bytes)} each way per rank per step over the link",
                f"(ring){by_dim} {c.collectives} collectives"]
    else:
        line = vol + [f"per rank per step ({c.collectives} collectives);",
                      f"{human_bytes(c.wire_bytes)} each way over the link (ring)"]
    if c.seconds is not None and c.bandwidth is not None:  # (both come with an interconnect)
        line += [f"≥ {human_time(c.seconds)} on {c.interconnect}",
                 f"({c.bandwidth / 1e9:g} GB/s each way)"]
        if r.roofline is not None:
            line += [f"beside compute ≥ {human_time(r.roofline.total_seconds)} (roofline)"]
    if len(c.by_dim) > 1 and not brief:
        line += [f"({dims})"]
    return line




def _chunks(chunks) -> str:
    """A rank's blocks over its stages (a stage of the embedding or the head alone has none)."""
    spans = [_span_numbers(c) for c in chunks if c[1] > c[0]]
    return "blocks " + ", ".join(spans) if spans else "no block"


def _pipeline_summary(r: Report, brief: bool = False) -> list[tuple[str, list[str]]]:
    """Every stage's peak (an interleaved schedule's: every rank's), the largest last (the line
    that decides the fit); ``brief``: the peaks in one list."""
    p = r.pipeline
    assert p is not None  # (the caller's test)
    v, unit = p.stages_per_rank, "stage" if p.stages_per_rank == 1 else "rank"
    head = [f"{p.stages} stages," if v == 1 else f"{p.stages} ranks of {v} stages,",
            f"{SCHEDULE_WORDS.get(p.schedule, p.schedule)},",
            f"{p.microbatches:,} micro-batches", f"of {p.micro_batch:,}",
            f"({p.per_rank_batch:,} a step);",
            # (zero bubble fills part of interleaved 1F1B's with the weight halves)
            f"bubble {'≤ ' * zero_bubble(p.schedule)}{p.bubble:.0%}",
            "of an even pipeline"]
    gpus = p.gpus
    if gpus > p.stages:
        head[-1] += ";"
        head += [f"{gpus:,} GPUs", f"({_mesh_words(p.mesh)})"]
    if brief and p.stages > 4:   # (in the largest's unit)
        size, scale = ("GiB", 2**30) if p.peak_bytes >= 2**30 else ("MiB", 2**20)
        peaks = [f"{s.peak_bytes / scale:,.2f}" for s in p.per_stage]
        rows = [[f"peaks ({size})"] + [f"{x}," for x in peaks[:-1]] + [f"{peaks[-1]};",
                                                                      _blocks(p.per_stage, unit)]]
    else:
        rows = [[f"stage {s.stage}: {_span(s.layers)}" if not s.chunks else
                 f"rank {s.stage} ({_chunks(s.chunks)}):",
                 f"peak {human_bytes(s.peak_bytes)},", f"{s.in_flight} in flight;"]
                for s in p.per_stage]
        rows[-1][-1] = rows[-1][-1].removesuffix(";")   # (the last stage ends the line)
    worst = p.per_stage[p.worst_stage]
    held = [("rank peak", _items(worst.breakdown_at_peak))] if gpus > p.stages else []
    comm = [("comm", _comm(r, p.comm, True))] if p.comm is not None and p.comm.by_dim else []
    return [("pipeline", head), ("stages", [w for row in rows for w in row]), *held, *comm,
            ("per rank", [f"peak {human_bytes(worst.peak_bytes)} ({worst.peak_bytes:,} B) on "
                          f"{unit} {worst.stage}, the largest;",
                          f"{unit}s uneven by {p.unevenness:,.0%}"])]


def _span(layers: tuple[int, int]) -> str:
    """``blocks 0–7``, ``block 3``; ``no block`` (torchtitan's split can leave the first or
    last stage its embedding or head alone)."""
    n = layers[1] - layers[0]
    return "no block" if n < 1 else ("blocks " if n > 1 else "block ") + _span_numbers(layers)


def _span_numbers(layers: tuple[int, int]) -> str:
    first, end = layers
    return f"{first}–{end - 1}" if end - first > 1 else f"{first}"


def _blocks(stages, unit: str = "stage") -> str:
    """``16 blocks a stage (15 on stages 6–7)``: the stages' (or ranks') blocks, the most
    common first."""
    sizes = [sum(b - a for a, b in (s.chunks or (s.layers,))) for s in stages]
    common = max(set(sizes), key=sizes.count)
    rest: dict[int, list[int]] = {}
    for s, n in zip(stages, sizes):
        if n != common:
            rest.setdefault(n, []).append(s.stage)
    parts = [f"{n} on {unit}{'s' if len(at) > 1 else ''} {_runs(at)}" for n, at in rest.items()]
    text = f"{common} block{'s' if common > 1 else ''} a {unit}"
    return text + (f" ({'; '.join(parts)})" if parts else "")


def _runs(numbers: list[int]) -> str:
    """``6–7``, ``0 and 7``, ``0–2, 5 and 7``: ascending numbers as their consecutive runs
    (a stage split's first and last can hold fewer blocks than the middle, apart)."""
    runs: list[list[int]] = []
    for k in numbers:
        if runs and k == runs[-1][-1] + 1:
            runs[-1].append(k)
        else:
            runs.append([k])
    words = [f"{r[0]}–{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
