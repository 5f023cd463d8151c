"""ONNX Runtime's half of ``graphcost calibrate``: the same microbenchmarks as eager PyTorch's
(calibrate.py, microbench.py), each a one-node ONNX model (analyzer/frontends/onnx/probe_models.py) run in an
InferenceSession on the CPU provider at torch's thread count. Every time is taken net of a
session run with nothing in it (an Identity); the launch cost is a chain of tiny Adds divided
by its length: one run's own cost spread over many nodes, as in a model."""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from ...passes.device.profile import EngineProfile
from ..frontends.onnx import probe_models as probe
from . import microbench as mb

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
    base = mb.fastest(_session(probe.identity(one), {"a": one}))
    launch = max(0.0, mb.fastest(_session(probe.add_chain(CHAIN), {"x": one})) - base) / CHAIN

    def cold(build: Callable[[], tuple[bytes, dict[str, np.ndarray]]]) -> float:
        """Net seconds per run, cycling through sessions of fresh operands (their weights
        too) past microbench.COLD_BYTES, as microbench.cold does for eager PyTorch."""
        model, feeds = build()
        size = sum(a.nbytes for a in feeds.values()) + len(model)
        runs = [_session(model, feeds)] + [_session(*build()) for _ in range(
            min(15, mb.COLD_BYTES // max(1, size)))]
        turn = itertools.cycle(runs)
        return max(1e-9, mb.fastest(lambda: next(turn)()) - base)

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, np.float32)

    def conv_model(b, ci, co, hw, k, groups=1):
        x = normal(b, ci, hw, hw)
        return probe.conv(x, normal(co, ci // groups, k, k), groups), {"x": x}

    gemm = [(2 * n ** 3, cold(lambda n=n: (probe.matmul(a := normal(n, n)), {"a": a})))
            for n in mb.GEMM_SIZES]
    conv = [(2 * b * co * hw * hw * ci * k * k, cold(lambda s=(b, ci, co, hw, k): conv_model(*s)))
            for b, ci, co, hw, k in mb.CONV_SHAPES]
    grouped = [(2 * b * c * hw * hw * 9, cold(lambda s=(b, c, c, hw, 3, c): conv_model(*s)))
               for b, c, hw in mb.GROUPED_SHAPES]
    pool = [(9 * b * c * (hw // 2) ** 2,
             cold(lambda s=(b, c, hw, hw): (probe.max_pool(x := normal(*s)), {"x": x})))
            for b, c, hw in mb.POOL_SHAPES]
    memory = [(12 * n, cold(lambda n=n: (probe.add(a := normal(n), b := normal(n)),
                                         {"a": a, "b": b})))
              for n in mb.MEMORY_ELEMENTS]
    grid = np.ones((4, 4), np.float32)
    view = max(0.0, mb.fastest(_session(probe.flatten(grid), {"a": grid})) - base)
    return EngineProfile(launch, view,
                         {"gemm": {"fp32": mb.rates(gemm, launch)},
                          "conv": {"fp32": mb.rates(conv, launch)},
                          "grouped_conv": {"fp32": mb.rates(grouped, launch)},
                          "pool": {"fp32": mb.rates(pool, launch)}},
                         mb.rates(memory, launch))
