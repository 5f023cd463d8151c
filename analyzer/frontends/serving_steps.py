"""What a serving trace gives the serving pass, whichever frontend traced it (torch or ONNX)."""
from __future__ import annotations

from dataclasses import dataclass

from ...passes.ir import Graph


@dataclass(frozen=True)
class Steps:
    """The two traced steps (torch or ONNX) and which of their values are the KV cache."""
    prefill: Graph
    decode: Graph
    prefill_cache: tuple[str, ...]   # prefill outputs: the cache kept for the prompt
    decode_past: tuple[str, ...]     # decode inputs: the cache after P + G − 1 tokens
    decode_cache: tuple[str, ...]    # decode outputs: the K/V appended, or the whole cache
    appends: bool                    # decode_cache is what the step appends
    traced_layers: str | None = None  # how a repeated stack was traced
    positions: int | None = None      # learned positions: the longest context the model takes
