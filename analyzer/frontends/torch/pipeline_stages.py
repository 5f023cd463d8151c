"""One pipeline stage's program: a torchtitan-style decoder cut as torchtitan's
``pipeline_module_split`` cuts it, then traced at the micro-batch like any module.

A decoder of this shape has a token embedding, a list of repeated blocks (``layers``), a
final norm and an output head, and its forward skips a part that is None (torchtitan's
Llama; graphcost's zoo Llama). Stage ``i`` of ``p`` keeps its share of the blocks (evenly,
the remainder to the first stages), the embedding on the first stage, the norm and head on
the last; its input is the token ids (first) or the previous stage's hidden states, its
output the next stage's input or, on the last stage, the logits, whose loss the schedule
computes there (torchtitan's cross-entropy, fp32 logits): ``LastStage`` adds it.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ....passes.errors import GraphcostError, opt
from ....passes.parallel.pipeline import stage_layers

EMBEDDINGS = ("embed_tokens", "tok_embeddings")
HEADS = ("lm_head", "output")


class LastStage(torch.nn.Module):
    """The last stage with the schedule's loss: ``loss_fn(stage(x), labels)``, torchtitan's
    ``cross_entropy_loss``. The logits are the stage's output (the schedule keeps them)."""

    def __init__(self, stage: torch.nn.Module):
        super().__init__()
        self.stage = stage

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pred = self.stage(hidden)
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def pipeline_stage(module: torch.nn.Module, stage: int, stages: int) -> torch.nn.Module:
    """A copy of ``module`` cut to stage ``stage`` of ``stages`` (checked: a torchtitan-style
    decoder with at least one block a stage)."""
    where = opt("parallel", value=f"pp={stages}")
    layers = getattr(module, "layers", None)
    embed = next((n for n in EMBEDDINGS if getattr(module, n, None) is not None), None)
    head = next((n for n in HEADS if getattr(module, n, None) is not None), None)
    if not isinstance(layers, torch.nn.ModuleList) or embed is None or head is None \
            or getattr(module, "norm", None) is None:
        raise GraphcostError(f"{where}: graphcost cuts torchtitan-style decoders (a token "
                             f"embedding ({'/'.join(EMBEDDINGS)}), a 'layers' ModuleList, "
                             f"'norm' and a head ({'/'.join(HEADS)}) on the model itself, its "
                             "forward skipping a part that is None); this model is not one")
    if len(layers) < stages:
        raise GraphcostError(f"{where}: {len(layers)} blocks cannot fill {stages} stages")
    model = copy.deepcopy(module)
    kept = stage_layers(len(layers), stage, stages)
    blocks = getattr(model, "layers")
    assert isinstance(blocks, torch.nn.ModuleList)  # (checked on the original above)
    setattr(model, "layers", torch.nn.ModuleList([blocks[i] for i in kept]))
    if stage > 0:
        setattr(model, embed, None)
    if stage < stages - 1:
        setattr(model, "norm", None)
        setattr(model, head, None)
    return model


def stage_inputs(module: torch.nn.Module, ids: torch.Tensor, stage: int,
                 stages: int) -> tuple[torch.Tensor, ...]:
    """The stage's inputs at the micro-batch of ``ids``: the ids (first stage), else the
    hidden states the previous stage sends (its embedding's width and dtype), and on the
    last stage the labels beside them."""
    if stage == 0:
        return (ids,)
    table = next(getattr(module, n) for n in EMBEDDINGS if getattr(module, n, None) is not None)
    hidden = ids.new_empty((*ids.shape, table.embedding_dim), dtype=table.weight.dtype)
    return (hidden, torch.empty_like(ids, dtype=torch.int64)) if stage == stages - 1 \
        else (hidden,)
