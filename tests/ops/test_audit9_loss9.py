"""Audit 9 (losses): masked -inf logits, the fused head's online logsumexp, labels."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import ShapeError
from fnnc.ops import linear_crossentropy
from fnnc.ops.pallas import softmax_crossentropy as kernel

NINF = -np.inf


def _masked_ce(x, label):
    """NumPy float64 ``logsumexp(x) - x[label]`` over the finite logits, and its gradient."""
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    e = np.exp(x - m)
    p = e / e.sum(-1, keepdims=True)
    loss = np.log(e.sum(-1)) + m[:, 0] - np.take_along_axis(x, label[:, None], -1)[:, 0]
    return loss, p - np.eye(x.shape[-1])[label]


# Row 0's first 16 classes are -inf: a whole class block of the kernel below (and of the
# linear head's class_chunk), the case where an online logsumexp computes -inf - -inf.
_X = np.random.default_rng(0).standard_normal((3, 37)).astype(np.float32) * 3
_X[0, :16] = NINF
_X[1, [2, 5, 36]] = NINF
_LABEL = np.array([20, 4, 0], np.int32)


@pytest.mark.parametrize("form", ["index", "index1", "float_index", "one_hot"])
def test_softmax_crossentropy_of_masked_logits_is_finite(form):
    """0 * -inf was NaN in -sum(t * z) for every class off the label (optax and NNC,
    which reads x[label] alone, give the finite loss)."""
    label = {
        "index": _LABEL,
        "index1": _LABEL[:, None],
        "float_index": _LABEL.astype(np.float32),
        "one_hot": np.eye(37, dtype=np.float32)[_LABEL],
    }[form]
    cmd = ops.softmax_crossentropy()
    want, want_grad = _masked_ce(_X, _LABEL)
    loss, p = cmd(_X, label)
    np.testing.assert_allclose(np.asarray(loss)[:, 0], want, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(
        want, optax.softmax_cross_entropy_with_integer_labels(_X, _LABEL), rtol=1e-6
    )
    assert np.all(np.asarray(p)[np.isinf(_X)] == 0)
    grad = jax.grad(lambda x: jnp.sum(cmd(x, label)[0]))(jnp.asarray(_X))
    np.testing.assert_allclose(grad, want_grad, atol=1e-6)


def test_smoothed_targets_on_a_masked_logit_are_an_infinite_loss():
    """trim0 > 0 puts mass on the -inf classes: the loss is +inf, not NaN."""
    loss, _ = ops.softmax_crossentropy(trim0=0.01, trim1=0.9)(_X, _LABEL)
    assert np.all(np.asarray(loss)[:2] == np.inf)


def test_pallas_kernel_of_masked_logits_matches_numpy(monkeypatch):
    """The kernel's online logsumexp saw a first class block of -inf only: NaN."""
    monkeypatch.setattr(kernel, "CLASS_BLOCK", 16)
    loss, _ = jax.jit(kernel.softmax_crossentropy)(_X, _LABEL)
    np.testing.assert_allclose(np.asarray(loss)[:, 0], _masked_ce(_X, _LABEL)[0], rtol=1e-5)


@pytest.mark.parametrize("class_chunk", [16, 5])
def test_linear_head_with_a_masked_first_class_block(class_chunk):
    """A bias of -inf over the first class block made the fused head's online
    logsumexp NaN for every row; the dense backend and the unfused pair were finite."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    w = (rng.standard_normal((37, 4)) * 0.5).astype(np.float32)
    bias = np.zeros(37, np.float32)
    bias[:16] = NINF
    label = rng.integers(16, 37, 5).astype(np.int32)
    z = x.astype(np.float64) @ w.T.astype(np.float64) + bias
    want, want_dz = _masked_ce(z, label)
    cmd = ops.linear_softmax_crossentropy(row_chunk=2, class_chunk=class_chunk)
    f = jax.jit(lambda x, w: jnp.sum(cmd(x, w, label, bias)[0]))
    loss, (gx, gw) = jax.value_and_grad(f, (0, 1))(x, w)
    np.testing.assert_allclose(loss, want.sum(), rtol=1e-5)
    np.testing.assert_allclose(gx, want_dz @ w.astype(np.float64), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gw, want_dz.T @ x.astype(np.float64), rtol=1e-4, atol=1e-5)


def test_linear_head_takes_batch_first_labels_as_the_pair_does():
    """Hidden [N, 1, D] with labels [N]: softmax_crossentropy takes them (NNC's
    batch-first rule), so the fused command that replaces the pair must too."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 1, 3)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    label = np.array([0, 4, 2, 1], np.int32)
    z = x[:, 0].astype(np.float64) @ w.T.astype(np.float64)
    want = np.log(np.exp(z).sum(-1)) - z[np.arange(4), label]
    loss, _ = ops.linear_softmax_crossentropy()(x, w, label)
    assert loss.shape == (4, 1, 1)
    np.testing.assert_allclose(np.ravel(loss), want, rtol=1e-6)
    mean, _, gw, _ = ops.linear_softmax_crossentropy_mean()(x, w, label)
    np.testing.assert_allclose(np.ravel(mean), [want.mean()], rtol=1e-6)
    dz = (np.exp(z) / np.exp(z).sum(-1, keepdims=True) - np.eye(5)[label]) / 4
    np.testing.assert_allclose(gw, dz.T @ x[:, 0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "name", ["linear_softmax_crossentropy", "linear_softmax_crossentropy_mean"]
)
def test_linear_head_over_no_classes_is_a_shape_error(name):
    """w [0, D]: the blockwise command divided by a class chunk of 0 (a raw
    ZeroDivisionError) and the mean returned -inf; softmax_crossentropy refuses C = 0."""
    x, w = np.ones((3, 4), np.float32), np.zeros((0, 4), np.float32)
    with pytest.raises(ShapeError, match=r"weights float32\[0, 4\] have no classes"):
        getattr(ops, name)()(x, w, np.array([0, 1, 2], np.int32))
    with pytest.raises(ShapeError, match="no classes"):
        ops.softmax_crossentropy()(np.ones((3, 0), np.float32), np.array([0, 1, 2], np.int32))


def test_a_label_outside_the_classes_hits_none_in_every_implementation():
    """The documented meaning of labels -1 and V (NNC asserts; a program cannot): targets
    trim0 everywhere, the same in the reference, the Pallas kernel, the blockwise and
    dense linear heads and the mean head (NumPy float64 oracle)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    label = np.array([6, -1, 2, 100], np.int32)
    t0, t1 = 0.02, 0.9  # smoothed: trim0 reaches every class of a label that hits none
    z = x.astype(np.float64) @ w.T.astype(np.float64) + b
    t = np.full((4, 6), t0)
    t[2, 2] = t1
    want = np.log(np.exp(z).sum(-1)) - (t * z).sum(-1)  # the documented loss, any trims
    zf = z.astype(np.float32)
    kw = {"trim0": t0, "trim1": t1}
    got = {
        "reference": ops.softmax_crossentropy(**kw)(zf, label)[0],
        "pallas": jax.jit(lambda a: kernel.softmax_crossentropy(a, label, **kw))(zf)[0],
        "blockwise": ops.linear_softmax_crossentropy(**kw, row_chunk=3, class_chunk=4)(
            x, w, label, b
        )[0],
        "dense": linear_crossentropy._dense(x, w, label, b, **kw, row_chunk=1, class_chunk=1)[0],
    }
    for name, loss in got.items():
        np.testing.assert_allclose(np.ravel(loss), want, rtol=1e-5, err_msg=name)
    mean = ops.linear_softmax_crossentropy_mean(**kw, row_chunk=3)(x, w, label, b)[0]
    np.testing.assert_allclose(np.ravel(mean), [want.mean()], rtol=1e-5)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    grad = jax.grad(lambda a: jnp.sum(ops.softmax_crossentropy(**kw)(a, label)[0]))(zf)
    np.testing.assert_allclose(grad, p - t, atol=1e-6)
