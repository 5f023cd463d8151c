"""The worked numbers of ../shared/design-notes.md and the published ResNet-50 / VGG-16 figures,
checked on the bundled zoo models exported to ONNX (legacy exporter, BatchNorm kept)."""
from __future__ import annotations

from graphcost import analyze


def by_name(report, prefix):
    return [n for n in report.nodes if n.name.startswith(prefix)]


def test_small_cnn_params():
    # §1.1: conv1 32·(3·3·1+1) = 320; conv2 32·(3·3·32+1) = 9,248; fc1 (6,272+1)·128 = 802,944;
    # fc2 (128+1)·10 = 1,290. These add up to 813,802 (the notes print the total as 813,804,
    # which their own per-layer figures do not support) → ×4 B = 3,255,208 B.
    r = analyze("zoo:small_cnn")
    assert r.totals.params == 320 + 9_248 + 802_944 + 1_290 == 813_802
    assert r.totals.param_bytes == 813_802 * 4
    # activations per sample: conv outs 28·28·32 = 25,088; pool 6,272; fc1 128; fc2 10
    convs = [n for n in r.nodes if n.op == "Conv"]
    assert [n.output_bytes for n in convs] == [25_088 * 4, 25_088 * 4]
    assert [n.output_bytes for n in r.nodes if n.op == "MaxPool"] == [6_272 * 4]
    assert [n.output_bytes for n in r.nodes if n.op == "Gemm"] == [128 * 4, 10 * 4]


def test_mnist_net_table():
    # §1.2, torchstat's table: out shape, params, MemRead = input + weights, MemWrite = output.
    r = analyze("zoo:mnist_net")
    assert r.totals.params == 21_840
    conv1, conv2 = [n for n in r.nodes if n.op == "Conv"]
    fc1, fc2 = [n for n in r.nodes if n.op == "Gemm"]
    assert (conv1.output_shapes, conv1.params, conv1.bytes_read, conv1.bytes_written) == \
        (("1×10×24×24",), 260, 784 * 4 + 260 * 4, 23_040)          # 4,176 read
    assert (conv2.output_shapes, conv2.params, conv2.bytes_read, conv2.bytes_written) == \
        (("1×20×8×8",), 5_020, 10 * 12 * 12 * 4 + 5_020 * 4, 5_120)  # 25,840 read
    assert (fc1.params, fc1.bytes_read, fc1.bytes_written) == (16_050, 320 * 4 + 16_050 * 4, 200)
    assert (fc2.params, fc2.bytes_read, fc2.bytes_written) == (510, 2_240, 40)
    # MACs: conv1 5,760·25 = 144,000; conv2 1,280·250 = 320,000; fc1 16,000; fc2 500
    assert [conv1.macs, conv2.macs, fc1.macs, fc2.macs] == [144_000, 320_000, 16_000, 500]
    # FLOPs = 2·MACs + one bias add per output: conv1 2·144,000 + 5,760 = 293,760
    assert conv1.flops == 2 * 144_000 + 5_760
    # the log_softmax is costed (5 FLOPs per element over 10 logits), nothing is unsupported
    assert [n.flops for n in r.nodes if n.op == "LogSoftmax"] == [50]
    assert r.coverage.unsupported == {} and r.coverage.covered == r.coverage.nodes


def test_three_conv_naive_sum():
    # §1.3 at 3×682×700: params 1,792 + 36,928 + 73,856 = 112,576 (450,304 B).
    # Outputs with in-place ReLUs: 64·HW + 64·HW + 64·(H/2)(W/2) + 128·(H/2)(W/2), HW = 477,400
    # → 84,022,400 elements = 336,089,600 B naive sum (graph input excluded).
    r = analyze("zoo:three_conv", include_inputs=False, inplace=True)
    assert r.totals.params == 112_576 and r.totals.param_bytes == 450_304
    assert r.memory.naive_sum_bytes == 336_089_600
    # liveness is smaller than the naive sum (outputs die); "×2 for backward" was 672,179,200
    assert r.memory.peak_bytes < r.memory.naive_sum_bytes
    # peak: conv_1 output (64·HW·4 = 122,209,600 B) and conv_2 output live together while
    # conv_2 runs → 244,419,200 B.
    assert r.memory.peak_bytes == 2 * 64 * 477_400 * 4
    # Without the in-place what-if the ONNX graph's ReLUs allocate their own outputs.
    plain = analyze("zoo:three_conv", include_inputs=False)
    assert plain.memory.naive_sum_bytes == 336_089_600 + 2 * 64 * 477_400 * 4


def test_resnet50_params_and_macs():
    # torchvision: 25,557,032 params; 4.09 GFLOPS (= MACs of conv + linear) at 224×224, batch 1
    r = analyze("zoo:resnet50", batch=1)
    assert r.totals.params == 25_557_032
    # BatchNorm running mean/var: 2 × Σ channels of the 53 BN layers = 2 × 26,560
    assert r.totals.buffers == 53_120
    assert round(r.totals.macs / 1e9, 2) == 4.09
    assert r.coverage.unsupported == {}


def test_vgg16_params_and_macs():
    # torchvision: 138,357,544 params; 15.47 GFLOPS (MACs) at 224×224 (traced on the meta
    # device: its 553 MB of weights are never made; its ONNX export would make them)
    r = analyze("zoo:vgg16", batch=1, zoo_exporter="fx")
    assert r.totals.params == 138_357_544
    assert round(r.totals.macs / 1e9, 2) == 15.47


def test_batch_scales_activations_not_params():
    # Feature map bytes are linear in batch; parameters are batch-independent (§1.4).
    r1 = analyze("zoo:resnet18", batch=1)
    r4 = analyze("zoo:resnet18", batch=4)
    assert r4.totals.params == r1.totals.params == 11_689_512
    assert r4.totals.macs == 4 * r1.totals.macs
    assert r4.memory.peak_bytes == 4 * r1.memory.peak_bytes
