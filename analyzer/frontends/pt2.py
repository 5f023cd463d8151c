"""Saved ``torch.export`` programs (``.pt2``) read without unpickling anything.

``torch.export.load`` unpickles the archive's weights (and falls back to an unrestricted
unpickler), which graphcost never does: here only the program's JSON is read, and every
parameter, buffer and constant becomes a fake tensor of the shape and dtype the program itself
records. No weight byte is read.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import torch

from graphcost.analyzer.errors import GraphcostError


def load_pt2(path: Path) -> "torch.export.ExportedProgram":
    from torch._export.serde import schema
    from torch._export.serde.serialize import (_SERIALIZE_TO_TORCH_DTYPE,
                                               ExportedProgramDeserializer, _bytes_to_dataclass)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.export.pt2_archive._package import PT2ArchiveReader

    if not path.is_file():
        raise GraphcostError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        raise GraphcostError(f"{path}: not a torch.export archive (.pt2 is a zip file)")
    try:
        with PT2ArchiveReader(str(path)) as reader:
            programs = [n for n in reader.get_file_names()
                        if n.startswith("models/") and n.endswith(".json")]
            if not programs:
                raise GraphcostError(f"{path}: no exported program in the archive")
            serialized = _bytes_to_dataclass(schema.ExportedProgram,
                                             reader.read_bytes(programs[0]))
    except GraphcostError:
        raise
    except Exception as exc:
        raise GraphcostError(f"{path}: unreadable .pt2 archive ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None

    graph = serialized.graph_module
    tensors = graph.graph.tensor_values
    fake = FakeTensorMode(allow_non_fake_inputs=True)

    def placeholder(name: str) -> torch.Tensor:
        meta = tensors[name]
        sizes = []
        for s in meta.sizes:
            if s.type != "as_int":
                raise GraphcostError(f"{path}: a weight with a symbolic size; not supported")
            sizes.append(s.as_int)
        device = meta.device.type if meta.device is not None else "cpu"
        with fake:
            return torch.empty(sizes, dtype=_SERIALIZE_TO_TORCH_DTYPE[meta.dtype], device=device)

    state, constants = {}, {}
    for spec in graph.signature.input_specs:
        kind = spec.type
        value = getattr(spec, kind)
        if kind == "parameter":
            state[value.parameter_name] = torch.nn.Parameter(placeholder(value.arg.name))
        elif kind == "buffer":
            state[value.buffer_name] = placeholder(value.arg.name)
        elif kind == "tensor_constant":
            constants[value.tensor_constant_name] = placeholder(value.arg.name)
    try:
        return ExportedProgramDeserializer().deserialize(serialized, state, constants, None)
    except Exception as exc:
        raise GraphcostError(f"{path}: cannot rebuild the exported program "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]})") from None
