"""Audit 12 (issues 7, 12, 13, 14, 28): sharding rules, memory passes and loops checked
against the issues' words. Layouts are planned on abstract meshes (no devices)."""

from __future__ import annotations

import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import GraphBuilder, ShardingRules, parameter_specs

MESH = AbstractMesh((2, 2), ("data", "model"))


@pytest.fixture(scope="module")
def mlp():
    b = GraphBuilder()
    x = b.input((4, 8), name="x")
    w1, w2 = b.input((32, 8), name="fc1"), b.input((8, 32), name="fc2")
    h = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w1))
    return b.build([b.exec(ops.gemm(transpose_b=True), h, w2)])


@pytest.mark.parametrize(
    "mesh,data",
    [(MESH, "batch"), (AbstractMesh((4,), ("model",)), "data")],
)
def test_fsdp_over_a_data_axis_the_mesh_lacks_is_refused(mlp, mesh, data):
    """ZeRO-3 asked on a mesh without its data axis gave the plain Megatron layout,
    silently (tensor_parallel and Model.compile refuse such a mesh)."""
    with pytest.raises(GraphError, match=rf"fsdp=True .* data axis '{data}', which the mesh"):
        parameter_specs(mlp, mesh, ShardingRules(data=data, fsdp=True), parameters=[1, 2])
    # oracle: the documented layouts (Megatron; with FSDP "data" on the first free axis)
    assert parameter_specs(mlp, MESH, ShardingRules(fsdp=True), parameters=[1, 2]) == {
        "fc1": P("model", "data"),
        "fc2": P("data", "model"),
    }
    assert parameter_specs(mlp, mesh, ShardingRules(data=data), parameters=[1, 2]) == {
        "fc1": P("model"),
        "fc2": P(None, "model"),
    }
