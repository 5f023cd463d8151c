"""ONNX Runtime's half of ``graphcost calibrate``: the same microbenchmarks as eager PyTorch's
(calibrate.py), each a one-node ONNX model (analyzer/frontends/onnx/probe_models.py) run in an
InferenceSession on the CPU provider at torch's thread count. Every time is taken net of a
session run with nothing in it (an Identity); the launch cost is a chain of tiny Adds divided
by its length: one run's own cost spread over many nodes, as in a model."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...passes.device.profile import EngineProfile
from ..frontends.onnx import probe_models as probe
from .calibrate import (
    CONV_SHAPES,
    GEMM_SIZES,
    GROUPED_SHAPES,
    MEMORY_ELEMENTS,
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

    def timed(model: bytes, feeds: dict[str, np.ndarray]) -> float:
        return max(1e-9, fastest(_session(model, feeds)) - base)

    gemm = []
    for n in GEMM_SIZES:
        a = rng.standard_normal((n, n), np.float32)
        gemm.append((2 * n ** 3, timed(probe.matmul(a), {"a": a})))
    conv = []
    for b, ci, co, hw, k in CONV_SHAPES:
        x = rng.standard_normal((b, ci, hw, hw), np.float32)
        w = rng.standard_normal((co, ci, k, k), np.float32)
        conv.append((2 * b * co * hw * hw * ci * k * k, timed(probe.conv(x, w), {"x": x})))
    grouped = []
    for b, c, hw in GROUPED_SHAPES:
        x = rng.standard_normal((b, c, hw, hw), np.float32)
        w = rng.standard_normal((c, 1, 3, 3), np.float32)
        grouped.append((2 * b * c * hw * hw * 9, timed(probe.conv(x, w, c), {"x": x})))
    memory = []
    for n in MEMORY_ELEMENTS:
        a = np.ones(n, np.float32)
        memory.append((12 * n, timed(probe.add(a), {"a": a})))
    grid = np.ones((4, 4), np.float32)
    return EngineProfile(launch, timed(probe.flatten(grid), {"a": grid}),
                         {"gemm": {"fp32": _rates(gemm, launch)},
                          "conv": {"fp32": _rates(conv, launch)},
                          "grouped_conv": {"fp32": _rates(grouped, launch)}},
                         _rates(memory, launch))
