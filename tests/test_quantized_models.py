"""Quantized and fused zoo models (issue #9): built with onnxruntime's own tools, checked against
the file's initializers, the fp32 parent and onnxruntime's shapes.

Variants: onnxruntime.quantization's quantize_dynamic (ConvInteger / MatMulInteger),
quantize_static in QDQ and QOperator formats (QLinearConv, QLinearMatMul, com.microsoft's
QLinearAdd/Mul/Softmax/Sigmoid/Concat/GlobalAveragePool, QGemm) with a small random calibration
set, MatMulNBitsQuantizer (4-bit com.microsoft::MatMulNBits), and onnxruntime.transformers'
optimize_model for fused gpt2/bert (SkipLayerNormalization, FastGelu, Attention, BiasGelu).

Expected numbers come from the files, not from graphcost: initializers named ``*_scale(s)`` /
``*_zero_point(s)`` (onnxruntime's naming) are quantization metadata; int64 initializers are
shape constants; every other initializer is a weight of numel elements, stored in
numel·bits/8 bytes — except a MatMulNBits weight, whose elements are the node's N·K.
"""
from __future__ import annotations

import functools
import os
import re
import warnings

import numpy as np
import onnx
import pytest
from graphcost.analyzer.app.api import analyze
from graphcost.analyzer.measure.verify import verify

SEQ = {"seq": 16}
TRANSFORMERS = ("gpt2", "bert", "llama_tiny")
# resnet18 in the QOperator format only: there its MaxPool, Relu and GlobalAveragePool run on
# quantized tensors (QLinearGlobalAveragePool), what mobilenet_v2 has not; its dynamic and QDQ
# variants quantize the same ops as mobilenet_v2's (ConvInteger, QuantizeLinear /
# DequantizeLinear around the convs and the Gemm), MaxPool and Relu left in float
VARIANTS = [("resnet18", "qop")] + [("mobilenet_v2", v) for v in ("dyn", "qdq", "qop")] + \
    [(m, v) for m in TRANSFORMERS for v in ("dyn", "qdq", "qop", "nbits")] + \
    [("gpt2", "fused"), ("bert", "fused"), ("gpt2", "fused_nbits")]
META = re.compile(r"_(scale|zero_point)s?$")
BITS = {onnx.TensorProto.FLOAT: 32, onnx.TensorProto.INT8: 8, onnx.TensorProto.UINT8: 8,
        onnx.TensorProto.INT32: 32, onnx.TensorProto.FLOAT16: 16}


def _dims(name: str) -> dict:
    return SEQ if name in TRANSFORMERS else {}


def _parent(name: str, d) -> str:
    """The fp32 parent: the zoo's ONNX export; an image model's at 64×64 instead of 224×224
    (its input's dims rewritten, the exporter's value_info dropped: ONNX shape inference
    gives them again), so that calibrating and running the variants in onnxruntime costs 12×
    less; every node and initializer is the same."""
    from graphcost.models_zoo.cache import cache_path

    src = str(cache_path(name))
    if not os.path.exists(src):  # (cached_export imports torch, ~1.6 s, even for a cached file)
        from graphcost.models_zoo import cached_export
        src = str(cached_export(name))
    if name in TRANSFORMERS:
        return src
    model = onnx.load(src)
    height, width = model.graph.input[0].type.tensor_type.shape.dim[2:]
    height.dim_value = width.dim_value = 64
    del model.graph.value_info[:]
    out = str(d / f"{name}_64.onnx")
    onnx.save(model, out)
    return out


def _reader(path: str):
    from onnxruntime.quantization import CalibrationDataReader

    model = onnx.load(path, load_external_data=False)
    rng = np.random.default_rng(0)
    feeds = []
    for _ in range(2):
        feed = {}
        for vi in model.graph.input:
            shape = [d.dim_value or (1 if d.dim_param == "batch" else 8)
                     for d in vi.type.tensor_type.shape.dim]
            if vi.type.tensor_type.elem_type == onnx.TensorProto.INT64:
                feed[vi.name] = rng.integers(0, 50, shape).astype(np.int64)
            else:
                feed[vi.name] = rng.standard_normal(shape).astype(np.float32)
        feeds.append(feed)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)
    return Reader()


def _build(name: str, variant: str, src: str, out: str) -> None:
    from onnxruntime.quantization import (
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if variant == "dyn":
        quantize_dynamic(src, out, weight_type=QuantType.QInt8)
    elif variant in ("qdq", "qop"):
        fmt = QuantFormat.QDQ if variant == "qdq" else QuantFormat.QOperator
        quantize_static(src, out, _reader(src), quant_format=fmt)
    elif variant in ("nbits", "fused", "fused_nbits"):
        model = onnx.load(src)
        if variant.startswith("fused"):
            from onnxruntime.transformers.optimizer import optimize_model
            model = optimize_model(src, model_type=name, num_heads=4, hidden_size=128).model
        if variant.endswith("nbits"):
            q = MatMulNBitsQuantizer(model, block_size=32, is_symmetric=True)
            q.process()
            model = q.model.model
        onnx.save(model, out)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(parent report, variant file) of each case, built when a case first asks (a parent
    once per model)."""
    d = tmp_path_factory.mktemp("quantized")

    @functools.cache
    def parent(name: str):
        src = _parent(name, d)
        return src, analyze(src, dims=_dims(name))

    def build(name: str, variant: str):
        src, report = parent(name)
        out = str(d / f"{name}_{variant}.onnx")
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            _build(name, variant, src, out)
        return report, out
    return build


def _expected(path: str) -> tuple[int, int, int, int, bool]:
    """(weight elements, weight bytes, metadata elements, metadata bytes, has 4-bit weights)
    from the file's initializers and the MatMulNBits nodes that read them."""
    model = onnx.load(path, load_external_data=False)
    logical = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
            logical[node.input[1]] = a["N"] * a["K"]
    elems = nbytes = meta = meta_bytes = 0
    for t in model.graph.initializer:
        n = int(np.prod(t.dims))
        b = n * BITS.get(t.data_type, 64) // 8
        if META.search(t.name):
            meta, meta_bytes = meta + n, meta_bytes + b
        elif t.data_type != onnx.TensorProto.INT64:
            elems, nbytes = elems + logical.get(t.name, n), nbytes + b
    return elems, nbytes, meta, meta_bytes, bool(logical)


@pytest.mark.parametrize("name, variant", VARIANTS, ids=[f"{m}-{v}" for m, v in VARIANTS])
def test_quantized_variant(built, name, variant):
    parent, path = built(name, variant)
    r = analyze(path, dims=_dims(name))
    t = r.totals
    assert r.coverage.percent == 100.0, (r.coverage.unsupported, r.coverage.unknown_shape)
    # params and their storage equal the file's initializers (weights; buffers are weights
    # too: BatchNorm statistics), scales and zero points apart
    elems, nbytes, meta, meta_bytes, packed = _expected(path)
    assert t.params + t.buffers == elems
    assert t.param_bytes + t.buffer_bytes == nbytes
    assert (t.quant_meta, t.quant_meta_bytes) == (meta, meta_bytes)
    assert sum(t.param_bytes_by_dtype.values()) == t.param_bytes
    if packed:
        assert "uint4" in t.param_bytes_by_dtype
    # integer arithmetic counted as such: the same MACs as the fp32 parent
    fp32 = parent.totals
    assert abs(t.macs - fp32.macs) <= 0.01 * fp32.macs, (t.macs, fp32.macs)
    assert sum(t.flops_by_dtype.values()) == t.flops
    if variant in ("dyn", "qop"):
        assert t.flops_by_dtype.get("int8", 0) > t.flops_by_dtype.get("fp32", 0)
    # every intermediate shape equals onnxruntime's
    v = verify(path, repeat=1, dims=_dims(name))  # token ids 0 and 1
    assert v.shapes_mismatched == 0 and v.shapes_unknown == 0, (v.mismatches, v.unknown)
    assert v.shapes_matched > 0
