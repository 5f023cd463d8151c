"""A parallel layout as the passes take it (``ParallelSpec``: the data-parallel strategy, its
world size and options, and the mesh's other dimensions), and its checks (``check_spec``):
what every parallel pass reads (passes/parallel/step.py, pipeline.py, step_time.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ..choices import Offload, Strategy
from ..errors import GraphcostError, opt
from .comm import InterconnectRates
from .context import check_cp
from .experts import check_ep
from .mesh import Mesh, mesh_of

STRATEGIES = Strategy.words()
SHARDED = tuple(s for s in Strategy if s.shards_gradients)
OFFLOADS = Offload.words()
MAX_WORLD = 1 << 16


@dataclass(frozen=True)
class ParallelSpec:
    """A parallel layout: how the data dimension shards (``strategy``) over how many ranks,
    with its options, and the mesh's other dimensions (HSDP's replica groups, tensor and
    pipeline parallelism). ``mesh`` names it as a device mesh (passes/parallel/mesh.py)."""
    strategy: str
    world_size: int | None = None     # None: the smallest that fits (``fits``)
    offload: str | None = None
    bucket_cap_mb: float = 25.0
    units: tuple[str, ...] | None = None
    interconnect: InterconnectRates | None = None
    # HSDP: replica groups of ``world_size`` sharding ranks each (FSDP2 on a 2-D mesh); the
    # rank's memory is its shard group's, its gradient shards all-reduced across the groups
    replicate: int = 1
    # tensor parallel: the graph is one of ``tp`` ranks' programs (traced so: LoadOptions'
    # tensor_parallel); ddp over one rank beside it is no data-parallel wrapper at all
    tp: int = 1
    # pipeline parallel: ``pp`` stages, each its own traced program (passes/parallel/
    # pipeline.py), ``microbatches`` a step under ``schedule``
    pp: int = 1
    microbatches: int | None = None     # None: one sequence each (torchtitan's default)
    schedule: str = "1f1b"
    stages_per_rank: int = 1            # an interleaved schedule's (pp × this stages in all)
    # the tensor-parallel collectives overlapped by the matmuls they feed (torchtitan's async
    # TP, Megatron's --tp-comm-overlap): their time on the clock (passes/parallel/step_time.py)
    async_tp: bool = False
    # expert parallel: the graph is one of ``ep`` ranks' programs (LoadOptions'
    # expert_parallel), carved out of the ``world_size`` sharding ranks; each layer's experts
    # an FSDP unit of its own over world_size / ep of them (torchtitan's efsdp)
    ep: int = 1
    # context parallel: the graph is one of ``cp`` ranks' programs (LoadOptions'
    # context_parallel: a shard of each sequence, attention a ring), ``cp`` of the
    # ``world_size`` sharding ranks sharing each sequence (torchtitan's dp_shard × cp)
    cp: int = 1
    # how the ring hands on the keys and values (passes/choices.py Rotate): all-gathered once,
    # or one rank's passed at each step
    cp_rotate: str = "allgather"
    gpus_per_node: int = 8   # a dimension whose group spans more crosses the network
    # FSDP2 gathers float8 linears' weights in float8 (torchao's enable_fsdp_float8_all_gather;
    # traced so: LoadOptions' float8_all_gather): their gathers and unsharded copies one byte
    # an element (passes/parallel/units.py)
    float8_all_gather: bool = False

    @property
    def mesh(self) -> Mesh:
        return mesh_of(self.strategy, self.world_size, self.replicate, self.tp, self.ep,
                       self.cp)

    @property
    def unwrapped(self) -> bool:
        """Tensor parallel alone: no DDP/FSDP around the model (torchtitan's dp degree 1)."""
        return self.tp > 1 and self.strategy == Strategy.DDP and self.world_size == 1


def check_spec(spec: ParallelSpec) -> None:
    if spec.strategy not in STRATEGIES:
        raise GraphcostError(f"{opt('parallel', value=spec.strategy)}: known: {', '.join(STRATEGIES)}")
    if spec.world_size is not None and (not isinstance(spec.world_size, int)
                                        or not 1 <= spec.world_size <= MAX_WORLD):
        # the bound --world-size auto searches to (65,536 ranks: beyond the largest jobs run)
        raise GraphcostError(f"{opt('parallel.world_size', value=spec.world_size)}: must be a whole number from 1 "
                             f"to {MAX_WORLD:,} (or auto)")
    if spec.offload not in (None, *OFFLOADS):
        raise GraphcostError(f"{opt('parallel.offload', value=spec.offload)}: known: {', '.join(OFFLOADS)}")
    if spec.offload and spec.strategy == Strategy.DDP:
        raise GraphcostError(f"{opt('parallel.offload', value=spec.offload)} with ddp: ddp keeps everything on the "
                             "device; offloading needs zero1, zero2, zero3 or fsdp")
    if spec.offload == Offload.PARAMS and spec.strategy not in (Strategy.ZERO3, Strategy.FSDP):
        raise GraphcostError(f"{opt('parallel.offload', value=Offload.PARAMS)} needs zero3 or fsdp (parameters are "
                             f"sharded there); {spec.strategy} replicates them: use "
                             f"{opt('parallel.offload', value=Offload.OPTIMIZER)}")
    if not spec.bucket_cap_mb > 0:
        raise GraphcostError(f"{opt('parallel.bucket_cap_mb')} {spec.bucket_cap_mb}: must be > 0")
    if spec.units is not None and spec.strategy not in SHARDED:
        raise GraphcostError(f"{opt('parallel.units')} goes with zero2, zero3 or fsdp")
    if not isinstance(spec.tp, int) or not 1 <= spec.tp <= MAX_WORLD:
        raise GraphcostError(f"{opt('parallel', value=f'tp={spec.tp}')}: must be a whole "
                             f"number from 1 to {MAX_WORLD:,}")
    check_ep(spec.ep, spec.strategy in SHARDED, spec.world_size, spec.tp)
    check_cp(spec.cp, spec.strategy in SHARDED, spec.world_size, spec.cp_rotate)
    if not isinstance(spec.replicate, int) or not 1 <= spec.replicate <= MAX_WORLD:
        raise GraphcostError(f"{opt('parallel', value=f'dp_replicate={spec.replicate}')}: "
                             f"must be a whole number from 1 to {MAX_WORLD:,}")
    if spec.float8_all_gather and spec.strategy not in SHARDED:
        raise GraphcostError(f"{opt('parallel.float8_all_gather')} is FSDP2's all-gather of "
                             f"float8 weights: {spec.strategy} gathers none (zero2, zero3, "
                             "fsdp: a mesh with dp_shard)")
    if spec.replicate > 1 and spec.strategy not in SHARDED:
        raise GraphcostError(f"{opt('parallel', value=spec.strategy)} with dp_replicate="
                             f"{spec.replicate}: HSDP shards within each replica group "
                             "(zero2, zero3, fsdp)")
