"""onnxruntime's own operator schemas, for what onnx.defs does not describe.

onnx knows its domains; onnxruntime adds schemas of its own: the com.microsoft contrib ops
(FusedConv takes 2 to 4 inputs) and a few ops in the ai.onnx domain at opsets below the one
where onnx added them (its LayerNormalization:1 runs at every opset; onnx's arrived in opset
17). The validator asks these schemas about nodes onnx.defs cannot judge, so a file
onnxruntime refuses for a count or a missing op is refused here too, and one it runs is not.
Read once, on the first such node (onnxruntime's import costs ~0.15 s; most models never
need it). Only counts are read: attributes of other domains stay the op's own business.
"""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _table() -> dict[tuple[str, str], list[tuple[int, int, int, int, int]]]:
    """(domain, op) -> [(since_version, min_in, max_in, min_out, max_out)], oldest first;
    empty when onnxruntime's schemas cannot be read (its own build may leave them out)."""
    try:
        import onnxruntime.capi.onnxruntime_pybind11_state as ort
        schemas = ort.get_all_operator_schema()
    except Exception:  # noqa: BLE001 - no schemas: nothing is refused on their account
        return {}
    table: dict[tuple[str, str], list] = {}
    for s in schemas:
        domain = "" if s.domain == "ai.onnx" else s.domain
        table.setdefault((domain, s.name), []).append(
            (s.since_version, s.min_input, s.max_input, s.min_output, s.max_output))
    for versions in table.values():
        versions.sort()
    return table


def counts(op: str, domain: str, version: int) -> tuple[int, int, int, int] | None:
    """(min_in, max_in, min_out, max_out) of onnxruntime's schema of ``op`` in ``domain`` at
    opset ``version``; None when onnxruntime has none."""
    domain = "" if domain == "ai.onnx" else domain
    found = None
    for since, *rest in _table().get((domain, op), ()):
        if since <= version:
            found = (rest[0], rest[1], rest[2], rest[3])
    return found
