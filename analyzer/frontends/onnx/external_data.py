"""Where an ONNX model's external data lives, read from the proto only (no file is opened).

Used to keep what graphcost writes off the files a model references (cli.refuse_overwrite)
and to keep onnxruntime from reading files beyond the model's folder (verify).
"""
from __future__ import annotations

from typing import Iterator

import onnx
from onnx import AttributeProto, TensorProto


def external_refs(proto: onnx.ModelProto) -> Iterator[tuple[str, str, bool]]:
    """(what, location, sparse) for every tensor stored outside the file: initializers,
    sparse initializers, tensor attributes — in the graph, its subgraphs and functions."""
    for what, t, sparse in _tensors(proto):
        if t.data_location == TensorProto.EXTERNAL:
            location = next((e.value for e in t.external_data if e.key == "location"), "")
            yield what, location, sparse


def _tensors(proto: onnx.ModelProto):
    def graph(g: onnx.GraphProto, where: str):
        for t in g.initializer:
            yield f"{where}initializer {t.name!r}", t, False
        for sp in g.sparse_initializer:
            for t in (sp.values, sp.indices):
                yield f"{where}sparse initializer {sp.values.name!r}", t, True
        yield from nodes(g.node, where)

    def nodes(node_list, where: str):
        for n in node_list:
            for a in n.attribute:
                label = f"{where}node {n.name!r} attribute {a.name!r}"
                if a.type == AttributeProto.TENSOR:
                    yield label, a.t, False
                for t in a.tensors:
                    yield label, t, False
                sparse = [a.sparse_tensor] if a.type == AttributeProto.SPARSE_TENSOR else []
                for sp in [*sparse, *a.sparse_tensors]:
                    for t in (sp.values, sp.indices):
                        yield label, t, True
                subs = [a.g] if a.type == AttributeProto.GRAPH else []
                for sub in [*subs, *a.graphs]:
                    yield from graph(sub, f"{label}: ")

    yield from graph(proto.graph, "")
    for f in proto.functions:
        yield from nodes(f.node, f"function {f.name!r} ")
