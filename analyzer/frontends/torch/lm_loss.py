"""The loss a training step backpropagates, as the engines users train with compute it.

``--loss`` (``analyze(loss=…)``; passes/choices.py ``Loss``):

* ``auto`` (the default): the model's own loss when it computes one — a transformers causal LM
  is given ``labels`` (its ``ForCausalLMLoss``: the logits upcast to fp32, cross-entropy over
  the vocabulary), a model returning ``(logits, loss)`` keeps its own —, else ``ce`` for a
  language-model head, else ``sum``;
* ``ce``: cross-entropy over the vocabulary of the logits upcast to fp32, as torchtitan's
  ``cross_entropy_loss`` computes it (``F.cross_entropy(pred.flatten(0, 1).float(),
  labels.flatten(0, 1))``); its training loop deletes the logits before the backward;
* ``chunked-ce``: torchtune's ``CEWithChunkedOutputLoss`` (8 chunks over the sequence, each
  upcast and cross-entropied on its own, summed, divided by the token count). A transformers
  causal LM also runs its output projection chunk by chunk (torchtune's ``chunked_output``);
  another model's logits are made whole and chunked for the loss;
* ``sum``: every floating output summed (graphcost's loss before ``--loss``; a model without
  a vocabulary, whose sum's backward reaches every parameter and makes no large tensor).

A language-model head: integer token ids of shape (batch, seq) in, and a last linear layer
that projects back onto the model's largest ``nn.Embedding`` table, of V rows (or a
transformers config's ``vocab_size``): a floating (batch, seq, V) output. The labels are a graph
input like the tokens (int64, the same shape), as a training loop moves them to the device.

The same module builds the loss of the traced step (frontends/torch/capture.py) and of the
real step a reference measurement runs (analyzer/measure/reference.py), so both sides of a
check backpropagate one loss.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree  # (torch.utils does not import it for the type checker)

from ....passes.choices import Loss
from ....passes.errors import GraphcostError, opt
from .loss_kernels import floating_leaves, returned_loss, split_loss, summed
from .tp_collectives import tp_cross_entropy

CHUNKS = 8          # torchtune's CEWithChunkedOutputLoss default (num_output_chunks)
LABELS = "graphcost_labels"   # the keyword a computed loss's labels travel under


@dataclass(frozen=True)
class LossPlan:
    """The loss one training step backpropagates (``kind``, a Loss: auto for the model's own
    else the sum, ce, chunked-ce, sum) and what the report says of it."""
    kind: str
    words: str
    vocab: int | None = None
    chunks: int = CHUNKS
    hf_labels: bool = False     # a transformers causal LM computes it, given ``labels``
    auto: bool = False          # asked ``auto``: a loss the model returns wins
    # a tensor-parallel rank whose logits stay sharded over this many ranks (loss
    # parallelism: tensor_parallel.py's head); 0: the whole vocabulary
    loss_parallel: int = 0

    @property
    def logit_width(self) -> int | None:
        """The logits' last dim as the step sees them: the vocabulary, or a rank's slice."""
        if self.vocab is None or not self.loss_parallel:
            return self.vocab
        return -(-self.vocab // self.loss_parallel)


# graphcost's loss where none is asked: the model's own where it returns one, else the sum
OWN_OR_SUM = LossPlan(Loss.AUTO, "the sum of the floating outputs")


def plan_loss(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any],
              asked: str = Loss.AUTO) -> LossPlan:
    """The loss ``asked`` for ``model`` called with these inputs (checked: ce and chunked-ce
    need a language-model head)."""
    vocab, tokens = _vocab(model), _tokens(args, kwargs)
    causal = _hf_causal_lm(model) or _hf_image_text_lm(model, kwargs)
    if asked == Loss.SUM:
        return LossPlan(Loss.SUM, "the sum of the floating outputs")
    if asked == Loss.AUTO and not causal and (vocab is None or tokens is None):
        return OWN_OR_SUM
    if vocab is None or tokens is None:
        raise GraphcostError(f"{opt('loss', value=asked)}: cross-entropy needs a language-model "
                             "head (token ids of shape (batch, seq) in, logits over an "
                             "embedding's vocabulary out); this model has none: use "
                             f"{opt('loss', value='sum')}")
    if causal and asked in (Loss.AUTO, Loss.CE):
        return LossPlan(Loss.CE, f"cross-entropy over {vocab:,} tokens, fp32 logits (the "
                        "model's own, given labels: ForCausalLMLoss)", vocab, hf_labels=True)
    group = max((getattr(m, "loss_parallel", 0) for m in model.modules()), default=0)
    if group and asked in (Loss.AUTO, Loss.CE):
        return LossPlan(Loss.CE, f"cross-entropy over {vocab:,} tokens, fp32 logits "
                        f"(torchtitan's), loss parallel: each of {group} ranks on its "
                        "vocabulary slice", vocab, auto=asked == Loss.AUTO, loss_parallel=group)
    if group:
        raise GraphcostError(f"{opt('loss', value=asked)} with tensor parallelism: modelled "
                             f"as torchtitan runs it, {opt('loss', value='ce')} (loss parallel)")
    if asked == Loss.CHUNKED_CE:
        return LossPlan(Loss.CHUNKED_CE, f"cross-entropy over {vocab:,} tokens in {CHUNKS} "
                        "chunks, fp32 (torchtune's CEWithChunkedOutputLoss)", vocab)
    return LossPlan(Loss.CE, f"cross-entropy over {vocab:,} tokens, fp32 logits "
                    "(torchtitan's)", vocab, auto=asked == Loss.AUTO)


def with_labels(plan: LossPlan, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the labels the plan's loss reads (an int64 tensor shaped as the token
    ids, on their device: fake, meta or real): ``labels`` for a transformers causal LM,
    ``LABELS`` for the loss computed here."""
    if plan.kind in (Loss.SUM, Loss.AUTO):
        return dict(kwargs)
    tokens = _tokens(args, kwargs)
    assert tokens is not None and plan.vocab is not None  # (plan_loss checked it)
    if tokens.device.type in ("meta",) or _is_fake(tokens):
        labels = torch.empty_like(tokens, dtype=torch.int64)
    else:  # a real step: labels drawn in the vocabulary, seeded (a measurement's)
        gen = torch.Generator().manual_seed(0)
        labels = torch.randint(0, plan.vocab, tuple(tokens.shape), generator=gen).to(
            tokens.device)   # (drawn on the CPU, the same labels on any device)
    return {**kwargs, ("labels" if plan.hf_labels else LABELS): labels}


def step_loss(model: torch.nn.Module, plan: LossPlan, args: tuple, kwargs: dict[str, Any]
              ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], str]:
    """(the loss of one step of ``model`` on these inputs, the tensors the loop holds beside
    it through the backward, what the loss is in words)."""
    kwargs = dict(kwargs)
    labels = kwargs.pop(LABELS, None)
    if plan.kind == Loss.CHUNKED_CE and _hf_causal_lm(model):
        return _chunked_hf(model, plan, args, kwargs, labels), (), plan.words
    out = model(*args, **kwargs)
    if plan.kind == Loss.SUM:  # asked: every floating output, a loss returned among them
        return summed(floating_leaves(out)), (), plan.words
    if labels is None:  # its own (given labels, or returned), else the sum: split_loss's
        loss, held = split_loss(out)
        returned = not plan.hf_labels and own_loss(out)
        return loss, held, "the model's own (the loss it returned)" if returned else plan.words
    if plan.auto and own_loss(out):
        loss, held = split_loss(out)
        return loss, held, "the model's own (the loss it returned)"
    logits = logits_of(out, plan.logit_width)
    if logits is None and plan.auto:  # token ids in, no logits out: an encoder, a classifier
        return (*split_loss(out), OWN_OR_SUM.words)
    if logits is None:
        raise GraphcostError(f"{opt('loss', value=plan.kind)}: the model returned no logits "
                             f"over its {plan.vocab:,}-token vocabulary (a floating (batch, "
                             f"seq, {plan.vocab}) output); use {opt('loss', value='sum')}")
    if plan.kind == Loss.CHUNKED_CE:
        return chunked_ce(list(logits.chunk(plan.chunks, dim=1)), labels, plan.chunks), (), \
            plan.words
    if plan.loss_parallel:   # under torchtitan's loss_parallel(): each rank's slice
        return tp_cross_entropy(logits, labels, plan.loss_parallel), (), plan.words
    # torchtitan: loss = loss_fn(pred, labels); del pred; loss.backward() — nothing held
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                             labels.flatten(0, 1)), (), plan.words


def own_loss(out: Any) -> bool:
    """Whether ``out`` holds a loss the model computed: one it returned beside other
    outputs (loss_kernels.returned_loss), or a bare scalar."""
    return returned_loss(out) is not None or (
        isinstance(out, torch.Tensor) and out.is_floating_point() and out.dim() == 0)


def chunked_ce(chunks: list[torch.Tensor], labels: torch.Tensor, n: int) -> torch.Tensor:
    """torchtune's CEWithChunkedOutputLoss.forward, ignore_index -100 kept out."""
    total = (labels != -100).sum()
    parts = [t.reshape(-1) for t in labels.chunk(n, dim=1)]
    loss = torch.zeros((), device=labels.device)
    for logit, target in zip(chunks, parts):
        loss = loss + torch.nn.functional.cross_entropy(
            logit.reshape(-1, logit.size(-1)).float(), target, reduction="sum")
    return loss / total


def _chunked_hf(model, plan: LossPlan, args: tuple, kwargs: dict, labels) -> torch.Tensor:
    """A transformers causal LM's decoder, then its output projection chunk by chunk (each
    chunk's logits made only for its loss: torchtune's chunked_output)."""
    hidden = model.base_model(*args, **kwargs)[0]
    head = model.get_output_embeddings()
    # (the head's own F.linear, as torchtune's TiedLinear calls it: one module call per chunk
    # would trip MemTracker's one-call-per-module check in the measurement)
    project = (lambda h: torch.nn.functional.linear(h, head.weight, head.bias)) \
        if isinstance(head, torch.nn.Linear) else head
    chunks = [project(h) for h in hidden.chunk(plan.chunks, dim=1)]
    return chunked_ce(chunks, labels, plan.chunks)


def logits_of(out: Any, vocab: int | None) -> torch.Tensor | None:
    """The model's logits: its first floating (batch, seq, vocab) output (None: none)."""
    for t in torch.utils._pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() == 3 \
                and t.shape[-1] == vocab:
            return t
    return None


def _vocab(model: torch.nn.Module) -> int | None:
    """The vocabulary: a transformers config's ``vocab_size``, else the rows of the largest
    embedding table (the tokens') when the model's last linear layer, its head, projects back
    onto them; None without such a head (an encoder, a classifier)."""
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    if isinstance(size, int) and size > 1:
        return size
    # (a tensor-parallel rank's sharded table and head say their whole sizes:
    # tensor_parallel.py's full_rows and full_out)
    rows = [getattr(m, "full_rows", m.num_embeddings) for m in model.modules()
            if isinstance(m, torch.nn.Embedding)]
    head = [getattr(m, "full_out", m.out_features) for m in model.modules()
            if isinstance(m, torch.nn.Linear)][-1:]
    # (the token table is the largest: a pooler as wide as BERT's 128 positions is no head)
    if not rows or not head or head[0] != max(rows):
        return None
    return max(rows)


def _tokens(args: tuple, kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """The token ids the logits are over: the first integer (batch, seq) input (by name an
    encoder-decoder's ``decoder_input_ids`` first, then ``input_ids``)."""
    named = kwargs.get("decoder_input_ids", kwargs.get("input_ids"))
    for t in (named, *args, *kwargs.values()):
        if isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point() \
                and t.dtype != torch.bool:
            return t
    return None


def _hf_causal_lm(model: torch.nn.Module) -> bool:
    """A transformers model that computes its causal-LM loss given ``labels`` and tokens
    alone: not one with a vision tower (GIT's loss drops its image's positions from the
    logits, given an image or not: with tokens alone it fails in eager too), whose step over
    tokens takes torchtitan's cross-entropy over the same logits."""
    name = type(model).__name__
    if not (name.endswith("ForCausalLM") or name.endswith("LMHeadModel")):
        return False
    if getattr(getattr(model, "config", None), "vision_config", None) is not None:
        return False
    try:
        return "labels" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _hf_image_text_lm(model: torch.nn.Module, kwargs: Mapping[str, Any]) -> bool:
    """A transformers vision-language decoder (LLaVA, PaliGemma: ``…ForConditionalGeneration``
    with a vision tower, not an encoder-decoder) called with its images: it computes its
    causal-LM loss given ``labels`` (ForCausalLMLoss over the logits of every position, the
    image tokens' too, whose labels fine-tuning masks: the same work)."""
    config = getattr(model, "config", None)
    if not type(model).__name__.endswith("ForConditionalGeneration") or \
            getattr(config, "vision_config", None) is None or \
            getattr(config, "is_encoder_decoder", False) or "pixel_values" not in kwargs:
        return False
    try:
        return "labels" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    return isinstance(t, FakeTensor)
