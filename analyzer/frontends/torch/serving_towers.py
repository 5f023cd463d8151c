"""A vision tower and its projector beside a served language model (Llama 4's, LLaVA's), as a
serving engine's tensor-parallel ranks hold them: vLLM shards an encoder as it shards the
decoder (``use_data_parallel`` off, its default) — an MLP's ``fc1`` column-parallel and
``fc2`` row-parallel (Llama 4's and CLIP's ``*VisionMLP``, SigLIP's), the linears
transformers' plan gathers column-parallel with their output gathered
(``ColumnParallelLinear(gather_output=True)``: Llama 4's patch embedding and
``multi_modal_projector``), and the tower's own tables (a class token, positional
embeddings: bare parameters, convolutions) whole on every rank. Outside the text model only
(vocab_layers.outside_text): inside it, a projection transformers' plan gathers is split by
vLLM its own way, refused where that is not modelled (Qwen3-Next's linear attention).
Derived from vLLM's code (vllm/model_executor/models/mllama4.py), not measured; a served
step without an image does not run the tower, whose weights a rank then holds alone.
"""
from __future__ import annotations

import torch

from .vocab_layers import outside_text

MLP_IN, MLP_OUT = ("fc1",), ("fc2",)


def encoder_style(style: str | None, leaf: str) -> str | None:
    """A tower's linear's style under a serving engine's plan: transformers' plan's where it
    names it (gathered column-wise ones kept gathered), else vLLM's MLP names."""
    if style is not None:
        return style if style in ("colwise", "rowwise", "colwise_gather_output") else None
    return "colwise" if leaf in MLP_IN else "rowwise" if leaf in MLP_OUT else None


def held_whole(model: torch.nn.Module, name: str) -> bool:
    """Whether module ``name`` is a tower's table — its matrices its own parameters, not a
    linear's or an embedding's, outside the text model — which every rank holds whole."""
    module = model.get_submodule(name) if name else model
    return outside_text(model)(name) and \
        not isinstance(module, (torch.nn.Linear, torch.nn.Embedding))
