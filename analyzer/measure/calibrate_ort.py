"""ONNX Runtime's half of ``graphcost calibrate``: the same microbenchmarks as eager PyTorch's
(calibrate.py), each a one-node ONNX model (analyzer/frontends/onnx/probe_models.py) run in an
InferenceSession on the CPU provider at torch's thread count. Every time is taken net of a
session run with nothing in it (an Identity); the launch cost is a chain of tiny Adds divided
by its length: one run's own cost spread over many nodes, as in a model."""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from ...passes.device.profile import EngineProfile
from ..frontends.onnx import probe_models as probe
from .calibrate import (
    COLD_BYTES,
    CONV_SHAPES,
    GEMM_SIZES,
    GROUPED_SHAPES,
    MEMORY_ELEMENTS,
    POOL_SHAPES,
    _rates,
    fastest,
)

CHAIN = 64   # tiny Adds in the launch model


def _session(model: bytes, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
    import onnxruntime as ort
    import torch

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return lambda: session.run(None, feeds)


def onnxruntime_engine() -> EngineProfile:
    rng = np.random.default_rng(0)
    one = np.ones(1, np.float32)
    base = fastest(_session(probe.identity(one), {"a": one}))
    launch = max(0.0, fastest(_session(probe.add_chain(CHAIN), {"x": one})) - base) / CHAIN

    def cold(build: Callable[[], tuple[bytes, dict[str, np.ndarray]]]) -> float:
        """Net seconds per run, cycling through sessions of fresh operands (their weights
        too) past calibrate.COLD_BYTES, as calibrate.cold does for eager PyTorch."""
        model, feeds = build()
        size = sum(a.nbytes for a in feeds.values()) + len(model)
        runs = [_session(model, feeds)] + [_session(*build()) for _ in range(
            min(15, COLD_BYTES // max(1, size)))]
        turn = itertools.cycle(runs)
        return max(1e-9, fastest(lambda: next(turn)()) - base)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, np.float32)

    def conv_model(b, ci, co, hw, k, groups=1):
        x = normal(b, ci, hw, hw)
        return probe.conv(x, normal(co, ci // groups, k, k), groups), {"x": x}

    gemm = [(2 * n ** 3, cold(lambda n=n: (probe.matmul(a := normal(n, n)), {"a": a})))
            for n in GEMM_SIZES]
    conv = [(2 * b * co * hw * hw * ci * k * k, cold(lambda s=(b, ci, co, hw, k): conv_model(*s)))
            for b, ci, co, hw, k in CONV_SHAPES]
    grouped = [(2 * b * c * hw * hw * 9, cold(lambda s=(b, c, c, hw, 3, c): conv_model(*s)))
               for b, c, hw in GROUPED_SHAPES]
    pool = [(9 * b * c * (hw // 2) ** 2,
             cold(lambda s=(b, c, hw, hw): (probe.max_pool(x := normal(*s)), {"x": x})))
            for b, c, hw in POOL_SHAPES]
    memory = [(12 * n, cold(lambda n=n: (probe.add(a := normal(n), b := normal(n)),
                                         {"a": a, "b": b})))
              for n in MEMORY_ELEMENTS]
    grid = np.ones((4, 4), np.float32)
    view = max(0.0, fastest(_session(probe.flatten(grid), {"a": grid})) - base)
    return EngineProfile(launch, view,
                         {"gemm": {"fp32": _rates(gemm, launch)},
                          "conv": {"fp32": _rates(conv, launch)},
                          "grouped_conv": {"fp32": _rates(grouped, launch)},
                          "pool": {"fp32": _rates(pool, launch)}},
                         _rates(memory, launch))
