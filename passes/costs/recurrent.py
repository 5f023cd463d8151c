"""Recurrent ops: cost per time step × sequence length, every gate included.

RNN / GRU / LSTM (X (S, B, I), or (B, S, I) with layout 1; W (D, G·H, I); R (D, G·H, H);
B (D, 2·G·H)) with G gates — RNN 1, GRU 3, LSTM 4 — and D directions (2 if bidirectional):
  MACs per step per direction per batch row = G·H·(I + H)   (W·x and R·h of every gate)
  MACs = S · B · D · G·H·(I + H)
  FLOPs = 2·MACs + S · B · D · H · (per hidden unit and step, below)
Per hidden unit and step (b = 1 with the bias B, p = 1 with LSTM peepholes P, c = 1 with clip):
  combine W·x + R·h (1) + the two biases (2b), clip (2c), per gate: G·(1 + 2b + 2c), then
  RNN   tanh 1                                                        → 1·(1+2b+2c) + 1
  GRU   z, r sigmoids (3 each), h̃ tanh (1), r ⊙ (R·h) (1),
        h = (1 − z) ⊙ h̃ + z ⊙ h (4)                                    → 3·(1+2b+2c) + 12
  LSTM  i, f, o sigmoids (3 each), g tanh (1), c = f⊙c + i⊙g (3), tanh(c) (1), h = o⊙tanh(c)
        (1), peepholes P⊙c on i, f, o (6p)                             → 4·(1+2b+2c) + 15 + 6p
(other activations than the defaults are counted at the defaults' cost). ``sequence_lens``
can stop a batch row early; every row is counted for all S steps (an upper bound when given).
"""
from __future__ import annotations

from ..costs.registry import OpView, rule

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
CELL = {"RNN": 1, "GRU": 12, "LSTM": 15}


def _recurrent(op: OpView) -> tuple[int, int]:
    kind = op.node.op
    g = GATES[kind]
    x, w = op.in_shape(0), op.in_shape(1)
    s, b, i = (x[1], x[0], x[2]) if op.attr("layout", 0) else (x[0], x[1], x[2])
    d = w[0]
    h = int(op.attr("hidden_size") or w[1] // g)
    macs = s * b * d * g * h * (i + h)
    bias = 1 if op.has_input(3) else 0
    clip = 1 if op.attr("clip") is not None else 0
    per_unit = g * (1 + 2 * bias + 2 * clip) + CELL[kind]
    if kind == "LSTM" and op.has_input(7):
        per_unit += 6
    if op.has_input(4):
        op.bounded("every batch row runs all S steps (sequence_lens may stop some earlier)")
    return macs, 2 * macs + s * b * d * h * per_unit


for _op in GATES:
    rule(_op, saves="inputs")(_recurrent)


@rule("LinearAttention", saves="inputs")
def linear_attention(op: OpView) -> tuple[int, int]:
    """Per token, with state S (dk × dv) per KV head (Q (B,T,Hq·dk), V (B,T,Hkv·dv)):
    output qᵀS per query head: Hq·dk·dv MACs; update S += k ⊗ v: Hkv·dk·dv MACs;
    delta rules also read Sᵀk (Hkv·dk·dv MACs) and form β·(v − Sᵀk) (2·dv per KV head);
    gated rules decay S by exp(g) (Hkv·dk·dv multiplies + Hkv exps); the scale 1 per output."""
    b, t, qd = op.in_shape(0)
    hq = int(op.attr("q_num_heads", 1) or 1)
    hkv = int(op.attr("kv_num_heads", 1) or 1)
    dk = qd // hq
    dv = op.in_shape(2)[2] // hkv
    rule_ = op.attr("update_rule", "linear")
    delta = "delta" in rule_
    gated = "gated" in rule_
    state = dk * dv
    macs = b * t * (hq * state + hkv * state * (2 if delta else 1))
    extra = b * t * hq * dv  # scale
    if delta:
        extra += b * t * hkv * 2 * dv
    if gated:
        extra += b * t * hkv * (state + 1)
    return macs, 2 * macs + extra


@rule("CausalConvWithState", saves="inputs")
def causal_conv_with_state(op: OpView) -> tuple[int, int]:
    # depthwise causal conv: input (B, C, L), weight (C, 1, k): B·C·L·k MACs; bias add 1 and a
    # fused SiLU x·sigmoid(x) (4) per output element.
    b, c, length = op.in_shape(0)
    k = op.in_shape(1)[-1]
    macs = b * c * length * k
    out = b * c * length
    act = 4 if op.attr("activation", "none") in ("silu", "swish") else 0
    return macs, 2 * macs + (out if op.has_input(2) else 0) + act * out


SELECTIVE_SCAN = "graphcost.selective_scan.default"


@rule(SELECTIVE_SCAN, saves="inputs")
def selective_scan(op: OpView) -> tuple[int, int]:
    """A Mamba 1 selective scan as one fused kernel (mamba-ssm's ``selective_scan_fn``:
    analyzer/frontends/torch/fused_scan.py), u (B, I, L), A (I, N). Per token, channel and
    state: the state update h = exp(δ·A)·h + δ·B·u — one MAC, and δ·A, exp, δ·B and ·u (4) —
    and the output's C·h, one MAC: 2·B·I·L·N MACs, 8·B·I·L·N FLOPs (the Mamba paper's 9BLDN,
    less its reading of the discretization as two); per token and channel δ's bias and
    softplus (3), D·u added (2), the gate's silu and product (5) where given."""
    b, i, length = op.in_shape(0)
    n = op.in_shape(2)[-1]
    macs = 2 * b * i * length * n
    per = (3 if op.has_input(7) else 0) + (2 if op.has_input(5) else 0) + \
        (5 if op.has_input(6) else 0)
    return macs, 2 * macs + 4 * b * i * length * n + per * b * i * length


SSD_SCAN = "graphcost.ssd_scan.default"


@rule(SSD_SCAN, saves="inputs")
def ssd_scan(op: OpView) -> tuple[int, int]:
    """Mamba 2's chunked scan (the SSD: mamba-ssm's ``mamba_chunk_scan_combined``,
    analyzer/frontends/torch/fused_scan.py), x (B, L, H, P), B and C (B, L, G, N), chunks of l
    (c = ⌈L/l⌉). Per chunk: C·Bᵀ per group, G·l²·N MACs; the masked scores times x per head,
    H·l²·P; the chunk's state B·x, H·l·P·N; the output's C·(passed state), H·l·P·N; the states
    passed between chunks, H·P·N. FLOPs twice those, plus the decay mask per head and score
    pair (exp and product, 2·H·l²), the time step's bias and softplus (3 per token and head)
    and D·x (2 per element of x; D is input 5 where given — transformers' callers give it and
    the time step's bias, and a missing one is dropped from the inputs, not left empty)."""
    b, length, heads, p = op.in_shape(0)
    _, _, groups, n = op.in_shape(3)
    chunk = int(op.attr("chunk_size", 0) or length) or 1
    c = -(-length // chunk)
    macs = b * c * (groups * chunk * chunk * n + heads * chunk * chunk * p
                    + 2 * heads * chunk * p * n + heads * p * n)
    extra = b * c * 2 * heads * chunk * chunk + 3 * b * length * heads + \
        (2 * b * length * heads * p if op.has_input(5) else 0)
    return macs, 2 * macs + extra
