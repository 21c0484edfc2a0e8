"""fold: constant subexpressions become constants; identities drop their node."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from fnnc import ops
from fnnc.graph import GraphBuilder, backward, check_pass, interpret
from fnnc.graph.passes import fold
from tests.graph.strategies import graphs
from tests.helpers import assert_pass_keeps_semantics, rand

SETTINGS = settings(max_examples=60)


def test_golden_constants_and_identity() -> None:
    b = GraphBuilder()
    x = b.input((2,), name="x")
    three = b.exec(ops.ewsum(), b.constant(np.float32(2)), b.constant(np.float32(1)))
    m = b.exec(ops.mul(), x, three, name="m")
    graph = b.build([b.exec(ops.scalar_mul(a=1.0), m, name="same")])
    new = assert_pass_keeps_semantics(fold, graph, [rand((2,))])
    assert str(new) == (
        "graph(%0:f32[2] x) {\n"
        "  %1:f32[] = constant[value=2.0]()\n"
        "  %2:f32[] = constant[value=1.0]()\n"
        "  %3:f32[] = constant[value=3.0]()\n"
        "  %4:f32[2] = mul(%0, %3)  # m\n"
        "  return %4\n"
        "}"
    )


def test_folds_through_views_and_chains() -> None:
    b = GraphBuilder()
    x = b.input((3,), name="x")
    c = b.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    row = b.alias(c, (1, 3), offset=(1, 0))
    e = b.exec(ops.ewexp(), b.exec(ops.scalar_mul(a=0.1), row))
    graph = b.build([b.exec(ops.ewprod(), x, b.exec(ops.reshape(shape=(3,)), e))])
    new = assert_pass_keeps_semantics(fold, graph, [rand((3,))])
    assert [n.cmd.name for n in new.nodes] == ["constant"] * 4 + ["ewprod"]


def test_large_random_and_effectful_results_stay() -> None:
    b = GraphBuilder()
    big = b.exec(ops.ewexp(), b.constant(np.zeros((40, 40), np.float32)))
    key = b.constant(np.zeros(2, np.uint32))
    noise = b.exec(ops.random_uniform(shape=(2,)), key)
    graph = b.build([big, noise])
    assert fold(graph) is graph
    assert fold(graph, max_elements=2000).nodes[1].cmd.name == "constant"


IDENTITIES = [
    ("mul x*1", lambda b, x: b.exec(ops.mul(), x, b.constant(np.ones(3, np.float32)))),
    ("mul 1*x", lambda b, x: b.exec(ops.mul(), b.constant(np.float32(1)), x)),
    ("ewprod x*1", lambda b, x: b.exec(ops.ewprod(), b.constant(np.float32(1)), x)),
    ("add x+0", lambda b, x: b.exec(ops.add(), x, b.constant(np.float32(0)))),
    ("add 0+x", lambda b, x: b.exec(ops.add(), b.constant(np.float32(0)), x)),
    ("add x-0", lambda b, x: b.exec(ops.add(q=-1.0), x, b.constant(np.float32(0)))),
    ("ewsum x+0", lambda b, x: b.exec(ops.ewsum(), x, b.constant(np.zeros(3, np.float32)))),
    ("ewsum one", lambda b, x: b.exec(ops.ewsum(), x)),
    ("ewdiv x/1", lambda b, x: b.exec(ops.ewdiv(), x, b.constant(np.float32(1)))),
    ("scalar_mul 1", lambda b, x: b.exec(ops.scalar_mul(a=1.0), x)),
    ("reshape", lambda b, x: b.exec(ops.reshape(shape=(3,)), x)),
    ("transpose", lambda b, x: b.exec(ops.transpose(perm=(0,)), x)),
    ("convert", lambda b, x: b.exec(ops.datatype_conversion(dtype=np.float32), x)),
    ("broadcast_to", lambda b, x: b.exec(ops.broadcast_to(shape=(3,)), x)),
    ("clamp", lambda b, x: b.exec(ops.clamp(), x)),
    ("min x x", lambda b, x: b.exec(ops.min(ties="split"), x, x)),
    ("max x x", lambda b, x: b.exec(ops.max(ties="split"), x, x)),
    ("slice all", lambda b, x: b.exec(ops.slice(start=(0,), limit=(3,)), x)),
    ("pad none", lambda b, x: b.exec(ops.pad(pads=((0, 0),)), x)),
    ("concat one", lambda b, x: b.exec(ops.concat(), x)),
    ("select true", lambda b, x: b.exec(ops.select(), b.constant(True), x, b.constant(0.0))),
    ("data_transfer", lambda b, x: b.exec(ops.data_transfer(), x)),
]


@pytest.mark.parametrize("make", [m for _, m in IDENTITIES], ids=[n for n, _ in IDENTITIES])
def test_identity_goes_and_outputs_follow(make) -> None:
    b = GraphBuilder()
    x = b.input((3,), name="x")
    same = make(b, x)
    graph = b.build([b.exec(ops.relu(), same), same])
    new = assert_pass_keeps_semantics(fold, graph, [rand((3,))])
    assert [n.cmd.name for n in new.nodes if n.cmd.name != "constant"] == ["relu"]
    assert new.nodes[-1].inputs == (0,) and new.outputs[1] == 0


MINMAX = [(f, t) for f in ("min", "max") for t in ("both", "split")]


@pytest.mark.parametrize(("name", "ties"), MINMAX, ids=[f"{f}-{t}" for f, t in MINMAX])
def test_f_x_x_keeps_the_gradient_of_the_tie_rule(name, ties) -> None:
    """``f(x, x) = x`` holds in gradient only under ``ties="split"``: NNC's rule gives both
    operands of a tie the whole gradient, so d/dx sum(max(x, x)^2) is 4x, not 2x, and
    fold must keep that node. Backward then fold equals fold then backward."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    m = b.exec(getattr(ops, name)(ties=ties), x, x)
    loss = b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.ewprod(), m, m))
    graph = b.build([loss])
    xv = np.array([1.0, -2.0, 3.0], np.float32)
    if ties == "split":  # JAX's tie rule is jax.grad's own
        pick = jnp.minimum if name == "min" else jnp.maximum
        want = jax.grad(lambda v: jnp.sum(pick(v, v) ** 2))(xv)
    else:  # NNC's: 2 * f(x, x) * (1 + 1), each operand taking all of the gradient
        want = 4 * xv
    grad_first, _ = backward(graph, loss, [x])
    folded = fold(graph)
    assert (folded is graph) == (ties == "both")
    fold_first, _ = backward(folded, folded.outputs[0], [folded.inputs[0]])
    np.testing.assert_allclose(interpret(grad_first, xv)[1], want, rtol=1e-6)
    np.testing.assert_allclose(interpret(fold(grad_first), xv)[1], want, rtol=1e-6)
    np.testing.assert_allclose(interpret(fold_first, xv)[1], want, rtol=1e-6)
    check_pass(fold, graph)


def test_identities_keep_output_specs() -> None:
    b = GraphBuilder()
    x = b.input((3,), name="x")
    wide = b.exec(ops.mul(), x, b.constant(np.ones((2, 3), np.float32)))  # broadcasts
    square = b.input((2, 2), name="s")
    flipped = b.exec(ops.transpose(perm=(1, 0)), square)  # same shape, not the identity
    fewer = b.exec(
        ops.ewsum(), x, x, b.constant(np.zeros((2, 3), np.float32))
    )  # dropping the zeros would lose the broadcast
    graph = b.build([wide, flipped, fewer])
    assert fold(graph) is graph


def test_cheaper_node_replaces_an_identity() -> None:
    b = GraphBuilder()
    x, y = b.input((3,), name="x"), b.input((3,), name="y")
    graph = b.build([b.exec(ops.ewsum(), x, b.constant(np.float32(0)), y)])
    new = assert_pass_keeps_semantics(fold, graph, [rand((3,)), rand((3,), seed=1)])
    assert new.nodes[-1].inputs == (0, 1)


def test_views_of_a_dropped_result_are_re_rooted() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    same = b.exec(ops.scalar_mul(a=1.0), x)
    row = b.alias(same, (1, 3), offset=(1, 0))
    graph = b.build([b.exec(ops.ewexp(), row)])
    new = assert_pass_keeps_semantics(fold, graph, [rand((2, 3))])
    assert [n.cmd.name for n in new.nodes] == ["ewexp"]


@SETTINGS
@given(graphs(max_nodes=8, constant_exprs=True, identities=True, alias_writes=False))
def test_random_graphs(case) -> None:
    graph, arrays = case
    assert_pass_keeps_semantics(fold, graph, arrays)
