"""Parameter counting: each weight counted once, however many nodes share it.

A weight is attributed to the first node (in execution order) that consumes it; a weight read by
several nodes (tied embeddings) is listed in ``shared``. A value the frontend marked PARAM is
trainable when some node reads it as an operand. One read only at an op's buffer positions
(BatchNormalization's running mean/var) is a buffer, as ``nn.Module.buffers()`` counts them;
one read only at settings positions (Clip bounds, Pad values, Resize scales) is a constant.

Quantized weights are counted as stored: params are elements (a packed input's logical
elements: MatMulNBits' N·K 4-bit values), param bytes their storage (int8 1 B, int4 two per
byte …; ``param_bytes_by_dtype`` splits them). Scales and zero points (a rule's
``meta_inputs``, and weights combined with a ``meta_outputs`` value, as the weight scale that a
dynamically quantized MatMul multiplies with its activation's scale) are quantization metadata,
counted apart. An integer constant a quantized op reads as an operand (QDQ's int32 bias) is a
parameter.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ..costs.registry import lookup
from ..ir import Graph, Node, Value, ValueKind


@dataclass(frozen=True)
class ParamReport:
    params: int                      # trainable parameter elements
    param_bytes: int
    buffers: int                     # non-trainable state elements (running stats, buffers)
    buffer_bytes: int
    const_bytes: int                 # index/shape/settings constants (not parameters)
    per_node: Mapping[int, int]      # node index -> parameter elements attributed to it
    shared: Mapping[str, tuple[int, ...]]  # weight name -> node indices reading it (≥ 2)
    names: tuple[str, ...]           # trainable parameter value names, sorted
    quant_meta: int = 0              # quantization scales and zero points (elements)
    quant_meta_bytes: int = 0
    param_bytes_by_dtype: Mapping[str, int] = field(default_factory=dict)


_WEIGHT_KINDS = (ValueKind.PARAM, ValueKind.BUFFER)
_STORED = (ValueKind.PARAM, ValueKind.BUFFER, ValueKind.CONST)


def count_params(graph: Graph) -> ParamReport:
    """Every stored value counted once: parameter, buffer, constant or quantization metadata."""
    uses = _Uses()
    for node in graph.nodes:
        uses.read(node, graph.values)
    return _tally(graph.values, uses)


@dataclass
class _Uses:
    """How the nodes read the stored values: what :func:`_tally` classifies them by."""
    consumers: dict[str, list[int]] = field(default_factory=dict)
    operand_use: set[str] = field(default_factory=set)
    buffer_use: set[str] = field(default_factory=set)
    meta: set[str] = field(default_factory=set)  # stored values that are scales / zero points
    # activations that are (DynamicQuantizeLinear's)
    meta_values: set[str] = field(default_factory=set)
    # integer constants a quantized op reads as operands
    quant_operand: set[str] = field(default_factory=set)
    # a packed weight -> its logical elements and their dtype (MatMulNBits' 4-bit values)
    packed: dict[str, tuple[int, str]] = field(default_factory=dict)

    def read(self, node: Node, values: Mapping[str, Value]) -> None:
        """Records how ``node`` reads each stored input, and which outputs are scales."""
        r = lookup(node.op)
        meta_pos = r.meta_inputs if r is not None else ()
        inputs = [(pos, name, values.get(name) if name else None)
                  for pos, name in enumerate(node.inputs)]
        # a plain op (no scale inputs of its own) combining a weight with a scale
        from_meta = not meta_pos and any(name in self.meta_values for _, name, _ in inputs)
        for pos, name, v in inputs:
            if v is not None and v.kind in _STORED:
                self._read_input(node, r, pos, name, v, from_meta)
        if r is not None and r.meta_outputs:
            self.meta_values.update(node.outputs[i] for i in r.meta_outputs
                                    if i < len(node.outputs))
        if from_meta and all(v is None or v.kind in _STORED or name in self.meta_values
                             for _, name, v in inputs if name):
            self.meta_values.update(o for o in node.outputs if o)

    def _read_input(self, node: Node, r, pos: int, name: str, v: Value,
                    from_meta: bool) -> None:
        """One stored input ``name`` read at ``pos`` of ``node`` (its rule ``r``)."""
        buffer_pos = r.buffer_inputs if r is not None else ()
        config_pos = r.config_inputs if r is not None else ()
        meta_pos = r.meta_inputs if r is not None else ()
        index_pos = r.index_inputs if r is not None else ()
        if pos in meta_pos or from_meta:  # a weight combined with a scale is a scale
            self.meta.add(name)
            return
        if v.kind == ValueKind.CONST:
            if not (meta_pos and pos not in config_pos and pos not in index_pos):
                return
            self.quant_operand.add(name)
            self.operand_use.add(name)
        lst = self.consumers.setdefault(name, [])
        if not lst or lst[-1] != node.index:
            lst.append(node.index)
        if pos in buffer_pos:
            self.buffer_use.add(name)
        elif pos not in config_pos:
            self.operand_use.add(name)
        if r is not None and pos in r.packed_inputs:
            self.packed[name] = r.packed_inputs[pos](v.spec, node.attrs)


def _tally(values: Mapping[str, Value], uses: _Uses) -> ParamReport:
    """Each stored value counted once, as a parameter, buffer, constant or scale."""
    params = param_bytes = buffers = buffer_bytes = const_bytes = 0
    quant_meta = quant_meta_bytes = 0
    by_dtype: dict[str, int] = {}
    per_node: dict[int, int] = {}
    names = []
    consumers = uses.consumers
    for name, v in values.items():
        n = v.spec.numel or 0
        b = v.spec.nbytes or 0
        if v.kind in _STORED and name in uses.meta and name not in uses.operand_use:
            quant_meta += n
            quant_meta_bytes += b
            continue
        if v.kind not in _WEIGHT_KINDS and name not in uses.quant_operand:
            if v.kind == ValueKind.CONST:
                const_bytes += b
            continue
        unused = name not in consumers
        if v.kind != ValueKind.BUFFER and (name in uses.operand_use or unused):
            n, dtype = uses.packed.get(name, (n, v.spec.dtype))
            params += n
            param_bytes += b
            by_dtype[dtype] = by_dtype.get(dtype, 0) + b
            names.append(name)
            if not unused:
                first = consumers[name][0]
                per_node[first] = per_node.get(first, 0) + n
        elif v.kind == ValueKind.BUFFER or name in uses.buffer_use:
            buffers += n
            buffer_bytes += b
        else:
            const_bytes += b
    shared = {k: tuple(v) for k, v in sorted(consumers.items()) if len(v) > 1}
    return ParamReport(params, param_bytes, buffers, buffer_bytes, const_bytes,
                       per_node, shared, tuple(sorted(names)), quant_meta, quant_meta_bytes,
                       dict(sorted(by_dtype.items())))
