"""An ONNX decoder exported with its KV cache, bound as its two serving steps.

A decoder-with-past export (Optimum's ``decoder_model_merged`` / ``decoder_with_past_model``,
``torch.onnx.export`` of a step taking the cache) takes ``input_ids``, ``attention_mask``,
optionally ``position_ids``, and the cache as ``past_key_values.<i>.key|value`` (or
``past.<i>…``) of shape (batch, kv_heads, past_length, head_dim); it returns the logits and
``present.<i>.key|value``. The same graph is bound twice: past length 0 and the P prompt
tokens (prefill), past length P + G − 1 and one token (decode). The cache is what the graph's
``present.*`` outputs hold: the whole cache when their length is the past's plus the step's
(Optimum's convention), or the step's own keys and values when it is the step's length.
"""
from __future__ import annotations

from ....passes.errors import GraphcostError, opt
from ..serving_steps import Steps

PAST = ("past_key_values.", "past_key_values_", "past.", "past_")
PRESENT = ("present.", "present_")
FIXED = ("input_ids", "attention_mask", "position_ids")


def capture_onnx(proto, *, batch: int, prompt: int, generate: int, name: str,
                 note=None) -> Steps:
    from .frontend import lower_onnx

    note = note or (lambda _m: None)
    g = proto.graph
    init = {t.name for t in g.initializer}
    feeds = [vi for vi in g.input if vi.name not in init]
    past = [vi for vi in feeds if vi.name.startswith(PAST)]
    present = [o.name for o in g.output if o.name.startswith(PRESENT)]
    if not past or not present:
        raise GraphcostError(f"{opt('serve')}: {name} has no past_key_values.* inputs and present.* "
                             "outputs: export the decoder with its KV cache (a decoder-with-"
                             "past export) to review it for serving")
    if "input_ids" not in {vi.name for vi in feeds}:
        raise GraphcostError(f"{opt('serve')}: {name} has no input_ids input; a decoder-with-past "
                             "export takes input_ids, attention_mask and past_key_values.*")
    other = [vi.name for vi in feeds if vi.name not in FIXED and vi not in past]
    if other:
        raise GraphcostError(f"{opt('serve')}: {name} has inputs {opt('serve')} cannot bind: "
                             + ", ".join(other) + f"; it binds {', '.join(FIXED)} and "
                             "past_key_values.*")
    layouts = {vi.name: _dims(vi) for vi in past}
    for vname, dims in layouts.items():
        if len(dims) < 3:
            raise GraphcostError(f"{opt('serve')}: {vname} has rank {len(dims)}; a cache input is "
                                 "(batch, heads, past length, head dim)")
        loose = [d for d in dims[1:-2] + dims[-1:] if not isinstance(d, int)]
        if loose:
            raise GraphcostError(f"{opt('serve')}: {vname} has a symbolic dim {loose[0]!r} besides "
                                 "the batch and the past length; export with fixed heads and "
                                 "head size")

    def shapes(tokens: int, cached: int) -> dict[str, tuple[int, ...]]:
        out = {}
        for vi in feeds:
            if vi.name in layouts and not cached:
                continue  # an empty cache: fixed in the graph itself (bindings are ≥ 1)
            if vi.name in layouts:
                dims = layouts[vi.name]
                out[vi.name] = (batch, *dims[1:-2], cached, dims[-1])
            elif vi.name == "attention_mask":
                out[vi.name] = (batch, cached + tokens)
            else:
                out[vi.name] = (batch, tokens)
        return out

    note(f"binding {name}'s prefill of {prompt} tokens")
    prefill = lower_onnx(_empty_cache(proto, layouts, batch), name=f"{name} prefill",
                         batch=batch, input_shapes=shapes(prompt, 0))
    note(f"binding one decode step over a cache of {prompt + generate - 1} tokens")
    decode = lower_onnx(proto, name=f"{name} decode", batch=batch,
                        input_shapes=shapes(1, prompt + generate - 1))
    past_names = tuple(vi.name for vi in past)
    lengths = [s.shape[-2] if (s := decode.spec(n)) and s.shape else None for n in present]
    if any(not isinstance(n, int) for n in lengths):
        raise GraphcostError(f"{opt('serve')}: {name}'s present.* outputs have no known length at "
                             "the decode step")
    return Steps(prefill, decode, tuple(present), past_names, tuple(present),
                 appends=all(n == 1 for n in lengths))


def _empty_cache(proto, layouts, batch: int):
    """A copy of ``proto`` (weights not loaded are not read) whose cache inputs are empty:
    (batch, heads, 0, head dim)."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    for vi in copy.graph.input:
        if vi.name in layouts:
            dims = layouts[vi.name]
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for d in (batch, *dims[1:-2], 0, dims[-1]):
                shape.dim.add().dim_value = d
    return copy


def _dims(vi) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in vi.type.tensor_type.shape.dim]
