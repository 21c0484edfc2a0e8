"""Passes read command attributes, so a command defined outside fnnc (here, in this test
file) is fused, merged and folded without editing any pass."""

import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.core import command as command_module
from fnnc.graph import GraphBuilder, cse, fold, fuse, interpret
from fnnc.ops._rules import same_shape
from tests.helpers import assert_close


@pytest.fixture(scope="module")
def user_max():
    """A new elementwise, commutative, idempotent two-input command."""

    @ops.defcommand(
        family="test", shape=same_shape, elementwise=True, commutative=True, idempotent=True
    )
    def test_user_max(a, b):
        """``max(a, b)`` (a stand-in for a user's elementwise command)."""
        return jnp.maximum(a, b)

    yield test_user_max
    command_module._REGISTRY.pop("test_user_max")


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 3)).astype(np.float32)


def test_fuse_takes_a_new_elementwise_command_into_chains(user_max):
    b = GraphBuilder()
    x, y = b.input((4, 3), name="x"), b.input((4, 3), name="y")
    z = b.exec(ops.tanh(), b.exec(user_max(), b.exec(ops.sigmoid(), x), y))
    graph = b.build([z])
    fused = fuse(graph)
    assert [n.cmd.name for n in fused.nodes] == ["fused_elementwise"]
    body = fused.nodes[0].cmd.param("body")
    assert [n.cmd.name for n in body.nodes] == ["sigmoid", "test_user_max", "tanh"]
    assert_close(interpret(fused, *_data()), interpret(graph, *_data()))


def test_cse_merges_a_new_commutative_command_in_either_order(user_max):
    b = GraphBuilder()
    x, y = b.input((4, 3), name="x"), b.input((4, 3), name="y")
    p, q = b.exec(user_max(), x, y), b.exec(user_max(), y, x)
    graph = b.build([b.exec(ops.ewsum(), p, q)])
    merged = cse(graph)
    assert [n.cmd.name for n in merged.nodes] == ["test_user_max", "ewsum"]
    assert_close(interpret(merged, *_data()), interpret(graph, *_data()))


def test_fold_applies_idempotence_of_a_new_command(user_max):
    b = GraphBuilder()
    x = b.input((4, 3), name="x")
    graph = b.build([b.exec(ops.relu(), b.exec(user_max(), x, x))])
    folded = fold(graph)
    assert [n.cmd.name for n in folded.nodes] == ["relu"]
    assert_close(interpret(folded, _data()[0]), interpret(graph, _data()[0]))


def test_a_command_without_the_attributes_is_left_alone():
    b = GraphBuilder()
    x, y = b.input((4, 3), name="x"), b.input((4, 3), name="y")
    p, q = b.exec(ops.ewdiv(), x, y), b.exec(ops.ewdiv(), y, x)  # not commutative
    graph = b.build([b.exec(ops.ewsum(), p, q)])
    assert cse(graph) is graph
