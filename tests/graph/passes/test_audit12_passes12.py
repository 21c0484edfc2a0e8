"""Audit 12 (passes): graph passes checked against interpret, jax.grad and Optax."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import DTypeError, ShapeError
from fnnc.graph import GraphBuilder, interpret
from fnnc.graph.passes import minimize, minimize_scaled


def _loss_graph():
    b = GraphBuilder()
    w, x = b.input((3,), name="w"), b.input((3,), name="x")
    h = b.exec(ops.ewprod(), w, x, name="h")
    index = b.exec(ops.argmax(axis=0), h, name="am")
    loss = b.exec(ops.reduce_sum(axes=(0,)), h, name="loss")
    return b.build([loss, index]), w, h, index


@pytest.mark.parametrize("step", [minimize, minimize_scaled])
def test_minimize_refuses_a_loss_without_gradient_or_of_several_elements(step):
    # an int loss (argmax) had given a step that never changed the parameters (zero
    # gradients); a vector loss was told to pass backward's df=, which no step takes
    graph, w, h, index = _loss_graph()
    with pytest.raises(DTypeError, match=rf"{step.__name__}: loss %\d+ \(am\) is int32\[1\]"):
        step(graph, index, [w], optax.sgd(0.1))
    with pytest.raises(ShapeError, match=rf"{step.__name__}: loss %\d+ \(h\) is float32\[3\]"):
        step(graph, h, [w], optax.sgd(0.1))
    with pytest.raises(ShapeError, match="reduce it to one"):
        step(graph, "w", [w], optax.sgd(0.1))


def test_minimize_of_a_scalar_loss_steps_as_optax():
    graph, w, _, _ = _loss_graph()
    step, layout = minimize(graph, "loss", [w], optax.sgd(0.1))
    x = np.arange(3, dtype=np.float32)
    w1, _, loss = layout.split(interpret(step, np.ones(3, np.float32), x))
    # oracle: d(sum(w * x))/dw = x, SGD: w - 0.1 x
    np.testing.assert_allclose(np.asarray(w1[0]), 1.0 - 0.1 * x, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(loss), [3.0])


def _mlp():
    b = GraphBuilder()
    x = b.input((4, 8), name="x")
    w1, w2 = b.input((32, 8), name="fc1"), b.input((8, 32), name="fc2")
    h = b.exec(ops.gemm(transpose_b=True), x, w1, name="h")
    y = b.exec(ops.gemm(transpose_b=True), b.exec(ops.relu(), h), w2, name="y")
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.mul(), y, y), name="loss")
    return b.build([loss, h])


def test_constrain_activations_keeps_names_unique_and_is_idempotent():
    # the constraint's output copied the layer's name, so "h" named two symbols and
    # backward(..., wrt="h") refused it; a second run pinned every layer twice more
    from jax.sharding import AbstractMesh

    from fnnc.graph import backward, constrain_activations, parameter_specs

    mesh = AbstractMesh((2, 2), ("data", "model"))
    graph = _mlp()
    specs = parameter_specs(graph, mesh, parameters=[1, 2])
    pinned = constrain_activations(graph, specs, sizes=dict(mesh.shape))
    assert constrain_activations(pinned, specs, sizes=dict(mesh.shape)) is pinned
    names = [s.name for s in pinned.symbols if s.name]
    assert len(names) == len(set(names)) and "h/shard" in names
    rng = np.random.default_rng(0)
    args = [rng.normal(size=graph.symbols[s].shape).astype(np.float32) for s in graph.inputs]
    got = interpret(backward(pinned, "loss", ["h"])[0], *args)
    want = interpret(backward(graph, "loss", ["h"])[0], *args)  # oracle: no constraints
    np.testing.assert_allclose(np.asarray(got[-1]), np.asarray(want[-1]), rtol=1e-6)


def _chain():
    b = GraphBuilder()
    x, w = b.input((4, 8), name="x"), b.input((8, 8), name="w")
    h = b.exec(ops.gemm(), x, w, name="h")
    u = b.exec(ops.ewexp(), b.exec(ops.tanh(), h, name="t"), name="u")
    return b.build([b.exec(ops.reduce_sum(axes=(0, 1)), u, name="loss")])


def _named_twice(graph):
    names = [s.name for s in graph.symbols if s.name]
    return sorted({n for n in names if names.count(n) > 1})


def _args():
    rng = np.random.default_rng(3)
    return rng.normal(size=(4, 8)).astype(np.float32), rng.normal(size=(8, 8)).astype(np.float32)


def _reference_dt(x, w):
    """Oracle: d(sum(exp(tanh(x @ w))))/dt = exp(tanh(x @ w)), float64."""
    return np.exp(np.tanh(x.astype(np.float64) @ w.astype(np.float64)))


def test_remat_names_its_recomputations_apart():
    # recomputed tensors (and the barrier's copies) took the forward's names, so "t"
    # named two symbols and backward(remat(g), "loss", ["t"]) refused it
    from fnnc.graph import backward, remat

    grad, _ = backward(_chain(), "loss", ["w"])
    r = remat(grad, policy="nothing_saveable")
    assert _named_twice(r) == [] and "t@remat" in {s.name for s in r.symbols}
    x, w = _args()
    got = interpret(backward(r, "loss", ["t"])[0], x, w)[-1]
    np.testing.assert_allclose(np.asarray(got), _reference_dt(x, w), rtol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cast_precision_leaves_each_name_on_one_symbol(dtype):
    # the cast kept the old symbols with their names beside the new ones, so
    # backward(cast_precision(g), "loss", ...) found two "loss" and refused
    from fnnc.graph import backward, cast_precision

    low = cast_precision(_chain(), dtype)
    assert _named_twice(low) == []
    x, w = _args()
    got = interpret(backward(low, "loss", ["t"])[0], x, w)[-1]
    np.testing.assert_allclose(np.asarray(got, np.float64), _reference_dt(x, w), rtol=2e-2)


def test_remat_makes_one_named_view_of_a_recomputed_tensor():
    # a view of a recomputed tensor was copied once per operand reading it, each copy
    # with the forward view's name (v * v: "v" named three symbols)
    from fnnc.graph import backward, remat

    b = GraphBuilder()
    x = b.input((2, 3), name="x")
    t = b.exec(ops.tanh(), x, name="t")
    v = b.alias(t, (3, 2), stride=(2, 1), name="v")  # a reshape view
    y = b.exec(ops.ewprod(), v, v, name="y")
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), y, name="loss")
    grad, _ = backward(b.build([loss]), "loss", ["x"])
    r = remat(grad, policy="nothing_saveable")
    assert _named_twice(r) == [] and "v@remat" in {s.name for s in r.symbols}
    xs = np.random.default_rng(4).normal(size=(2, 3)).astype(np.float32)
    t64 = np.tanh(xs.astype(np.float64))  # oracle: d sum(tanh(x)^2)/dx
    np.testing.assert_allclose(np.asarray(interpret(r, xs)[-1]), 2 * t64 * (1 - t64**2), rtol=1e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cast_precision_reads_index_select_positions_at_their_type(dtype):
    # float positions were rounded to the low type with the rows: in bfloat16 257 read
    # row 256 and 299 (of 300 rows) became 300, out of range: NaN
    from fnnc.graph import backward, cast_precision

    b = GraphBuilder()
    x, pos = b.input((300, 2), name="x"), b.input((3,), name="pos")
    rows = b.exec(ops.index_select(), b.exec(ops.tanh(), x), pos, name="rows")
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), rows, name="loss")
    low = cast_precision(b.build([rows, loss]), dtype)
    xs = np.linspace(-1, 1, 600).reshape(300, 2).astype(np.float32)
    ps = np.array([257.0, 1.25, 299.0], np.float32)
    t = np.tanh(xs.astype(np.float64))  # oracle: NNC's interpolation in float64
    j = ps.astype(np.int64)
    w = (ps - j)[:, None]
    want = t[j] * (1 - w) + t[np.minimum(j + 1, 299)] * w
    np.testing.assert_allclose(np.asarray(interpret(low, xs, ps)[0]), want, atol=1e-2)
    grad = interpret(backward(low, "loss", ["x"])[0], xs, ps)[-1]
    touched = np.flatnonzero(np.abs(np.asarray(grad)).sum(1))
    assert touched.tolist() == [1, 2, 257, 299]  # the rows the positions read


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cast_precision_keeps_nms_scores_in_their_type(dtype):
    # nms sorts by score: 0.3 and 0.3001 rounded to one value in the low type, and the
    # tie came out in row order (0 before 1), not by score
    from fnnc.graph import cast_precision

    b = GraphBuilder()
    a = b.input((3, 5), name="a")
    rows, index = b.exec(ops.nms(iou_threshold=0.5), a, name="nms")
    graph = b.build([rows, index])
    boxes = [[0.3, 0, 0, 10, 10], [0.3001, 20, 20, 10, 10], [0.9, 100, 100, 10, 10]]
    xs = np.array(boxes, np.float32)
    _, got = interpret(cast_precision(graph, dtype), xs)
    want = np.argsort(-xs[:, 0], kind="stable")  # oracle: disjoint boxes, all kept by score
    np.testing.assert_array_equal(np.asarray(got), want)
