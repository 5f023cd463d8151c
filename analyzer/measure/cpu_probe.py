"""Run as ``python -m graphcost.analyzer.measure.cpu_probe BUDGET`` by analyzer.measure.reference.measure_cpu.

A child process with single-threaded BLAS: a multi-threaded matmul on a machine whose other
cores are busy reads 5-40× low (its threads wait on each other), one thread stays within ~10%
of its idle rate. The best of many short runs is an idle moment's rate. Prints one JSON line:
{"flops": FLOP/s of a float32 512³ matmul, "bandwidth": bytes/s read + written by a copy}.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np


def best(fn, budget: float) -> float:
    """The fastest of at least three runs of ``fn`` within ``budget`` seconds."""
    b, start, runs = float("inf"), time.perf_counter(), 0
    while runs < 3 or time.perf_counter() - start < budget:
        t = time.perf_counter()
        fn()
        b = min(b, time.perf_counter() - t)
        runs += 1
    return b


def main(budget: float) -> dict[str, float]:
    n = 512
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    c = rng.standard_normal((n, n), dtype=np.float32)
    _ = a @ c  # warm-up
    flops = 2.0 * n ** 3 / best(lambda: a @ c, budget)
    src = np.ones(32 << 20, dtype=np.float32)  # 128 MiB: beyond most caches
    dst = np.empty_like(src)
    np.copyto(dst, src)  # page the destination in
    bandwidth = 2.0 * src.nbytes / best(lambda: np.copyto(dst, src), budget)
    return {"flops": flops, "bandwidth": bandwidth}


if __name__ == "__main__":
    print(json.dumps(main(float(sys.argv[1]))))
