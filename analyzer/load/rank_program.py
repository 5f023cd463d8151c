"""One rank's program of a parallel layout, made from a resolved PyTorch model before it is
traced: a pipeline stage cut from it (frontends/torch/pipeline_stages.py), the expert-
parallel rank's experts (frontends/torch/expert_parallel.py), then the tensor-parallel
rank's rewrite (frontends/torch/tensor_parallel.py). The caller's module is never
changed."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...passes.errors import GraphcostError, opt
from .resolve import Resolved


def pipeline_blocks(r: Resolved) -> int:
    """The repeated blocks a pipeline of ``r`` divides among its stages (0: none found; the
    cut refuses the model by name)."""
    from ..frontends.torch.pipeline_stages import block_count
    return block_count(r.module) if r.kind == "torch" else 0


def split_by_tracer(r: Resolved) -> bool:
    """Whether a pipeline of ``r`` is split by PyTorch's tracer (frontends/torch/
    pipeline_split.py): a model graphcost does not cut by name, with a list of blocks."""
    from ..frontends.torch.pipeline_stages import named_blocks
    return r.kind == "torch" and not named_blocks(r.module) and pipeline_blocks(r) > 0


def check_tracer_split(r: Resolved, stages: int) -> None:
    """Refused (GraphcostError): a pipeline of ``stages`` that PyTorch's tracer splits with a
    stage taking a tensor from one not just before it, which PyTorch's pipelining cannot
    run backward through, or of an encoder-decoder (frontends/torch/pipeline_split.py)."""
    from ..frontends.torch.pipeline_split import (
        check_adjacent,
        check_one_stack,
        stage_pipe,
    )
    check_one_stack(r.module, stages)
    ids = r.kwargs.get("input_ids", r.inputs[0] if r.inputs else None)
    if stages > 2 and ids is not None:
        check_adjacent(stage_pipe(r.module, ids, stages), stages)


def tied_table(r: Resolved) -> int:
    """The elements of the table ``r``'s LM head shares with its token embedding (one
    weight; 0: not tied)."""
    from ..frontends.torch.vocab_layers import is_tied, vocab_layers
    if r.kind != "torch":
        return 0
    tokens, head = vocab_layers(r.module)
    return tokens.weight.numel() if tokens is not None and is_tied(tokens, head) else 0


def expert_count(r: Resolved) -> int:
    """The experts each mixture-of-experts layer of ``r`` holds stacked, as expert
    parallelism splits them (their greatest common divisor where layers differ; 0: none)."""
    from math import gcd

    from ..frontends.torch.grouped_experts import stacked_experts
    if r.kind != "torch":
        return 0
    return gcd(*(getattr(m, "num_experts") for _, m in stacked_experts(r.module)))


def interleaved_orders(ranks: int, per_rank: int, micro: int,
                       schedule: str = "interleaved-1f1b") -> list[list[tuple]]:
    """Each rank's forwards and backwards under an interleaved ``schedule`` (1F1B, or a
    zero-bubble one's: its forwards, input halves and weight halves), read off PyTorch's
    (frontends/torch/pipeline_stages.py ``interleaved_order``)."""
    from ..frontends.torch.pipeline_stages import interleaved_order
    return [interleaved_order(ranks, per_rank, micro, r, schedule) for r in range(ranks)]


def first_microbatch(example_inputs, micro: int | None) -> tuple[int, int, Any]:
    """The batch of a pipeline's example inputs, its micro-batches and the first of them, as
    torch.distributed.pipelining splits them (frontends/torch/pipeline_stages.py)."""
    from ..frontends.torch.pipeline_stages import first_microbatch as split
    return split(example_inputs, micro)


def in_pipeline_stage(r: Resolved, stage: tuple[int, int] | None,
                      blocks: int | None = None, beside: bool = False) -> Resolved:
    """One pipeline stage (``(stage, stages)``; None: ``r`` itself): a PyTorch module cut to
    the stage (``blocks``: to its first that many), its inputs the stage's at the same
    micro-batch (frontends/torch/pipeline_stages.py; the caller's module is copied).
    ``beside``: tensor, context or expert parallelism rewrites the stage after, which a stage
    PyTorch's tracer split (a graph module) cannot take."""
    if stage is None:
        return r
    index, stages = stage
    if r.kind != "torch":
        raise GraphcostError(f"{opt('parallel', value=f'pp={stages}')}: pipeline stages are "
                             "cut from a PyTorch module; trace the PyTorch model")
    import torch

    from ..frontends.torch.pipeline_split import traced_stage
    from ..frontends.torch.pipeline_stages import (
        LastStage,
        named_blocks,
        pipeline_stage,
        stage_inputs,
    )
    ids = r.kwargs.get("input_ids", r.inputs[0] if r.inputs else None)
    if ids is None or ids.dim() != 2 or ids.is_floating_point():
        raise GraphcostError(f"{opt('parallel', value=f'pp={stages}')}: a pipeline's first "
                             "stage takes token ids of shape (batch, seq)")
    if named_blocks(r.module):
        module = pipeline_stage(r.module, index, stages, blocks)
        inputs = stage_inputs(r.module, ids, index, stages)
    elif beside:
        raise GraphcostError(f"{opt('parallel', value=f'pp={stages}')}: graphcost splits this "
                             "model as PyTorch's pipeline tracer does (its blocks are not a "
                             "'layers' list), and tensor, context and expert parallelism "
                             "rewrite a stage graphcost cuts by name (torchtitan-style "
                             "decoders, transformers' model.layers): pipeline stages beside "
                             "data parallelism only")
    else:   # (PyTorch's tracer splits it: GPT-2 and the like)
        module, inputs = traced_stage(r.module, ids, index, stages, blocks)
        inputs += (torch.empty_like(ids, dtype=torch.int64),) if index == stages - 1 else ()
    return replace(r, module=LastStage(module) if index == stages - 1 else module,
                   inputs=inputs, kwargs={})


def in_routed_experts(r: Resolved) -> Resolved:
    """``r`` with a mixture of experts that transformers runs densely (Llama 4's: every
    expert on every token) routed, as the engines whose layouts graphcost models run it
    (frontends/torch/routed_llama4.py; the caller's module is copied, and only when it has
    one); the report says so."""
    if r.kind != "torch":
        return r
    import copy

    from ..frontends.torch.routed_llama4 import dense_blocks, routed
    if not dense_blocks(r.module):
        return r
    module = copy.deepcopy(r.module)
    count = routed(module)
    return replace(r, module=module, notes=r.notes + (
        f"{count} Llama 4 expert blocks routed as vLLM and torchtitan run them, each token "
        "through its top-k experts (transformers runs every expert on every token)",))


def in_expert_parallel(r: Resolved, group: int, stage: tuple[int, int] | None = None,
                       whole: Resolved | None = None, tp: int = 1) -> Resolved:
    """One of ``group`` expert-parallel ranks (1: ``r`` itself): a PyTorch module whose
    experts are rewritten into the rank's slice and its token dispatch
    (frontends/torch/expert_parallel.py; the caller's module is copied). A pipeline
    ``stage`` cut from ``whole`` may hold no mixture-of-experts layer (an interleaved split's
    head): it runs as cut, where ``whole`` has experts. Beside ``tp`` tensor-parallel
    ranks each runs its share of the tokens through the experts."""
    if group == 1:
        return r
    if r.kind != "torch":
        raise GraphcostError(f"{opt('parallel', value=f'ep={group}')}: expert parallelism "
                             "rewrites a PyTorch module's experts; trace the PyTorch model")
    r = in_routed_experts(r)
    from ..frontends.torch.expert_parallel import expert_parallel
    from ..frontends.torch.grouped_experts import stacked_experts
    if stage is not None and whole is not None and not stacked_experts(r.module) \
            and stacked_experts(whole.module):
        return r
    return replace(r, module=expert_parallel(r.module, group, tp))


def in_context_parallel(r: Resolved, group: int, stage: tuple[int, int] | None = None
                        ) -> Resolved:
    """One of ``group`` context-parallel ranks (1: ``r`` itself): its shard of each sequence,
    S/``group`` tokens of every input laid out (batch, sequence) — the token ids and what
    runs beside them (masks, positions, labels; a later pipeline ``stage``'s hidden states
    and labels) — as torchtitan's ``cp_shard`` gives a rank (head and tail chunks under load
    balancing: the same sizes). Its attention is the ring (frontends/torch/
    context_parallel.py), set on the trace's attention target."""
    if group == 1:
        return r
    import torch

    words = opt("parallel", value=f"cp={group}")
    if r.kind != "torch":
        raise GraphcostError(f"{words}: context parallelism shards a PyTorch model's "
                             "sequence; trace the PyTorch model")
    flat = [*r.inputs, *r.kwargs.values()]
    ids = next((t for t in flat if isinstance(t, torch.Tensor) and t.dim() == 2
                and not t.is_floating_point()), None)
    if stage is not None and stage[0] > 0 and r.inputs:   # (the hidden states come in)
        ids = r.inputs[0]
    if ids is None:
        raise GraphcostError(f"{words}: context parallelism shards the sequence of token ids "
                             "of shape (batch, seq); this model takes none")
    seq = ids.shape[1]
    if seq % (2 * group):
        raise GraphcostError(f"{words}: the sequence ({seq} tokens) splits into 2 × {group} "
                             "chunks, a head and a tail a rank (torchtitan's load balancing)")

    def shard(t):
        if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[1] == seq:
            return t[:, :seq // group]
        return t
    return replace(r, inputs=tuple(shard(t) for t in r.inputs),
                   kwargs={k: shard(t) for k, t in r.kwargs.items()})


def in_tensor_parallel(r: Resolved, group: int, *, serving: bool = False,
                       stage: tuple[int, int] | None = None) -> Resolved:
    """One of ``group`` tensor-parallel ranks (1: ``r`` itself): a PyTorch module rewritten
    into the rank's program (frontends/torch/tensor_parallel.py; the caller's is copied) —
    ``serving``: under a serving engine's plan (no sequence parallelism); ``stage``: the
    pipeline stage ``r`` was cut to (``in_pipeline_stage``)."""
    if group == 1:
        return r
    if r.kind != "torch":
        raise GraphcostError(f"{opt('parallel', value=f'tp={group}')}: tensor parallelism "
                             "rewrites a PyTorch module's linears; trace the PyTorch model (an "
                             f"{'ONNX graph' if r.kind == 'onnx' else 'exported program'} "
                             "is fixed)")
    from ..frontends.torch.tensor_parallel import is_transformers, tensor_parallel
    module, notes = tensor_parallel(r.module, group, sequence=False if serving else None)
    r = replace(r, notes=r.notes + notes)
    if serving or not stage or not stage[0] or is_transformers(r.module):
        return replace(r, module=module)
    # a later pipeline stage under sequence parallelism receives the previous stage's
    # sequence shard (its last block's row-wise linears scatter the sequence)
    hidden, *rest = r.inputs
    for m in module.modules():   # (the zoo's Llama: where its rotary embedding is made)
        if hasattr(m, "positions"):
            m.positions = hidden.shape[1]
    return replace(r, module=module,
                   inputs=(hidden.narrow(1, 0, hidden.shape[1] // group), *rest))

