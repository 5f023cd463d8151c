"""A deterministic ONNX fuzzer: mutated copies of real exports, for tests/test_fuzz.py.

``generate(bases, counts, seed)`` yields (base name, mutation label, file bytes). Each file
gets one to three mutations drawn from MUTATIONS by a random.Random seeded from (seed, base,
index), so the same arguments always give the same files. Mutations work at three levels:
raw bytes (truncation, byte flips inside the nodes' encoding), protobuf fields (dims, types,
attributes, names, node order, opsets, initializer sizes …) and graph structure (cycles,
undefined inputs, a name written twice).
"""
from __future__ import annotations

import random
import zlib
from typing import Callable, Iterator

import onnx
from onnx import AttributeProto, TensorProto, helper

HUGE = 2 ** 62


def _node(rng: random.Random, m: onnx.ModelProto, with_attrs: bool = False):
    nodes = [n for n in m.graph.node if n.attribute] if with_attrs else list(m.graph.node)
    return rng.choice(nodes) if nodes else None


def _data_inputs(m: onnx.ModelProto):
    inits = {t.name for t in m.graph.initializer}
    return [vi for vi in m.graph.input if vi.name not in inits]


# ---- protobuf-level mutations: each edits ``m`` in place and returns its label ----------------

def dim_value(rng, m):
    dims = [d for vi in [*_data_inputs(m), *m.graph.output] for d in vi.type.tensor_type.shape.dim]
    if not dims:
        return "dim_value:none"
    v = rng.choice([-1, -3, 0, HUGE, 2 ** 63 - 1, 7])
    rng.choice(dims).dim_value = v
    return f"dim_value:{v}"


def dim_param(rng, m):
    dims = [d for vi in _data_inputs(m) for d in vi.type.tensor_type.shape.dim]
    if not dims:
        return "dim_param:none"
    rng.choice(dims).dim_param = rng.choice(["ba\x1b[31mtch", "se\nq", "", "x" * 300])
    return "dim_param"


def init_dims(rng, m):
    if not m.graph.initializer:
        return "init_dims:none"
    t = rng.choice(m.graph.initializer)
    if t.dims:
        t.dims[rng.randrange(len(t.dims))] = rng.choice([-2, 0, HUGE, 3])
    else:
        t.dims.append(rng.choice([-2, 2]))
    return "init_dims"


def raw_size(rng, m):
    inits = [t for t in m.graph.initializer if t.HasField("raw_data") and t.raw_data]
    if not inits:
        return "raw_size:none"
    t = rng.choice(inits)
    cut = rng.choice([1, 3, 8])
    t.raw_data = t.raw_data[:-cut] if rng.random() < 0.6 else t.raw_data + b"\0" * cut
    return "raw_size"


def elem_type(rng, m):
    v = rng.choice([999, 0, TensorProto.STRING, TensorProto.INT8, -1])
    if rng.random() < 0.5 and m.graph.initializer:
        rng.choice(m.graph.initializer).data_type = v
        return f"elem_type:init:{v}"
    vis = [*_data_inputs(m), *m.graph.output]
    rng.choice(vis).type.tensor_type.elem_type = v
    return f"elem_type:value:{v}"


def attr_type(rng, m):
    n = _node(rng, m, with_attrs=True)
    if n is None:
        return "attr_type:none"
    a = rng.choice(n.attribute)
    name = a.name
    new = rng.choice([helper.make_attribute(name, "oops"), helper.make_attribute(name, 1.5),
                      helper.make_attribute(name, [1, 2, 3]), helper.make_attribute(name, 4)])
    a.CopyFrom(new)
    return f"attr_type:{n.op_type}.{name}"


def attr_flip_type(rng, m):
    n = _node(rng, m, with_attrs=True)
    if n is None:
        return "attr_flip_type:none"
    a = rng.choice(n.attribute)
    a.type = rng.choice([AttributeProto.STRING, AttributeProto.GRAPH, 0, AttributeProto.FLOATS])
    return f"attr_flip_type:{n.op_type}"


def attr_remove(rng, m):
    n = _node(rng, m, with_attrs=True)
    if n is None:
        return "attr_remove:none"
    del n.attribute[rng.randrange(len(n.attribute))]
    return f"attr_remove:{n.op_type}"


def attr_add(rng, m):
    n = _node(rng, m)
    n.attribute.append(helper.make_attribute(rng.choice(["bogus", "axis", "group"]),
                                             rng.choice([0, -5, 3, 10 ** 9])))
    return f"attr_add:{n.op_type}"


def input_undefined(rng, m):
    n = _node(rng, m)
    if not n.input:
        return "input_undefined:none"
    n.input[rng.randrange(len(n.input))] = f"ghost_{rng.randrange(100)}"
    return "input_undefined"


def input_count(rng, m):
    n = _node(rng, m)
    if n.input and rng.random() < 0.5:
        del n.input[-1]
        return f"input_drop:{n.op_type}"
    n.input.append(rng.choice([n.input[0] if n.input else "", ""]))
    return f"input_add:{n.op_type}"


def output_dup(rng, m):
    nodes = list(m.graph.node)
    if len(nodes) < 2:
        return "output_dup:none"
    a, b = rng.sample(nodes, 2)
    if rng.random() < 0.3 and _data_inputs(m):
        a.output[0] = _data_inputs(m)[0].name
        return "output_writes_input"
    a.output[0] = b.output[0]
    return "output_dup"


def cycle(rng, m):
    nodes = list(m.graph.node)
    i = rng.randrange(len(nodes))
    if rng.random() < 0.3 or i == len(nodes) - 1:
        if nodes[i].input:
            nodes[i].input[0] = nodes[i].output[0]  # a self-loop
        return "cycle:self"
    # node i reads the output of a later node that reads node i's output
    outs = set(nodes[i].output)
    for j in range(i + 1, len(nodes)):
        if outs & set(nodes[j].input) and nodes[i].input:
            nodes[i].input[0] = nodes[j].output[0]
            return "cycle"
    nodes[i].input.append(nodes[-1].output[0])
    return "cycle:to_last"


def shuffle(rng, m):
    nodes = [onnx.NodeProto() for _ in m.graph.node]
    for copy, n in zip(nodes, m.graph.node):
        copy.CopyFrom(n)
    rng.shuffle(nodes)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return "shuffle"


def remove_node(rng, m):
    if len(m.graph.node) > 1:
        del m.graph.node[rng.randrange(len(m.graph.node))]
    return "remove_node"


def op_type(rng, m):
    n = _node(rng, m)
    n.op_type = rng.choice(["Frobnicate", "Add", "Conv", "Reshape", "Split", "Loop", "Scan",
                            "Resize", "NonZero", ""])
    return f"op_type:{n.op_type}"


def domain(rng, m):
    n = _node(rng, m)
    n.domain = rng.choice(["com.unknown", "ai.onnx.ml", "ai.onnx"])
    return f"domain:{n.domain}"


def opset(rng, m):
    v = rng.choice([0, -1, 99, 1, 7, 11, 21])
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = v
    return f"opset:{v}"


def ir_version(rng, m):
    m.ir_version = rng.choice([0, 1, 3, 99, -4])
    return f"ir_version:{m.ir_version}"


def init_dup(rng, m):
    if not m.graph.initializer:
        return "init_dup:none"
    m.graph.initializer.append(rng.choice(m.graph.initializer))
    return "init_dup"


def graph_output(rng, m):
    if rng.random() < 0.5 and len(m.graph.output) > 0:
        m.graph.output[0].name = "nowhere"
        return "graph_output:undefined"
    del m.graph.output[:]
    return "graph_output:none"


def external_constant(rng, m):
    """A Constant whose value lives in 'secret.txt' (never to be read)."""
    t = TensorProto(name="ext", data_type=TensorProto.INT64, dims=[2])
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=rng.choice(["secret.txt", "../../etc/passwd"]))
    n = _node(rng, m)
    c = helper.make_node("Constant", [], ["ext_value"], name="ext", value=t)
    m.graph.node.insert(0, c)
    if n.input:
        n.input[-1] = "ext_value"
    return "external_constant"


def constant_of_shape(rng, m):
    """A tiny file asking for a gigantic tensor, fed to NonZero."""
    big = helper.make_tensor("big_dims", TensorProto.INT64, [2], [10 ** 6, 10 ** 6])
    m.graph.initializer.append(big)
    m.graph.node.extend([helper.make_node("ConstantOfShape", ["big_dims"], ["cos"], name="cos"),
                         helper.make_node("NonZero", ["cos"], ["nz"], name="nz")])
    m.graph.output.append(helper.make_tensor_value_info("nz", TensorProto.INT64, None))
    return "constant_of_shape"


def wide_split(rng, m):
    """One Split with thousands of outputs (the arena planner's worst case)."""
    x = _data_inputs(m)[0].name
    outs = [f"split_{k}" for k in range(4000)]
    m.graph.node.append(helper.make_node("Flatten", [x], ["flat"], name="flat", axis=0))
    m.graph.node.append(helper.make_node("Split", ["flat"], outs, name="wide", axis=1))
    m.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                          for o in outs)
    return "wide_split"


def function_doubling(rng, m):
    """A call to a local function whose function k calls k − 1 twice: 2^(depth−1) nodes once
    inlined (tests/hostile_files.py; refused before any is made)."""
    from tests.hostile_files import doubling_functions
    depth = rng.choice([18, 24, 31])
    donor = doubling_functions(depth)
    x = _data_inputs(m)[0].name
    call = donor.graph.node[0]
    call.input[0], call.output[0], call.name = x, "doubled", "doubled"
    m.graph.node.append(call)
    m.functions.extend(donor.functions)
    m.opset_import.append(helper.make_opsetid("local", 1))
    m.graph.output.append(helper.make_tensor_value_info("doubled", TensorProto.FLOAT, None))
    return f"function_doubling:{depth}"


def many_inputs(rng, m):
    """One Sum reading a graph input tens of thousands of times."""
    n = rng.choice([10_000, 50_000])
    x = _data_inputs(m)[0].name
    m.graph.node.append(helper.make_node("Sum", [x] * n, ["wide_sum"], name="wide_sum"))
    m.graph.output.append(helper.make_tensor_value_info("wide_sum", TensorProto.FLOAT, None))
    return f"many_inputs:{n}"


def nested_trips(rng, m):
    """Loops nested ``depth`` deep around an Add of a graph input, each of 2^63 − 1 trips."""
    from tests.hostile_files import nested_loop
    depth = rng.choice([2, 8, 30])
    x = _data_inputs(m)[0]
    shape = [d.dim_value or 1 for d in x.type.tensor_type.shape.dim]  # (batch 1, the default)
    m.graph.initializer.extend([helper.make_tensor("trips", TensorProto.INT64, [], [2 ** 63 - 1]),
                                helper.make_tensor("cond", TensorProto.BOOL, [], [True])])
    m.graph.node.append(nested_loop(depth, "trips", x.name, "looped", shape=shape))
    m.graph.output.append(helper.make_tensor_value_info("looped", TensorProto.FLOAT, None))
    return f"nested_trips:{depth}"


MUTATIONS: list[Callable[[random.Random, onnx.ModelProto], str]] = [
    dim_value, dim_param, init_dims, raw_size, elem_type, attr_type, attr_flip_type,
    attr_remove, attr_add, input_undefined, input_count, output_dup, cycle, shuffle,
    remove_node, op_type, domain, opset, ir_version, init_dup, graph_output, external_constant,
    constant_of_shape, wide_split, function_doubling, many_inputs, nested_trips]


# ---- byte-level mutations -----------------------------------------------------------------

def truncate(rng: random.Random, data: bytes) -> bytes:
    return data[:rng.randrange(1, len(data))]


def flip_bytes(rng: random.Random, data: bytes, m: onnx.ModelProto) -> bytes:
    """Flips 1-6 bytes, mostly inside some node's encoding (weights are most of the file and
    flipping them changes nothing graphcost reads)."""
    out = bytearray(data)
    spans = []
    for n in rng.sample(list(m.graph.node), min(8, len(m.graph.node))):
        enc = n.SerializeToString()
        at = data.find(enc)
        if at >= 0:
            spans.append((at, at + len(enc)))
    for _ in range(rng.randint(1, 6)):
        lo, hi = rng.choice(spans) if spans and rng.random() < 0.85 else (0, len(data))
        pos = rng.randrange(lo, hi)
        out[pos] ^= rng.randrange(1, 256)
    return bytes(out)


def bad_utf8_name(rng: random.Random, m: onnx.ModelProto) -> bytes:
    n = next((n for n in m.graph.node if len(n.name) >= 3), None)
    data = m.SerializeToString()
    if n is None:
        return data
    old = n.name.encode()
    new = old[:1] + b"\xff" + old[2:]
    return data.replace(len(old).to_bytes(1, "little") + old,
                        len(new).to_bytes(1, "little") + new, 1) if len(old) < 128 else data


def mutate(base: onnx.ModelProto, rng: random.Random) -> tuple[str, bytes]:
    kind = rng.random()
    if kind < 0.08:
        return "truncate", truncate(rng, base.SerializeToString())
    if kind < 0.18:
        return "flip_bytes", flip_bytes(rng, base.SerializeToString(), base)
    if kind < 0.21:
        return "bad_utf8_name", bad_utf8_name(rng, base)
    m = onnx.ModelProto()
    m.CopyFrom(base)
    labels = [rng.choice(MUTATIONS)(rng, m) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
    return "+".join(labels), m.SerializeToString()


def generate(bases: dict[str, onnx.ModelProto], counts: dict[str, int],
             seed: int = 0) -> Iterator[tuple[str, str, bytes]]:
    for name, base in bases.items():
        for i in range(counts[name]):
            rng = random.Random(zlib.crc32(f"{seed}/{name}/{i}".encode()))
            label, data = mutate(base, rng)
            yield name, label, data
