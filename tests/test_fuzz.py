"""Fuzzing the ONNX path: 480 deterministic mutations of four zoo exports (tests/fuzz_onnx.py),
and issue 27's hostile files (tests/fuzz_hostile.py).

Every file: exit 0, 2 or 3 only (never 70), no traceback, a refusal is one line, the input is
never modified, and a valid-but-shuffled graph is analyzed. Every file that BOTH onnx.checker
(full_check) and onnxruntime (session creation) reject must exit 2. Runs graphcost in-process
(subprocesses would take minutes); onnxruntime judges the candidates in one child process, so
a crash of onnxruntime on a hostile file cannot take pytest down. `pytest -s` prints the
histogram of exit statuses.
"""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from collections import Counter, defaultdict

import onnx
import pytest
from graphcost.analyzer.cli.main import main

from tests.fuzz_onnx import generate

COUNTS = {"mnist_net": 150, "small_cnn": 110, "gpt2": 110, "bert": 110}
ARGS = {"gpt2": ["--dim", "seq=16"], "bert": ["--dim", "seq=16"]}

ORT_JUDGE = """
import json, sys
import onnxruntime as ort
opts = ort.SessionOptions()
opts.log_severity_level = 4
verdicts = {}
for path in sys.argv[1:]:
    try:
        ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        verdicts[path] = "accepts"
    except Exception as exc:
        verdicts[path] = "rejects: " + str(exc).splitlines()[0][:200]
print(json.dumps(verdicts))
"""


@pytest.fixture(scope="module")
def bases():
    from graphcost import models_zoo
    return {name: onnx.load(str(models_zoo.cached_export(name))) for name in COUNTS}


def _checker_rejects(data: bytes) -> bool:
    try:
        onnx.checker.check_model(onnx.load_from_string(data), full_check=True)
        return False
    except Exception:
        return True


def _ort_verdicts(paths: list[str], cwd: str) -> dict[str, str]:
    """onnxruntime's verdict on each file, in a child process (per file if it crashes)."""
    if not paths:
        return {}
    p = subprocess.run([sys.executable, "-c", ORT_JUDGE, *paths], capture_output=True,
                       text=True, timeout=600, cwd=cwd)
    if p.returncode == 0:
        return json.loads(p.stdout)
    if len(paths) == 1:
        return {paths[0]: f"rejects: onnxruntime crashed ({p.returncode})"}
    out = {}
    for path in paths:
        out.update(_ort_verdicts([path], cwd))
    return out


def test_fuzzed_files(bases, tmp_path):
    t0 = time.perf_counter()
    statuses: Counter = Counter()
    by_kind: dict[str, Counter] = defaultdict(Counter)
    problems, candidates = [], {}
    # a file the external-constant mutation points at: it must never be read
    (tmp_path / "secret.txt").write_bytes(b"\x05\0\0\0\0\0\0\0\x07\0\0\0\0\0\0\0")
    for k, (name, label, data) in enumerate(generate(bases, COUNTS)):
        path = tmp_path / f"{k:03d}_{name}.onnx"
        path.write_bytes(data)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(path), "--format", "json", *ARGS.get(name, [])])
        err_text = err.getvalue()
        statuses[code] += 1
        by_kind[label.split("+")[0].split(":")[0]][code] += 1
        where = f"{path.name} [{label}]: exit {code}: {err_text.strip()[:300]}"
        if code not in (0, 2, 3) or "Traceback" in err_text:
            problems.append(where)
        if code == 2 and (err_text.count("\n") != 1 or
                          not err_text.startswith("graphcost: error: ")):
            problems.append(f"not one line: {where}")
        if path.read_bytes() != data:
            problems.append(f"input modified: {where}")
        if code == 0 and "nested_trips" in label and "over 2^64" not in out.getvalue():
            problems.append(f"trip counts past 2^64 without a label: {where}")
        if label == "shuffle" and code != 0:
            problems.append(f"a valid unsorted graph was not analyzed: {where}")
        if code == 2:
            path.unlink()
        elif _checker_rejects(data) and "external" not in label:
            candidates[str(path)] = where  # onnxruntime decides (external: it would read)
        else:
            path.unlink()
    verdicts = _ort_verdicts(sorted(candidates), str(tmp_path))
    for path, verdict in verdicts.items():
        if verdict.startswith("rejects"):
            problems.append(f"checker and onnxruntime reject it, graphcost did not: "
                            f"{candidates[path]} — {verdict}")
    total = sum(statuses.values())
    print(f"\nfuzz: {total} files in {time.perf_counter() - t0:.1f} s; exit status "
          f"histogram: " + ", ".join(f"{c}: {n}" for c, n in sorted(statuses.items())))
    for kind, hist in sorted(by_kind.items()):
        print(f"  {kind:<20} " + ", ".join(f"{c}: {n}" for c, n in sorted(hist.items())))
    print(f"  accepted by graphcost and refused by onnx.checker: {len(candidates)}, of which "
          f"onnxruntime also refuses: {sum(v.startswith('rejects') for v in verdicts.values())}")
    assert total >= 300
    assert not problems, "\n".join(problems[:30])


def test_hostile_cases(tmp_path):
    """Issue 27's hostile files (tests/fuzz_hostile.py), each run through the command line in a
    child process: the status it must get — 2 with one line, or 0 with the label asked for on
    a valid file — no traceback, within 200 MB above what the process held and 2 s, or 8 µs
    per input byte for a large file: time per byte is what the bound is about, and a pass
    quadratic in a 20k-node file would take thousands of times that (a run over 1.5 s is
    timed once more and the faster counts: with the other xdist worker on the second core,
    the 20k-node file, 517,847 B, took 1.5 to 2.4 s on a slow day, 2.9 to 4.7 µs/B)."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-m", "tests.fuzz_hostile", str(tmp_path)], cwd=root,
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(root)))
    assert p.returncode == 0, p.stderr[-3000:]
    results = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(results) == 21, p.stdout[-3000:]
    problems = []
    print(f"\nhostile: {len(results)} cases; exit status histogram: " + ", ".join(
        f"{c}: {n}" for c, n in sorted(Counter(r["code"] for r in results).items())))
    print(f"  {'case':<28} exit {'s':>6} {'MiB':>7} {'bytes':>9} {'µs/B':>7} {'KiB/B':>7}")
    for r in results:
        print(f"  {r['case']:<28} {r['code']:>4} {r['seconds']:6.2f} {r['peak_mib']:7.1f} "
              f"{r['bytes']:9,} {r['seconds'] / r['bytes'] * 1e6:7.2f} "
              f"{r['peak_mib'] * 1024 / r['bytes']:7.3f}")
        where = f"{r['case']}: exit {r['code']}: {r['stderr'].strip()[:300]}"
        if r["code"] != r["want"] or not r["said"] or "Traceback" in r["stderr"]:
            problems.append(where)
        if r["code"] == 2 and (r["stderr"].count("\n") != 1 or
                               not r["stderr"].startswith("graphcost: error: ")):
            problems.append(f"not one line: {where}")
        if r["code"] == 0 and r["stderr"]:
            problems.append(f"stderr on success: {where}")
        if r["seconds"] > max(2, 8e-6 * r["bytes"]) or r["peak_mib"] > 200:
            problems.append(f"{r['seconds']:.2f} s, {r['peak_mib']:.0f} MiB: {where}")
    assert not problems, "\n".join(problems)
