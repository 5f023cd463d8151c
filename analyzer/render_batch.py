"""``--max-batch``'s answer (analyzer.batch_scaling.MaxBatch) as text."""
from __future__ import annotations

from graphcost.analyzer.units import human, human_bytes


def max_batch_lines(model: str, m) -> list[str]:
    """analyzer.batch_scaling.MaxBatch as text."""
    f = m.fit
    what = "training step" if m.train else "inference"
    if m.parallel:
        what += f", one rank under {m.parallel} (the batch is each rank's)"
    lines = [f"{model} on {m.device} ({human_bytes(m.memory_bytes)}), {what}:"]
    if m.batch == 0:
        lines.append(f"  nothing fits: batch 1 needs {human_bytes(m.required_bytes)}")
    else:
        lines.append(f"  max batch   {m.batch:,} (needs {human_bytes(m.required_bytes)}; batch "
                     f"{m.batch + 1:,} would need {human_bytes(m.next_required_bytes)})")
    lines += [
        f"  memory(b) = {human_bytes(f.memory.fixed)} + {human_bytes(f.memory.per_sample)}·b "
        f"(peak with overhead; fitted at b=1,2, off by {100 * f.memory_error:+.2f}% at "
        f"b={f.check_batch:,})",
        f"  FLOPs(b)  = {human(f.flops.fixed)} + {human(f.flops.per_sample)}·b "
        f"(off by {100 * f.flops_error:+.2f}% at b={f.check_batch:,})",
        f"  {m.analyses} full analyses; every answer is checked by analyzing that batch"
        + (f" ({m.traces} model traces: graphs traced at two batches and re-bound to the "
           "others, checked by a trace at the answer)" if m.traces else ""),
    ]
    return lines
