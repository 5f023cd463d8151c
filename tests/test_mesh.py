"""The parallel layout as a device mesh of named dimensions (passes/parallel/mesh.py): the
data-parallel strategies are meshes of the data dimensions, spelled as torchtitan spells its
``[parallelism]`` (dp_shard, dp_replicate); the same layout either way gives the same rank.
(HSDP: tests/test_hsdp.py; tp: tests/test_tensor_parallel.py.)
"""
from __future__ import annotations

import pytest
from graphcost.passes.errors import GraphcostError
from graphcost.passes.parallel.mesh import Mesh, mesh_of, parse_mesh

from graphcost import analyze
from tests.cli_runner import run_cli


def _rank(parallel: dict):
    return analyze("zoo:mlp", batch=4, train=True, parallel=parallel).parallel


@pytest.mark.parametrize("mesh, strategy", [
    ({"mesh": "dp_shard=8"}, {"strategy": "fsdp", "world_size": 8}),
    ({"mesh": {"dp_replicate": 4}}, {"strategy": "ddp", "world_size": 4}),
    ({"mesh": "dp_shard=2", "strategy": "zero2"}, {"strategy": "zero2", "world_size": 2}),
])
def test_a_mesh_is_the_strategy_it_names(mesh, strategy):
    by_mesh, by_strategy = _rank(mesh), _rank(strategy)
    assert by_mesh == by_strategy  # every field of the rank's section, the mesh included
    name = "dp_replicate" if strategy["strategy"] == "ddp" else "dp_shard"
    assert by_mesh.mesh == {name: strategy["world_size"]}
    assert by_mesh.world_size == strategy["world_size"]


def test_the_mesh_parses_as_torchtitan_names_it():
    m = parse_mesh("dp_replicate=1, dp_shard=8")
    assert m == Mesh((("dp_replicate", 1), ("dp_shard", 8)))
    assert m.world_size == 8 and m.size("tp") == 1 and m.words == "dp_replicate=1,dp_shard=8"
    assert parse_mesh("dp_shard=auto").world_size is None
    assert mesh_of("ddp", 4) == Mesh((("dp_replicate", 4),))
    assert mesh_of("zero3", None).words == "dp_shard=auto"


@pytest.mark.parametrize("text, said", [
    ("dp_shard=auto,cp=2", "auto is not searched beside cp"),
    ("dp_shard=8,cp=auto", "tp, pp, ep and cp are traced at their sizes"),
    ("dp_replicate=auto,dp_shard=4", "auto searches dp_shard"),
    ("dp=8", "the dimensions are"),
    ("dp_shard=8,dp_shard=2", "each at most once"),
    ("dp_shard=0", "whole numbers ≥ 1"),
    ("dp_shard", "NAME=SIZE"),
])
def test_a_mesh_graphcost_cannot_price_is_refused_by_name(text, said):
    with pytest.raises(GraphcostError, match=said):
        parse_mesh(text)


def test_the_api_refuses_a_mesh_beside_a_world_size_or_the_wrong_strategy():
    with pytest.raises(GraphcostError, match="a mesh's sizes give the world size"):
        _rank({"mesh": "dp_shard=8", "world_size": 8})
    with pytest.raises(GraphcostError, match="ddp replicates"):
        _rank({"mesh": "dp_shard=8", "strategy": "ddp"})


@pytest.mark.same_on_every_torch   # (the command line's arguments: no torch path of its own)
def test_the_command_line_takes_a_mesh():
    def run(*args):   # (in this process: the arguments, not the installed script, the test)
        return run_cli("zoo:mlp", "--batch", "4", "--train", "--format", "json", *args)
    mesh, strategy = run("--parallel", "dp_shard=8"), \
        run("--parallel", "fsdp", "--world-size", "8")
    assert mesh.returncode == 0, mesh.stderr[-2000:]
    assert mesh.stdout == strategy.stdout
    refused = run("--parallel", "dp_shard=8,cp=2")   # (an MLP has no sequence to shard)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "--parallel cp=2: context parallelism shards the sequence of token ids" in \
        refused.stderr
    both = run("--parallel", "dp_shard=8", "--world-size", "8")
    assert both.returncode == 2 and "--world-size" in both.stderr
