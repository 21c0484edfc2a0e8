"""A layer frozen for some steps and trained again: its optimizer state stays readable and
the partition's step count never goes backwards.

The oracle is Optax by hand: one Adam (or SGD) state over every parameter, each step
updating only the parameters trained at that step (their moments and the shared count),
with gradients from ``jax.grad``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.models import Dense, Input, Model
from fnnc.models import minimizers as mz

RNG = np.random.default_rng(0)
XS = [RNG.standard_normal((4, 3)).astype(np.float32) for _ in range(5)]
YS = [RNG.standard_normal((4, 2)).astype(np.float32) for _ in range(5)]
A = ["t-a-0-0", "t-a-0-1"]
ALL = ["t-a-0-0", "t-a-0-1", "t-b-0-0", "t-b-0-1"]
FROZEN = [False, True, True, False, False]  # is layer "a" frozen at each step


def _mse(outs, targets):
    return jnp.mean((outs[0] - targets[0]) ** 2)


def _model(minimizer):
    x = Input()
    da, db = Dense(5, name="a"), Dense(2, name="b")
    m = Model(x, db(da(x)))
    m.compile(XS[0], loss=_mse, minimizer=minimizer)
    return m, da


def _forward(p, x):
    h = x @ p["t-a-0-0"].T + p["t-a-0-1"][None]
    return h @ p["t-b-0-0"].T + p["t-b-0-1"][None]


def _adam_oracle(p, lr, frozen, loss):
    """Optax Adam over all parameters, a step moving only the unfrozen ones."""
    tx = optax.adam(lr)
    (adam, rest) = tx.init(p)
    for i, skip in enumerate(frozen):
        g = jax.grad(lambda q, i=i: loss(q, i))(p)
        live = [k for k in p if not (skip and k in A)]
        sub = (
            adam._replace(mu={k: adam.mu[k] for k in live}, nu={k: adam.nu[k] for k in live}),
            rest,
        )
        u, (new, rest) = tx.update({k: g[k] for k in live}, sub, {k: p[k] for k in live})
        adam = adam._replace(mu={**adam.mu, **new.mu}, nu={**adam.nu, **new.nu}, count=new.count)
        p = {**p, **optax.apply_updates({k: p[k] for k in live}, u)}
    return p


def _fit_loss(q, i):
    return jnp.mean((_forward(q, XS[i]) - YS[i]) ** 2)


def _close(m, want):
    got = m.parameters()
    for k in ALL:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda: optax.adam(0.01),
        lambda: mz.adam(0.01),
        lambda: mz.sgd(0.1, momentum=0.9),
        lambda: optax.sgd(0.1, momentum=0.9),
    ],
    ids=["optax-adam", "mz-adam", "mz-sgd", "optax-sgd"],
)
def test_unfrozen_layer_trains_again(make) -> None:
    m, da = _model(make())
    before = None
    for i, frozen in enumerate(FROZEN):
        da.is_trainable = not frozen
        if frozen and before is None:
            before = {k: v for k, v in m.parameters().items() if k in A}
        m.fit(XS[i], YS[i])
        if frozen:  # a frozen layer keeps its weights
            for k in A:
                np.testing.assert_array_equal(np.asarray(m.parameters()[k]), before[k])
    assert all(np.isfinite(np.asarray(v)).all() for v in m.parameters().values())


def test_unfrozen_layer_takes_the_newest_count_as_optax_does() -> None:
    m, da = _model(optax.adam(0.01))
    p0 = {k: jnp.asarray(v) for k, v in m.parameters().items()}
    for i, frozen in enumerate(FROZEN):
        da.is_trainable = not frozen
        m.fit(XS[i], YS[i])
    counts = {k: [int(s[0].count) for s in m.engine.optimizer_state(k).values()] for k in ALL}
    assert counts == {k: [5] for k in ALL}  # b stepped 5 times; a's count follows it
    _close(m, _adam_oracle(p0, 0.01, FROZEN, _fit_loss))


def test_noop_partition_and_back_matches_optax() -> None:
    opt = optax.adam(0.01)
    m, _ = _model(opt)
    p0 = {k: jnp.asarray(v) for k, v in m.parameters().items()}
    for i, frozen in enumerate(FROZEN):
        m.set_minimizer(mz.noop() if frozen else opt, params=A)
        m.fit(XS[i], YS[i])
    _close(m, _adam_oracle(p0, 0.01, FROZEN, _fit_loss))


def test_apply_gradients_after_unfreezing_matches_optax() -> None:
    m, da = _model(optax.adam(0.01))
    p0 = {k: jnp.asarray(v) for k, v in m.parameters().items()}
    for i, frozen in enumerate(FROZEN):
        da.is_trainable = not frozen
        m.evaluate(XS[i], requires_grad=True)
        m.backward()  # seeds every output with ones: the gradient of their sum
        m.apply_gradients()
    want = _adam_oracle(p0, 0.01, FROZEN, lambda q, i: jnp.sum(_forward(q, XS[i])))
    _close(m, want)


def test_new_rate_after_unfreezing_keeps_moments_and_count() -> None:
    m, da = _model(optax.adam(0.01))
    p0 = {k: jnp.asarray(v) for k, v in m.parameters().items()}
    for i, frozen in enumerate(FROZEN[:3]):
        da.is_trainable = not frozen
        m.fit(XS[i], YS[i])
    da.is_trainable = True
    m.set_minimizer(optax.adam(0.01))  # a new object of the same structure
    m.fit(XS[3], YS[3])
    _close(m, _adam_oracle(p0, 0.01, FROZEN[:4], _fit_loss))
