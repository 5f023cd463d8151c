"""``--max-batch`` against one analysis of the same model, in one run.

    python -m benchmarks.bench_max_batch [--model zoo:gpt2] [--device a10] [--no-train]

The baseline is a single ``analyze()`` of the model at batch 1 (one trace and the passes);
the measured side is the whole ``graphcost MODEL --max-batch --device D [--train]`` command
(its main(), output as JSON: traces at two batches re-bound to every other, the search, the
check trace at the answer). Each runs in a fresh process, so its time and peak RSS are its
own; the torch import is included in both and printed apart. The ratio says how many single
analyses the search costs; #13's target for the GPT-2 training case is ≤ 5 s in all.
"""
from __future__ import annotations

import argparse

from benchmarks.child import run

PRELUDE = """
import contextlib, io, json, resource, time
t0 = time.perf_counter()
import torch
t_import = time.perf_counter() - t0
"""
ONE = PRELUDE + """
from graphcost import analyze
r = analyze({model!r}, batch=1, train={train}, device={device!r}, what_if=False)
r.to_json()
print(json.dumps(dict(seconds=time.perf_counter() - t0, torch_import=t_import,
                      rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)))
"""
SEARCH = PRELUDE + """
from graphcost.analyzer.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main([{model!r}, "--max-batch", "--device", {device!r}, "--format", "json"]
              + (["--train"] if {train} else []))
doc = json.loads(out.getvalue()) if rc == 0 else {{}}
print(json.dumps(dict(seconds=time.perf_counter() - t0, torch_import=t_import, rc=rc,
                      rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      max_batch=doc.get("max_batch"), analyses=doc.get("analyses"),
                      traces=doc.get("traces"))))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="zoo:gpt2")
    ap.add_argument("--device", default="a10")
    ap.add_argument("--no-train", action="store_true", help="inference instead of a step")
    a = ap.parse_args()
    fmt = dict(model=a.model, device=a.device, train=not a.no_train)
    one, search = run(ONE.format(**fmt)), run(SEARCH.format(**fmt))
    for side, out in (("one analysis", one), ("--max-batch", search)):
        if "error" in out:
            raise SystemExit(f"{side} failed: {out['error']}")
    if search["rc"] != 0:
        raise SystemExit(f"--max-batch exited {search['rc']}")
    what = "training step" if fmt["train"] else "inference"
    print(f"{a.model} on {a.device}, {what}")
    print(f"{'':32s}{'time s':>8s}{'of which torch import':>23s}{'peak RSS MB':>13s}")
    for label, out in (("analyze() at batch 1", one), ("--max-batch (whole command)", search)):
        print(f"{label:32s}{out['seconds']:8.2f}{out['torch_import']:23.2f}{out['rss_mb']:13.0f}")
    print(f"max batch {search['max_batch']:,}: {search['analyses']} analyses, "
          f"{search['traces'] or search['analyses']} model traces")
    ratio = search["seconds"] / one["seconds"]
    bare = (search["seconds"] - search["torch_import"]) / (one["seconds"] - one["torch_import"])
    print(f"ratio --max-batch / one analysis: {ratio:.2f}x (without the torch import: "
          f"{bare:.2f}x)")
    print("target (GPT-2 training case, #13): <= 5 s: "
          + ("met" if search["seconds"] <= 5 else f"NOT met ({search['seconds']:.1f} s)"))


if __name__ == "__main__":
    main()
