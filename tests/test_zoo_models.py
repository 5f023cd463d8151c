"""Tests for the reference model zoo (models_zoo/)."""

from __future__ import annotations

import functools
import importlib.metadata

import numpy as np
import onnx
import pytest
import torch
from graphcost.models_zoo import (
    MODELS,
    ZooModel,
    build_model,
    cached_export,
    example_inputs,
    export_onnx,
    input_shapes,
)

# Exact parameter counts; the graph analyzer's tests rely on these.
EXPECTED_PARAMS = {
    # conv1 32*(3*3*1+1)=320; conv2 32*(3*3*32+1)=9,248; fc1 (14*14*32)*128+128=6272*128+128=802,944;
    # fc2 128*10+10=1,290  ->  320 + 9,248 + 802,944 + 1,290 = 813,802
    "small_cnn": 813_802,
    # conv1 10*(5*5*1+1)=260; conv2 20*(5*5*10+1)=5,020; fc1 320*50+50=16,050; fc2 50*10+10=510
    #   ->  260 + 5,020 + 16,050 + 510 = 21,840
    "mnist_net": 21_840,
    # conv_1 64*(3*3*3+1)=1,792; conv_2 64*(3*3*64+1)=36,928; conv_3 128*(3*3*64+1)=73,856
    #   ->  1,792 + 36,928 + 73,856 = 112,576
    "three_conv": 112_576,
    "resnet18": 11_689_512,  # torchvision.models.resnet18()
    "resnet50": 25_557_032,  # torchvision.models.resnet50()
    "vgg16": 138_357_544,  # torchvision.models.vgg16()
    "mobilenet_v2": 3_504_872,  # torchvision.models.mobilenet_v2()
}

# expected output shapes for example_inputs(name, batch=2) (default dims)
EXPECTED_OUTPUT_SHAPES = {
    "small_cnn": [(2, 10)],
    "mnist_net": [(2, 10)],
    "three_conv": [(2, 128, 341, 350)],
    "resnet18": [(2, 1000)],
    "resnet50": [(2, 1000)],
    "vgg16": [(2, 1000)],
    "mobilenet_v2": [(2, 1000)],
    "gpt2": [(2, 64, 1000)],
    "gpt2_lora": [(2, 64, 1000)],
    "mlp": [(2, 10)],
    "llama_tiny": [(2, 64, 1000)],
    "bert": [(2, 64, 128), (2, 128)],
    "unet": [(2, 2, 64, 64)],
}


@functools.cache
def _model(name: str) -> torch.nn.Module:
    return build_model(name)


def _as_tuple(y) -> tuple[torch.Tensor, ...]:
    return y if isinstance(y, tuple) else (y,)


def _shape(vi: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


def test_registry() -> None:
    assert list(MODELS) == [
        "small_cnn", "mnist_net", "three_conv", "resnet18", "resnet50",
        "vgg16", "mobilenet_v2", "gpt2", "gpt2_lora", "bert", "llama_tiny", "llama7b",
        "llama3_8b", "llama3_70b", "llama3_405b", "mlp", "unet",
    ]  # fmt: skip
    for name, spec in MODELS.items():
        assert isinstance(spec, ZooModel) and spec.name == name and spec.description
        shapes = spec.input_shapes(4)
        assert set(shapes) == set(spec.input_dtypes) == set(spec.dynamic_dims)
        for inp, dims in spec.dynamic_dims.items():
            assert dims[0] == "batch" and shapes[inp][0] == 4
            if name in ("gpt2", "gpt2_lora", "bert") or name.startswith("llama"):
                assert dims[1] == "seq"


@pytest.mark.parametrize("name", list(EXPECTED_PARAMS))
def test_param_count(name: str) -> None:
    assert sum(p.numel() for p in _model(name).parameters()) == EXPECTED_PARAMS[name]


def test_mnist_net_attribute_names() -> None:
    names = [n for n, _ in _model("mnist_net").named_children()]
    assert names == ["conv1", "conv2", "conv2_drop", "fc1", "fc2"]
    assert [n for n, _ in _model("three_conv").named_children()] == ["conv_1", "relu_1", "conv_2", "relu_2", "pool", "conv_3"]


@pytest.mark.parametrize("name", [n for n, m in MODELS.items() if not m.meta_only])
def test_forward_shapes(name: str) -> None:
    with torch.no_grad():
        out = _as_tuple(_model(name)(*example_inputs(name, batch=2)))
    assert [tuple(o.shape) for o in out] == EXPECTED_OUTPUT_SHAPES[name]
    assert all(torch.isfinite(o).all() for o in out)


def test_example_inputs() -> None:
    (ids,) = example_inputs("gpt2", batch=3, seq=16)
    assert ids.shape == (3, 16) and ids.dtype == torch.int64
    assert 0 <= int(ids.min()) and int(ids.max()) < 1000
    ids, mask = example_inputs("bert", batch=2)
    assert ids.shape == mask.shape == (2, 64) and mask.dtype == torch.int64 and bool((mask == 1).all())
    assert torch.equal(example_inputs("small_cnn", 2)[0], example_inputs("small_cnn", 2)[0])  # seeded
    assert input_shapes("three_conv", 1, height=32, width=48) == {"x": (1, 3, 32, 48)}
    with pytest.raises(TypeError):
        example_inputs("small_cnn", 1, seq=3)
    with pytest.raises(KeyError):
        example_inputs("no_such_model")


def test_meta_only_models_build_on_meta() -> None:
    # llama7b's fp32 weights would take 27 GB: build_model never materializes it
    m = build_model("llama7b")
    assert all(p.device.type == "meta" for p in m.parameters())
    with pytest.raises(Exception, match="too large to export"):
        cached_export("llama7b")


def test_llama3_shapes_have_the_published_parameter_counts() -> None:
    # meta-llama's model cards / safetensors indexes: Llama 3.1 8B, 70B and 405B
    from graphcost.models_zoo.llama import LLAMA3, param_count
    published = {"8b": 8_030_261_248, "70b": 70_553_706_496, "405b": 405_853_388_800}
    for flavor, count in published.items():
        assert param_count(LLAMA3[flavor]) == count
    m = build_model("llama3_8b")
    assert sum(p.numel() for p in m.parameters()) == published["8b"]


def test_gpt2_tied_lm_head() -> None:
    m = _model("gpt2")
    assert m.lm_head.weight is m.wte.weight


def _check_onnx(path, name: str, batch: int = 3, **dims: int) -> None:
    onnx.checker.check_model(str(path))
    proto = onnx.load(str(path))
    spec = MODELS[name]
    assert [i.name for i in proto.graph.input] == list(spec.input_shapes(1))
    assert [o.name for o in proto.graph.output] == list(spec.output_names)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
    for vi in proto.graph.input:
        shape = _shape(vi)
        for axis, dim_name in spec.dynamic_dims[vi.name].items():
            assert shape[axis] == dim_name, (vi.name, shape)  # symbolic (dim_param)

    ort = pytest.importorskip("onnxruntime")
    inputs = example_inputs(name, batch=batch, seed=1, **dims)
    with torch.no_grad():
        ref = _as_tuple(_model(name)(*inputs))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outs = sess.run(None, {k: v.numpy() for k, v in zip(spec.input_shapes(batch, **dims), inputs)})
    assert len(outs) == len(ref)
    for o, r in zip(outs, ref):
        assert o.shape == tuple(r.shape)
        np.testing.assert_allclose(o, r.numpy(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["small_cnn", "gpt2"])
def test_export_legacy(name: str, tmp_path) -> None:
    path = export_onnx(name, tmp_path / f"{name}.onnx")
    assert path.exists()
    assert onnx.load(str(path)).opset_import[0].version == 17
    _check_onnx(path, name, batch=3)
    if name == "gpt2":  # the sequence length is dynamic too
        _check_onnx(path, name, batch=3, seq=16)


def test_export_dynamo(tmp_path) -> None:
    pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript")
    path = export_onnx("small_cnn", tmp_path / "small_cnn_dynamo.onnx", dynamo=True)
    _check_onnx(path, "small_cnn", batch=3)


def test_cached_export(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GRAPHCOST_CACHE", str(tmp_path / "cache"))
    p1 = cached_export("mnist_net")
    mtime = p1.stat().st_mtime_ns
    p2 = cached_export("mnist_net")
    assert p1 == p2 and p2.stat().st_mtime_ns == mtime  # second call hits the cache
    # named for the torch release as its package says (a CUDA wheel's says "2.14.1", its
    # torch.__version__ "2.14.1+cu130"): read without importing torch
    release = importlib.metadata.version("torch").replace("+", "_")
    assert p1.parent == tmp_path / "cache" and release in p1.name
    assert [p.name for p in p1.parent.iterdir()] == [p1.name]  # no temp files left behind
    onnx.checker.check_model(str(p1))
