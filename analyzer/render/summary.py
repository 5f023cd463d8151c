"""The summary of a Report: label + items, each mode leading with its own answer, the lines
wrapped to a width only between items, never inside a number (the terminal view's last part:
analyzer/render/terminal.py; the Markdown file's and the HTML's too). Rendering never
computes costs.
"""
from __future__ import annotations

from ..app.report import Report
from ..app.units import human, human_bytes, human_time
from . import explain
from .parallel import parallel_summary
from .serving import serving_summary

LABEL = 12           # the summary's label column


def summary(r: Report) -> list[tuple[str, list[str]]]:
    """The summary as (label, items): each item is one unbreakable phrase. Each mode leads
    with its own answer (issue 26): a serving review with the batch (``_serving_first``), a
    training step — and a data-parallel rank — with the step, then the device's fit; the
    graph's counts and memory after."""
    dims = ", ".join(f"{k}={v}" for k, v in r.dims.items())
    head = [("model", [f"{r.model} ({r.source}),", f"batch {r.batch}" + ("," if dims else "")]
             + ([f"dims {dims}"] if dims else []))]
    tail = ([("traced", [r.traced_layers])] if r.traced_layers else []) + \
        [("warning", [w]) for w in r.warnings]
    counts, memory, moe = _counts(r), _memory(r), _moe(r)
    if r.serving is not None:
        return _serving_first(head + counts + memory + moe + serving_summary(r)
                              + _roofline_summary(r) + tail)
    if r.training is not None:
        return head + _training_summary(r) + parallel_summary(r) + _roofline_summary(r) \
            + _attention_summary(r) + counts + memory + moe + tail
    return head + counts + memory + moe + _attention_summary(r) + _roofline_summary(r) + tail


def _counts(r: Report) -> list[tuple[str, list[str]]]:
    """Parameters, MACs, FLOPs, bytes moved, and what was not costed or only bounded."""
    t, c = r.totals, r.coverage
    out: list[tuple[str, list[str]]] = [
        ("params", [f"{t.params:,} ({human_bytes(t.param_bytes)})"]
         + ([f"+ buffers {t.buffers:,} ({human_bytes(t.buffer_bytes)})"] if t.buffers else [])),
        ("MACs", [f"{t.macs:,} ({human(t.macs)})"]),
        ("FLOPs", [f"{t.flops:,} ({human(t.flops)})", "[2·MACs + other arithmetic]"]),
        ("bytes", [f"read {human_bytes(t.bytes_read)},",
                   f"written {human_bytes(t.bytes_written)}"]),
        ("coverage", [f"{c.covered}/{c.nodes} nodes costed ({c.percent:.1f}%)"]),
    ]
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
    if t.quant_meta:
        out.append(("quant meta", [f"{t.quant_meta:,} scales/zero points "
                                   f"({human_bytes(t.quant_meta_bytes)}), not in params"]))
    return out


def _memory(r: Report) -> list[tuple[str, list[str]]]:
    """The activation peak, the arena, the reserved replay (inference), the live tensors and
    the one peak."""
    m = r.memory
    out = [("activations", [
        f"peak {human_bytes(m.peak_bytes)} ({m.peak_bytes:,} B)",
        f"at {m.peak_node} (#{m.peak_node_index});",
        f"naive sum {human_bytes(m.naive_sum_bytes)}", f"({explain.activations_includes(r)})"])]
    if m.arena_bytes is not None:
        out.append(("arena", [f"{human_bytes(m.arena_bytes)} ({m.arena_bytes:,} B, greedy by "
                              f"size; fragmentation {100 * m.fragmentation:.1f}%)"]))
    if m.reserved_peak_bytes is not None and r.serving is None:  # (serving: its own line)
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
    out.append(("peak", [f"{human_bytes(r.peak_bytes)} ({r.peak_bytes:,} B)",
                         f"= {explain.peak_includes(r)}"]))
    return out


def _moe(r: Report) -> list[tuple[str, list[str]]]:
    if r.moe is None:
        return []
    e, first = r.moe, r.moe.layers[0]
    return [("experts", [f"{len(e.layers)} MoE layer(s), top-{first.top_k} of "
                         f"{first.experts}:", f"params {e.active_params:,} active per token "
                         f"of {e.total_params:,};", f"FLOPs per token {human(e.flops_per_token)}",
                         f"(all experts: {human(e.dense_flops_per_token)});",
                         f"rows per expert ≈ {first.rows_per_expert_estimate:g} balanced "
                         "(ESTIMATE),", f"≤ {first.rows_per_expert_bound:,} (BOUND)"])]


# A serving review answers first (issue 24): what the batch holds, how fast it runs, how many
# sequences fit and whether it fits; then the prefill graph's counts. The prefill's own
# activation peak, arena, live tensors and roofline total describe one inference of it, which
# the serving lines already price (its working peak, its time): left out there.
SERVING_FIRST = ("model", "serving", "KV cache", "weights", "reserved", "prefill", "decode",
                 "capacity", "device", "fits", "", "what-if")
SERVING_LEFT_OUT = frozenset({"activations", "arena", "live", "peak", "roofline", "bytes"})


def _serving_first(out: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    first = [item for label in SERVING_FIRST for item in out if item[0] == label]
    return first + [item for item in out
                    if item[0] not in SERVING_FIRST and item[0] not in SERVING_LEFT_OUT]


def _bounds_summary(r: Report) -> list[tuple[str, list[str]]]:
    """The sizes the data decides: the totals at their lower ends, then each size's range,
    the node that makes it, what declares its maximum and the flag that sets it."""
    b = r.bounds
    if b is None:
        return []
    out = [("sizes", ["data-dependent: MACs, FLOPs, bytes and memory above are upper bounds;",
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


def _training_summary(r: Report) -> list[tuple[str, list[str]]]:
    t = r.training
    if t is None:
        return []
    where = f"{t.peak_phase}" + (f" at {t.peak_node}" if t.peak_node else " step")
    first = explain.first_step(r)
    out = [("training", [f"optimizer {t.optimizer}" + _impl(r) + ":",
                         f"step peak {human_bytes(t.peak_bytes)} "
                         f"({t.peak_bytes:,} B) in {where}",
                         "(steady state)" + (";" if first else "")]
            + ([first] if first else [])),
           ("at peak", [f"{k.replace('_', ' ')} {human_bytes(v)},"
                        for k, v in t.breakdown_at_peak.items() if v])]
    if t.frozen_param_bytes:  # (as eager: no .grad, so no optimizer state either)
        out.append(("no grad", [f"{human_bytes(t.frozen_param_bytes)} of the parameters",
                                "(requires_grad=False,", "or no gradient reaches them):",
                                "no gradient,", "no optimizer state"]))
    if t.reserved_peak_bytes is not None:
        items = [f"{human_bytes(t.reserved_peak_bytes)}", f"({t.reserved_peak_bytes:,} B)",
                 "on PyTorch's CUDA caching", "allocator, two steps",
                 f"({_settings(r)}its rounding and segments"
                 + ("; cuBLAS workspaces, kernel temporaries included" if r.roofline else "")
                 + ")"]
        out.append(("reserved", explain.with_growth(items, t.reserved_by_phase)))
    out += [("what-if", [explain.what_if_line(r, name)]) for name in t.what_if]
    ck = t.checkpoint
    if ck is not None:
        note = explain.checkpoint_note(r)
        out += [("checkpoint", [f"{ck.mode}:", ", ".join(ck.segments) or "none needed"]),
                ("", [f"peak {human_bytes(ck.peak_without_bytes)} → {human_bytes(ck.peak_bytes)}",
                      f"({ck.peak_without_bytes:,} → {ck.peak_bytes:,} B)",
                      f"recompute {human(ck.recompute_flops)} FLOPs "
                      f"({ck.recompute_pct:.1f}% of the step)"]
                 + ([f"budget {human_bytes(ck.budget_bytes)}"] if ck.budget_bytes else [])
                 + ([f"— {note}"] if note else []))]
    return out


def _attention_summary(r: Report) -> list[tuple[str, list[str]]]:
    """One line per kernel the step's attention runs: which, how many calls, for what
    target, and why PyTorch's first choices were passed over."""
    return [("attention", [f"{u.kernel} kernel ×{u.calls}", f"(as PyTorch dispatches on "
                           f"{u.target})" + (";" if u.reason else "")]
             + ([u.reason] if u.reason else [])) for u in r.attention]


def _settings(r: Report) -> str:
    return f"{r.allocator}; " if r.allocator else ""


def fit_words(f) -> list[str]:
    """The one fits line (passes/fits.py's Fit): the answer, needs against offers with the
    margin, then the parts it adds up."""
    margin = f"{human_bytes(abs(f.margin))} {'to spare' if f.fits else 'short'}"
    parts = " + ".join(f"{p.what} {human_bytes(p.bytes)}" for p in f.parts)
    return [f"{'yes' if f.fits else 'NO'}: needs {human_bytes(f.needs)} of",
            f"{human_bytes(f.offers)} ({margin}) =", parts]


def _roofline_summary(r: Report) -> list[tuple[str, list[str]]]:
    ro = r.roofline
    if ro is None:
        return []
    rate = ro.peak_flops["tf32" if ro.tf32 and ro.peak_flops.get("tf32") else "fp32"] or 0
    out = [
        ("device", [f"{ro.label}:", f"{rate / 1e12:.1f} TFLOP/s {'tf32' if ro.tf32 else 'fp32'}",
                    f"{ro.bandwidth / 1e9:,.0f} GB/s", human_bytes(ro.memory_bytes)]),
        ("roofline", [f"{human_time(ro.total_seconds)} lower bound",
                      f"(compute-bound nodes {human_time(ro.compute_seconds)},",
                      f"memory-bound {human_time(ro.memory_seconds)});",
                      "max(FLOPs/peak, bytes/bandwidth) per node — not a benchmark"]),
        ("fits", fit_words(ro.fit)),
    ]
    if ro.fallbacks:
        out.append(("", [f"no fast path for {', '.join(ro.fallbacks)} on {ro.device}:",
                         "those nodes use the fp32 rate"]))
    return out


_UNITS = frozenset({"B", "KiB", "MiB", "GiB", "TiB", "s", "ms", "µs", "ns", "FLOPs",
                    "TFLOP/s", "GB/s", "→"})


def _pieces(item: str, room: int) -> list[str]:
    """An item that fits ``room`` whole, else its words — a number kept with its unit and
    with an arrow, so that no value is ever split across lines."""
    if len(item) <= room:
        return [item]
    out: list[str] = []
    for word in item.split(" "):
        if out and (word in _UNITS or out[-1].endswith("→")):
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


def summary_lines(r: Report, width: int | None = None) -> list[str]:
    return [line for label, items in summary(r) for line in wrap(label, items, width)]

