"""The breadth sweep's tables (sweep_breadth.py): one row per model, the counts, and the
failures grouped by their message."""
from __future__ import annotations

import re
from collections import Counter, defaultdict


def verdict(rec: dict) -> str:
    if rec["skipped"]:
        return f"skipped ({rec['skipped']})"
    if not rec["analyzed"]:
        return f"{'BUG ' if rec.get('bug') else ''}failed in {rec['stage']}: {rec['error'][:100]}"
    return (f"params {'exact' if rec['params_exact'] else 'differ'}, "
            f"MACs {'within 1%' if rec['macs_ok'] else 'off'}"
            + (f", peak {rec['peak_gc'] / rec['peak_ref'] - 1:+.1%}" if rec.get("peak_ref")
               else ""))


def _ratio(rec: dict) -> str:
    ref, ours = rec.get("flops_ref", 0), rec.get("flops_gc", 0)
    if ref == 0:
        return "0 = 0" if ours == 0 else "ref 0"
    return f"{100 * (ours / ref - 1):+.1f}%"


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def _matmuls(ops: dict) -> dict:
    return {op: n for op, n in ops.items()
            if any(k in op for k in ("mm", "conv", "linear", "matmul", "einsum"))}


def _group(rec: dict) -> str:
    msg = rec["skipped"] or f"{rec['stage']}: {rec['error']}"
    return re.sub(r"\d+", "#", msg)[:80]


def print_table(records: list[dict], title: str, wall: float) -> None:
    from .sweep_training import peak_cell, peak_counts, print_peak_misses
    train = any("peak_ref" in r or "peak_error" in r for r in records)
    print(f"\n## {title}\n")
    print("| name | model | analyzed | params gc / module | 2·MACs vs FlopCounterMode | "
          + ("peak vs MemTracker | " if train else "") + "s | failure |")
    print("|---|---|---|---|---|" + ("---|" if train else "") + "---:|---|")
    for rec in records:
        if rec["analyzed"]:
            params = ("exact " if rec["params_exact"] else "DIFFER ") + \
                f"{rec['params_gc']:,} / {rec['params_module']:,}"
            macs = ("ok " if rec["macs_ok"] else "OFF ") + _ratio(rec)
        else:
            params = macs = ""
        failure = rec["skipped"] and f"skipped: {rec['skipped']}" or \
            (f"{'BUG ' if rec.get('bug') else ''}{rec['stage']}: {rec['error']}"
             if rec["stage"] else "")
        name = rec["name"] if rec.get("family", rec["name"]) == rec["name"] else \
            f"{rec['family']}: {rec['name']}"
        print(f"| {name} | {rec.get('model', '')} | "
              f"{'yes' if rec['analyzed'] else 'no'} | {params} | {macs} | "
              + (f"{peak_cell(rec)} | " if train else "") +
              f"{rec.get('seconds', 0):.1f} | {_cell(failure[:160])} |")
    n = len(records)
    count = Counter()
    for rec in records:
        for key in ("constructed", "ran", "analyzed", "params_exact", "macs_ok"):
            count[key] += bool(rec[key])
        count["skipped"] += bool(rec["skipped"])
    analyzed = count["analyzed"]
    print(f"\n{title}: {n} models, wall {wall:.0f} s\n")
    print("| count | models |")
    print("|---|---:|")
    print(f"| skipped (not applicable) | {count['skipped']} |")
    print(f"| constructed (model and inputs built) | {count['constructed']} |")
    print(f"| reference forward ran (FlopCounterMode) | {count['ran']} |")
    print(f"| analyzed by graphcost | {analyzed} of {count['ran']} |")
    print(f"| params exact | {count['params_exact']} of {analyzed} |")
    print(f"| 2·MACs within 1% of FlopCounterMode | {count['macs_ok']} of {analyzed} |")
    for label, value in peak_counts(records) if train else ():
        print(f"| {label} | {value} |")
    print(f"| graphcost bugs (not a one-line GraphcostError) | "
          f"{sum(bool(r.get('bug')) for r in records)} |")
    for label, keep in (("Skipped", lambda r: r["skipped"]),
                        ("Failures", lambda r: not r["skipped"] and not r["analyzed"]),
                        ("Analyzed, params not exact", lambda r: r["analyzed"]
                         and not r["params_exact"]),
                        ("Analyzed, MACs off by more than 1%", lambda r: r["analyzed"]
                         and not r["macs_ok"])):
        chosen = [r for r in records if keep(r)]
        if not chosen:
            continue
        print(f"\n{label} ({len(chosen)}):\n")
        if label.startswith("Analyzed"):
            for r in chosen:
                print(f"* {r['name']}: params {r['params_gc']:,} / {r['params_module']:,}, "
                      f"2·MACs {r['flops_gc']:,} vs {r['flops_ref']:,} ({_ratio(r)}), "
                      f"coverage {r.get('coverage', 0)}%"
                      + (f", unsupported {r['unsupported']}" if r.get("unsupported") else "")
                      + (f", upper bounds (data-dependent sizes): {_matmuls(r['bounded'])}"
                         if _matmuls(r.get("bounded") or {}) else ""))
            continue
        groups: dict[str, list[str]] = defaultdict(list)
        for r in chosen:
            groups[_group(r)].append(r["name"] + (" (BUG)" if r.get("bug") else ""))
        print("| count | message (first 80 chars, digits as #) | e.g. |")
        print("|---:|---|---|")
        for msg, names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            print(f"| {len(names)} | {_cell(msg)} | {', '.join(names[:3])} |")
    if train:
        print_peak_misses(records)
