"""A parallel layout as a device mesh: named dimensions, outer to inner, whose sizes multiply
to the world size — torchtitan's ``ParallelDims`` and PyTorch's ``init_device_mesh``.

The names are torchtitan's (its ``[parallelism]`` settings), with Megatron-LM's beside them:

=============  ==========================================  ================================
dimension      what it splits                               Megatron-LM
=============  ==========================================  ================================
dp_replicate   the batch; weights replicated (DDP, HSDP's   data-parallel (DDP)
               replicas)
dp_shard       the batch; weights, gradients and optimizer  data-parallel with the
               state sharded (FSDP2 ``fully_shard``, ZeRO)  distributed optimizer
cp             the sequence (context parallel)              context-parallel-size
tp             each layer's weights (tensor parallel)       tensor-model-parallel-size
pp             the layers (pipeline stages)                 pipeline-model-parallel-size
ep             the experts of an MoE layer                  expert-model-parallel-size
=============  ==========================================  ================================

``cp`` splits each sequence: a rank holds S/cp tokens of it (torchtitan's head-tail shard)
and its attention is PyTorch's ring over the cp ranks (analyzer/frontends/torch/
context_parallel.py); as in torchtitan, the cp ranks also shard the weights with dp_shard's
(fully_shard over dp_shard × cp), and the batch is split over dp_shard alone.

``ep`` is not a dimension of its own ranks: as in torchtitan's ``ParallelDims`` (its sparse mesh
``dp_replicate × efsdp × ep``) and Megatron-LM, the expert-parallel group is carved out of the
data-sharding ranks and the tensor-parallel ones beside them (dp_shard × cp × tp), so
``dp_shard=8,ep=4`` is 8 ranks, each holding a quarter of every layer's experts, sharded by
fully_shard over the 2 ranks that hold the same quarter (efsdp = dp_shard · cp · tp / ep) and
replicated over dp_replicate.

Today's strategies are meshes of the data-parallel dimensions (``mesh_of``): ddp replicates
over ``dp_replicate``; zero1/2/3 and fsdp shard over ``dp_shard``; both (HSDP, FSDP2's
``fully_shard`` on a 2-D mesh) shard within each replica group and all-reduce the gradient
shards across the groups. ``tp`` is traced: the model rewritten into one tensor-parallel
rank's program (analyzer/frontends/torch/tensor_parallel.py) before the data dimensions shard
it (passes/parallel/tensor.py adds its collectives). ``pp`` cuts the model into stages, each
its own traced program, beside fully_shard's data dimensions, ``tp``, ``ep`` and ``cp``
(passes/parallel/pipeline.py; beside DDP it is refused). ``ep`` is traced too, the experts rewritten into the
rank's slice and torchtitan's token exchange (analyzer/frontends/torch/expert_parallel.py),
beside fully_shard, HSDP, cp, tp and pp. ``MODELLED`` lists these; a mesh with
another dimension larger than 1 is refused by ``check_mesh`` with its name, never priced as
if it were data parallel. A new dimension is
added here and in a module of passes/parallel/ that transforms the rank's step (docs/layout.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from ..choices import Strategy
from ..errors import GraphcostError, opt

MESH_DIMS = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
MODELLED = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
CARVED = ("ep",)     # dimensions made of other dimensions' ranks: no factor of the world


@dataclass(frozen=True)
class Mesh:
    """Named dimensions outer to inner, each ``(name, size)``; a size None is ``auto`` (the
    smallest that fits, searched by the parallel pass)."""
    dims: tuple[tuple[str, int | None], ...]

    def size(self, name: str) -> int | None:
        """The dimension's size: 1 where the mesh does not have it, None where auto."""
        return dict(self.dims).get(name, 1)

    @property
    def world_size(self) -> int | None:
        sizes = [n for k, n in self.dims if k not in CARVED]
        return None if any(n is None for n in sizes) else prod(n for n in sizes if n)

    @property
    def words(self) -> str:
        """``dp_shard=8,tp=2`` (the command line's spelling; ``auto`` for a searched size)."""
        return ",".join(f"{k}={'auto' if n is None else n}" for k, n in self.dims)


def mesh_of(strategy: str, world_size: int | None, replicate: int = 1, tp: int = 1,
            ep: int = 1, cp: int = 1) -> Mesh:
    """The mesh a data-parallel strategy runs on: DDP replicates, the others shard over
    ``world_size`` ranks — within each of ``replicate`` groups (HSDP) where that is above 1,
    ``cp`` of them context-parallel (dp_shard × cp, torchtitan's order); ``tp``
    tensor-parallel ranks innermost, ``ep`` carved out of the sharding ranks."""
    inner = (("cp", cp),) if cp > 1 else ()
    inner += (("tp", tp),) if tp > 1 else ()
    inner += (("ep", ep),) if ep > 1 else ()
    if strategy == Strategy.DDP:
        if tp > 1 and world_size == 1:
            return Mesh(inner)
        return Mesh((("dp_replicate", world_size), *inner))
    shard = None if world_size is None else world_size // cp
    if replicate > 1:
        return Mesh((("dp_replicate", replicate), ("dp_shard", shard), *inner))
    return Mesh((("dp_shard", shard), *inner))


def strategy_of(mesh: Mesh) -> str:
    """The data-parallel strategy a mesh names: fsdp where it shards (FSDP2, torchtitan's
    default; HSDP beside dp_replicate), ddp where it only replicates (dp_shard absent or 1,
    as torchtitan's ParallelDims reads it). A tensor-parallel mesh whose data dimensions are
    all 1 is ddp over one rank: no data-parallel wrapper (passes/parallel/step.py)."""
    dims = dict(mesh.dims)
    shard, replicate = mesh.size("dp_shard"), mesh.size("dp_replicate")
    if shard is None or shard > 1 or mesh.size("cp") != 1:   # (cp ranks shard with dp_shard)
        return Strategy.FSDP
    if replicate is None or replicate > 1 or mesh.size("tp") != 1 or mesh.size("pp") != 1:
        return Strategy.DDP
    return Strategy.FSDP if "dp_shard" in dims else Strategy.DDP


def data_sizes(mesh: Mesh) -> tuple[int | None, int]:
    """(the size the strategy runs over, the replica groups beside it): for a sharding mesh
    the dp_shard size (times cp's: torchtitan's fully_shard mesh dp_shard × cp) and
    dp_replicate (HSDP where above 1); for ddp dp_replicate and 1."""
    if strategy_of(mesh) == Strategy.DDP:
        return mesh.size("dp_replicate"), 1
    shard = mesh.size("dp_shard")
    return (None if shard is None else shard * (mesh.size("cp") or 1),
            mesh.size("dp_replicate") or 1)


def parse_mesh(text: str) -> Mesh:
    """``dp_shard=8,tp=2`` as a Mesh (sizes whole numbers ≥ 1, or auto), checked."""
    dims: list[tuple[str, int | None]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, size = (x.strip() for x in part.partition("="))
        if not sep or not size:
            raise GraphcostError(f"{opt('parallel', value=text[:80])}: expected NAME=SIZE "
                                 f"pairs such as dp_shard=8 (names: {', '.join(MESH_DIMS)})")
        if size.lower() == "auto":
            dims.append((name, None))
        elif size.isdigit():
            dims.append((name, int(size)))
        else:
            raise GraphcostError(f"{opt('parallel', value=part[:80])}: a size is a whole "
                                 "number ≥ 1 or auto")
    mesh = Mesh(tuple(dims))
    check_mesh(mesh)
    return mesh


def check_mesh(mesh: Mesh) -> None:
    """Known names, each once; sizes ≥ 1 (at most one auto); only MODELLED ones above 1."""
    names = [k for k, _ in mesh.dims]
    unknown = [k for k in names if k not in MESH_DIMS]
    if unknown or not names or len(set(names)) != len(names):
        raise GraphcostError(f"{opt('parallel', value=mesh.words[:80])}: the dimensions are "
                             f"{', '.join(MESH_DIMS)}, each at most once")
    sizes = [n for _, n in mesh.dims]
    if any(n is not None and n < 1 for n in sizes) or sizes.count(None) > 1:
        raise GraphcostError(f"{opt('parallel', value=mesh.words[:80])}: sizes are whole "
                             "numbers ≥ 1, at most one of them auto")
    beyond = [k for k, n in mesh.dims if k not in MODELLED and n != 1]
    if beyond:
        raise GraphcostError(f"{opt('parallel', value=mesh.words[:80])}: {beyond[0]} is not "
                             f"modelled yet (modelled: {', '.join(MODELLED)})")
    if mesh.size("pp") != 1 and mesh.size("dp_replicate") != 1 and mesh.size("dp_shard") == 1:
        raise GraphcostError(f"{opt('parallel', value=mesh.words[:80])}: pipeline stages "
                             "beside ddp are not modelled (beside fully_shard, dp_shard, as "
                             "torchtitan runs them, they are)")
    if any(mesh.size(k) is None for k in ("tp", "pp", "ep", "cp")):
        raise GraphcostError(f"{opt('parallel', value=mesh.words[:80])}: tp, pp, ep and cp "
                             "are traced at their sizes; auto searches a data dimension")
    _check_experts(mesh)
    _check_context(mesh)
    if mesh.size("dp_replicate") is None and mesh.size("dp_shard") != 1:
        raise GraphcostError(f"{opt('parallel', value=mesh.words[:80])}: with HSDP, auto "
                             "searches dp_shard (the group that shards); give dp_replicate")


def _check_context(mesh: Mesh) -> None:
    """cp sharding with dp_shard (torchtitan's dp_shard × cp), beside the data dimensions."""
    if (mesh.size("cp") or 1) == 1:
        return
    words = opt("parallel", value=mesh.words[:80])
    if mesh.size("dp_shard") is None:
        raise GraphcostError(f"{words}: the cp ranks shard the weights with dp_shard's; give "
                             "dp_shard's size (auto is not searched beside cp)")


def _check_experts(mesh: Mesh) -> None:
    """ep carved out of dp_shard × cp × tp (torchtitan's sparse mesh), beside fully_shard
    (HSDP too: the experts replicated over dp_replicate), cp, tp and pp (a stage's dp_shard ×
    tp ranks carving it)."""
    ep, shard = mesh.size("ep") or 1, mesh.size("dp_shard")
    if ep == 1:
        return
    words = opt("parallel", value=mesh.words[:80])
    tp = mesh.size("tp") or 1
    if shard is None:
        raise GraphcostError(f"{words}: the ep group is carved out of the dp_shard ranks; "
                             "give dp_shard's size (auto is not searched beside ep)")
    region = shard * (mesh.size("cp") or 1) * tp
    if region % ep:
        raise GraphcostError(f"{words}: the ep group is carved out of the dp_shard × cp × tp "
                             f"ranks (torchtitan's efsdp × ep): ep={ep} must divide "
                             f"dp_shard × cp × tp ({region})")
