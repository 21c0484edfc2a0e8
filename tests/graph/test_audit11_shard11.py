"""Audit 11 (sharding rules): user mistakes in rules, ``specs=`` and parameter
positions are clear errors, not silent replication or raw Python errors. Layouts are
planned on abstract meshes (no devices)."""

from __future__ import annotations

import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from fnnc import ops
from fnnc.errors import GraphError, ShapeError
from fnnc.graph import (
    GraphBuilder,
    ShardingRules,
    data_parallel,
    parameter_specs,
    tensor_parallel,
)

MESH = AbstractMesh((2, 2), ("data", "model"))


@pytest.fixture(scope="module")
def mlp():
    b = GraphBuilder()
    x = b.input((4, 8), name="x")
    w1, w2 = b.input((32, 8), name="fc1"), b.input((8, 32), name="fc2")
    h = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w1))
    return b.build([b.exec(ops.gemm(transpose_b=True), h, w2)])


def test_a_specs_key_naming_no_input_is_refused(mlp):
    """``specs={"fc_1": ...}`` left fc1 replicated, silently (rules refuse such typos)."""
    with pytest.raises(GraphError, match=r"specs= names 'fc_1', which no input.*x, fc1, fc2"):
        tensor_parallel(mlp, MESH, parameters=["fc1", "fc2"], specs={"fc_1": P("model")})
    # the Megatron layout parameter_specs finds (oracle: the documented table) is kept
    specs = parameter_specs(mlp, MESH, parameters=["fc1", "fc2"])
    plan = tensor_parallel(mlp, MESH, parameters=["fc1", "fc2"], specs=specs)
    assert plan.inputs == (P("data"), P("model"), P(None, "model"))


@pytest.mark.parametrize("position", [3, 99, -1])
def test_parameter_positions_out_of_range_are_named(mlp, position):
    """99 was an IndexError and -1 took the last input, which data_parallel refuses."""
    with pytest.raises(GraphError, match=rf"input position {position} is out of range.*3 inputs"):
        parameter_specs(mlp, MESH, parameters=[position])
    assert parameter_specs(mlp, MESH, parameters=[1, 2]) == {
        "fc1": P("model"),
        "fc2": P(None, "model"),
    }


@pytest.mark.parametrize(
    "rules",
    [
        lambda: ShardingRules(layers=(("fc1", "model"),)),  # was "names 5 axes"
        lambda: {"fc1": P(1)},  # was TypeError: 'int' object is not iterable
        lambda: {"fc1": P(("model", 2))},
        lambda: ShardingRules(layers=(("fc1",),)),
        lambda: ShardingRules(roles=(("column", 1),)),  # was TypeError too
    ],
)
def test_specs_that_are_not_mesh_axis_names_are_refused(mlp, rules):
    with pytest.raises(GraphError, match=r"expected a jax.sharding.PartitionSpec of mesh axis"
                       r" names|each rule is a pair|expected pairs \(role, mesh axis"):  # fmt: skip
        parameter_specs(mlp, MESH, rules(), parameters=["fc1", "fc2"])


def test_rules_given_directly_take_tuples_and_lists_as_of_does(mlp):
    direct = ShardingRules(layers=[("fc2", (None, "model")), ("fc1", ["model"])])
    assert direct == ShardingRules.of({"fc2": (None, "model"), "fc1": ["model"]})
    hash(direct)  # Parallel keys programs by its rules
    assert parameter_specs(mlp, MESH, direct, parameters=["fc1", "fc2"]) == {
        "fc1": P("model"),
        "fc2": P(None, "model"),
    }


def test_a_rule_naming_a_repeat_stack_by_its_id_matches_it():
    """A Repeat's stacked ids hold ``[0:3]``, a character class as a glob: the id
    itself, which the errors list and suggest as a rule, matched no parameter."""
    from fnnc.models import Dense, Input, Model, ReLU, Repeat
    from fnnc.models.layer import BuildContext

    def block():
        x = Input()
        return Model(x, Dense(8, name="mlp2")(ReLU()(Dense(16, name="mlp1")(x))), name="b")

    x = Input(name="x")
    model = Model([x], [Repeat(block, 3, name="blocks")(x)], name="m")
    ctx = BuildContext(False)
    out = model.build(ctx, ctx.b.input((4, 8), name="x"), nested=False)
    graph, pids = ctx.b.build([out]), list(ctx.params)
    stack = next(p for p in pids if p.endswith("mlp1-0-0"))
    assert "[0:3]" in stack
    specs = parameter_specs(graph, MESH, {stack: P()}, parameters=pids)
    # oracle: the role table (column on the block's output axis) for the others
    assert specs[stack] == P()
    assert specs[stack[:-1] + "1"] == P(None, "model")
    # the glob still globs: "*mlp1-0-?" matches both of mlp1's stacks
    both = parameter_specs(graph, MESH, {"*mlp1-0-?": P()}, parameters=pids)
    assert both[stack] == both[stack[:-1] + "1"] == P()


def test_role_splits_that_do_not_divide_are_named_together_with_rules_that_work():
    """An MLP of 5 hidden units on model=2: the column weight, its bias and the row
    weight do not divide. One error at a time suggested replicating only that one,
    which led to the next error; one error now names all three, and its rules work."""
    b = GraphBuilder()
    x = b.input((4, 6), name="x")
    w1, b1, w2 = (
        b.input((5, 6), name="fc1"),
        b.input((5,), name="fc1b"),
        b.input((3, 5), name="fc2"),
    )
    h = b.exec(ops.relu(), b.exec(ops.gemm(transpose_b=True), x, w1, b1))
    graph = b.build([b.exec(ops.gemm(transpose_b=True), h, w2)])
    params = ["fc1", "fc1b", "fc2"]
    with pytest.raises(
        ShapeError,
        match=r"fc1 \[5, 6\] is split along axis 0 \(5\) .* 2 more: fc1b \[5\] .*; "
        r"fc2 \[3, 5\] is split along axis 1",
    ) as e:
        parameter_specs(graph, MESH, parameters=params)
    rules = eval(str(e.value).rsplit("all with the rules ", 1)[1], {"PartitionSpec": P})
    assert rules == {"fc1": P(), "fc1b": P(), "fc2": P()}
    assert parameter_specs(graph, MESH, rules, parameters=params) == rules
    # one alone keeps its own message (axis, sizes and the rule for it)
    with pytest.raises(ShapeError, match=r"fc1 \[5, 6\] is split along axis 0 \(5\)"):
        parameter_specs(graph, MESH, {"fc1b": P(), "fc2": P()}, parameters=params)


def test_rules_given_as_lists_are_hashable_and_bad_roles_are_named():
    """The model keys its programs by the rules: lists made them unhashable."""
    rules = ShardingRules(layers=[["fc2", P()]], roles=[["column", "model"], ["row", "model"]])
    assert hash(rules) == hash(ShardingRules(layers=(("fc2", P()),), roles=MEGATRON_2))
    with pytest.raises(GraphError, match=r"roles is 'column'; expected pairs"):
        ShardingRules(roles="column")
    with pytest.raises(GraphError, match=r"expected pairs \(role, mesh axis or None\)"):
        ShardingRules(roles=[("column", ["data", "model"])])  # a list axis: unhashable


def test_input_positions_are_ints_or_numpy_ints_never_bools(mlp):
    """One reading of an input position for parameter_specs and data_parallel: a NumPy
    int is a position (it was looked up as a name), a bool is refused (True was 1)."""
    want = parameter_specs(mlp, MESH, parameters=[1, 2])
    assert parameter_specs(mlp, MESH, parameters=[np.int64(1), np.int32(2)]) == want
    with pytest.raises(GraphError, match=r"parameter_specs|sharding rules.*bool"):
        parameter_specs(mlp, MESH, parameters=[True])
    with pytest.raises(GraphError, match=r"data_parallel: input True is a bool"):
        data_parallel(mlp, MESH, parameters=[True])


MEGATRON_2 = (("column", "model"), ("row", "model"))
