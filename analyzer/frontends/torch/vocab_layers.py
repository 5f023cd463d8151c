"""A model's token embedding and the LM head projecting back onto its vocabulary — what
tensor parallelism shards vocabulary-wise (tensor_parallel.py), a pipeline's end stages share
when tied (analyzer/load/rank_program.py) and the serving review reads the last position's
logits through (serve.py) — and the text model they bound (``outside_text``)."""
from __future__ import annotations

from typing import Callable

import torch

from .pipeline_stages import HEADS


def is_tied(tokens, head) -> bool:
    """Whether the LM head ``head`` reads the token embedding's table (``vocab_layers``)."""
    return tokens is not None and head is not None and head.weight is tokens.weight


def vocab_layers(model: torch.nn.Module):
    """(the token embedding, the LM head projecting back onto its vocabulary), either None."""
    tokens, head = _got(model, "get_input_embeddings"), _got(model, "get_output_embeddings")
    if tokens is None:
        tables = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
        tokens = max(tables, key=lambda m: m.num_embeddings, default=None)
    if head is None and isinstance(tokens, torch.nn.Embedding):
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        # (whole sizes: a tensor-parallel rank's shards say theirs, tp_shards.py)
        rows = getattr(tokens, "full_rows", tokens.num_embeddings)
        head = linears[-1] if linears and \
            getattr(linears[-1], "full_out", linears[-1].out_features) == rows else None
    if head is None and tokens is None:   # (a later pipeline stage: its head by name)
        head = next((m for n, m in model.named_modules()
                     if n.rsplit(".", 1)[-1] in HEADS and isinstance(m, torch.nn.Linear)),
                    None)
    return (tokens if isinstance(tokens, torch.nn.Embedding) else None,
            head if isinstance(head, torch.nn.Linear) else None)


def outside_text(model: torch.nn.Module) -> Callable[[str], bool]:
    """Whether a module of ``model`` (by name) is outside its text model — the module holding
    the token embedding: a vision tower or a projector beside it (Llama 4's, LLaVA's). Nothing
    is, where the embedding is the model's own child (or there is none)."""
    tokens, head = vocab_layers(model)
    names = {id(m): n for n, m in model.named_modules()}
    root = names.get(id(tokens), "").rpartition(".")[0]
    own = names.get(id(head), "") or "\0"   # (the head beside it is the text model's)
    return lambda path: bool(root) and not path.startswith(root + ".") and \
        path != own and not path.startswith(own + ".")


def _got(model: torch.nn.Module, getter: str):
    """What transformers' ``getter`` returns, None where the model has none (its default
    raises NotImplementedError on a model without token embeddings: Parakeet's CTC encoder)."""
    get = getattr(model, getter, None)
    try:
        return get() if callable(get) else None
    except NotImplementedError:
        return None
