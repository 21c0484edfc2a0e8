"""fold and fuse reach their fixpoint in one run (``p(p(g)) is p(g)``) on the graphs that
used to need two, and fuse keeps NNC's loss fusions after ``backward`` has run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from fnnc import ops
from fnnc.graph import GraphBuilder, interpret, simplify
from fnnc.graph.passes import fold, fuse
from fnnc.graph.passes.backward import backward
from tests.graph.strategies import graphs
from tests.helpers import assert_close, assert_pass_keeps_semantics, rand

# -- fold: views of a value an identity replaced by a constant ----------------------------


@pytest.mark.parametrize("identity", ["ewsum", "min", "max"])
def test_fold_sees_a_view_of_a_replaced_result_as_constant(identity) -> None:
    """``c = constant; s = ewsum(c) (or min(c, c)); v = alias(s); ewabs(v)``: the
    first run drops ``s`` for ``c`` and must fold ``ewabs(v)`` too (``ties="split"``: the
    tie rule under which ``min(c, c) = c`` is an identity, gradient included)."""
    b = GraphBuilder()
    x = b.input((3,), name="x")
    c = b.constant(np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5)
    s = (
        b.exec(ops.ewsum(), c)
        if identity == "ewsum"
        else b.exec(getattr(ops, identity)(ties="split"), c, c)
    )
    v = b.alias(s, (1, 3), offset=(1, 0))
    a = b.exec(ops.ewabs(), v, name="abs")
    graph = b.build([b.exec(ops.ewprod(), x, b.exec(ops.reshape(shape=(3,)), a))])
    once = assert_pass_keeps_semantics(fold, graph, [rand((3,))])
    assert [n.cmd.name for n in once.nodes] == ["constant"] * 3 + ["ewprod"]
    assert_close(once.nodes[2].cmd.param("value").numpy(), np.array([0.5, 1.5, 2.5], np.float32))


def test_fold_view_of_a_replaced_input_result_stays() -> None:
    """The same shape over a graph input: nothing to fold, the view is re-rooted."""
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    v = b.alias(b.exec(ops.min(ties="split"), x, x), (3,), offset=(3,), stride=(1,))
    graph = b.build([b.exec(ops.ewabs(), v)])
    once = assert_pass_keeps_semantics(fold, graph, [rand((2, 3))])
    assert [n.cmd.name for n in once.nodes] == ["ewabs"]


# -- fuse: a producer read twice within one chain ----------------------------------------


def test_fuse_takes_a_producer_read_twice_within_the_chain() -> None:
    """``s = sigmoid(x); a = ewabs(s); ewdiv(s, a)``: one node of all three at once."""
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    s = b.exec(ops.sigmoid(), x)
    a = b.exec(ops.ewabs(), s)
    graph = b.build([b.exec(ops.ewdiv(), s, a)])
    once = assert_pass_keeps_semantics(fuse, graph, [rand((2, 3))])
    assert [str(n.cmd) for n in once.nodes] == ["fused_elementwise[sigmoid, ewabs, ewdiv]"]


def test_fuse_shared_producer_read_outside_the_chain_stays_out() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    s = b.exec(ops.sigmoid(), x)
    a = b.exec(ops.ewabs(), s)
    graph = b.build([b.exec(ops.ewdiv(), s, a), b.exec(ops.reduce_sum(axes=(0,)), s)])
    once = assert_pass_keeps_semantics(fuse, graph, [rand((2, 3))])
    assert [str(n.cmd) for n in once.nodes][:2] == ["sigmoid", "fused_elementwise[ewabs, ewdiv]"]


# -- fuse after backward: the pair's gradient nodes become the fused one's --------------

LOGITS = np.array([[10, -1, -5], [12, 4, 24]], np.float32)
LABELS = np.array([2, 1], np.int32)


def _softmax_xent_backward():
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    label = b.input((2,), np.int32, name="label")
    p = b.exec(ops.softmax(), x, name="p")
    loss = b.exec(ops.categorical_crossentropy(), p, label, name="loss")
    total = b.exec(ops.reduce_sum(axes=(0, 1)), loss, name="total")
    return backward(b.build([loss]), total, [x])[0]


def test_softmax_crossentropy_is_fused_after_backward() -> None:
    graph = _softmax_xent_backward()
    new = assert_pass_keeps_semantics(fuse, graph, [LOGITS, LABELS])
    names = [str(n.cmd) for n in new.nodes]
    assert names[0] == "softmax_crossentropy"
    assert "softmax_crossentropy.backward[wants=(0,)]" in names
    assert not any(n.startswith(("softmax.", "categorical")) for n in names)
    loss, dx = interpret(new, LOGITS, LABELS)
    # NNC's numbers (crossentropy.tests.c / softmax_crossentropy's doc): the loss rows,
    # and the gradient softmax(x) - onehot(label) in closed form.
    assert_close(loss, np.array([[15.000017], [20.000006]], np.float32), rtol=1e-5)
    e = np.exp(LOGITS - LOGITS.max(-1, keepdims=True))
    assert_close(dx, e / e.sum(-1, keepdims=True) - np.eye(3, dtype=np.float32)[LABELS])


def test_simplify_keeps_the_fused_loss_and_its_gradient() -> None:
    graph = _softmax_xent_backward()
    new = simplify(graph)
    assert {"softmax_crossentropy", "gradient"} <= {n.cmd.name for n in new.nodes}
    assert_close(interpret(new, LOGITS, LABELS), interpret(graph, LOGITS, LABELS), rtol=1e-5)


def test_sigmoid_binary_crossentropy_is_fused_after_backward() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    y = b.input((2, 3), name="y")
    loss = b.exec(ops.binary_crossentropy(pos_weight=2.0), b.exec(ops.sigmoid(), x), y)
    total = b.exec(ops.reduce_sum(axes=(0, 1)), loss)
    graph, _ = backward(b.build([loss]), total, [x])
    arrays = [LOGITS / 10, np.array([[0, 1, 0.5], [1, 0, 0.2]], np.float32)]
    new = assert_pass_keeps_semantics(fuse, graph, arrays, rtol=1e-4)
    assert [n.cmd.name for n in new.nodes].count("gradient") == 2  # reduce_sum's and the pair's
    assert str(new.nodes[0].cmd) == "sigmoid_binary_crossentropy[pos_weight=2.0]"


def test_backward_pair_with_another_reader_stays_unfused() -> None:
    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    label = b.input((2,), np.int32, name="label")
    p = b.exec(ops.softmax(), x)
    loss = b.exec(ops.categorical_crossentropy(), p, label)
    total = b.exec(ops.reduce_sum(axes=(0, 1)), loss)
    graph, _ = backward(b.build([loss, b.exec(ops.relu(), p)]), total, [x])
    assert "softmax_crossentropy" not in [n.cmd.name for n in fuse(graph).nodes]


# -- the property tests draw these shapes ------------------------------------------------


@settings(max_examples=40)
@given(graphs(max_nodes=8, constant_exprs=True, identities=True, alias_writes=False))
def test_fold_fixpoint_on_random_graphs_with_folded_views(case) -> None:
    graph, arrays = case
    assert_pass_keeps_semantics(fold, graph, arrays)


@settings(max_examples=40)
@given(graphs(max_nodes=8, activations=True, aliases=False, alias_writes=False))
def test_fuse_fixpoint_on_random_graphs_with_shared_producers(case) -> None:
    graph, arrays = case
    assert_pass_keeps_semantics(fuse, graph, arrays)
