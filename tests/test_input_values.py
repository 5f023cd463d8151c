"""A branch on a truth value the example inputs alone decide (FSMT's ``if not
padding_mask.any()``, Longformer's and LED's ``is_global_attn``) is decided by the inputs'
real values, as an eager run of them decides it (analyzer/frontends/torch/input_values.py),
and the report says where; a value a weight reaches, a number read from the inputs and inputs
given by shape only are not (before, every such branch stopped the trace)."""
from __future__ import annotations

import json

import pytest
import torch
from graphcost.passes.errors import GraphcostError
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphcost import analyze
from tests.shared import step_flops


class _Padded(nn.Module):
    """FSMT's padding mask: applied only when the ids hold a pad (id 1)."""

    def __init__(self):
        super().__init__()
        self.embed, self.fc = nn.Embedding(100, 64), nn.Linear(64, 64)

    def forward(self, ids):
        padding = ids.eq(1)
        if not padding.any():
            padding = None
        h = self.fc(self.embed(ids))
        if padding is not None:
            h = h.masked_fill(padding.unsqueeze(-1), 0.0)
        return self.fc(h)


@pytest.mark.parametrize("pad", [False, True])
def test_a_branch_on_the_inputs_takes_their_way(pad):
    # ids (4, 32): the Linear(64, 64), run twice, 2·128·64·64 = 1,048,576 FLOPs a run
    # forward, and its input's and weight's gradients each run backward (the embedding needs
    # its gradient): 6 × 1,048,576, FlopCounterMode's count either way. With a pad the
    # masked_fill is traced (and its backward), without one it is not.
    torch.manual_seed(0)
    model, ids = _Padded(), torch.randint(2, 100, (4, 32))
    if pad:
        ids[0, -3:] = 1
    r = analyze(model, (ids,), train=True, optimizer="sgd", include_inputs=False)
    assert 2 * r.totals.macs == step_flops(model, (ids,)) == 6 * 2 * 128 * 64 * 64
    assert any(n.op.startswith("aten.masked_fill") or n.op == "aten.where.self"
               for n in r.nodes) == pad
    line = _Padded.forward.__code__.co_firstlineno + 2
    said = [w for w in r.warnings if "values of its inputs" in w]
    assert len(said) == 1 and f"test_input_values.py:{line}" in said[0], r.warnings


class _Global(nn.Module):
    """Longformer's global attention: a mask the model makes itself (no global mask given),
    read as one truth value (``.any().item()``)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        mask = torch.ones(x.shape[:2], dtype=torch.long) * 1  # local attention everywhere
        is_global = (mask > 1).flatten().any().item()
        h = self.fc(x)
        return self.fc(h) if is_global else h


def test_a_branch_on_a_mask_the_model_makes_is_decided():
    # x (2, 8, 16): no token is global, so one Linear: 2·16·16·16 = 8,192 FLOPs
    r = analyze(_Global(), input_shapes={"x": (2, 8, 16)})
    assert 2 * r.totals.macs == 2 * 16 * 16 * 16
    assert any("values of its inputs" in w for w in r.warnings)


def test_inputs_given_by_shape_only_decide_nothing():
    # graphcost makes the ids itself (zeros, fake): no values, the branch stays refused
    with pytest.raises(GraphcostError) as err:
        analyze(_Padded(), input_shapes={"ids": (4, 32)}, input_dtypes={"ids": "int64"})
    assert "value read from a tensor" in str(err.value) and "\n" not in str(err.value)


class _Counted(nn.Module):
    """A number read from the inputs: how many ids are not padding."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, ids, x):
        n = int((ids != 0).sum())
        return self.fc(x[:n])


def test_a_number_read_from_the_inputs_is_theirs():
    # 5 of the 16 ids are not padding: the Linear runs on 5 rows, 5·8·8 = 320 MACs, as an
    # eager run of these inputs does
    ids = torch.zeros(16, dtype=torch.long)
    ids[:5] = 3
    model, x = _Counted(), torch.randn(16, 8)
    r = analyze(model, (ids, x))
    counter = FlopCounterMode(display=False)
    with counter:
        model(ids, x)
    assert 2 * r.totals.macs == counter.get_total_flops() == 2 * 5 * 8 * 8
    assert any("values of its inputs" in w for w in r.warnings)


class _Initted(nn.Module):
    """A codebook initialized from the first batch (vector-quantize-pytorch's ``initted``
    buffer): the branch reads a buffer, a value the model holds, not a weight's result."""

    def __init__(self, initted: bool):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.register_buffer("initted", torch.tensor(initted))

    def forward(self, x):
        if not self.initted:
            x = self.fc(x)
        return self.fc(x)


@pytest.mark.parametrize("initted", [True, False])
def test_a_branch_on_a_buffer_is_decided_by_its_value(initted):
    # x (4, 16): each run of the Linear 4·16·16 = 1,024 MACs; twice before the codebook is
    # initialized, once after
    r = analyze(_Initted(initted), (torch.randn(4, 16),))
    assert r.totals.macs == 1_024 * (1 if initted else 2)
    assert any("values of its inputs" in w for w in r.warnings)


class _MaskUsedThenRead(nn.Module):
    """A mask read by an op with a weight's result (its twin kept: nothing written), then
    branched on; or written in place from a weight's result first (its twin stale)."""

    def __init__(self, written: bool):
        super().__init__()
        self.fc, self.written = nn.Linear(8, 8), written

    def forward(self, x, mask):
        h = self.fc(x) + mask
        if self.written:
            mask.masked_fill_(h > 0, 0.0)
        if mask.any():
            h = self.fc(h)
        return h


@pytest.mark.parametrize("written", [False, True])
def test_a_twin_lives_until_a_weight_writes_its_tensor(written):
    x, mask = torch.randn(4, 8), torch.ones(4, 8)
    if not written:  # x (4, 8): the Linear twice, 2 · 4·8·8 = 512 MACs
        assert analyze(_MaskUsedThenRead(False), (x, mask)).totals.macs == 512
        return
    with pytest.raises(GraphcostError) as err:  # the mask's values are the weight's now
        analyze(_MaskUsedThenRead(True), (x, mask))
    assert "value read from a tensor" in str(err.value)


def _from_config(tmp_path, cfg, cls, seq: int):
    """The training step (AdamW, batch 2, inputs left out) graphcost gives ``cls`` named by
    ``cfg`` in a config.json, as a user's hub id or folder is analyzed."""
    (tmp_path / "config.json").write_text(json.dumps(
        {**cfg.to_dict(), "architectures": [cls.__name__]}))
    return analyze(str(tmp_path), batch=2, dims={"seq": seq}, train=True, optimizer="adamw",
                   include_inputs=False, what_if=False)


def _values_said(r) -> str:
    """The report's one warning that the model branched on its inputs' values."""
    said = [w for w in r.warnings if "values of its inputs" in w]
    assert len(said) == 1, r.warnings
    return said[0]


def _against_memtracker(r, model, tokens: dict, within: float = 0.005) -> None:
    """``r``'s step peak within ``within`` of MemTracker's on the real step of ``model``."""
    from graphcost.analyzer.measure.reference import measure_training

    measured = measure_training(model, (), "adamw", tokens)[0]
    assert abs(r.training.peak_bytes - measured) <= within * measured, \
        (r.training.peak_bytes, measured)


@pytest.mark.parametrize("kind", ["fsmt", "led"])
def test_a_configs_model_branches_as_ids_without_padding_do(kind, tmp_path):
    # A config.json's model is built on meta, and so are the token ids graphcost makes for
    # it: FSMT's `if not padding_mask.any()` and LED's global attention (`.any().item()` of
    # its mask) stopped the trace ("a value read from a tensor, not a size"). The ids now
    # stand for ids of one token that no *_token_id of the config names (no padding, as the
    # all-ones attention mask eager makes has none: config_inputs.ordinary_tokens), and the report says
    # the values were graphcost's. Measured (2026-12-06, torch 2.13; ids drawn in 4..1023,
    # none FSMT's pad 1 or LED's pad 1): FSMT 9,432,428 B predicted, 9,431,404 B MemTracker
    # (+0.01%); LED 8,439,028 B both
    import transformers

    if kind == "fsmt":
        cfg = transformers.FSMTConfig(
            langs=["en", "de"], src_vocab_size=1024, tgt_vocab_size=1024, d_model=64,
            encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
            max_position_embeddings=256)
        cls = transformers.FSMTForConditionalGeneration
    else:
        cfg = transformers.LEDConfig(
            vocab_size=1024, d_model=64, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_ffn_dim=128, max_encoder_position_embeddings=256,
            max_decoder_position_embeddings=256, attention_window=[16, 16])
        cls = transformers.LEDForConditionalGeneration
    r = _from_config(tmp_path, cfg, cls, seq=64)
    assert "graphcost's for a config's model" in _values_said(r)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    tokens = {name: torch.randint(4, 1024, (2, 64), generator=g)
              for name in ("input_ids", "decoder_input_ids")}
    _against_memtracker(r, cls(cfg), tokens)


@pytest.mark.same_on_every_torch   # (a config's pad token set: the same on every torch)
def test_a_sequence_classifier_without_a_padding_token_trains_at_a_batch(tmp_path):
    # GPT-2's config names no pad_token_id, and transformers' sequence classifiers refuse a
    # batch above 1 without one (they pool each sequence at its last token before the
    # padding): `graphcost gpt2-classifier --batch 2` was refused so. The eos token (50256)
    # is set, as fine-tuning sets the tokenizer's pad token, and said; the ids hold none.
    # Measured (2026-12-06, torch 2.13), the real model given that pad token and ids without
    # it: 3,485,304 B predicted, 3,485,308 B MemTracker (−4 B)
    import transformers

    cfg = transformers.GPT2Config(vocab_size=1024, n_embd=64, n_layer=2, n_head=4,
                                  n_positions=128, num_labels=3)
    assert cfg.pad_token_id is None and cfg.eos_token_id == 50256
    r = _from_config(tmp_path, cfg, transformers.GPT2ForSequenceClassification, seq=32)
    assert any("no pad_token_id" in w and "set to 50256" in w for w in r.warnings), r.warnings
    torch.manual_seed(0)
    cfg.pad_token_id = 50256
    ids = torch.randint(0, 1024, (2, 32), generator=torch.Generator().manual_seed(1))
    _against_memtracker(r, transformers.GPT2ForSequenceClassification(cfg), {"input_ids": ids})


@pytest.mark.parametrize("kind, within", [("bart", 0.005), ("t5", 0.015)])
def test_an_encoder_decoder_classifier_pools_at_the_eos_its_ids_end_with(kind, within,
                                                                          tmp_path):
    # BART's and T5's sequence classifiers (and mBART's, PLBart's, MVP's, BigBird-Pegasus's,
    # mT5's, UMT5's) pool each sequence at its eos token: `hidden[eos_mask, :]` after a check
    # that `unique_consecutive(eos_mask.sum(1))` has one element, two sizes the data decides,
    # which the training trace cannot follow ("aten.unique_consecutive.default returns a
    # size the data decides"; before, every one of them refused --train). graphcost's ids for
    # a config's model end each sequence with the eos token, as these tokenizers end it, and
    # both sizes are traced at what those ids give (input_values.InputValues.sized): the mask
    # indexed by its positions, constant index tensors. Measured (2026-12-06, torch 2.13;
    # ids drawn in 4..1023, each ending with eos): BART 4,592,044 B predicted, 4,592,052 B
    # MemTracker (−8 B); T5 5,099,760 B against 5,165,296 B (−1.27%, 64 KiB: the size of one
    # (2, 4, 32, 32) fp32 score tensor; T5's generation model is exact, the classifier's gap
    # not traced further)
    import transformers

    if kind == "bart":
        cfg = transformers.BartConfig(
            vocab_size=1024, d_model=64, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
            decoder_ffn_dim=128, max_position_embeddings=128, num_labels=3)
        cls = transformers.BartForSequenceClassification
    else:
        cfg = transformers.T5Config(vocab_size=1024, d_model=64, d_kv=16, d_ff=128,
                                    num_layers=2, num_heads=4, num_labels=3)
        cls = transformers.T5ForSequenceClassification
    r = _from_config(tmp_path, cfg, cls, seq=32)
    assert "each sequence ending with its eos token" in _values_said(r)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 1024, (2, 32), generator=g)
    ids[:, -1] = cfg.eos_token_id
    tokens = {"input_ids": ids, "decoder_input_ids": torch.randint(4, 1024, (2, 32), generator=g)}
    _against_memtracker(r, cls(cfg), tokens, within=within)


@pytest.mark.same_on_every_torch   # (the keywords a head is called with: alike on every torch)
def test_a_head_that_turns_the_cache_off_itself_trains_from_its_config(tmp_path):
    # T5Gemma's sequence classifier calls its model with use_cache=False beside **kwargs:
    # graphcost passed use_cache=False through those kwargs too ("got multiple values for
    # keyword argument 'use_cache'"); a config.json's model has its cache off already, in
    # each config it holds (hub._no_cache), and is passed none. Its ids hold no special token
    # (0, 1, 2: pad, eos, bos). Measured (2026-12-06, torch 2.13): 4,758,708 B predicted,
    # 4,774,584 B MemTracker (−0.33%)
    import transformers

    side = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16}
    cfg = transformers.T5GemmaConfig(encoder=side, decoder=side, vocab_size=256, num_labels=3)
    cls = transformers.T5GemmaForSequenceClassification
    r = _from_config(tmp_path, cfg, cls, seq=32)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    tokens = {name: torch.randint(4, 256, (2, 32), generator=g)
              for name in ("input_ids", "decoder_input_ids")}
    _against_memtracker(r, cls(cfg), tokens)


def test_longformers_classifier_trains_with_global_attention_on_its_first_token(tmp_path):
    # Longformer's sequence classifier puts global attention on each sequence's first token
    # and sizes the global attention by the mask: `nonzero` of it, `max()` of its row sums
    # as a size (new_zeros, view, narrow). With graphcost's ids (no padding) those sizes are
    # what the ids give, traced so (InputValues.sized); before, --train was refused ("the
    # forward branches on the data-dependent Eq(u5, 1)"). Measured (2026-12-06, torch 2.13;
    # ids drawn in 4..1023): 4,188,408 B predicted, 4,188,536 B MemTracker (−128 B)
    import transformers

    cfg = transformers.LongformerConfig(
        vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, attention_window=[16, 16], max_position_embeddings=160,
        num_labels=3)
    cls = transformers.LongformerForSequenceClassification
    r = _from_config(tmp_path, cfg, cls, seq=64)
    assert "modeling_longformer.py" in _values_said(r)
    torch.manual_seed(0)
    ids = torch.randint(4, 1024, (2, 64), generator=torch.Generator().manual_seed(1))
    _against_memtracker(r, cls(cfg), {"input_ids": ids})
