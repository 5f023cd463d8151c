"""A vision tower and its projector beside a served language model (Llama 4's, LLaVA's,
Gemma 3's), as a serving engine's tensor-parallel ranks hold them. vLLM has two modes
(``mm_encoder_tp_mode``):

* ``weights`` (its default): the encoder sharded as the decoder is — an attention's q/k/v
  column- and its output projection row-parallel, an MLP's ``fc1`` column- and ``fc2``
  row-parallel (CLIP's, SigLIP's and Llama 4's ``*VisionMLP``), a projector's ``linear_1``
  column- and ``linear_2`` row-parallel (LLaVA's), the linears transformers' plan gathers
  column-parallel with their output gathered (``ColumnParallelLinear(gather_output=True)``:
  Llama 4's patch embedding and ``multi_modal_projector``), the tower's tables (a class token,
  positional embeddings, a patch convolution) whole on every rank;
* ``data``: the encoder whole on every rank, each rank encoding its own images.

graphcost holds a tower as ``weights`` does where it knows a style for each of its linears
(by transformers' plan or the names above), else — a fused or otherwise named tower (Qwen2.5-
VL's ``qkv``, Pixtral's merger) — as ``data`` does, whole, which the report says (its default
would shard it: fewer bytes a rank). Outside the text model only (vocab_layers.outside_text):
inside it, a projection transformers' plan gathers is split by vLLM its own way, refused where
that is not modelled (Qwen3-Next's linear attention). Derived from vLLM's code (vllm/
model_executor/models/mllama4.py, clip.py, llava.py), not measured.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from .vocab_layers import outside_text

COLUMN = ("q_proj", "k_proj", "v_proj", "fc1", "gate_proj", "up_proj", "linear_1")
ROW = ("out_proj", "o_proj", "fc2", "down_proj", "linear_2")
KEPT = ("colwise", "rowwise", "colwise_gather_output")


def encoder_style(style: str | None, leaf: str) -> str | None:
    """A tower's linear's style in ``weights`` mode: transformers' plan's where it names it
    (gathered column-wise ones kept gathered), else by vLLM's names; None: not known."""
    if style is not None:
        return style if style in KEPT else None
    return "colwise" if leaf in COLUMN else "rowwise" if leaf in ROW else None


class Towers(NamedTuple):
    """Whether a module (by name) is outside the text model, and whether its tower is
    sharded (``weights`` mode: a style known for each of its linears) or held whole
    (``data``)."""
    outside: Callable[[str], bool]
    sharded: bool


def tower_plan(model: torch.nn.Module, style: Callable[[str], str | None]) -> Towers:
    """``model``'s vision tower and projector, as a serving engine's ranks hold them."""
    outside = outside_text(model)
    linears = [n for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and outside(n)]
    return Towers(outside, all(encoder_style(style(n), n.rsplit(".", 1)[-1])
                               for n in linears))


def held_whole(model: torch.nn.Module, name: str, towers: Towers) -> bool:
    """Whether module ``name`` is part of a tower that every rank holds whole: a table of a
    sharded tower (its matrices not a linear's), any module of one held whole."""
    module = model.get_submodule(name) if name else model
    return towers.outside(name) and \
        (not towers.sharded or not isinstance(module, torch.nn.Linear))


def whole_towers(model: torch.nn.Module, group: int,
                 towers: Towers) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the modules of a tower held whole — ``data`` mode —, whose head counts stay whole;
    the report's line for it): nothing where the tower is sharded or there is none."""
    held = () if towers.sharded else \
        tuple(n for n, _ in model.named_modules() if n and towers.outside(n))
    if not held:
        return (), ()
    return held, (f"tp={group}: vision tower whole on each rank (vLLM's 'data' encoder mode)",)
