"""analyze()'s pass arguments checked as the command line checks its options.

The world size is within the bound the passes search (passes.parallel.spec.MAX_WORLD), a
device is a name or a DeviceRates with positive rates, an overhead a
passes.device.fits.Overhead (or its command-line text), a checkpoint plan one of the four
forms the CLI builds. Each reads the caller's values made plain first, with the helpers of
analyzer/load/checks.py (which also checks the loading options).
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from ...passes.choices import Rotate, Strategy
from ...passes.device.fits import Overhead
from ...passes.device_rates import DeviceRates
from ...passes.errors import GraphcostError, opt
from ...passes.memory.caching_allocator import AllocatorConfig
from ...passes.parallel.comm import InterconnectRates
from ...passes.parallel.schedules import INTERLEAVED_STAGES, interleaved
from ...passes.training.checkpoint import MEGATRON_CORE_ATTN, CheckpointSpec
from ..load.checks import INT64_MAX, plain, positive, shown, word
from .devices import GPUS_PER_NODE

CHECKPOINT_KEYS = ("names", "every", "sqrt", "budget", "sac", "nth", "core_attn")


def check_unknown(extra: tuple, unknown: Mapping[str, Any], known: Sequence[str]) -> None:
    """Positional arguments past ``example_inputs`` and keywords analyze does not take."""
    if extra:
        raise GraphcostError(f"analyze takes the model and example_inputs as positional "
                             f"arguments; {len(extra)} more given (pass the rest by name)")
    if unknown:
        raise GraphcostError(f"unknown argument(s) {', '.join(sorted(map(str, unknown)))}; "
                             f"known: {', '.join(k for k in known if not k.startswith('_'))}")


def profile_of(profile):
    """A device profile: a path to the JSON file ``graphcost calibrate`` writes (read and
    checked), or a passes.device.profile.DeviceProfile (checked as if read from its JSON);
    None as None."""
    from os import PathLike

    from ...passes.device.profile import (
        DeviceProfile,
        profile_from_json,
        profile_to_json,
    )

    if profile is None:
        return None
    if isinstance(profile, (str, PathLike)):
        from .devices import read_profile
        return read_profile(str(profile))
    if not isinstance(profile, DeviceProfile):
        raise GraphcostError(f"{opt('device_profile')} must be the path of a profile "
                             "graphcost calibrate wrote or a passes.device.profile."
                             f"DeviceProfile, got {type(profile).__name__}")
    try:
        return profile_from_json(profile_to_json(profile))
    except (TypeError, AttributeError, ValueError) as exc:
        raise GraphcostError(f"{opt('device_profile')}: not a well-formed DeviceProfile "
                             f"({type(exc).__name__})") from None


def run_budget(tokens, price, rates, profile) -> dict:
    """A training run to price (``tokens``, a positive count) and its ``price`` per
    GPU-hour, checked: both need a time estimate (a GPU device, or a device profile)."""
    if tokens is None:
        if price is not None:
            raise GraphcostError(f"{opt('price')} prices a run: add {opt('tokens')}")
        return {}
    ok = isinstance(tokens, int) and not isinstance(tokens, bool) and 0 < tokens < 10**18
    if not ok:
        raise GraphcostError(f"{opt('tokens', value=tokens)}: expected a positive count of "
                             "tokens below 10^18")
    if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float))
                              or not 0 < price < 1e6 or price != price):
        raise GraphcostError(f"{opt('price', value=price)}: expected a positive price per "
                             "GPU-hour")
    if profile is None and not (rates is not None and rates.is_gpu):
        raise GraphcostError(f"{opt('tokens')} is priced by the time estimate: give a GPU "
                             f"{opt('device')} or {opt('device_profile')}")
    return {"run_tokens": tokens, "price": None if price is None else float(price)}


def device_of(device):
    """A device name as its DeviceRates; a DeviceRates checked (its rates, bandwidth and memory
    as builtins: the passes compare them); None as None."""
    from ...passes.device.roofline import DTYPES

    if device is None:
        return None
    if isinstance(device, str):
        from .devices import get_device
        return get_device(word(device))
    if not isinstance(device, DeviceRates):
        raise GraphcostError(f"{opt('device')} must be a device name such as 'a100-40gb' or a "
                             f"passes.device_rates.DeviceRates, got {type(device).__name__}")
    rates = plain(device.peak_flops, "device")
    if not isinstance(rates, Mapping) or set(rates) - set(DTYPES):
        raise GraphcostError(f"{opt('device')}: peak_flops must map some of {', '.join(DTYPES)} to "
                             f"FLOP/s, got {shown(rates, 200)}")
    positive(rates.get("fp32"), f"{opt('device')} peak_flops['fp32']")
    for k, v in rates.items():
        if v is not None:
            positive(v, f"{opt('device')} peak_flops[{k!r}]")
    bandwidth, memory = plain(device.bandwidth, "device"), plain(device.memory, "device")
    positive(bandwidth, f"{opt('device')} bandwidth")
    positive(memory, f"{opt('device')} memory", integer=True)
    if not isinstance(device.name, str) or not isinstance(device.label, str):
        raise GraphcostError(f"{opt('device')}: name and label must be strings")
    return dataclasses.replace(device, peak_flops=MappingProxyType(rates), bandwidth=bandwidth,
                               memory=memory, name=word(device.name),
                               label=word(device.label))


def allocator_of(text) -> AllocatorConfig:
    """The caching allocator's settings, as ``PYTORCH_CUDA_ALLOC_CONF`` spells them
    (``expandable_segments:True,max_split_size_mb:128``; None or "default": PyTorch's
    defaults). Settings the replay does not model are refused, never ignored."""
    text = word(text)
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "default")):
        return AllocatorConfig()
    if not isinstance(text, str):
        raise GraphcostError(f"{opt('allocator')} must be text such as "
                             f"'expandable_segments:True', got {type(text).__name__}")
    expandable, split = False, None
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (x.strip() for x in part.partition(":"))
        if key == "expandable_segments" and value in ("True", "False"):
            expandable = value == "True"
        elif key == "max_split_size_mb" and value.isdigit() and int(value) > 20:
            split = int(value) << 20  # CUDAAllocatorConfig: at least kLargeBuffer (20 MiB)
        elif key in ("expandable_segments", "max_split_size_mb"):
            raise GraphcostError(f"{opt('allocator')} {part[:80]}: expected expandable_segments:True "
                                 "or False, max_split_size_mb: a number of MiB over 20")
        else:
            raise GraphcostError(f"{opt('allocator')} {part[:80]}: not modelled (the replay models "
                                 "expandable_segments and max_split_size_mb)")
    return AllocatorConfig(expandable, split)


def overhead_of(overhead):
    """An Overhead checked (its figures as builtins), its command-line text
    (``context=1GiB,allocator=5%``) parsed."""
    if overhead is None:
        return None
    if isinstance(overhead, str):
        from .devices import parse_overhead
        return parse_overhead(word(overhead))
    if not isinstance(overhead, Overhead):
        raise GraphcostError(f"{opt('overhead')} must be a passes.device.fits.Overhead or text such as "
                             f"'context=512MiB,allocator=10%', got {type(overhead).__name__}")
    c, f = plain(overhead.context_bytes, "overhead"), plain(overhead.allocator_fraction, "overhead")
    if c is not None and (isinstance(c, bool) or not isinstance(c, int)
                          or not 0 <= c <= INT64_MAX):
        raise GraphcostError(f"{opt('overhead')} context_bytes must be an integer ≥ 0 within int64, "
                             f"got {shown(c)}")
    if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float))
                          or not 0 <= f < 10):
        raise GraphcostError(f"{opt('overhead')} allocator_fraction must be a number in [0, 10), got "
                             f"{shown(f)}")
    return dataclasses.replace(overhead, context_bytes=c, allocator_fraction=f)


def check_checkpoint(checkpoint, train: bool) -> CheckpointSpec | None:
    """One of the forms the CLI builds: {"names": [...]}, {"every": N}, {"sqrt": True},
    {"budget": BYTES}, {"sac": True} (torchtitan's op policy), {"sac": [op, ...]},
    {"nth": N} (every N-th block whole) or {"core_attn": True} (Megatron-LM's selective
    recompute: the fused attention alone)."""
    checkpoint = plain(checkpoint, "checkpoint")
    if checkpoint is None:
        return None
    if not isinstance(checkpoint, Mapping):
        raise GraphcostError(f"checkpoint must be a mapping such as {{'every': 2}}, got "
                             f"{type(checkpoint).__name__}")
    if checkpoint and not train:
        raise GraphcostError(f"checkpoint plans need a training analysis ({opt('train')})")
    unknown = sorted(map(str, set(checkpoint) - set(CHECKPOINT_KEYS)))
    if unknown or len(checkpoint) > 1:
        raise GraphcostError(f"checkpoint takes one of the keys {', '.join(CHECKPOINT_KEYS)}, "
                             f"got {', '.join(unknown) or ', '.join(map(str, checkpoint))}")
    for key, value in checkpoint.items():
        if key == "names" and (isinstance(value, str) or not isinstance(value, Sequence) or
                               not value or not all(isinstance(n, str) and n for n in value)):
            raise GraphcostError(f"checkpoint['names'] must be a list of module paths, got "
                                 f"{shown(value, 200)}")
        if key == "every":
            positive(value, opt("checkpoint.every"), integer=True)
        if key == "budget":
            positive(value, opt("checkpoint.budget"), integer=True)
        if key == "nth":
            positive(value, opt("checkpoint.nth"), integer=True)
        if key in ("sqrt", "core_attn") and value is not True:
            raise GraphcostError(f"checkpoint[{key!r}] must be True, got {shown(value)}")
        if key == "sac" and value is not True and (isinstance(value, str) or not isinstance(
                value, Sequence) or not value or not all(isinstance(n, str) and n for n in value)):
            raise GraphcostError(f"checkpoint['sac'] must be True (torchtitan's op policy) or "
                                 f"a list of op names to save, got {shown(value, 200)}")
    if not checkpoint:
        return None
    names, sac = checkpoint.get("names"), checkpoint.get("sac")
    return CheckpointSpec(names=tuple(names) if names else None, every=checkpoint.get("every"),
                          sqrt=bool(checkpoint.get("sqrt")), budget=checkpoint.get("budget"),
                          sac=MEGATRON_CORE_ATTN if checkpoint.get("core_attn") else
                          ("torchtitan",) if sac is True else tuple(sac) if sac else None,
                          nth=checkpoint.get("nth"))


def _stages_per_rank(parallel: Mapping) -> int:
    """The stages a pipeline rank runs: 2 by default under the interleaved schedule
    (torchtitan's), else 1."""
    v = parallel.get("stages_per_rank", INTERLEAVED_STAGES
                     if interleaved(str(parallel.get("schedule"))) else 1)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise GraphcostError(f"{opt('parallel.stages_per_rank', value=v)}: a whole number ≥ 1")
    return v


_PARALLEL_KEYS = ("strategy", "world_size", "mesh", "offload", "bucket_cap_mb", "units",
                  "interconnect", "microbatches", "schedule", "async_tp", "gpus_per_node",
                  "stages_per_rank", "float8_all_gather", "cp_rotate")


def _with_mesh(parallel: Mapping) -> dict:
    """A ``mesh`` (``"dp_shard=8,tp=2"`` or ``{"dp_shard": 8}``) as the strategy, world size,
    replica groups (HSDP), tensor and pipeline sizes it names (passes/parallel/mesh.py); a
    strategy given beside it says how the shard dimension shards (zero2, zero3, fsdp)."""
    from ...passes.parallel.mesh import data_sizes, parse_mesh, strategy_of

    out = dict(parallel)
    mesh = out.pop("mesh", None)
    if mesh is None:
        return out
    if "world_size" in out:
        raise GraphcostError(f"{opt('parallel.world_size')}: a mesh's sizes give the world size")
    if isinstance(mesh, Mapping):
        mesh = ",".join(f"{k}={v}" for k, v in mesh.items())
    if not isinstance(mesh, str):
        raise GraphcostError(f"{opt('parallel')}: a mesh is text such as 'dp_shard=8' or a "
                             f"mapping such as {{'dp_shard': 8}}, got {shown(mesh)}")
    m = parse_mesh(mesh)
    named = strategy_of(m)
    strategy = out.setdefault("strategy", named)
    if (strategy == Strategy.DDP) != (named == Strategy.DDP):
        raise GraphcostError(f"{opt('parallel', value=strategy)} with the mesh {m.words}: ddp "
                             "replicates (dp_replicate), zero1/2/3 and fsdp shard (dp_shard)")
    size, replicate = data_sizes(m)
    if replicate > 1 and strategy not in [s for s in Strategy if s.shards_gradients]:
        raise GraphcostError(f"{opt('parallel', value=strategy)} with the mesh {m.words}: "
                             "HSDP shards within each replica group (zero2, zero3, fsdp)")
    out["world_size"] = "auto" if size is None else size
    out["replicate"] = replicate
    out["tp"], out["pp"], out["ep"] = m.size("tp"), m.size("pp"), m.size("ep")
    out["cp"] = m.size("cp")
    for dim, what in (("ep", "expert"), ("cp", "context")):
        if (out[dim] or 1) > 1 and strategy not in (Strategy.FSDP, Strategy.ZERO3,
                                                    Strategy.ZERO2):
            raise GraphcostError(f"{opt('parallel', value=strategy)} with the mesh {m.words}: "
                                 f"{what} parallelism is modelled beside fully_shard (fsdp, "
                                 "zero3, zero2), as torchtitan runs it")
    return out


def _flag(value, key: str) -> bool:
    if not isinstance(value, bool):
        raise GraphcostError(f"{opt('parallel.' + key, value=value)}: expected True or False")
    return value


def _async_tp(value, tp: int) -> bool:
    """Tensor parallelism with its collectives overlapped by the matmuls they feed
    (torchtitan's async TP, Megatron's --tp-comm-overlap): a flag that needs a tp dimension."""
    if _flag(value, "async_tp") and tp <= 1:
        raise GraphcostError(f"{opt('parallel.async_tp')} overlaps tensor parallelism's "
                             "collectives: a mesh with tp")
    return value


def node_size(n: Any) -> int:
    """``parallel``'s ``gpus_per_node``, checked: a whole number ≥ 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise GraphcostError(f"{opt('parallel.gpus_per_node', value=n)}: a whole number ≥ 1")
    return n


def parallel_spec(parallel, train: bool):
    """``analyze``'s ``parallel`` mapping as the pass's ParallelSpec (checked)."""
    parallel = plain(parallel, "parallel")
    if not parallel:
        return None
    from ...passes.parallel.spec import ParallelSpec, check_spec
    from .devices import get_interconnect

    if not isinstance(parallel, Mapping):
        raise GraphcostError(f"{opt('parallel')}: expected a mapping such as "
                             "{'strategy': 'fsdp', 'world_size': 8}")
    unknown = sorted(map(str, set(parallel) - set(_PARALLEL_KEYS)))
    if unknown:
        raise GraphcostError(f"{opt('parallel')}: unknown key(s) {', '.join(unknown)}; known: "
                             + ", ".join(_PARALLEL_KEYS))
    parallel = _with_mesh(parallel)
    if "strategy" not in parallel:
        raise GraphcostError(f"{opt('parallel')}: name a strategy "
                             f"({', '.join(Strategy.words()[:-1])} or {Strategy.FSDP}) or a "
                             "mesh ({'mesh': 'dp_shard=8'})")
    if not train:
        raise GraphcostError(f"{opt('parallel', value=parallel['strategy'])} divides a training step "
                             f"across ranks: add {opt('train')}")
    if "world_size" not in parallel:
        raise GraphcostError(f"{opt('parallel', value=parallel['strategy'])} needs "
                             f"{opt('parallel.world_size', value='N')} (or auto with {opt('device')})")
    world = parallel["world_size"]
    if world == "auto":
        world = None
    elif isinstance(world, bool) or not isinstance(world, int):
        raise GraphcostError(f"{opt('parallel.world_size', value=world)}: expected a whole number ≥ 1 or auto")
    units, link = parallel.get("units"), parallel.get("interconnect")
    if units is not None and (isinstance(units, str) or not isinstance(units, Sequence)
                              or not all(isinstance(u, str) for u in units)):
        raise GraphcostError(f"{opt('parallel.units')}: expected a list of module paths, got "
                             f"{shown(units, 200)}")
    if link is not None and not isinstance(link, (str, InterconnectRates)):
        raise GraphcostError(f"{opt('parallel.interconnect')}: expected a name such as 'nvlink4', got "
                             f"{type(link).__name__}")
    cap = parallel.get("bucket_cap_mb", 25.0)
    if cap is not None:
        positive(cap, opt("parallel.bucket_cap_mb"))
    spec = ParallelSpec(
        str(parallel["strategy"]), world, parallel.get("offload"),
        float(cap if cap is not None else 25.0), tuple(units) if units else None,
        get_interconnect(link) if isinstance(link, str) else link,
        replicate=parallel.get("replicate", 1), tp=parallel.get("tp", 1),
        pp=parallel.get("pp", 1), ep=parallel.get("ep", 1), cp=parallel.get("cp", 1),
        cp_rotate=str(parallel.get("cp_rotate", Rotate.ALL_GATHER)),
        microbatches=parallel.get("microbatches"),
        schedule=str(parallel.get("schedule", "1f1b")),
        stages_per_rank=_stages_per_rank(parallel),
        async_tp=_async_tp(parallel.get("async_tp", False), parallel.get("tp", 1)),
        gpus_per_node=node_size(parallel.get("gpus_per_node", GPUS_PER_NODE)),
        float8_all_gather=_flag(parallel.get("float8_all_gather", False),
                                "float8_all_gather"))
    _pipeline_options(spec, parallel)
    check_spec(spec)
    return spec


def _pipeline_options(spec, parallel: Mapping) -> None:
    """A pipeline's options need pipeline stages."""
    if (spec.microbatches is not None or "schedule" in parallel
            or "stages_per_rank" in parallel) and spec.pp == 1:
        raise GraphcostError(f"{opt('parallel.microbatches')}, {opt('parallel.schedule')} "
                             f"and {opt('parallel.stages_per_rank')} go with pipeline stages "
                             "(a mesh with pp)")
