"""The Python entry point: ``analyze(model, ...) -> Report``. Never prints."""
from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Mapping, Sequence

from analyzer.errors import GraphcostError
from analyzer.report import Report

ZOO_PREFIX = "zoo:"


def load_graph(model, *, batch: int | None = None, dims: Mapping[str, int] | None = None,
               input_shapes: Mapping[str, Sequence[int]] | None = None):
    """Lower an ONNX path, ``zoo:NAME`` or ``onnx.ModelProto`` into the IR."""
    from analyzer.frontends.onnx_frontend import load_model, lower_onnx

    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if text.startswith(ZOO_PREFIX):
            path, name = zoo_path(text[len(ZOO_PREFIX):]), text
            import models_zoo
            # the zoo's own sizes (seq=64 …) unless the caller binds them
            dims = {**models_zoo.default_dims(text[len(ZOO_PREFIX):]), **(dims or {})}
            if input_shapes:
                dims = {k: v for k, v in dims.items() if k not in _symbols_in(path)}
        else:
            path, name = Path(text), Path(text).name
        proto = load_model(path)
    else:
        import onnx

        if not isinstance(model, onnx.ModelProto):
            raise GraphcostError(f"cannot analyze a {type(model).__name__}: pass an ONNX path, "
                                 "'zoo:NAME' or an onnx.ModelProto")
        proto, name = model, (model.graph.name or "model")
    return lower_onnx(proto, name=name, batch=batch, dims=dims, input_shapes=input_shapes)


def _symbols_in(path: Path) -> set[str]:
    import onnx
    m = onnx.load(str(path), load_external_data=False)
    return {d.dim_param for vi in m.graph.input for d in vi.type.tensor_type.shape.dim
            if d.dim_param}


def zoo_path(name: str) -> Path:
    """Export (once, cached) a models_zoo model to ONNX; imports torch only here."""
    try:
        import models_zoo
    except ImportError as exc:  # pragma: no cover - an install without the zoo
        raise GraphcostError(f"the model zoo needs torch: {exc}") from None
    if name not in models_zoo.MODELS:
        raise GraphcostError(f"no zoo model {name!r}; known: " + ", ".join(sorted(models_zoo.MODELS)))
    return Path(models_zoo.cached_export(name))


def analyze(model, *, batch: int | None = None, dims: Mapping[str, int] | None = None,
            input_shapes: Mapping[str, Sequence[int]] | None = None,
            include_inputs: bool = True, inplace: bool = False) -> Report:
    """Analyze ``model`` (ONNX path, ``zoo:NAME`` or ModelProto) at the given bindings.

    ``batch`` binds axis 0 of the graph inputs (default 1), ``dims`` any other symbolic dim by
    name, ``input_shapes`` whole input shapes. Raises GraphcostError on bad input.
    """
    from analyzer.pipeline import run_passes

    # The IR is hundreds of thousands of small acyclic objects: the cyclic collector would
    # rescan them again and again (≈15% of the time on a 100k-node graph) and free nothing.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        graph = load_graph(model, batch=batch, dims=dims, input_shapes=input_shapes)
        return run_passes(graph, include_inputs=include_inputs, inplace=inplace)
    finally:
        if was_enabled:
            gc.enable()
