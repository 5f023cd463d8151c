"""The serving review as text: summary lines, the per-phase table, Markdown. Renders only."""
from __future__ import annotations

from ..app.report import Report
from ..app.units import human, human_bytes, human_time
from . import explain
from .table import Col, print_table


def _t(seconds) -> str:
    return human_time(seconds) if seconds is not None else "—"


def _b(n) -> str:
    """Bytes for people, with the exact count when the unit rounds it."""
    return human_bytes(n) + (f" ({n:,} B)" if n >= 1024 else "")


def _n(value) -> str:
    return f"{value:,}" if value is not None else "—"


def serving_summary(r: Report, brief: bool = False) -> list[tuple[str, list[str]]]:
    """The serving lines; ``brief``: the KV cache and the capacity without how they were
    found (the terminal's default view: analyzer/render/summary.py)."""
    s = r.serving
    if s is None:
        return []
    p, d = s.prefill, s.decode
    update = ("appended in place" if s.cache_update == "append"
              else "concatenated: the step copies the whole cache")
    tp = s.collectives.tensor_parallel if s.collectives is not None else 1
    out = [
        ("serving", [f"batch {s.batch} × (prompt {s.prompt:,} + generate {s.generate:,}",
                     f"= {s.prompt + s.generate:,} tokens);", f"weights {s.weight_dtype},",
                     f"KV cache {s.kv_dtype}" + (";" if tp > 1 else "")]
         + ([f"tensor parallel {tp}:", "each GPU's share below"] if tp > 1 else [])),
        ("KV cache", [f"{_b(s.kv_cache_bytes)} for the batch at {s.prompt + s.generate:,} "
                      "tokens;", _per_token(s) + ("" if brief else ";")]
         + ([] if brief else [f"{s.cache_tensors} cache tensors, {update}"])),
        ("weights", [_b(s.weight_bytes)]),
        ("reserved", explain.with_growth(
            [_b(s.reserved_peak_bytes), "on PyTorch's CUDA caching allocator:",
             "weights, the cache " + ("allocated whole at first," if s.cache_update == "append"
                                      else "as it grows,"),
             "the prefill, then the last decode step"], s.reserved_by_phase)),
        ("prefill", [f"{human(p.flops)} FLOPs,", f"read {human_bytes(p.bytes_read)},",
                     f"written {human_bytes(p.bytes_written)},",
                     f"working peak {human_bytes(p.peak_bytes)};"]
         + ([f"{_t(p.seconds)} ({p.bound}-bound);"] if p.seconds is not None else [])
         + [f"attention {human(p.attention_flops_dense)} FLOPs dense,",
            f"{human(p.attention_flops_causal)} with a causal mask"]),
        ("decode", [f"{human(d.flops_per_token)} FLOPs/token,",
                    f"{human_bytes(d.bytes_per_token)}/token moved,",
                    f"working peak {human_bytes(d.peak_bytes)}"
                    + (";" if d.seconds_per_token is not None else "")]
         + ([f"{_t(d.seconds_per_token)}/token ({d.bound}-bound),",
             f"{human(d.tokens_per_second) if d.tokens_per_second else '—'} tokens/s for "
             "the batch;",
             f"(weights + KV) / bandwidth = {_t(d.bandwidth_bound_seconds)}"]
            if d.seconds_per_token is not None else [])),
    ]
    if s.collectives is not None and not brief:
        out.append(("collectives", _collectives(s)))
    if s.time is not None:
        out.append(("time", _serving_time(s, brief)))
    if s.fit is not None:  # (whether this batch fits: the summary's one fits line)
        out.append(("capacity", _capacity(s, brief)))
    for w in s.what_if:
        timed = w.decode_seconds_per_token is not None
        out.append(("what-if", [f"{w.weight_dtype} weights, {w.kv_dtype} KV:",
                                f"weights {human_bytes(w.weight_bytes)},",
                                f"KV {human_bytes(w.kv_cache_bytes)}" + ("," if timed else "")]
                    + ([f"decode ≥ {_t(w.decode_seconds_per_token)}/token,",
                        f"max {_n(w.max_concurrent_sequences)} sequences"] if timed else [])))
    if s.traced_layers:
        out.append(("traced", [s.traced_layers]))
    if s.uncosted_decode_nodes:
        out.append(("warning", [f"{s.uncosted_decode_nodes} node(s) of the decode step have "
                                "no cost rule or shape (counted as 0)"]))
    return out


def _serving_time(s, brief: bool) -> list[str]:
    """TTFT and TPOT estimated, with their band and the batch's output tokens/s (brief: the
    figures alone)."""
    t = s.time
    if brief:
        return [f"≈ TTFT {human_time(t.ttft_seconds)}, TPOT {human_time(t.tpot_seconds)}"
                f" ± {t.band:.0%} (estimate);", f"{human(t.tokens_per_second)} tokens/s"]
    host = ["a decode step waits on eager PyTorch's host (CUDA graphs would cut it);"] \
        if t.host_bound else []
    engine = ("eager PyTorch" if t.engine == "eager"
              else "as vLLM runs it: compiled kernels, the decode step a CUDA graph")
    engine += f", on {t.profile}" if t.profile else ""
    comm = [f"the collectives' {human_time(t.prefill_communication_seconds)} and "
            f"{human_time(t.decode_communication_seconds)} of them;"] \
        if s.collectives is not None else []
    return [f"≈ TTFT {human_time(t.ttft_seconds)}, TPOT {human_time(t.tpot_seconds)}"
            f" ± {t.band:.0%} (estimate: {engine});", *comm, *host,
            f"{human(t.tokens_per_second)} output tokens/s for the batch"]


def _collectives(s) -> list[str]:
    """What a tensor-parallel rank all-reduces and gathers in each step."""
    c = s.collectives
    return [f"each of {c.tensor_parallel} ranks, prefill: all-reduce "
            f"{human_bytes(c.prefill_all_reduce_bytes)}, all-gather "
            f"{human_bytes(c.prefill_all_gather_bytes)} in {c.prefill_calls} calls;",
            f"decode step: all-reduce {human_bytes(c.decode_all_reduce_bytes)}, all-gather "
            f"{human_bytes(c.decode_all_gather_bytes)} in {c.decode_calls} calls"]


def _per_token(s) -> str:
    """What a token more adds to the cache per sequence: nothing once every layer's sliding
    window is full (Phi-3-mini's 2,047 tokens) or its state is fixed (a state-space model's),
    said so rather than "0 B"."""
    if s.kv_bytes_per_token == 0 and s.kv_cache_bytes > 0:
        return "no more per token (the cache no longer grows)"
    return f"{_b(s.kv_bytes_per_token)} per token per sequence"


def _capacity(s, brief: bool) -> list[str]:
    """How many sequences of this length fit, and the longest context at this batch."""
    learned = s.positions is not None and s.max_context == s.positions
    windowed = s.max_context is None and s.kv_bytes_per_token == 0 and s.kv_cache_bytes > 0
    return [f"max {_n(s.max_concurrent_sequences)} concurrent sequences of "
            f"{s.prompt + s.generate:,} tokens;",
            f"max context {_n(s.max_context)} at batch {s.batch}"
            + (" (its learned positions)" if learned else "")
            + (" (the cache no longer grows)" if windowed else "")
            + ("; estimates" if brief else
               "; estimates: this batch's allocator replay with its sizes scaled")]


def phase_rows(r: Report) -> list[list[str]]:
    s = r.serving
    assert s is not None  # a serving report's
    p, d = s.prefill, s.decode
    return [
        ["prefill", f"{p.tokens:,}", human(p.flops), human_bytes(p.bytes_read + p.bytes_written),
         human_bytes(p.peak_bytes), _t(p.seconds), p.bound or "—",
         human(p.tokens / p.seconds) if p.seconds else "—"],
        ["decode step", f"{s.batch:,}", human(d.flops_per_token * s.batch),
         human_bytes(d.bytes_per_token * s.batch), human_bytes(d.peak_bytes),
         _t(d.seconds_per_token), d.bound or "—",
         human(d.tokens_per_second) if d.tokens_per_second else "—"],
    ]


PHASE_COLUMNS = ["phase", "tokens", "FLOPs", "bytes R+W", "working peak", "time (roofline)",
                 "bound", "tokens/s"]


def render_serving_table(r: Report, console, width: int | None = None) -> None:
    if r.serving is None:
        return
    short = dict(zip(PHASE_COLUMNS[1:], ("tok", "", "R+W", "peak", "time ≥", "", "tok/s")))
    cols = [Col(PHASE_COLUMNS[0], min_width=6, priority=1)] + \
        [Col(h, numeric=True, short=short[h]) for h in PHASE_COLUMNS[1:6]] + \
        [Col("bound", min_width=6)] + [Col("tokens/s", numeric=True, short=short["tokens/s"])]
    print_table(console, "serving: prefill and one decode step", cols, phase_rows(r),
                width=width)


def serving_markdown(r: Report) -> list[str]:
    if r.serving is None:
        return []
    out = ["", "## Serving", "", "| " + " | ".join(PHASE_COLUMNS) + " |",
           "|---|" + "---:|" * 5 + "---|---:|"]
    out += ["| " + " | ".join(row) + " |" for row in phase_rows(r)]
    return out
