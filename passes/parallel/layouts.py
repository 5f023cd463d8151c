"""The device meshes a plan searches for ``gpus`` GPUs (analyzer/app/plan.py): every way the
modelled dimensions divide them, as torchtitan lays them out (tp innermost, within a node).

For each tensor-parallel size (powers of two up to a node's GPUs that divide ``gpus``; or the
sizes asked for) the data ranks left over run

- FSDP2 over all of them (``dp_shard``; torchtitan's default);
- HSDP where they span several nodes: each shard group one node's GPUs, replicated across
  the nodes (``dp_replicate`` × ``dp_shard``, torchtitan's and Megatron's usual multi-node
  layout: the all-gathers stay on NVLink);
- DDP (``dp_replicate``): every weight and optimizer state whole on each rank.

With pipeline stages (``pipeline_sizes``: 2, 4, 8, … stages, outermost as torchtitan lays
them) the data ranks left over run FSDP or HSDP: a pipeline beside DDP is not modelled.

A model trained on long sequences also runs FSDP with context parallelism
(``context_layouts``): each sequence split over ``cp`` of the data ranks (2, 4, … up to a
node, dividing them and the sequence into a head and a tail chunk a rank), which shard the
weights with dp_shard's (torchtitan's dp_shard × cp), beside each tensor-parallel size.

A mixture of experts' GPUs also run FSDP with expert parallelism (``expert_layouts``): ``ep``
ranks carved out of ``dp_shard`` (2, 4, … up to a node: the all-to-alls on NVLink, as
torchtitan's and Megatron's MoE recipes keep them), each size dividing the data ranks and
every layer's experts — beside FSDP, and beside HSDP where the GPUs span several nodes (a
shard group a node), a pipeline's stages each so, and beside each tensor-parallel size
(ep carved out of dp_shard × tp, as torchtitan carves it; over several nodes beside HSDP
too, a node's dp_shard × tp ranks carving it); not beside cp (analyzed, not searched).
"""
from __future__ import annotations

from .mesh import Mesh


def tensor_sizes(gpus: int, node: int) -> tuple[int, ...]:
    """The tensor-parallel sizes a plan tries: 1, 2, 4, … up to a node, dividing ``gpus``
    (a tensor-parallel group crossing nodes puts its per-layer collectives on the network)."""
    sizes, tp = [], 1
    while tp <= min(node, gpus):
        if gpus % tp == 0:
            sizes.append(tp)
        tp *= 2
    return tuple(sizes)


def pipeline_sizes(gpus: int, blocks: int, most: int = 16) -> tuple[int, ...]:
    """The pipeline sizes a plan tries besides none: 2, 4, … up to ``most`` stages, dividing
    ``gpus`` (those of one tensor-parallel size), each stage at least one of ``blocks``."""
    sizes, pp = [], 2
    while pp <= min(most, gpus, blocks):
        if gpus % pp == 0:
            sizes.append(pp)
        pp *= 2
    return tuple(sizes)


def piped(mesh: Mesh, pp: int) -> Mesh | None:
    """``mesh`` (of one pipeline stage's GPUs) in ``pp`` stages, outermost; None where its
    data ranks replicate (DDP beside a pipeline is not modelled)."""
    dims = dict(mesh.dims)
    if pp == 1:
        return mesh
    if (dims.get("dp_replicate") or 1) > 1 and dims.get("dp_shard", 1) == 1:
        return None
    return Mesh((("pp", pp), *mesh.dims))


def data_layouts(gpus: int, tp: int, node: int) -> list[Mesh]:
    """The meshes of ``gpus`` GPUs with ``tp`` tensor-parallel ranks: FSDP, HSDP (a shard group
    a node) and DDP over the ``gpus // tp`` data ranks, in that order."""
    data = gpus // tp
    inner = (("tp", tp),) if tp > 1 else ()
    if data == 1:
        return [Mesh(inner)]   # (one GPU: no mesh at all)
    out = [Mesh((("dp_shard", data), *inner))]
    shard = max(node // tp, 1)
    if 1 < shard < data and data % shard == 0:
        out.append(Mesh((("dp_replicate", data // shard), ("dp_shard", shard), *inner)))
    out.append(Mesh((("dp_replicate", data), *inner)))
    return out


def data_ranks(mesh: Mesh) -> int:
    """The mesh's data-parallel ranks (the batch is split over them)."""
    return (mesh.size("dp_replicate") or 1) * (mesh.size("dp_shard") or 1)


def expert_sizes(data: int, experts: int, node: int) -> tuple[int, ...]:
    """The expert-parallel sizes a plan tries over ``data`` sharding ranks: 2, 4, … up to a
    node, each dividing the ranks and ``experts`` (a layer's; 0: the model has none)."""
    sizes, ep = [], 2
    while ep <= min(node, data, experts):
        if data % ep == 0 and experts % ep == 0:
            sizes.append(ep)
        ep *= 2
    return tuple(sizes)


def expert_layouts(gpus: int, sizes: tuple[int, ...], node: int, tp: int = 1) -> list[Mesh]:
    """FSDP over ``gpus`` ranks with each expert-parallel size of ``sizes`` carved out of
    them (``dp_shard=gpus,ep=E``: torchtitan's efsdp × ep); over several nodes HSDP too, a
    shard group a node and ep within it (the experts replicated across the nodes). Beside
    ``tp`` tensor-parallel ranks (innermost) the ep group is carved out of dp_shard × tp:
    ``dp_shard=gpus/tp,tp=tp,ep=E``, and over several nodes ``dp_replicate=gpus/node,
    dp_shard=node/tp,tp=tp,ep=E`` (a node's dp_shard × tp ranks carve ep)."""
    if gpus % tp or gpus // tp < 2:   # (a dp_shard of 1 is no fully_shard: DDP, refused)
        return []
    inner = (("tp", tp),) if tp > 1 else ()
    out = [Mesh((("dp_shard", gpus // tp), *inner, ("ep", ep))) for ep in sizes]
    if 1 < node < gpus and gpus % node == 0 and node % tp == 0 and node > tp:
        out += [Mesh((("dp_replicate", gpus // node), ("dp_shard", node // tp), *inner,
                      ("ep", ep))) for ep in sizes if node % ep == 0]
    return out


def context_sizes(gpus: int, seq: int, node: int) -> tuple[int, ...]:
    """The context-parallel sizes a plan tries over ``gpus`` sharding ranks: 2, 4, … up to a
    node, each dividing the ranks and ``seq`` into 2·cp chunks (0: no sequence)."""
    sizes, cp = [], 2
    while cp <= min(node, gpus):
        if gpus % cp == 0 and seq and seq % (2 * cp) == 0:
            sizes.append(cp)
        cp *= 2
    return tuple(sizes)


def context_layouts(gpus: int, sizes: tuple[int, ...], tp: int = 1) -> list[Mesh]:
    """FSDP over ``gpus`` ranks (``tp`` of them tensor-parallel, innermost), each size of
    ``sizes`` of the rest splitting every sequence (``dp_shard=gpus/tp/cp,cp=cp[,tp=tp]``)."""
    inner = (("tp", tp),) if tp > 1 else ()
    return [Mesh((("dp_shard", gpus // tp // cp), ("cp", cp), *inner)) for cp in sizes
            if (gpus // tp) % cp == 0]


def context_expert_layouts(gpus: int, sizes: tuple[int, ...],
                           experts: tuple[int, ...]) -> list[Mesh]:
    """FSDP over ``gpus`` ranks, each size of ``sizes`` splitting every sequence and each
    expert-parallel size of ``experts`` carved out of the dp_shard × cp ranks
    (``dp_shard=gpus/cp,cp=cp,ep=E``: torchtitan's carving, a ring's ranks routing to each
    other's experts)."""
    return [Mesh((("dp_shard", gpus // cp), ("cp", cp), ("ep", ep))) for cp in sizes
            for ep in experts if gpus % cp == 0 and gpus % ep == 0]
