"""Receptive fields (passes/graph/receptive_field.py) against hand arithmetic, a published table and
the gradients of real torch models.

Coordinates: pixel i spans [i, i+1), the input has rf=1, jump=1, start=0.5. Per layer with
k' = d(k−1)+1: rf += (k'−1)·j, j *= s, start += ((k'−1)/2 − p_begin)·j_in.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from graphcost.analyzer.app.request import LoadOptions
from graphcost.analyzer.load.loading import load_graph
from graphcost.passes.costs import lookup
from graphcost.passes.costs.registry import WINDOWS
from graphcost.passes.graph.receptive_field import Field, is_cnn, receptive_fields
from torch import nn

from tests.onnx_builders import model, node, weight


def onnx_graph(nodes, in_shape, out_name, out_shape, inits=()):
    return load_graph(model(nodes, [("x", in_shape)], [(out_name, out_shape)], inits))


def by_name(graph) -> dict[str, Field]:
    return {graph.nodes[i].name: f for i, f in receptive_fields(graph).items()}


def windowed(graph) -> list[Field]:
    """Fields of the Conv/pool nodes, in execution order."""
    f = receptive_fields(graph)
    return [f[i] for i in sorted(f) if lookup(graph.nodes[i].op).rf in WINDOWS]


def square(rf, jump, start, n=2) -> Field:
    return Field((rf,) * n, (jump,) * n, (float(start),) * n)


def test_guide_chain_conv_conv_pool_conv():
    # conv k3 s1 p1: rf 1+2·1 = 3, j 1, start 0.5 + (1−1)·1 = 0.5
    # conv k3 s1 p1: rf 3+2·1 = 5, j 1, start 0.5
    # maxpool k2 s2: rf 5+1·1 = 6, j 2, start 0.5 + (0.5−0)·1 = 1.0
    # conv k3 s1 p1: rf 6+2·2 = 10, j 2, start 1.0 + 0·2 = 1.0
    conv = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    g = onnx_graph([node("Conv", ["x", "w1"], ["c1"], **conv),
                    node("Relu", ["c1"], ["r1"]),
                    node("Conv", ["r1", "w2"], ["c2"], **conv),
                    node("MaxPool", ["c2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                    node("Conv", ["p", "w3"], ["y"], **conv)],
                   [1, 1, 8, 8], "y", [1, 1, 4, 4],
                   [weight("w1", 1, 1, 3, 3), weight("w2", 1, 1, 3, 3), weight("w3", 1, 1, 3, 3)])
    f = by_name(g)
    assert f["c1"] == square(3, 1, 0.5)
    assert f["r1"] == f["c1"]  # an activation passes the field through
    assert f["c2"] == square(5, 1, 0.5)
    assert f["p"] == square(6, 2, 1.0)
    assert f["y"] == square(10, 2, 1.0)
    assert is_cnn(g)


def test_stride_with_padding_gives_start_negative_in_the_padding():
    # conv k3 s2 p0: rf 3, j 2, start 0.5 + (1−0)·1 = 1.5 (output 0 covers pixels 0..2).
    # conv k3 s2 p2: rf 3+2·2 = 7, j 4, start 1.5 + (1−2)·2 = −0.5: output 0 is centred on
    # layer-1 index −1, a padding position.
    g = onnx_graph([node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], strides=[2, 2]),
                    node("Conv", ["a", "w2"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[2, 2, 2, 2])],
                   [1, 1, 9, 9], "y", [1, 1, 4, 4],
                   [weight("w1", 1, 1, 3, 3), weight("w2", 1, 1, 3, 3)])
    f = by_name(g)
    assert f["a"] == square(3, 2, 1.5)
    assert f["y"] == square(7, 4, -0.5)


def test_dilation_and_asymmetric_axes():
    # H: k3 d2 → k' 5, p 2: rf 5, start 0.5 + (2−2) = 0.5; then k3 d4 → k' 9, p 4: rf 5+8 = 13.
    # W: k1 (k' 1), p 0 then k3 d4 p4: rf 1 then 9; start 0.5 throughout.
    g = onnx_graph([node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 1], dilations=[2, 1],
                         pads=[2, 0, 2, 0]),
                    node("Conv", ["a", "w2"], ["y"], kernel_shape=[3, 3], dilations=[4, 4],
                         pads=[4, 4, 4, 4])],
                   [1, 1, 16, 16], "y", [1, 1, 16, 16],
                   [weight("w1", 1, 1, 3, 1), weight("w2", 1, 1, 3, 3)])
    f = by_name(g)
    assert f["a"] == Field((5, 1), (1, 1), (0.5, 0.5))
    assert f["y"] == Field((13, 9), (1, 1), (0.5, 0.5))


@pytest.mark.parametrize("auto_pad, begin", [("SAME_UPPER", 1), ("SAME_LOWER", 2),
                                             ("VALID", 0)])
def test_auto_pad_begin_padding_from_shapes(auto_pad, begin):
    # in 7, k4 s2. SAME: out ⌈7/2⌉ = 4, total pad (4−1)·2 + 4 − 7 = 3: UPPER puts 1 at the
    # start (the odd pixel at the end), LOWER 2. VALID: 0. start = 0.5 + (1.5 − begin)·1.
    out = 2 if auto_pad == "VALID" else 4   # VALID: ⌊(7−4)/2⌋+1 = 2
    g = onnx_graph([node("Conv", ["x", "w"], ["y"], kernel_shape=[4, 4], strides=[2, 2],
                         auto_pad=auto_pad)],
                   [1, 1, 7, 7], "y", [1, 1, out, out], [weight("w", 1, 1, 4, 4)])
    assert by_name(g)["y"] == square(4, 2, 0.5 + 1.5 - begin)


def test_branch_add_takes_the_wider_field_and_the_hull_when_misaligned():
    # x → conv k3 p1 (rf 3, start 0.5) ; x → conv k1 (rf 1, start 0.5); Add → rf max = 3.
    # Then two misaligned k2 branches off the sum: pads (1 begin, 0 end) gives rf 3 + 1 = 4,
    # start 0.5 + (0.5 − 1) = 0.0; pads (0, 1) rf 4, start 1.0. Output 0 of their sum reads
    # the union of the two fields, wider than either (the max would say 4).
    g = onnx_graph([node("Conv", ["x", "w3"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                    node("Conv", ["x", "w1"], ["b"], kernel_shape=[1, 1]),
                    node("Add", ["a", "b"], ["s"]),
                    node("Conv", ["s", "w2"], ["l"], kernel_shape=[2, 2], pads=[1, 1, 0, 0]),
                    node("Conv", ["s", "w2"], ["r"], kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
                    node("Add", ["l", "r"], ["y"])],
                   [1, 1, 6, 6], "y", [1, 1, 6, 6],
                   [weight("w3", 1, 1, 3, 3), weight("w1", 1, 1, 1, 1), weight("w2", 1, 1, 2, 2)])
    f = by_name(g)
    assert f["s"] == square(3, 1, 0.5)
    assert f["l"] == square(4, 1, 0.0)   # 3 + 1·1; 0.5 + (0.5 − 1)·1
    assert f["r"] == square(4, 1, 1.0)
    # union of [0 − 1.5, 0 + 1.5] and [1 − 1.5, 1 + 1.5] = [−1.5, 2.5]: rf 5, centre 0.5
    assert f["y"] == square(5, 1, 0.5)


def test_chain_ends_at_global_pool_flatten_gemm_and_resize():
    g = onnx_graph([node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                    node("Resize", ["c", "", "scales"], ["up"], mode="nearest"),
                    node("Relu", ["up"], ["ru"]),
                    node("Add", ["c", "c"], ["c2"]),
                    node("GlobalAveragePool", ["c2"], ["gap"]),
                    node("Flatten", ["gap"], ["fl"]),
                    node("Gemm", ["fl", "wf"], ["y"], transB=1)],
                   [1, 1, 4, 4], "y", [1, 2],
                   [weight("w", 1, 1, 3, 3), ("scales", np.array([1, 1, 2, 2], np.float32)),
                    weight("wf", 2, 1)])
    f = by_name(g)
    assert set(f) == {"c", "c2"}  # Resize (and its consumer), GAP, Flatten, Gemm: no entry
    assert f["c2"] == f["c"] == square(3, 1, 0.5)


def test_conv_transpose_jump_divides_or_is_undefined():
    # x → ConvT s2 at jump 1: the jump would be 1/2 pixel — left undefined.
    # x → conv k2 s2 (rf 2, j 2, start 0.5 + 0.5 = 1.0) → ConvT k2 s2: every output reads one
    # input element (span ⌊1/2⌋ = 0): rf 2, j 1, start 1.0 + (0 − 0.5)·1 = 0.5 — the grid of
    # the input again. ConvT k4 s2 p1 instead: two inputs per output (span ⌊3/2⌋ = 1):
    # rf 2 + 1·2 = 4, start 1.0 + (1 − 1.5)·1 = 0.5.
    g = onnx_graph([node("ConvTranspose", ["x", "wt"], ["u0"], kernel_shape=[2, 2],
                         strides=[2, 2]),
                    node("Conv", ["x", "w"], ["d"], kernel_shape=[2, 2], strides=[2, 2]),
                    node("ConvTranspose", ["d", "wt"], ["u"], kernel_shape=[2, 2],
                         strides=[2, 2]),
                    node("ConvTranspose", ["d", "wt4"], ["y"], kernel_shape=[4, 4],
                         strides=[2, 2], pads=[1, 1, 1, 1])],
                   [1, 1, 8, 8], "y", [1, 1, 8, 8],
                   [weight("wt", 1, 1, 2, 2), weight("w", 1, 1, 2, 2), weight("wt4", 1, 1, 4, 4)])
    f = by_name(g)
    assert "u0" not in f
    assert f["d"] == square(2, 2, 1.0)
    assert f["u"] == square(2, 1, 0.5)
    assert f["y"] == square(4, 1, 0.5)


def test_mnist_net_both_frontends():
    # conv5: rf 5, j 1, start 0.5 + 2 = 2.5; pool2: rf 6, j 2, start 3.0;
    # conv5: rf 6 + 4·2 = 14, j 2, start 3 + 2·2 = 7.0; pool2: rf 14 + 1·2 = 16, j 4, start 8.0
    want = [square(5, 1, 2.5), square(6, 2, 3.0), square(14, 2, 7.0), square(16, 4, 8.0)]
    for exporter in ("onnx", "fx"):
        g = load_graph("zoo:mnist_net", LoadOptions(exporter=exporter))
        assert windowed(g) == want, exporter
        assert is_cnn(g)


def test_resnet18_both_frontends_and_final_field_435():
    # conv1 k7 s2: rf 7, j 2; maxpool k3 s2: 7 + 2·2 = 11, j 4;
    # layer1: 4 convs k3 at j 4: 11 + 4·8 = 43;
    # layer2: k3 s2 at j 4: 43 + 8 = 51, j 8; 3 more: 51 + 3·16 = 99;
    # layer3: 99 + 16 = 115, j 16; + 3·32 = 211;  layer4: 211 + 32 = 243, j 32; + 3·64 = 435.
    # Every pad is (k−1)/2 and k'−1 even, so start stays 0.5; the 1×1 s2 shortcuts are centred
    # on the same pixels, so each Add takes the main path's field.
    fields = {}
    for exporter in ("onnx", "fx"):
        g = load_graph("zoo:resnet18", LoadOptions(exporter=exporter))
        w = windowed(g)
        assert w[-1] == square(435, 32, 0.5), exporter
        last = max(receptive_fields(g))
        assert g.nodes[last].op in ("Relu", "aten.relu.default")  # then the global pool
        fields[exporter] = sorted((f.rf, f.jump, f.start) for f in w)
    assert fields["onnx"] == fields["fx"]
    assert len(fields["onnx"]) == 20 + 1  # 17 convs + 3 shortcuts + the max pool


def test_resnet50_torchvision_layout():
    # torchvision's stride sits on the first bottleneck's 3×3 of each stage (v1.5):
    # 11 after the stem; layer1 3·8 → 35; layer2 8 (s2) → 43, j 8, + 3·16 → 91;
    # layer3 16 → 107, j 16, + 5·32 → 267; layer4 32 → 299, j 32, + 2·64 → 427.
    # (Araujo et al.'s 483 for resnet_v1_50 is TF-slim's layout, the stride on each stage's
    # *last* unit: 3 units at j 4 … → 483; the same recurrence, a different network.)
    g = load_graph("zoo:resnet50")
    assert windowed(g)[-1] == square(427, 32, 0.5)


def test_vgg16_matches_the_published_table():
    # Araujo et al., "Computing Receptive Fields of Convolutional Neural Networks" (Distill
    # 2019) and github.com/google-research/receptive_field: vgg_16 — receptive field 212,
    # effective stride 32, effective padding 90. Their centre of feature 0 (pixel i at i) is
    # −90 + (212−1)/2 = 15.5, i.e. 16.0 in ours (pixel i centred at i + 0.5).
    # By hand: convs k3 p1 add 2·j, pools k2 s2 add j and move start by j/2:
    # 5 → 6 (j2) → 14 → 16 (j4) → 40 → 44 (j8) → 92 → 100 (j16) → 196 → 212 (j32).
    g = load_graph("zoo:vgg16")
    w = windowed(g)
    pool5 = next(f for f in w if f.jump == (32, 32))
    assert pool5 == square(212, 32, 16.0)
    assert pool5.start[0] - 0.5 == -90 + (212 - 1) / 2


def test_unet_concat_and_conv_transpose_realign():
    # down: 3, 5 | pool 6 (j2) | 10, 14 | pool 16 (j4) | 24, 32 | pool 36 (j8) | 52, 68.
    # ConvT k2 s2 keeps rf (span 0), j 8 → 4, start 4.0 − 0.5·4 = 2.0 = the skip's start, so
    # the concat takes max(68, 32) = 68; 76, 84 | ConvT j2, start 1.0 | 88, 92 | ConvT j1,
    # start 0.5 | 94, 96 | head 1×1: 96.
    for exporter in ("onnx", "fx"):
        g = load_graph("zoo:unet", LoadOptions(exporter=exporter))
        w = windowed(g)
        assert w[-1] == square(96, 1, 0.5), exporter
        assert [f.rf[0] for f in w if f.jump == (4, 4) and f.rf[0] > 60] == [68, 76, 84]


def test_gpt2_is_not_a_cnn():
    g = load_graph("zoo:gpt2")
    assert not is_cnn(g)
    assert receptive_fields(g) == {}


# --- against reality: the gradient of one output element is non-zero exactly on its field ---

class Net(nn.Module):
    """Stride, padding, dilation, average pooling, an explicit pad and a residual add."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 2, 3, stride=2, padding=0, bias=False)
        self.c2 = nn.Conv2d(2, 2, 3, padding=2, dilation=2, bias=False)
        self.pad = nn.ZeroPad2d((2, 0, 1, 0))  # (left, right, top, bottom)
        self.pool = nn.AvgPool2d(2, stride=2)
        self.c3 = nn.Conv2d(2, 2, (3, 5), padding=(1, 2), bias=False)
        self.c4 = nn.Conv2d(2, 2, 1, bias=False)
        for c in (self.c1, self.c2, self.c3, self.c4):
            nn.init.constant_(c.weight, 1.0)  # positive: no cancellation in the gradient

    def forward(self, x):
        h = self.pool(self.pad(torch.relu(self.c2(self.c1(x)))))
        return self.c3(h) + self.c4(h)


def gradient_box(net, shape, index):
    """Per spatial axis, (first, last) input pixel with a non-zero gradient of y[0, 0, *index]."""
    x = torch.ones(shape, requires_grad=True)
    net(x)[(0, 0, *index)].backward()
    nz = x.grad[0].abs().sum(0).nonzero()
    return [(int(nz[:, a].min()), int(nz[:, a].max())) for a in range(nz.shape[1])]


def field_box(f: Field, index, size):
    # output n is centred at start + n·jump; pixel i's centre is i + 0.5.
    box = []
    for a, n in enumerate(index):
        c = f.start[a] + n * f.jump[a] - 0.5
        half = (f.rf[a] - 1) / 2
        box.append((max(0, round(c - half)), min(size[a] - 1, round(c + half))))
    return box


def test_fields_match_the_gradient_of_a_real_network():
    shape = (1, 1, 64, 64)
    net = Net().eval()
    g = load_graph(net, example_inputs=(torch.ones(shape),))
    f = receptive_fields(g)
    out = f[next(n.index for n in g.nodes if g.outputs[0] in n.outputs)]
    # By hand: c1 k3 s2 p0: rf 3, j 2, start 1.5; c2 k'5 p2: rf 3 + 4·2 = 11, start 1.5;
    # pad (top 1, left 2): start H 1.5 − 2 = −0.5, W 1.5 − 4 = −2.5; pool k2 s2: rf 13, j 4,
    # start H 0.5, W −1.5; c3 (3, 5) p (1, 2): rf H 13 + 8 = 21, W 13 + 16 = 29; start kept;
    # the 1×1 branch is centred the same, so the add keeps c3's field.
    assert out == Field((21, 29), (4, 4), (0.5, -1.5))
    # (6, 8) lies inside the image on both axes; (0, 0) and (5, 2) are clipped at the border.
    for index in [(6, 8), (5, 2), (0, 0)]:
        assert gradient_box(net, shape, index) == field_box(out, index, shape[2:]), index


def test_conv_transpose_field_sizes_and_grid_against_the_gradient():
    # conv k2 s2: rf 2, j 2, start 1.0; ConvT k4 s2 p1: span ⌊3/2⌋ = 1 → rf 2 + 1·2 = 4, j 1,
    # start 1.0 + (1 − 1.5)·1 = 0.5. Every output reads two adjacent conv outputs = 4 pixels;
    # its real centre alternates ±0.5 pixel (a quarter of the input jump) around the grid
    # position start + y·jump, which is where the upsampled pixel sits.
    net = nn.Sequential(nn.Conv2d(1, 1, 2, stride=2, bias=False),
                        nn.ConvTranspose2d(1, 1, 4, stride=2, padding=1, bias=False))
    for m in net:
        nn.init.constant_(m.weight, 1.0)
    shape = (1, 1, 32, 32)
    g = load_graph(net, example_inputs=(torch.ones(shape),))
    f = windowed(g)[-1]
    assert f == square(4, 1, 0.5)
    for y in range(4, 12):
        (lo, hi), _ = gradient_box(net, shape, (y, y))
        assert hi - lo + 1 == f.rf[0]
        assert abs((lo + hi + 1) / 2 - (f.start[0] + y * f.jump[0])) <= 0.5


def test_report_columns_through_the_cli(capsys):
    """The table/CSV/JSON columns of a CNN, none for a transformer."""
    import csv
    import io
    import json

    from graphcost.analyzer.cli.main import main

    assert main(["zoo:mnist_net", "--format", "csv"]) == 0
    rows = {r["index"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    # conv1 k5 → rf 5; pool k2 s2 → 5 + 1 = 6, jump 2; conv2 k5 → 6 + 4·2 = 14; pool → 14 + 2 = 16
    assert [(rows[i]["receptive_field"], rows[i]["jump"]) for i in "0134"] == \
        [("5", "1"), ("6", "2"), ("14", "2"), ("16", "4")]
    assert rows["8"]["receptive_field"] == ""  # fc1: the spatial chain ended at the Reshape
    assert main(["zoo:gpt2", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["receptive_field"] == []
