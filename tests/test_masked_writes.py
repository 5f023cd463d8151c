"""A training step that writes through a boolean mask (``x[mask] = v``: wav2vec2's and
HuBERT's SpecAugment) is traced: indexing by a mask takes its ``nonzero``, a size the data
decides, which AOTAutograd's backward trace cannot follow, so the write is traced as the
``where`` it equals (exported_run._masked_write). The steps against FlopCounterMode and
MemTracker on this CPU."""
from __future__ import annotations

import pytest
import torch
from graphcost.analyzer.measure.reference import measure_training, training_loss_of
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from graphcost import analyze


class _Masked(nn.Module):
    """Frames picked by a fixed mask get a learned embedding, as SpecAugment writes them."""

    def __init__(self):
        super().__init__()
        self.proj, self.embed = nn.Linear(64, 256), nn.Parameter(torch.randn(256))
        self.out = nn.Linear(256, 64)
        self.register_buffer("mask", torch.arange(128).reshape(4, 32) % 5 == 0)

    def forward(self, x):
        h = self.proj(x)
        h[self.mask] = self.embed
        return self.out(torch.relu(h))


def test_a_masked_write_is_traced_as_eager_computes_it():
    # x (4, 32, 64). FLOPs: the two Linears' 2·4·32·64·256 each, forward; backward the input
    # gradient of the second and both weight gradients (the first's input needs none):
    # 5 × 4,194,304 = 20,971,520 (FlopCounterMode's count of the same step)
    torch.manual_seed(0)
    model, x = _Masked(), torch.randn(4, 32, 64)
    r = analyze(model, (x,), train=True, optimizer="sgd", include_inputs=False)
    counter = FlopCounterMode(display=False)
    with counter:
        training_loss_of(model, (x,), None).backward()
    model.zero_grad(set_to_none=True)
    assert 2 * r.totals.macs == counter.get_total_flops() == 5 * 2 * 4 * 32 * 64 * 256
    # every parameter gets a gradient, the embedding too (the masked frames' gradients summed)
    assert r.training.grad_bytes == r.training.param_bytes == (2 * 64 * 256 + 2 * 256 + 64) * 4
    # At the backward's peak both hold four (4, 32, 256) gradients of the write's backward
    # (131,072 B each); eager gathers the masked frames' gradient (26 frames × 256 × 4 =
    # 26,624 B) where the where's backward has reduced the masked full gradient to the
    # embedding's (1,024 B), and eager still holds the loss's gradient (4 B): 757,380 B
    # against MemTracker's 782,984 B (−3.3%)
    measured, _ = measure_training(model, (x,), "sgd")
    assert measured - r.training.peak_bytes == 26_624 - 1_024 + 4, (r.training.peak_bytes,
                                                                     measured)


@pytest.mark.parametrize("kind", ["Wav2Vec2", "Hubert"])
def test_speech_encoders_train_with_spec_augment(kind):
    # transformers' defaults mask 5% of the frames in spans of 10 (at least 2 spans) in train
    # mode; two layers of width 32 over 2 × 16,000 samples (799 frames), LayerDrop off
    transformers = pytest.importorskip("transformers")
    from benchmarks.flop_formulas import conv_backward_flops
    cfg = getattr(transformers, f"{kind}Config")(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, layerdrop=0.0)
    assert cfg.mask_time_prob > 0
    torch.manual_seed(0)
    model, x = getattr(transformers, f"{kind}Model")(cfg), torch.randn(2, 16000)
    r = analyze(model, (x,), train=True, optimizer="sgd", include_inputs=False)
    model.train()
    counter = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten.convolution_backward: conv_backward_flops})
    with counter:
        training_loss_of(model, (x,), None).backward()
    model.zero_grad(set_to_none=True)
    # eager also computes the first convolution's input gradient (the feature encoder sets
    # requires_grad on the waveform in train mode, for gradient checkpointing), which the
    # export does not see: 2 · 2·16·3,199·10 = 2,047,360 FLOPs (0.05%)
    assert counter.get_total_flops() - 2 * r.totals.macs == 2 * 2 * 16 * 3199 * 10
    measured, _ = measure_training(model, (x,), "sgd")
    # measured 2026-11-29: 298,801,206 B against 299,619,894 B (−0.27%)
    assert abs(r.training.peak_bytes / measured - 1) <= 0.01, (r.training.peak_bytes, measured)
