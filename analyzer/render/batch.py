"""``--max-batch``'s answer (analyzer.app.batch_scaling.MaxBatch) as text, wrapped to the
terminal between values like the summary (analyzer/render/summary.py's ``wrap``)."""
from __future__ import annotations

from ..app.batch_scaling import ESTIMATE_AT
from ..app.units import human, human_bytes
from .summary import wrap


def max_batch_lines(model: str, m, width: int | None = None) -> list[str]:
    """analyzer.app.batch_scaling.MaxBatch as text; ``width``: the terminal's (None: unwrapped)."""
    f = m.fit
    what = "training step" if m.train else "inference"
    if m.checkpoint:
        what += f" under its checkpoint plan ({m.checkpoint})"
    if m.parallel:
        what += f", one rank under {m.parallel} (the batch is each rank's)"
    rows = [
        ("memory(b) =", [f"{human_bytes(f.memory.fixed)} + "
                         f"{human_bytes(f.memory.per_sample)}·b",
                         f"(what fits counts; fitted at b={f.fit_from:,},{f.fit_batch:,},",
                         f"off by {100 * f.memory_error:+.2f}% at b={f.check_batch:,})"]),
        ("FLOPs(b)  =", [f"{human(f.flops.fixed)} + {human(f.flops.per_sample)}·b",
                         f"(off by {100 * f.flops_error:+.2f}% at b={f.check_batch:,})"]),
        ("analyses", [f"{m.analyses} full analyses; every answer is checked by analyzing that "
                      "batch"] + _traces(m)) if not m.grows else
        ("analyses", [f"{m.analyses} full analyses, at b={','.join(map(str, ESTIMATE_AT))}:",
                      f"the graph grows with the batch ({m.grows[0]:,} nodes at b=2,",
                      f"{m.grows[1]:,} at b=3: Python that loops over the samples), so",
                      "larger batches are not traced and the answer is extrapolated",
                      "from the fit"]),
        _answer(m),   # the last line: the answer (issue 48)
    ]
    head = _headline([model, "on", m.device, f"({human_bytes(m.memory_bytes)}),",
                      *f"{what}:".split()], width)
    return head + [line for label, items in rows for line in wrap(label, items, width)]


def _answer(m) -> tuple[str, list[str]]:
    """The max batch line: the batch, what it needs and how far the next one is over."""
    if m.batch == 0:
        return ("max batch", ["none fits:", f"batch 1 needs {human_bytes(m.required_bytes)}"])
    if m.grows:
        return ("max batch", [f"≈ {m.batch:,}", "(ESTIMATED: needs about",
                              f"{human_bytes(m.required_bytes)}; batch {m.batch + 1:,} "
                              f"about {human_bytes(m.next_required_bytes)})"])
    if m.at_limit:
        return ("max batch", [f"at least {m.batch:,},", "the search's limit",
                              f"(needs {human_bytes(m.required_bytes)}; batch "
                              f"{m.batch + 1:,} would need "
                              f"{human_bytes(m.next_required_bytes)}, which fits too)"])
    # the two needs usually round to the device's size: the margins tell them apart
    spare = m.memory_bytes - m.required_bytes
    over = m.next_required_bytes - m.memory_bytes
    return ("max batch", [f"{m.batch:,}", f"(needs {human_bytes(m.required_bytes)},",
                          f"{human_bytes(spare)} to spare; batch {m.batch + 1:,}",
                          f"would be {human_bytes(over)} over)"])


def _headline(items: list[str], width: int | None) -> list[str]:
    """The first line, wrapped between items (a size stays with its unit), continuation
    lines indented."""
    lines = [items[0]]
    for item in items[1:]:
        if width is not None and len(lines[-1]) + 1 + len(item) > width:
            lines.append("  " + item)
        else:
            lines[-1] += " " + item
    return lines


def _traces(m) -> list[str]:
    """How the analyses got their graphs (None: each traced its own)."""
    if m.traced_at:
        return [f"(one model trace, at batch {m.traced_at:,}: its graph re-run on fake tensors "
                "at batch 2, re-bound to the other batches and re-run at the answer and one "
                "above to check)"]
    if m.traces:
        return [f"({m.traces} model traces: graphs traced at two batches and re-bound to the "
                "others, checked by traces at the answer and one above)"]
    return []
