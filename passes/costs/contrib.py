"""onnxruntime's com.microsoft transformer ops (fused by its transformer optimizer and emitted by
its LLM exporters), plus ONNX's RotaryEmbedding, which they share a formula with.

MACs follow linear.py: a fused attention counts its projections (input × weights) and its two
attention products, Sk·(numel(Q) + numel(Y)) as ONNX Attention; so a fused model's MACs equal
its unfused parent's. FLOPs = 2·MACs + bias adds + 6 per attention score (softmax 5 and the
scale 1, as ONNX Attention) + 1 per score for an additive mask; fused norms and activations count
the FLOPs of the ops they fuse (normalization.py, elementwise.py), written next to each.
ONNX's shape inference knows none of these: each rule's ``shapes`` gives its output types.
"""
from __future__ import annotations

from ..costs import shape_fns as sf
from ..costs.normalization import leading_stat
from ..costs.registry import OpView, rule

MS = "com.microsoft::"
SCORE = 6       # softmax 5 + scale 1 per attention score
ROTATE = 3      # per rotated element: (x1·cos − x2·sin, x2·cos + x1·sin) = 6 per pair


# -- attention --------------------------------------------------------------------------------

def _attention_shapes(v):
    x, w = v.shape(0), v.shape(1)
    if x is None or w is None:
        return [None, None]
    sizes = v.attr("qkv_hidden_sizes") or ()
    dv = sizes[2] if sizes else (w[1] // 3 if isinstance(w[1], int) else None)
    out = (v.dtype(0), (x[0], x[1], dv))
    past = v.shape(4)
    present = None
    if past is not None:
        total = past[3] + x[1] if isinstance(past[3], int) and isinstance(x[1], int) else None
        present = (v.dtype(0), (2, x[0], past[2], total, past[4]))
    return [out, present]


@rule(MS + "Attention", saves="inputs", shapes=_attention_shapes)
def ms_attention(op: OpView) -> tuple[int, int]:
    # (input (B,S,Din), weights (Din, Dq+Dk+Dv), bias, mask_index, past (2,B,H,P,hd),
    # attention_bias, past_sequence_length): QKV projection numel(input)·(Dq+Dk+Dv) MACs, then
    # Sk = P + S keys: Sk·(B·S·Dq + B·S·Dv).
    b, s, _ = op.in_shape(0)
    width = op.in_shape(1)[1]
    sizes = op.attr("qkv_hidden_sizes") or ()
    dq, dv = (sizes[0], sizes[2]) if sizes else (width // 3, width // 3)
    sk = s + (op.in_shape(4)[3] if op.has_input(4) else 0)
    heads = int(op.attr("num_heads", 1) or 1)
    proj = op.in_numel(0) * width
    macs = proj + sk * (b * s * dq + b * s * dv)
    scores = b * heads * s * sk
    masked = scores if op.has_input(3) or op.has_input(5) else 0
    bias = b * s * width if op.has_input(2) else 0
    return macs, 2 * macs + bias + SCORE * scores + masked


def _mha_dims(q, k, v, heads: int):
    """(B, S, D, L, Dv, key_is_cache) of MultiHeadAttention's layouts: Q (B,S,D) or packed
    QKV (B,S,N,3,H); K (B,L,D), (B,N,L,H) (a cache) or packed KV (B,L,N,2,H); V likewise."""
    b, s = q[0], q[1]
    d = q[2] * q[4] if len(q) == 5 else q[2]
    if k is None:  # packed QKV
        return b, s, d, s, d, False
    if len(k) == 5:  # packed KV
        return b, s, d, k[1], k[2] * k[4], False
    if len(k) == 4:
        dv = v[1] * v[3] if v is not None and len(v) == 4 else d
        return b, s, d, k[2], dv, True
    dv = v[2] if v is not None else d
    return b, s, d, k[1], dv, False


def _mha_shapes(v):
    q = v.shape(0)
    if q is None:
        return [None] * 3
    heads = max(1, sf.attr_int(v, "num_heads", 1))
    k = v.shape(1) if v.has_input(1) else None
    val = v.shape(2) if v.has_input(2) else None
    b, s, d, length, dv, cache = _mha_dims(q, k, val, heads)
    past = v.shape(6) if v.has_input(6) else None
    total = length
    if past is not None and not cache:
        total = past[2] + length if isinstance(past[2], int) and isinstance(length, int) \
            else None
    dt = v.dtype(0)
    hd = d // heads if isinstance(d, int) else None
    hv = dv // heads if isinstance(dv, int) else None
    return [(dt, (b, s, dv)), (dt, (b, heads, total, hd)), (dt, (b, heads, total, hv))]


@rule(MS + "MultiHeadAttention", saves="inputs", shapes=_mha_shapes)
def ms_multi_head_attention(op: OpView) -> tuple[int, int]:
    # (query, key, value, bias, key_padding_mask, attention_bias, past_key, past_value, …):
    # projections are done outside; Lt keys (past + new): Lt·(B·S·D + B·S·Dv) MACs.
    heads = max(1, int(op.attr("num_heads", 1) or 1))
    k = op.in_shape(1) if op.has_input(1) else None
    val = op.in_shape(2) if op.has_input(2) else None
    b, s, d, length, dv, cache = _mha_dims(op.in_shape(0), k, val, heads)
    total = length + (op.in_shape(6)[2] if op.has_input(6) and not cache else 0)
    macs = total * (b * s * d + b * s * dv)
    scores = b * heads * s * total
    masked = scores if op.has_input(4) or op.has_input(5) else 0
    bias = (b * s * d + b * length * (d + dv)) if op.has_input(3) else 0
    return macs, 2 * macs + bias + SCORE * scores + masked


def _gqa_dims(v_shape, has, const, attr):
    """(B, S, Dq, kv_hidden, P, total) of GroupQueryAttention."""
    q = v_shape(0)
    heads, kv_heads = int(attr("num_heads", 1) or 1), int(attr("kv_num_heads", 1) or 1)
    b, s = q[0], q[1]
    if has(1):
        dq, dkv = q[2], v_shape(1)[2]
    else:  # packed QKV: (B, S, (N + 2·Nkv)·H)
        hd = q[2] // (heads + 2 * kv_heads)
        dq, dkv = heads * hd, kv_heads * hd
    p = v_shape(3)[2] if has(3) else 0
    total = const(6)
    if total is None:
        total = p + s if isinstance(p, int) and isinstance(s, int) else None
    return b, s, dq, dkv, p, total


def _gqa_shapes(v):
    if v.shape(0) is None:
        return [None] * 3
    b, s, dq, dkv, p, total = _gqa_dims(v.shape, v.has_input, lambda i: sf.const_int(v, i),
                                        v.attr)
    kv_heads = max(1, sf.attr_int(v, "kv_num_heads", 1))
    present = max(p, total) if isinstance(p, int) and isinstance(total, int) else None
    hd = dkv // kv_heads if isinstance(dkv, int) else None
    dt = v.dtype(0)
    return [(dt, (b, s, dq)), (dt, (b, kv_heads, present, hd)), (dt, (b, kv_heads, present, hd))]


@rule(MS + "GroupQueryAttention", saves="inputs", shapes=_gqa_shapes)
def ms_group_query_attention(op: OpView) -> tuple[int, int]:
    # (query, key, value, past_key, past_value, seqlens_k, total_sequence_length, cos_cache,
    # sin_cache, …): each of the S queries attends to up to `total` keys (the present cache's
    # length; a causal mask is not discounted): total·2·B·S·Dq MACs; rotary on Q and K when
    # do_rotary (3 per element).
    b, s, dq, dkv, _, _ = _gqa_dims(op.in_shape, op.has_input, lambda i: None, op.attr)
    total = op.out_shape(1)[2] if len(op.node.outputs) > 1 and op.node.outputs[1] else \
        s + (op.in_shape(3)[2] if op.has_input(3) else 0)
    heads = int(op.attr("num_heads", 1) or 1)
    macs = total * 2 * b * s * dq
    scores = b * heads * s * total
    rotary = ROTATE * b * s * (dq + dkv) if op.attr("do_rotary", 0) else 0
    return macs, 2 * macs + SCORE * scores + rotary


def _rotary(op: OpView, cos_at: int) -> tuple[int, int]:
    # X (B,S,N·H) or (B,N,S,H); cos_cache (…, rot/2): rot of every H elements are rotated
    # (3 FLOPs each), the rest copied.
    x = op.in_shape(0)
    rot = 2 * op.in_shape(cos_at)[-1]
    if len(x) == 4:
        head = x[-1]
    else:
        heads = int(op.attr("num_heads", 0) or 0)
        head = x[-1] // heads if heads else rot
    return 0, ROTATE * op.in_numel(0) * min(rot, head) // max(1, head)


@rule("RotaryEmbedding", saves="nothing", same_shape=True, rf="pointwise")
def rotary_embedding(op: OpView) -> tuple[int, int]:
    return _rotary(op, 1)  # (X, cos_cache, sin_cache, position_ids)


@rule(MS + "RotaryEmbedding", saves="nothing", same_shape=True, shapes=sf.like(0))
def ms_rotary_embedding(op: OpView) -> tuple[int, int]:
    return _rotary(op, 2)  # (input, position_ids, cos_cache, sin_cache)


# -- fused normalizations --------------------------------------------------------------------

def _skip_shapes(v):
    x = v.shape(0)
    stat = None if x is None else tuple(x[:-1]) + (1,)
    return [(v.dtype(0), x), ("float32", stat), ("float32", stat), (v.dtype(0), x)]


@rule(MS + "SkipLayerNormalization", saves="inputs", same_shape=True, shapes=_skip_shapes)
def skip_layer_norm(op: OpView) -> tuple[int, int]:
    # (input, skip, gamma, beta, bias): skip add (1) + bias add (1) + LayerNorm 5 + gamma (1)
    # + beta (1) per element
    extra = (1 if op.has_input(4) else 0) + (1 if op.has_input(3) else 0)
    return 0, (1 + 5 + 1 + extra) * op.in_numel(0)


@rule(MS + "SkipSimplifiedLayerNormalization", saves="inputs", same_shape=True,
      shapes=_skip_shapes)
def skip_simplified_layer_norm(op: OpView) -> tuple[int, int]:
    # (input, skip, gamma, bias): skip add (1) + bias add (1) + RMSNorm 4 per element
    return 0, (1 + 4 + (1 if op.has_input(3) else 0)) * op.in_numel(0)


def _simplified_shapes(v):
    x = v.shape(0)
    if x is None:
        return [None, None]
    axis = sf.attr_int(v, "axis", -1) % len(x)
    return [(v.dtype(0), x), ("float32", tuple(x[:axis]) + (1,) * (len(x) - axis))]


# onnxruntime registers SimplifiedLayerNormalization in the ONNX domain (onnx has no schema).
@rule("SimplifiedLayerNormalization", MS + "SimplifiedLayerNormalization", saves="stat",
      stat=leading_stat(1), same_shape=True, shapes=_simplified_shapes)
def simplified_layer_norm(op: OpView) -> tuple[int, int]:
    return 0, 4 * op.in_numel(0)  # RMSNorm: square, sum, multiply by 1/rms, scale


def _embed_shapes(v):
    ids, word = v.shape(0), v.shape(2)
    if ids is None or word is None:
        return [None] * 3
    out = (v.dtype(2), tuple(ids) + (word[1],))
    return [out, ("int32", (ids[0],)), out]


@rule(MS + "EmbedLayerNormalization", reads="outputs", index_inputs=(0, 1, 7, 8),
      saves="nothing", shapes=_embed_shapes)
def embed_layer_norm(op: OpView) -> tuple[int, int]:
    # (input_ids, segment_ids, word_emb, position_emb, segment_emb, gamma, beta, mask,
    # position_ids): per output element the gathered rows are added (tables − 1) and
    # LayerNorm'd with gamma and beta (7); the mask is summed per row (1 per element). Bytes
    # read are counted as a selection's: the output's size plus the ids.
    tables = 2 + (1 if op.has_input(4) else 0)
    mask = op.in_numel(7) if op.has_input(7) else 0
    return 0, (tables - 1 + 7) * op.out_numel(0) + mask


# -- fused activations -------------------------------------------------------------------------

def _activation(k: int, bias_at: int | None = None):
    def fn(op: OpView) -> tuple[int, int]:
        bias = 1 if bias_at is not None and op.has_input(bias_at) else 0
        return 0, (k + bias) * op.out_numel()
    return fn


_ACT = dict(saves="inputs", same_shape=True, rf="pointwise", shapes=sf.like(0))
rule(MS + "FastGelu", **_ACT)(_activation(8, 1))   # tanh GELU 8 (elementwise.py) + bias add
rule(MS + "BiasGelu", **_ACT)(_activation(5, 1))   # exact GELU 5 + bias add
rule(MS + "Gelu", **_ACT)(_activation(5))          # exact GELU 5
rule(MS + "QuickGelu", **_ACT)(_activation(5))     # x·sigmoid(alpha·x): mul, sigmoid 3, mul
rule(MS + "BiasAdd", **_ACT)(_activation(2))       # x + bias + skip
