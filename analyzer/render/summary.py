"""The summary of a Report: label + items, context first and each mode's answer last, so that
every view ends on the line that decides (issue 48): inference on its peak, a training step on
its step peak, a data-parallel run on one rank's peak, a serving batch on its capacity, and
with a device on whether it fits ("fits" is then the last line, what it adds up just above).
The lines are wrapped to a width only between items, never inside a number (the terminal
view's last part: analyzer/render/terminal.py; the Markdown file's too). Rendering never
computes costs.

``brief``: the answer alone, the terminal's default view of a question beyond "what does it
cost" (--train, --device, --parallel, --serve): the counts as one line, no activation detail,
the attention kernels without why PyTorch passed over others, one what-if (the one that saves
the most), and under a strategy no one-device step: one screen at 80×24 for the common
questions. The full summary (``--details``, the Markdown file) holds every line.
"""
from __future__ import annotations

from ..app.pipeline import ARENA_WARNING
from ..app.report import Report
from ..app.units import human, human_bytes
from . import explain
from .checkpoint_line import checkpoint_entries
from .device_lines import counted_per, device_entries, fit_entries
from .parallel import parallel_summary
from .serving import serving_summary
from .time_line import time_entries

LABEL = 12           # the summary's label column
Entry = tuple[str, list[str]]


def summary(r: Report, brief: bool = False) -> list[Entry]:
    """The summary as (label, items): each item is one unbreakable phrase. The context
    (model, traced layers, warnings) first, then the detail, then the device and its time,
    then the mode's answer, and with a device the fit last."""
    if r.serving is not None:
        body, answer = _serving(r, brief)
    elif r.training is not None:
        body, answer = _training(r, brief)
    else:
        body, answer = _inference(r, brief)
    return _context(r, brief) + body + device_entries(r, brief) + time_entries(r, brief) \
        + answer + fit_entries(r, brief)


def summary_lines(r: Report, width: int | None = None, brief: bool = False) -> list[str]:
    return [line for label, items in summary(r, brief) for line in wrap(label, items, width)]


def _context(r: Report, brief: bool) -> list[Entry]:
    """The model, the layers traced, the warnings (brief serving: the model alone, the serving
    line says the batch and the tokens)."""
    dims = ", ".join(f"{k}={v}" for k, v in r.dims.items())
    s = r.serving
    traced = dict.fromkeys(t for t in (r.traced_layers, s.traced_layers if s else "") if t)
    out = [("model", [f"{r.model} ({r.source})"] if brief and s is not None else
            [f"{r.model} ({r.source}),", ("micro-batch" if r.pipeline else "batch")
             + f" {r.batch}" + ("," if dims else "")]
            + ([f"dims {dims}"] if dims else []))]
    out += _stand_in(r.model)
    # (brief: what the layers are is in the note's first clause; --details says it whole)
    out += [("traced", [t.removesuffix(" (identical blocks)") if brief else t])
            for t in traced]
    # (a serving review leaves the prefill's arena out: and what is said of it)
    out += [("warning", [w]) for w in r.warnings
            if s is None or not w.startswith(ARENA_WARNING)]
    if s is not None and s.uncosted_decode_nodes:
        out.append(("warning", [f"{s.uncosted_decode_nodes} node(s) of the decode step have "
                                "no cost rule or shape (counted as 0)"]))
    return out


def _stand_in(model: str) -> list[Entry]:
    """A zoo miniature named after a published model says so (zoo:gpt2 is not GPT-2 small;
    its ONNX export stores the tied head twice, so it counts more parameters than its
    PyTorch module does)."""
    if not model.startswith("zoo:"):
        return []  # (before the import: the registry imports torch, ~1.2 s a run)
    from ...models_zoo import registry

    spec = registry.MODELS.get(model.removeprefix("zoo:"))
    if spec is None or spec.stand_in is None:
        return []
    return [("stand-in", [f"a {spec.description.split(':')[0]} (zoo), not {spec.stand_in}"])]


def _inference(r: Report, brief: bool) -> tuple[list[Entry], list[Entry]]:
    body = _coverage(r, brief) + _memory(r, brief) + _moe(r) \
        + ([] if brief else _attention_summary(r)) + _counts(r, brief)
    m = r.memory
    # (what the activation peak includes is on its own line)
    peak = [f"{human_bytes(r.peak_bytes)} ({r.peak_bytes:,} B)",
            "= parameters + buffers + activation peak"
            + (f" (at {m.peak_node})" if brief and m.peak_node else "")]
    return body, [("peak", peak)]


def _training(r: Report, brief: bool) -> tuple[list[Entry], list[Entry]]:
    t = r.training
    assert t is not None  # a training report's
    body = _counts(r, brief) + _coverage(r, brief) + _memory(r, brief) + _moe(r) \
        + _attention_summary(r, brief) + _training_detail(r, brief)
    parallel = parallel_summary(r, brief)
    if parallel:  # one rank's figures decide: the one device's step is detail
        keep = BRIEF_PARALLEL if brief else {label for label, _ in parallel}
        return (body + [e for e in parallel if e[0] != "per rank" and e[0] in keep],
                [e for e in parallel if e[0] == "per rank"])
    return body, [_step_peak(t)]


def _step_peak(t) -> Entry:
    """The step's peak; under a checkpoint plan that lowers it, the plan's (the one the fit
    prices), with the step's own beside it."""
    ck = t.checkpoint
    if ck is None or not ck.segments or ck.peak_bytes == ck.peak_without_bytes:
        return ("step peak", [f"{human_bytes(t.peak_bytes)} ({t.peak_bytes:,} B)",
                              f"in {_where(t)}", "(steady state)"])
    return ("step peak", [f"{human_bytes(ck.peak_bytes)} ({ck.peak_bytes:,} B)",
                          "with the checkpoint plan,", f"in {_where(ck.checkpointed)}",
                          f"(steady state; without it {human_bytes(t.peak_bytes)})"])


def _where(t) -> str:
    """Where a step peaks: its phase and node."""
    return f"{t.peak_phase}" + (f" at {t.peak_node}" if t.peak_node else " step")


# the data-parallel lines a brief view keeps: the strategy, what a rank holds at its peak,
# what it sends, what is offloaded, and the world size searched ("per rank" ends the view)
BRIEF_PARALLEL = frozenset({"parallel", "rank peak", "host", "comm", "world size", "pipeline",
                            "stages"})


def _serving(r: Report, brief: bool) -> tuple[list[Entry], list[Entry]]:
    """A serving review: what the batch holds, how fast it runs, and as its answer how many
    sequences fit (with a device) or what the caching allocator reserves (without). The
    prefill graph's own activation peak, arena, live tensors and roofline total describe one
    inference of it, which the serving lines already price: left out."""
    s = r.serving
    assert s is not None  # a serving report's
    lines = dict(serving_summary(r, brief))
    counts = [] if brief else [e for e in _counts(r, brief) if e[0] != "bytes"]
    body = counts + _coverage(r, brief) + _moe(r, serving=True) + [
        (label, lines[label]) for label in ("serving", "KV cache", "weights", "reserved",
                                            "prefill", "decode", "collectives", "time")
        if label in lines
        and not (brief and label in ("prefill", "decode"))  # (the phase table has them)
        and not (brief and label == "reserved" and s.fit is not None)]  # (the fit shows it)
    what_if = [e for e in serving_summary(r, brief) if e[0] == "what-if"]
    if brief and what_if:  # the one that serves the most sequences, then the fastest
        best = max(range(len(s.what_if)), key=lambda i: (
            s.what_if[i].max_concurrent_sequences or 0,
            -(s.what_if[i].decode_seconds_per_token or 0)))
        what_if = [what_if[best]]
    body += what_if
    if "capacity" in lines:
        return body, [("capacity", lines["capacity"])]
    return [e for e in body if e[0] != "reserved"], [("reserved", lines["reserved"])]


def _counts(r: Report, brief: bool) -> list[Entry]:
    """Parameters (and buffers), MACs, FLOPs and bytes moved; brief: parameters and FLOPs
    on one line."""
    t = r.totals
    # a tensor- or expert-parallel rank's program holds its shards of the weights (its slice
    # of the experts): its counts are the rank's
    mesh = r.parallel.mesh if r.parallel is not None else \
        r.pipeline.mesh if r.pipeline is not None else {}
    sharded = " × ".join(d for d in ("tp", "ep") if mesh.get(d, 1) > 1)
    rank = f" on each {sharded} rank" if sharded else ""
    params = [f"{t.params:,} ({human_bytes(t.param_bytes)}){rank}"]
    if brief:  # (the buffers are in the breakdown at the peak)
        return [("params", [params[0] + ";", f"FLOPs {human(t.flops)}{counted_per(r)}"])]
    params += [f"+ buffers {t.buffers:,} ({human_bytes(t.buffer_bytes)})"] if t.buffers else []
    return [("params", params), ("MACs", [f"{t.macs:,} ({human(t.macs)})"]),
            ("FLOPs", [f"{t.flops:,} ({human(t.flops)})", "[2·MACs + other arithmetic]"]),
            ("bytes", [f"read {human_bytes(t.bytes_read)},",
                       f"written {human_bytes(t.bytes_written)}"])]


def _coverage(r: Report, brief: bool) -> list[Entry]:
    """What was costed, what was not or only at a bound, and the sizes the data decides
    (brief: the coverage line only when some node was not costed)."""
    t, c = r.totals, r.coverage
    out: list[Entry] = []
    if not brief or c.covered < c.nodes:
        out.append(("coverage", [f"{c.covered}/{c.nodes} nodes costed ({c.percent:.1f}%)"]))
    if c.unsupported:
        out.append(("unsupported", [f"{k}×{v}" for k, v in c.unsupported.items()]
                    + ["(counted as 0 — not costed)"]))
    if c.unknown_shape:
        out.append(("no shape", [f"{k}×{v}" for k, v in c.unknown_shape.items()]
                    + ["(shapes unknown — not costed)"]))
    if c.bounded:
        out.append(("bound", [f"{sum(c.bounded.values())} node(s) costed at an upper bound:"]
                    + [f"{k}×{v}" for k, v in c.bounded.items()]
                    + ["(data-dependent sizes or worst-case counts; see each node's bound)"]))
    out += _bounds_summary(r)
    if t.quant_meta and not brief:
        out.append(("quant meta", [f"{t.quant_meta:,} scales/zero points "
                                   f"({human_bytes(t.quant_meta_bytes)}), not in params"]))
    return out


def _memory(r: Report, brief: bool) -> list[Entry]:
    """The activation peak, the arena, the reserved replay (inference) and the live tensors
    (brief: none of them; the peak line names the node, the fit the reserved bytes)."""
    m = r.memory
    if brief:  # (the peak line names the node)
        return []
    out = [("activations", [
        f"peak {human_bytes(m.peak_bytes)} ({m.peak_bytes:,} B)",
        f"at {m.peak_node} (#{m.peak_node_index});",
        f"naive sum {human_bytes(m.naive_sum_bytes)}", f"({explain.activations_includes(r)})"])]
    if m.arena_bytes is not None:
        out.append(("arena", [f"{human_bytes(m.arena_bytes)} ({m.arena_bytes:,} B, greedy by "
                              f"size; fragmentation {100 * m.fragmentation:.1f}%)"]))
    if m.reserved_peak_bytes is not None and r.training is None:
        items = [f"{human_bytes(m.reserved_peak_bytes)}", f"({m.reserved_peak_bytes:,} B)",
                 "on PyTorch's CUDA caching", "allocator, two batches",
                 f"({_settings(r)}its rounding and", "segments; parameters"
                 + (", cuBLAS workspace, kernel temporaries" if r.roofline else ""),
                 "included)"]
        out.append(("reserved", explain.with_growth(items, m.reserved_by_phase)))
    if m.live_at_peak:
        more = len(m.live_at_peak) - 5
        out.append(("live", ["at the peak:"] + [f"{x.name} {human_bytes(x.bytes)},"
                                                 for x in m.live_at_peak[:5]]
                    + ([f"(+{more} more)"] if more > 0 else [])))
    return out


def _moe(r: Report, serving: bool = False) -> list[Entry]:
    """The mixture's layers and what a token runs of them; ``serving``: the parameters alone
    (the phase table has the FLOPs; --details the rows an expert takes)."""
    if r.moe is None:
        return []
    e, first = r.moe, r.moe.layers[0]
    params = [f"{len(e.layers)} MoE layer(s), top-{first.top_k} of {first.experts}:",
              f"params {e.active_params:,} active per token of {e.total_params:,}"]
    if serving:
        return [("experts", params)]
    return [("experts", [*params[:-1], params[-1] + ";",
                         f"FLOPs per token {human(e.flops_per_token)}",
                         f"(all experts: {human(e.dense_flops_per_token)});",
                         f"rows per expert ≈ {first.rows_per_expert_estimate:g} balanced "
                         "(ESTIMATE),", f"≤ {first.rows_per_expert_bound:,} (BOUND)"])]


def _bounds_summary(r: Report) -> list[Entry]:
    """The sizes the data decides: the totals at their lower ends, then each size's range,
    the node that makes it, what declares its maximum and the flag that sets it."""
    b = r.bounds
    if b is None:
        return []
    out = [("sizes", ["data-dependent: MACs, FLOPs, bytes and memory are upper bounds;",
                      "at the lower bounds", f"MACs {human(b.lower_macs)},",
                      f"FLOPs {human(b.lower_flops)},",
                      f"activation peak {human_bytes(b.lower_activation_peak)}"])]
    for s in b.sizes:
        if s.upper is None:
            out.append(("", [f"{s.symbol} ≥ {s.lower}: from {s.origin};", "no upper bound",
                             f"(--dim {s.symbol}=MAX sets one)"]))
        else:
            out.append(("", [f"{s.symbol} ∈ [{s.lower}, {s.upper}] at {s.upper}:",
                             f"from {s.origin};", f"max: {s.source}" + (";" if s.capped else "")]
                        + ([f"capped by the model: {', '.join(s.capped)}"] if s.capped else [])
                        + [f"(--dim {s.symbol}=N lowers it)"]))
    return out


def _impl(r: Report) -> str:
    """Which implementation the step's temporaries are of, where it matters (an adaptive
    optimizer's): the device decides PyTorch's default, so a report with one says so."""
    t = r.training
    if t is None or not t.step_temp_bytes:
        return ""
    where = "a GPU" if t.optimizer_impl == "foreach" else "a CPU"
    return (f" ({t.optimizer_impl} step: PyTorch's default with the parameters on {where})")


def _training_detail(r: Report, brief: bool) -> list[Entry]:
    """The step's optimizer, what it holds at its peak, the reserved replay, the what-ifs
    and the checkpoint plan. Under a strategy the one device's step is detail: in the brief
    view left out (the rank's line names it), in the full one under "one device"."""
    t = r.training
    assert t is not None  # a training report's
    one_device = r.parallel is not None or r.pipeline is not None
    first = explain.first_step(r)
    run = t.run
    breakdown = [f"{k.replace('_', ' ')} {human_bytes(v)},"
                 for k, v in run.breakdown_at_peak.items() if v]
    out: list[Entry] = []
    if not (brief and one_device):
        out.append(("training", [f"optimizer {t.optimizer}" + _impl(r) + (";" if first else "")]
                    + ([first] if first else [])))
    if t.loss and not (brief and t.loss.startswith("the sum")):  # (an LM's decides the peak)
        out.append(("loss", t.loss.split(" ")))
    if not one_device:
        out.append(("at peak", breakdown))
    elif not brief:
        out.append(("one device", [f"step peak {human_bytes(run.peak_bytes)} "
                                   f"({run.peak_bytes:,} B) in {_where(run)} (steady state):"]
                    + breakdown))
    if t.frozen_param_bytes:  # (as eager: no .grad, so no optimizer state either)
        out.append(("no grad", [f"{human_bytes(t.frozen_param_bytes)} of the parameters",
                                "(requires_grad=False,", "or no gradient reaches them):",
                                "no gradient,", "no optimizer state"]))
    if t.reserved_peak_bytes is not None and not (brief and (r.roofline or one_device)):
        items = [f"{human_bytes(t.reserved_peak_bytes)}", f"({t.reserved_peak_bytes:,} B)",
                 "on PyTorch's CUDA caching", "allocator, two steps",
                 f"({_settings(r)}its rounding and segments"
                 + ("; cuBLAS workspaces, kernel temporaries included" if r.roofline else "")
                 + ")"]
        out.append(("reserved", items if brief
                    else explain.with_growth(items, t.reserved_by_phase)))
    out += [("what-if", [explain.what_if_line(r, name)]) for name in _what_ifs(r, brief)]
    return out + checkpoint_entries(r, brief)


def _what_ifs(r: Report, brief: bool) -> list[str]:
    """Every what-if; brief: the one that lowers the one-device peak the most, if any does
    (none under a strategy, whose rank they do not price)."""
    t = r.training
    assert t is not None  # a training report's
    if not brief:
        return list(t.what_if)
    savers = [n for n in t.what_if if t.what_if[n].peak_bytes < t.peak_bytes]
    if r.parallel is not None or not savers:
        return []
    return [min(savers, key=lambda n: t.what_if[n].peak_bytes)]


def _attention_summary(r: Report, brief: bool = False) -> list[Entry]:
    """One line per kernel the step's attention runs: which, how many calls, for what
    target, and (not brief) why PyTorch's first choices were passed over. Brief: in words
    short enough for one 80-column line (a 7B step in bf16 on an H100's took two)."""
    how = "dispatched on" if brief else "as PyTorch dispatches on"
    return [("attention", [f"{u.kernel} kernel ×{u.calls}", f"({how} "
                           f"{u.target})" + (";" if u.reason and not brief else "")]
             + ([u.reason] if u.reason and not brief else [])) for u in r.attention]


def _settings(r: Report) -> str:
    return f"{r.allocator}; " if r.allocator else ""


_UNITS = frozenset({"B", "KiB", "MiB", "GiB", "TiB", "s", "ms", "µs", "ns", "FLOPs",
                    "TFLOP/s", "GB/s", "→"})


def _pieces(item: str, room: int) -> list[str]:
    """An item that fits ``room`` whole, else its words — a number kept with its unit and
    with an arrow, so that no value is ever split across lines."""
    if len(item) <= room:
        return [item]
    out: list[str] = []
    for word in item.split(" "):
        if out and (word.rstrip(").,;:") in _UNITS or out[-1].endswith("→")):
            out[-1] += " " + word
        else:
            out.append(word)
    return out


def wrap(label: str, items: list[str], width: int | None) -> list[str]:
    """``label`` then ``items`` joined by spaces, wrapped between items (or between the words
    of an item longer than a line, never inside a number)."""
    lines, line = [], label.ljust(LABEL - 1) + " "
    fresh = True
    room = None if width is None else max(20, width - LABEL)
    pieces = [p for item in items for p in (_pieces(item, room) if room else [item])]
    for piece in pieces:
        if not fresh and width is not None and len(line) + 1 + len(piece) > width:
            lines.append(line.rstrip())
            line, fresh = " " * LABEL, True
        line += ("" if fresh else " ") + piece
        fresh = False
    lines.append(line.rstrip().rstrip(","))
    return lines
