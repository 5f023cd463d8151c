"""Receptive fields of conv/pool chains: size, jump and start per spatial axis.

The recurrence of Dumoulin & Visin's convolution arithmetic as written up in "A guide to
receptive field arithmetic for CNNs" (Dang Ha The Hien, 2017) and Araujo et al., "Computing
Receptive Fields of Convolutional Neural Networks" (Distill, 2019). Per spatial axis, with the
effective kernel k' = d·(k−1)+1, stride s and begin padding p:

    rf_out    = rf_in + (k'−1)·j_in
    j_out     = j_in·s
    start_out = start_in + ((k'−1)/2 − p)·j_in

Coordinates are the guide's: a graph input (rank ≥ 3, NC… layout) has rf=1, jump=1 and
start=0.5, i.e. pixel i spans [i, i+1) and ``start`` is the centre of output element 0's field
(negative when it lies in the padding). Output element n is centred at start + n·jump and covers
the input pixels whose centres lie within ±(rf−1)/2 of it.

Choices — each op's role is its rule's ``rf`` (passes/costs/registry.py); an op with none
*ends* the chain (the node gets no entry):
* pass-through ("pointwise") — elementwise ops and activations,
  BatchNorm, InstanceNorm/GroupNorm/LRN (statistics-based norms treated as pointwise, as the
  literature does), Dropout/Identity/Cast/clone, reshapes that leave the shape unchanged, a
  Softmax over the channel axis, provided the spatial dims are unchanged; torch's constant pad
  (``aten.constant_pad_nd``, whose amounts are attributes) moves start by −pad·j;
* several spatial inputs (Add, Mul, Where, Concat not on a spatial axis) — the field of output
  element 0 is the hull of the inputs' fields per axis: the max rf when the centres agree (every
  ResNet join), wider when they do not; the larger jump is kept if jumps disagree. Inputs whose
  spatial dims are all 1 (a squeeze-excitation gate, a per-channel scale) and weights are
  ignored; a spatial activation input *without* a field (after a Resize) makes the output
  undefined;
* ConvTranspose — the output grid refines the input's: j_out = j_in/s (undefined unless s
  divides j_in), start_out = start_in + (p − (k'−1)/2)·j_out, and rf_out = rf_in + span·j_in
  where span = (d/g)·⌊(k−1)·g/s⌋, g = gcd(d, s), is how many input elements apart two
  taps reaching one output can be (k2 s2 → span 0: each output sees one input element). ``start``
  and ``jump`` place the output grid in the input (the upsampling convention, so a UNet's
  decoder lines up with its skips); the real field of output n may sit off start + n·jump by
  a fraction of j_in that alternates with n's phase (±j_in/4 for k2 s2 and k4 s2 p1), and no
  output's field exceeds rf;
* adaptive pools whose input size divides evenly into a non-1 output are pools with
  k = s = in/out (VGG's 7×7 → 7×7 is the identity, as its ONNX export's AveragePool k1 s1);
* global pools (GlobalAveragePool, adaptive pools to 1, ``aten.mean`` over the spatial axes),
  Flatten/Reshape that change the shape, Gemm/MatMul, Resize/Upsample, Pad with tensor pads,
  Slice, Transpose end the chain: their outputs have no spatial grid left, or one this pass
  does not follow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import overload

from ..costs.registry import WINDOWS, lookup
from ..ir import Dim, Graph, Node, ValueKind

INPUT_START = 0.5  # centre of input pixel 0, the guide's convention


@dataclass(frozen=True)
class Field:
    rf: tuple[int, ...]       # receptive field size per spatial axis (H, W, …) in input pixels
    jump: tuple[int, ...]     # input pixels between adjacent outputs (cumulative stride)
    start: tuple[float, ...]  # input coordinate of the centre of output element 0's field


def receptive_fields(graph: Graph) -> dict[int, Field]:
    """node index -> field of its first output, for nodes on a spatial path from an input."""
    by_value: dict[str, Field] = {}
    for name in graph.inputs:
        spec = graph.spec(name)
        if spec is not None and spec.shape is not None and len(spec.shape) >= 3:
            n = len(spec.shape) - 2
            by_value[name] = Field((1,) * n, (1,) * n, (INPUT_START,) * n)
    out: dict[int, Field] = {}
    for node in graph.nodes:
        if not any(i in by_value for i in node.inputs):
            continue
        field = _node_field(node, graph, by_value)
        if field is None:
            continue
        out[node.index] = field
        rank = len(field.rf) + 2
        for name in node.outputs:  # every output on the same grid (Split on channels, indices)
            spec = graph.spec(name) if name else None
            if spec is not None and spec.shape is not None and len(spec.shape) == rank:
                by_value[name] = field
    return out


@dataclass(frozen=True)
class NodeField:
    """A node's receptive field (of its first output): the report's ``receptive_field`` rows."""
    index: int
    rf: tuple[int, ...]
    jump: tuple[int, ...]
    start: tuple[float, ...]


def cnn_fields(graph: Graph) -> tuple[NodeField, ...]:
    """The report's receptive fields: every node's, when the graph is a CNN (some Conv/pool
    node has a field), else none."""
    found = receptive_fields(graph)
    if not is_cnn(graph, found):
        return ()
    return tuple(NodeField(i, f.rf, f.jump, f.start) for i, f in sorted(found.items()))


def is_cnn(graph: Graph, fields: dict[int, Field] | None = None) -> bool:
    """True when some Conv/pool node has a known field (the table shows the field columns);
    pass ``fields`` when receptive_fields(graph) has already been computed."""
    if fields is None:
        fields = receptive_fields(graph)
    return any(_role(graph.nodes[i]) in WINDOWS for i in fields)


def _role(node: Node) -> str | None:
    r = lookup(node.op)
    return r.rf if r is not None else None


def _node_field(node: Node, graph: Graph, by_value: dict[str, Field]) -> Field | None:
    r = lookup(node.op)
    if r is None or r.rf is None:
        return None
    role = r.rf
    if role in WINDOWS:
        f = by_value.get(node.inputs[0])
        if f is None or not _rank_is(graph, node.outputs[0], len(f.rf)):
            return None
        if role == "adaptive_pool":
            return _adaptive(node, graph, f)
        if role == "conv_transpose" or (role == "conv" and r.attr(node.attrs, "transposed")):
            return _transposed(node, graph, f, r)
        w = _window(node, graph, len(f.rf), r)
        return None if w is None else _apply(f, *w)
    if role == "reshape":
        same = graph.spec(node.inputs[0]) == graph.spec(node.outputs[0])
        return by_value.get(node.inputs[0]) if same else None
    if role == "softmax":
        f = by_value.get(node.inputs[0])
        axis = r.attr(node.attrs, "axis", -1)
        return f if f is not None and axis in (1, -len(f.rf) - 1) else None
    if role == "concat":
        axis = r.attr(node.attrs, "axis", 0)
        f = next((by_value[i] for i in node.inputs if i in by_value), None)
        if f is None or axis not in (0, 1, -len(f.rf) - 2, -len(f.rf) - 1):
            return None
        return _merge(node, graph, by_value)
    if role == "constant_pad":
        return _constant_pad(node, by_value.get(node.inputs[0]))
    return _merge(node, graph, by_value)  # pointwise


def _apply(f: Field, k, s, d, p) -> Field:
    rf, jump, start = [], [], []
    for a in range(len(f.rf)):
        ke = d[a] * (k[a] - 1) + 1
        rf.append(f.rf[a] + (ke - 1) * f.jump[a])
        jump.append(f.jump[a] * s[a])
        start.append(f.start[a] + ((ke - 1) / 2 - p[a]) * f.jump[a])
    return Field(tuple(rf), tuple(jump), tuple(start))


def _per_axis(value, n: int, default: int) -> tuple[int, ...] | None:
    """aten gives one size for all axes or one per axis; ONNX one per axis."""
    if value is None or (isinstance(value, (tuple, list)) and len(value) == 0):
        return (default,) * n
    if isinstance(value, int):
        return (value,) * n
    vals = tuple(int(v) for v in value)
    return vals * n if len(vals) == 1 else vals[:n] if len(vals) >= n else None


def _window(node: Node, graph: Graph, n: int, r):
    """(kernel, stride, dilation, begin padding) per spatial axis, ONNX or aten attrs (the
    rule's ``attr_names`` spell them in both)."""
    a = node.attrs
    k = r.attr(a, "kernel")
    if not k and r.rf == "conv":  # a convolution's window is its weight's spatial shape
        w = graph.spec(node.inputs[1]) if len(node.inputs) > 1 else None
        if w is None or w.shape is None or len(w.shape) != n + 2:
            return None
        k = w.shape[2:]
    k = _per_axis(k, n, 1)
    if k is None or not all(isinstance(v, int) for v in k):
        return None
    s = _per_axis(r.attr(a, "strides"), n, 1)
    if r.rf == "pool" and "kernel_size" in a and not a.get("stride"):
        s = k  # aten pools: an empty/omitted stride means stride = kernel
    d = _per_axis(r.attr(a, "dilations"), n, 1)
    p = _begin_padding(node, graph, n, k, s, d, r)
    if None in (s, d, p):
        return None
    return k, s, d, p


def _begin_padding(node: Node, graph: Graph, n: int, k, s, d, r):
    a = node.attrs
    auto = r.attr(a, "auto_pad", "NOTSET")
    pad = r.attr(a, "pads")
    if isinstance(pad, str):  # aten conv2d.padding: "same" puts the odd pixel at the end
        auto = {"same": "SAME_UPPER", "valid": "VALID"}.get(pad, pad)
        if auto == "SAME_UPPER":
            return tuple((d[i] * (k[i] - 1)) // 2 for i in range(n))
    if auto == "VALID":
        return (0,) * n
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        # From the shapes: total = (out−1)·s + k' − in, the odd pixel at the end for UPPER.
        ins, outs = _spatial(graph, node.inputs[0], n), _spatial(graph, node.outputs[0], n)
        if ins is None or outs is None:
            return None
        begin = []
        for i in range(n):
            total = max(0, (outs[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 - ins[i])
            begin.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
        return tuple(begin)
    if "pads" in a:  # ONNX: (b1 … bn, e1 … en)
        return tuple(int(v) for v in a["pads"][:n]) if len(a["pads"]) >= n else None
    return _per_axis(pad, n, 0)


def _transposed(node: Node, graph: Graph, f: Field, r) -> Field | None:
    n = len(f.rf)
    a = node.attrs
    inputs = node.inputs  # a local: the checker narrows its length, not node.inputs'
    w = graph.spec(inputs[1]) if len(inputs) > 1 else None
    k = r.attr(a, "kernel") or (w.shape[2:] if w is not None and w.shape is not None
                                and len(w.shape) == n + 2 else None)
    k = _per_axis(k, n, 1) if k else None
    s = _per_axis(r.attr(a, "strides"), n, 1)
    d = _per_axis(r.attr(a, "dilations"), n, 1)
    if k is None or s is None or d is None or not all(isinstance(v, int) for v in k):
        return None
    auto = r.attr(a, "auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER") or "output_shape" in a:
        # ONNX's rule: total = s·(in−1) + output_padding + k' − out; SAME_UPPER puts
        # total//2 at the start, otherwise the larger half.
        ins, outs = _spatial(graph, node.inputs[0], n), _spatial(graph, node.outputs[0], n)
        op_ = _per_axis(r.attr(a, "output_padding"), n, 0)
        if ins is None or outs is None or op_ is None:
            return None
        tot = [s[i] * (ins[i] - 1) + op_[i] + d[i] * (k[i] - 1) + 1 - outs[i] for i in range(n)]
        p = tuple(t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in tot)
    elif auto == "VALID":
        p = (0,) * n
    else:
        pads = r.attr(a, "pads")
        p = _per_axis(pads[:n] if "pads" in a else pads, n, 0)
    if p is None or any(f.jump[i] % s[i] for i in range(n)):
        return None  # a jump that is not a whole number of input pixels: left undefined
    rf, jump, start = [], [], []
    for i in range(n):
        g = math.gcd(d[i], s[i])
        span = (d[i] // g) * ((k[i] - 1) * g // s[i])
        j = f.jump[i] // s[i]
        rf.append(f.rf[i] + span * f.jump[i])
        jump.append(j)
        start.append(f.start[i] + (p[i] - d[i] * (k[i] - 1) / 2) * j)
    return Field(tuple(rf), tuple(jump), tuple(start))


def _adaptive(node: Node, graph: Graph, f: Field) -> Field | None:
    n = len(f.rf)
    ins, outs = _spatial(graph, node.inputs[0], n), _spatial(graph, node.outputs[0], n)
    if ins is None or outs is None or all(o == 1 for o in outs):
        return None  # global: no grid left
    if any(o <= 0 or i % o for i, o in zip(ins, outs)):
        return None  # uneven windows: not one kernel/stride
    k = tuple(i // o for i, o in zip(ins, outs))
    return _apply(f, k, k, (1,) * n, (0,) * n)


def _constant_pad(node: Node, f: Field | None) -> Field | None:
    # torch's pad list runs from the last axis: (begin_last, end_last, begin_prev, …).
    pad = node.attrs.get("pad")
    if f is None or not pad or len(pad) % 2 or len(pad) // 2 > len(f.rf):
        return None
    n = len(f.rf)
    begin = [0] * n
    for i in range(len(pad) // 2):
        begin[n - 1 - i] = int(pad[2 * i])
    return Field(f.rf, f.jump, tuple(f.start[a] - begin[a] * f.jump[a] for a in range(n)))


def _merge(node: Node, graph: Graph, by_value: dict[str, Field]) -> Field | None:
    fields = []
    n = next(len(by_value[i].rf) for i in node.inputs if i in by_value)
    out_sp = _spatial(graph, node.outputs[0], n, concrete=False)
    if out_sp is None:
        return None
    for name in node.inputs:
        if name in by_value:
            if len(by_value[name].rf) != n or _spatial(graph, name, n, concrete=False) != out_sp:
                return None
            fields.append(by_value[name])
            continue
        v = graph.values.get(name) if name else None
        if v is None or v.kind not in (ValueKind.ACTIVATION, ValueKind.INPUT):
            continue  # weights, constants
        sp = v.spec.shape
        if sp is not None and len(sp) == n + 2 and any(d != 1 for d in sp[2:]):
            return None  # a spatial activation whose field is unknown
    if len(fields) == 1:
        return fields[0]
    rf, jump, start = [], [], []
    for a in range(n):
        lo = min(f.start[a] - (f.rf[a] - 1) / 2 for f in fields)
        hi = max(f.start[a] + (f.rf[a] - 1) / 2 for f in fields)
        rf.append(round(hi - lo) + 1)
        jump.append(max(f.jump[a] for f in fields))
        start.append((lo + hi) / 2)
    return Field(tuple(rf), tuple(jump), tuple(start))


def _rank_is(graph: Graph, name: str, n: int) -> bool:
    spec = graph.spec(name)
    return spec is not None and spec.shape is not None and len(spec.shape) == n + 2


@overload  # concrete (the default): every size is an int, else None
def _spatial(graph: Graph, name: str, n: int) -> tuple[int, ...] | None: ...
@overload
def _spatial(graph: Graph, name: str, n: int, concrete: bool) -> tuple[Dim, ...] | None: ...


def _spatial(graph: Graph, name: str, n: int, concrete: bool = True) -> tuple[Dim, ...] | None:
    spec = graph.spec(name)
    if spec is None or spec.shape is None or len(spec.shape) != n + 2:
        return None
    sp = tuple(spec.shape[2:])
    if concrete and not all(isinstance(v, int) for v in sp):
        return None
    return sp
