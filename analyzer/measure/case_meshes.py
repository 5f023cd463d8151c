"""The device meshes a measured case's ranks run on (analyzer/measure/parallel.py), as
torchtitan's ``ParallelDims`` lays them out, and fully_shard over them: the dense mesh
(dp_replicate, dp_shard, tp) or (dp_shard, cp, tp), and beside expert parallelism the sparse
mesh (dp_replicate, efsdp, ep), ep the innermost ranks of dp_shard × cp × tp."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .parallel import Case


def case_mesh(case: Case):
    """The dense device mesh of HSDP, context and/or tensor parallelism, torchtitan's
    dimensions outer to inner ((dp_replicate, dp_shard, tp) or (dp_shard, cp, tp)), else
    None: fully_shard's default, a 1-D mesh over every rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    if case.cp > 1:        # (dp_shard, cp, tp): fully_shard over dp_shard × cp
        shard = dist.get_world_size() // (case.cp * case.tp)
        return init_device_mesh("cpu", (shard, case.cp, case.tp),
                                mesh_dim_names=("dp_shard", "cp", "tp"))
    if case.replicate == 1 and case.tp == 1:
        return None
    shard = dist.get_world_size() // (case.replicate * case.tp)
    return init_device_mesh("cpu", (case.replicate, shard, case.tp),
                            mesh_dim_names=("dp_replicate", "dp_shard", "tp"))


def data_mesh(mesh):
    """The data dimensions of a 3-D mesh as fully_shard takes them: (replicate, shard) for
    HSDP, the shard dimension alone (with cp, dp_shard × cp flattened: torchtitan's
    dp_shard_cp), or None where the data dimensions are 1."""
    if "cp" in (mesh.mesh_dim_names or ()):
        return shard_with_cp(mesh)
    replicate, shard = mesh["dp_replicate"].size(), mesh["dp_shard"].size()
    if replicate > 1:
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_shard"] if shard > 1 else None


def shard_with_cp(mesh):
    """The ranks fully_shard shards over beside context parallelism: dp_shard × cp flattened
    (torchtitan's dp_shard_cp), or cp alone where dp_shard is 1."""
    if mesh["dp_shard"].size() == 1:
        return mesh["cp"]
    return mesh["dp_shard", "cp"]._flatten("dp_shard_cp")


def expert_ranks(model, case: Case, tp_group=None):
    """Expert parallelism applied (expert_plan.py; beside ``tp_group``'s tensor parallelism,
    on each tp rank's share of the tokens): the new experts modules and the mesh fully_shard
    shards them on (none without ep) — torchtitan's sparse mesh (dp_replicate, efsdp, ep), ep
    the innermost ranks of dp_shard × cp × tp, the experts sharded over efsdp and replicated
    over dp_replicate (HSDP)."""
    if case.ep == 1:
        return [], None
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from .expert_plan import apply_expert_parallel
    efsdp = dist.get_world_size() // (case.replicate * case.ep)
    mesh = init_device_mesh("cpu", (case.replicate, efsdp, case.ep),
                            mesh_dim_names=("dp_replicate", "efsdp", "ep"))
    experts = apply_expert_parallel(model, mesh["ep"].get_group(), tp_group)
    return experts, mesh["dp_replicate", "efsdp"] if case.replicate > 1 else mesh["efsdp"]


def fully_shard_case(model, case: Case, mesh, experts: list, experts_mesh) -> None:
    """fully_shard on each expert-parallel experts module (over efsdp, torchtitan's order),
    each unit, then the root; bf16-master under FSDP2's MixedPrecisionPolicy."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    reshard = case.strategy != "zero2"
    kw = {} if mesh is None else {"mesh": mesh}
    if case.precision == "bf16-master":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    for module in experts:
        fully_shard(module, reshard_after_forward=reshard, **{**kw, "mesh": experts_mesh})
    for name in case.units:
        fully_shard(model.get_submodule(name), reshard_after_forward=reshard, **kw)
    fully_shard(model, reshard_after_forward=reshard, **kw)
