"""Small hostile files, each built in a few milliseconds, for tests/test_hostile_budgets.py and
the hostile-case run in tests/test_fuzz.py: expansions that grow exponentially, many-input
nodes, counts beyond any device, .pt2 fields torch's deserializer iterates over or hands to
sympy.

ONNX builders return a ModelProto; ``pt2_variant`` rewrites a saved program's JSON.
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

from onnx import TensorProto, helper

OPSET = [helper.make_opsetid("", 17)]


def _model(nodes, inputs, outputs, inits=(), opsets=OPSET, functions=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=list(opsets), functions=list(functions))
    m.ir_version = 8
    return m


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def doubling_functions(depth: int, recursive: bool = False):
    """Local function f_k calls f_(k-1) twice; f_0 is one Relu: the graph's one call to
    f_(depth-1) inlines to 2^(depth-1) Relu nodes. ``recursive``: f_0 calls f_(depth-1)."""
    opsets = [*OPSET, helper.make_opsetid("local", 1)]
    first = helper.make_node("f%d" % (depth - 1), ["x"], ["y"], domain="local") if recursive \
        else helper.make_node("Relu", ["x"], ["y"])
    fs = [helper.make_function("local", "f0", ["x"], ["y"], [first], opsets)]
    for k in range(1, depth):
        fs.append(helper.make_function("local", f"f{k}", ["x"], ["y"], [
            helper.make_node(f"f{k - 1}", ["x"], ["t"], domain="local"),
            helper.make_node(f"f{k - 1}", ["t"], ["y"], domain="local")], opsets))
    call = helper.make_node(f"f{depth - 1}", ["x"], ["y"], domain="local")
    return _model([call], [_vi("x", [1, 4])], [_vi("y", [1, 4])], opsets=opsets, functions=fs)


def many_input_sum(n: int):
    """One Sum reading the same input n times (3 bytes per extra input on disk)."""
    return _model([helper.make_node("Sum", ["x"] * n, ["y"], name="sum")],
                  [_vi("x", [1, 4])], [_vi("y", [1, 4])])


def split_concat(n: int):
    """A Split into n one-float slices, all read by one Concat."""
    outs = [f"o{i}" for i in range(n)]
    return _model([helper.make_node("Split", ["x"], outs, name="split", axis=1),
                   helper.make_node("Concat", outs, ["y"], name="concat", axis=1)],
                  [_vi("x", [1, n])], [_vi("y", [1, n])])


def nested_loop(depth: int, trips: str, x: str, out: str, shape=(1, 4), level: int = 1):
    """Loop node ``level`` of ``depth`` nested ones over ``x`` (trip count: the value named
    ``trips``; condition: ``cond``), the innermost body an Add of its state with itself."""
    k = level
    if level == depth:
        inner = helper.make_node("Add", [f"v{k}", f"v{k}"], [f"w{k}"], name="add")
    else:
        inner = nested_loop(depth, trips, f"v{k}", f"w{k}", shape, level + 1)
        inner.input[1] = f"c{k}"
    shape = list(shape) if shape is not None else None
    body = helper.make_graph(
        [helper.make_node("Identity", [f"c{k}"], [f"co{k}"], name=f"cond{k}"), inner],
        f"body{k}", [_vi(f"i{k}", [], TensorProto.INT64), _vi(f"c{k}", [], TensorProto.BOOL),
                     _vi(f"v{k}", shape)],
        [_vi(f"co{k}", [], TensorProto.BOOL), _vi(f"w{k}", shape)])
    return helper.make_node("Loop", [trips, "cond", x], [out], name=f"loop{k}", body=body)


def nested_loops(depth: int, trips: int = 2 ** 63 - 1):
    """``depth`` Loops, each the body of the one outside it, each with the constant trip count
    ``trips``: the innermost Add runs trips^depth times."""
    inits = [helper.make_tensor("trips", TensorProto.INT64, [], [trips]),
             helper.make_tensor("cond", TensorProto.BOOL, [], [True])]
    return _model([nested_loop(depth, "trips", "x", "y")], [_vi("x", [1, 4])],
                  [_vi("y", [1, 4])], inits)


def huge_tile(exponent: int = 81):
    """A Tile of one float to 2^exponent elements (exponent split over the dims so that
    each dim and each count stays within int64)."""
    dims = []
    while exponent > 0:
        dims.append(2 ** min(exponent, 40))
        exponent -= min(exponent, 40)
    rank = len(dims)
    reps = helper.make_tensor("reps", TensorProto.INT64, [rank], dims)
    return _model([helper.make_node("Tile", ["x", "reps"], ["y"], name="tile")],
                  [_vi("x", [1] * rank)], [_vi("y", [f"d{i}" for i in range(rank)])], [reps])


# ---- .pt2 -------------------------------------------------------------------------------

def pt2_variant(src: Path, dst: Path, edit) -> Path:
    """Copies the archive ``src``, passing its program's JSON through ``edit(doc)``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith(".json") and "/models/" in f"/{info.filename}":
                doc = json.loads(data)
                edit(doc)
                data = json.dumps(doc).encode()
            zout.writestr(info, data)
    return dst


def symbol(i: int) -> str:
    return f"Symbol('s{i}', positive=True, integer=True)"


def first_expr(doc) -> dict:
    """The first ``as_expr`` holder in the program (a symbolic size)."""
    stack = [doc]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            if "expr_str" in obj:
                return obj
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
    raise AssertionError("no expr_str in the program")


def range_key(index: int):
    """An unbacked symbol u<index> in range_constraints: torch counts up to index."""
    return lambda doc: doc["range_constraints"].update({f"u{index}": {"min_val": 0,
                                                                       "max_val": 5}})


def expr_of(text: str):
    """One size's expression becomes ``text``."""
    return lambda doc: first_expr(doc).update(expr_str=text)


def long_max(n: int):
    """One size's expression becomes Max(s0, …, s(n-1)): sympy compares the pairs."""
    return lambda doc: first_expr(doc).update(
        expr_str="Max(" + ", ".join(symbol(i) for i in range(n)) + ")")


def shared_parameter_name(doc) -> None:
    """The second parameter takes the first one's name."""
    specs = [s for s in doc["graph_module"]["signature"]["input_specs"] if "parameter" in s]
    specs[1]["parameter"]["parameter_name"] = specs[0]["parameter"]["parameter_name"]


def tiny_program(path: Path) -> Path:
    """A saved torch.export program of Linear(4, 3) + ReLU with a symbolic batch (its JSON
    holds expr_str entries and a range constraint)."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.fc(x).relu()

    ep = torch.export.export(Tiny(), (torch.randn(2, 4),),
                             dynamic_shapes=({0: torch.export.Dim.AUTO},))
    torch.export.save(ep, path)
    return path


def same_names(n: int):
    """A chain of n Relu nodes that all have the name "n" (names may repeat in ONNX)."""
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], name="n") for i in range(n)]
    return _model(nodes, [_vi("v0", [1, 4])], [_vi(f"v{n}", [1, 4])])


# ---- invalid files that onnx.checker (full_check) and onnxruntime both refuse -------------

def fused_conv_inputs(n_inputs: int = 1):
    """com.microsoft FusedConv (X, W[, B[, Z]]) given ``n_inputs`` inputs."""
    ins = ["x", "w", "b", "z", "extra"][:n_inputs]
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3, 1, 1], [0.5] * 6)
    inits = [w] if "w" in ins else []
    node = helper.make_node("FusedConv", ins, ["y"], name="fused", domain="com.microsoft",
                            activation="Relu")
    return _model([node], [_vi("x", [1, 3, 4, 4])], [_vi("y", [1, 2, 4, 4])], inits,
                  opsets=[*OPSET, helper.make_opsetid("com.microsoft", 1)])


def op_before_its_opset(op: str = "LayerNormalization", opset: int = 1):
    """``op`` at an opset older than the op (LayerNormalization: 17, Gelu: 20)."""
    return _model([helper.make_node(op, ["x"], ["y"], name="early")],
                  [_vi("x", [2, 8])], [_vi("y", [2, 8])],
                  opsets=[helper.make_opsetid("", opset)])


def sparse_initializer(name: str = "S", index: int = 4):
    """A 4×4 sparse initializer with one value at flat ``index`` (500: beyond 16)."""
    values = helper.make_tensor(name, TensorProto.FLOAT, [1], [1.0])
    indices = helper.make_tensor(f"{name}_idx", TensorProto.INT64, [1], [index])
    m = _model([helper.make_node("Add", ["x", name], ["y"], name="add")] if name else
               [helper.make_node("Relu", ["x"], ["y"], name="relu")],
               [_vi("x", [4, 4])], [_vi("y", [4, 4])])
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4, 4]))
    return m


def lying_value_info():
    """value_info says the Relu's output is int64 of shape 3×7; inference says float 2×8."""
    m = _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                helper.make_node("Neg", ["r"], ["y"], name="neg")],
               [_vi("x", [2, 8])], [_vi("y", [2, 8])])
    m.graph.value_info.append(_vi("r", [3, 7], TensorProto.INT64))
    return m


def many_max(n: int):
    """n distinct two-argument Max expressions (symbolic ints of the program): 2n Max/Min
    arguments over the program's expressions."""
    def edit(doc):
        values = doc["graph_module"]["graph"].setdefault("sym_int_values", {})
        for i in range(n):
            values[f"m{i}"] = {"as_expr": {"expr_str": f"Max({symbol(0)}, {symbol(i + 1)})"}}
    return edit


def zip_bomb(src: Path, dst: Path, megabytes: int = 70) -> Path:
    """The program JSON followed by ``megabytes`` MB of spaces (still JSON), deflated: about
    a thousandth of that in the archive."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith(".json") and "/models/" in f"/{info.filename}":
                data += b" " * (megabytes << 20)
            zout.writestr(info.filename, data)
    return dst
