"""``--max-batch`` against one analysis of the same model, both as whole commands.

    python -m benchmarks.bench_max_batch [--model zoo:gpt2] [--device a10] [--no-train]
                                         [--repeat 2]

The baseline is ``graphcost MODEL --batch 1 --device D [--train]`` (one trace, the passes, the
table); the measured side is ``graphcost MODEL --max-batch --device D [--train]`` (one trace
at a marker batch, re-runs on fake tensors, about twenty re-bound analyses). Each is timed as
a user waits for it: a fresh process from start to exit (interpreter start, the torch import,
exit included), best of ``--repeat``. The ratio says how many single analyses the search
costs; #13's target for the GPT-2 training case is ≤ 5 s in all.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _timed(argv: list[str], repeat: int) -> tuple[float, str]:
    best, out = float("inf"), ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "graphcost", *argv], capture_output=True,
                           text=True)
        seconds = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"graphcost {' '.join(argv)} exited {p.returncode}: "
                             f"{p.stderr.strip().splitlines()[-1:]}")
        best, out = min(best, seconds), p.stdout
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="zoo:gpt2")
    ap.add_argument("--device", default="a10")
    ap.add_argument("--no-train", action="store_true", help="inference instead of a step")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    common = [a.model, "--device", a.device] + ([] if a.no_train else ["--train"])
    t_import = min(_timed_import() for _ in range(a.repeat))
    one, _ = _timed([*common, "--batch", "1"], a.repeat)
    search, out = _timed([*common, "--max-batch", "--format", "json"], a.repeat)
    doc = json.loads(out)
    what = "inference" if a.no_train else "training step"
    print(f"{a.model} on {a.device}, {what}; whole commands, best of {a.repeat}")
    print(f"{'':44s}{'time s':>8s}")
    for label, t in (("python -c 'import torch' (a floor)", t_import),
                     ("graphcost --batch 1 (one analysis)", one),
                     ("graphcost --max-batch", search)):
        print(f"{label:44s}{t:8.2f}")
    print(f"max batch {doc['max_batch']:,}: {doc['analyses']} analyses, "
          f"{doc['traces'] or doc['analyses']} model trace(s)"
          + (f", traced at batch {doc['traced_at']:,}" if doc.get("traced_at") else ""))
    print(f"ratio --max-batch / one analysis: {search / one:.2f}x")
    print("target (GPT-2 training case, #13): <= 5 s: "
          + ("met" if search <= 5 else f"NOT met ({search:.1f} s)"))


def _timed_import() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
