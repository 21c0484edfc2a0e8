"""Losses against closed forms, NNC's softmax cross-entropy numbers, and label errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.errors import CommandError, DTypeError, ShapeError
from tests.helpers import assert_close, rand, randint


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_softmax_crossentropy_numbers() -> None:
    logits = np.array([[10, -1, -5], [12, 4, 24]], np.float32)
    loss, p = ops.softmax_crossentropy()(logits, np.array([2, 1], np.int32))
    np.testing.assert_array_equal(
        np.asarray(loss), np.array([[15.000017], [20.000006]], np.float32)
    )
    assert_close(p, _softmax(logits.astype(np.float64)), atol=1e-7)


def test_softmax_crossentropy_backward_is_softmax_minus_target() -> None:
    x, label = rand([4, 5]) * 3, randint([4], 5)
    cmd = ops.softmax_crossentropy()
    loss, p = cmd(x, label)
    g = rand([4, 1], seed=3)
    spec = jax.ShapeDtypeStruct
    gx, glabel = cmd.definition.backward(
        (g, None), (spec(x.shape, x.dtype), label), (spec(loss.shape, loss.dtype), p), **cmd.kwargs
    )
    assert glabel is None
    onehot = np.eye(5, dtype=np.float32)[label]
    np.testing.assert_array_equal(np.asarray(gx), np.asarray(g * (p - onehot)))
    want = jax.grad(lambda x_: jnp.sum(cmd.definition.forward(x_, label)[0] * g))(x)
    assert_close(gx, want, atol=1e-6)


def test_softmax_crossentropy_label_forms_agree() -> None:
    x = rand([3, 4]) * 2
    label = randint([3], 4, seed=1)
    want, _ = ops.softmax_crossentropy()(x, label)
    for other in (label[:, None], label.astype(np.float32), np.eye(4, dtype=np.float32)[label]):
        assert_close(ops.softmax_crossentropy()(x, other)[0], want, atol=1e-6)
    lse = np.log(np.exp(x.astype(np.float64)).sum(-1))
    assert_close(want[:, 0], lse - x[np.arange(3), label], atol=1e-6)


def test_softmax_crossentropy_label_smoothing() -> None:
    x, label, eps = rand([3, 5]), randint([3], 5), 0.1
    trim0, trim1 = eps / 5, 1 - eps + eps / 5  # targets that sum to 1
    loss, p = ops.softmax_crossentropy(trim0=trim0, trim1=trim1)(x, label)
    t = np.full((3, 5), trim0)
    t[np.arange(3), label] = trim1
    assert_close(loss[:, 0], -(t * np.log(_softmax(x.astype(np.float64)))).sum(-1), atol=1e-6)
    grad = jax.grad(
        lambda x_: jnp.sum(ops.softmax_crossentropy(trim0=trim0, trim1=trim1)(x_, label)[0])
    )
    assert_close(grad(x), p - t, atol=1e-6)


def test_categorical_crossentropy() -> None:
    p, label = _softmax(rand([3, 4]).astype(np.float64)).astype(np.float32), randint([3], 4)
    got = ops.categorical_crossentropy()(p, label)
    assert got.shape == (3, 1)
    assert_close(got[:, 0], -np.log(p[np.arange(3), label]), atol=1e-6)
    smooth = ops.categorical_crossentropy(trim0=0.1, trim1=0.7)(p, label[:, None])
    t = np.full((3, 4), 0.1)
    t[np.arange(3), label] = 0.7
    assert_close(smooth[:, 0], -(t * np.log(p)).sum(-1), atol=1e-6)


def test_binary_crossentropies() -> None:
    x, y = rand([3, 4]) * 3, rand([3, 4], seed=1, lo=0.0, hi=1.0)
    p = 1 / (1 + np.exp(-x.astype(np.float64)))
    for w in (1.0, 2.5):
        want = ((y - 1) * np.log(1 - p) - w * y * np.log(p)).sum(-1, keepdims=True)
        assert_close(
            ops.binary_crossentropy(pos_weight=w)(p.astype(np.float32), y), want, rtol=1e-5
        )
        loss, s = ops.sigmoid_binary_crossentropy(pos_weight=w)(x, y)
        assert_close(loss, want, rtol=1e-5)
        assert_close(s, p, atol=1e-6)


def test_mse_and_smooth_l1() -> None:
    a, b = rand([2, 3, 2]), rand([2, 3, 2], seed=1)
    d = (a - b).reshape(2, -1).astype(np.float64)
    assert_close(ops.mse()(a, b), (d**2).mean(-1, keepdims=True), atol=1e-6)
    assert_close(ops.mse(reduce="sum")(a, b), (d**2).sum(-1, keepdims=True), atol=1e-6)
    near = a + np.float32(0.01)
    got = ops.smooth_l1(beta=1.0)(np.concatenate([a, a]), np.concatenate([near, b + 2]))
    l1 = np.abs(np.concatenate([a - near, a - b - 2])).reshape(4, -1).sum(-1)
    sq = ((np.concatenate([a - near, a - b - 2])) ** 2).reshape(4, -1).sum(-1)
    assert_close(got[:, 0], np.where(l1 < 1.0, 0.5 * sq, l1 - 0.5), atol=1e-6)
    assert l1[0] < 1.0 < l1[3]


def test_loss_errors_say_what_fits() -> None:
    x = rand([3, 5])
    with pytest.raises(
        ShapeError,
        match=r"label int32\[3, 2\] does not fit scores float32\[3, 5\]: "
        r"expected class indices shaped \[3\] or \[3, 1\]",
    ):
        ops.softmax_crossentropy()(x, randint([3, 2], 5))
    with pytest.raises(ShapeError, match=r"float targets shaped \[3, 5\]"):
        ops.softmax_crossentropy()(x, rand([3, 4]))
    with pytest.raises(DTypeError, match="label"):
        ops.categorical_crossentropy()(x, np.ones((3,), bool))
    with pytest.raises(ShapeError, match="shaped like the input"):
        ops.binary_crossentropy()(x, rand([3, 1]))
    with pytest.raises(ShapeError, match="share one shape"):
        ops.mse()(x, rand([3, 4]))
    with pytest.raises(CommandError, match="reduce"):
        ops.mse(reduce="max")(x, x)
    with pytest.raises(CommandError, match="beta"):
        ops.smooth_l1(beta=0.0)(x, x)


def test_softmax_crossentropy_takes_dimension_0_as_the_batch() -> None:
    """NNC's label rule: logits [16, 1, 1, 8] with labels [16] (a ShapeError before)."""
    x, label = rand([16, 1, 1, 8], seed=4) * 3, randint([16], 8, seed=5)
    loss, p = ops.softmax_crossentropy()(x, label)
    flat = x.reshape(16, 8).astype(np.float64)
    lse = np.log(np.exp(flat).sum(-1))
    assert loss.shape == (16, 1, 1, 1)
    assert_close(loss.reshape(16), lse - flat[np.arange(16), label], atol=1e-5)
    assert_close(p.reshape(16, 8), _softmax(flat), atol=1e-6)
    assert_close(ops.softmax_crossentropy()(x, label[:, None])[0], loss)
    with pytest.raises(ShapeError, match=r"or \[N\] for scores \[N, 1, \.\.\., 1, C\]"):
        ops.softmax_crossentropy()(rand([16, 2, 8]), label)


def test_empty_sample_losses_are_sums_of_nothing_or_refused() -> None:
    from fnnc.graph import GraphBuilder, backward, compile

    z = np.zeros((2, 0), np.float32)
    for loss in (ops.mse(reduce="sum"), ops.smooth_l1(), ops.binary_crossentropy()):
        np.testing.assert_array_equal(np.asarray(loss(z, z)), np.zeros((2, 1)))  # np.sum([]) == 0
    with pytest.raises(ShapeError, match=r"mse: inputs float32\[2, 0\] have no values per sample"):
        ops.mse()(z, z)  # np.mean([]) is NaN: refused, not NaN
    with pytest.raises(ShapeError, match=r"softmax_crossentropy: scores .* have no classes"):
        ops.softmax_crossentropy()(z, np.zeros(2, np.int32))
    b = GraphBuilder()
    x, t = b.input((2, 0), name="x"), b.input((2, 0), name="t")
    with pytest.raises(ShapeError, match=r"^node 'loss' \(mse\): mse: inputs float32\[2, 0\]"):
        b.exec(ops.mse(), x, t, name="loss")
    s = b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.mse(reduce="sum"), x, t), name="s")
    g, _ = backward(b.build([s]), s, [x])
    grads = compile(g)(z, z)  # the sum's gradient over no values: empty, no ZeroDivisionError
    assert [np.shape(v) for v in jax.tree.leaves(grads)][-1] == (2, 0)


def test_float16_softmax_crossentropy_past_65504_classes() -> None:
    """Uniform float16 logits over V > 65504 classes: the sum of the exponentials is V,
    past float16's range, so it is taken in float32 (the loss was inf, the softmax 0).
    Closed forms: loss log V, softmax 1 / V, gradient 1 / V - one_hot."""
    v = 70_000
    cmd = ops.softmax_crossentropy()
    x, label = np.zeros([2, v], np.float16), np.array([5, v - 1], np.int32)
    loss, p = cmd(x, label)
    assert loss.dtype == p.dtype == np.float16
    assert_close(loss, np.full([2, 1], np.log(v)), rtol=1e-3)
    assert_close(p, np.full([2, v], 1 / v), rtol=2e-2)  # 1 / V is subnormal in float16
    ones = np.ones([2, 1], np.float16)
    gx, _ = cmd.definition.backward((ones, None), (x, label), (loss, p), **cmd.kwargs)
    want = np.full([2, v], 1 / v)
    want[[0, 1], label] -= 1
    assert_close(gx, want, rtol=2e-2, atol=1e-6)


def test_float16_mse_mean_fits_where_the_sum_of_squares_does_not() -> None:
    """1000 squared errors of 20: the sum 400000 is past float16's 65504, the mean 400
    is not (it was inf); the "sum" is then inf, as float16 holds it."""
    a, b = np.full([2, 1000], 20, np.float16), np.zeros([2, 1000], np.float16)
    mean = ops.mse(reduce="mean")(a, b)
    assert mean.dtype == np.float16
    assert_close(mean, np.full([2, 1], 400.0))
    assert np.isinf(np.asarray(ops.mse(reduce="sum")(a, b))).all()


def test_categorical_crossentropy_of_a_zero_probability_off_the_label() -> None:
    """A class of probability 0 that the label gives no weight adds 0 (it was 0 * log 0,
    NaN, and so was its gradient). NNC's closed form: loss -log p[label], gradient
    -1 / p[label] at the label, 0 elsewhere."""
    p = np.array([[0.0, 0.3, 0.7], [0.2, 0.8, 0.0], [0.0, 1.0, 0.0]], np.float32)
    label = np.array([2, 1, 1], np.int32)
    rows = np.arange(3)
    want = -np.log(p[rows, label].astype(np.float64))
    want_grad = np.zeros((3, 3))
    want_grad[rows, label] = -1 / p[rows, label].astype(np.float64)
    cmd = ops.categorical_crossentropy()
    for form in (
        label,
        label[:, None],
        label.astype(np.float32),
        np.eye(3, dtype=np.float32)[label],
    ):
        assert_close(cmd(p, form)[:, 0], want, atol=1e-6)
        assert_close(jax.grad(lambda q, f=form: jnp.sum(cmd(q, f)))(p), want_grad, atol=1e-6)
        ones = (np.ones((3, 1), np.float32),)
        g, _ = cmd.definition.backward(ones, (p, form), (None,), **cmd.kwargs)
        assert_close(g, want_grad, atol=1e-6)  # the command's own backward, as NNC's
    # soft targets: xlogy's convention, 0 where the target is 0
    t = np.array([[0.0, 0.5, 0.5], [0.5, 0.5, 0.0], [0.0, 1.0, 0.0]], np.float32)
    logs = np.log(np.where(t == 0, 1, p).astype(np.float64))
    assert_close(cmd(p, t)[:, 0], -(t * logs).sum(-1), atol=1e-6)
    grad = jax.grad(lambda q: jnp.sum(cmd(q, t)))(p)
    assert_close(grad, np.where(t == 0, 0, -t / np.where(t == 0, 1, p)), atol=1e-6)
    # smoothing weighs every class: a zero probability anywhere is an infinite loss
    assert np.isinf(np.asarray(ops.categorical_crossentropy(trim0=0.1, trim1=0.8)(p, label))).all()


@pytest.mark.parametrize("pos_weight", [1.0, 2.5])
def test_binary_crossentropy_of_a_saturated_correct_probability_is_zero(pos_weight) -> None:
    """p == y, 0 or 1 (a sigmoid that rounded to 1.0): loss 0 and a finite gradient (it
    was 0 * log 0, NaN); other entries as the closed form in NumPy."""
    p = np.array([[1.0, 0.0, 0.3], [0.0, 1.0, 0.9]], np.float32)
    y = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]], np.float32)
    q = p.astype(np.float64)
    terms = np.where(y == 1, 0, (y - 1) * np.log1p(-np.where(y == 1, 0, q)))
    terms -= pos_weight * np.where(y == 0, 0, y * np.log(np.where(y == 0, 1, q)))
    cmd = ops.binary_crossentropy(pos_weight=pos_weight)
    assert_close(cmd(p, y), terms.sum(-1, keepdims=True), rtol=1e-6)
    # the command's backward is NNC's (p - y) / max(p (1 - p), 1e-12): 0 at p == y
    safe = np.where(p == y, 0.5, q)
    want = np.where(p == y, 0, ((1 - y) * q - pos_weight * y * (1 - q)) / (safe * (1 - safe)))
    ones = np.ones((2, 1), np.float32)
    gp, _ = cmd.definition.backward((ones,), (p, y), (None,), **cmd.kwargs)
    assert_close(gp, want, rtol=1e-5)
    # JAX's derivative of the forward: the one-sided derivative, each term 0 where its
    # target weight is, so -pos_weight at p == y == 1 and 1 at p == y == 0; finite
    one_sided = np.where(y == 1, 0, (1 - y) / np.where(y == 1, 0.5, 1 - q))
    one_sided -= pos_weight * np.where(y == 0, 0, y / np.where(y == 0, 0.5, q))
    assert_close(jax.grad(lambda v: jnp.sum(cmd(v, y)))(p), one_sided, rtol=1e-5)
    tiny = np.array([[2.0611537e-09]], np.float32)  # log1p keeps -log(1 - p) ~ p
    assert_close(cmd(tiny, np.zeros_like(tiny)), tiny, rtol=1e-6)
