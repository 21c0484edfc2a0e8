"""Audit 9 of fnnc.models.minimizers: hyper-parameters float32 cannot hold, and
hyper-parameters traced by ``optax.inject_hyperparams``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import CommandError
from fnnc.models.minimizers import adam, adamw, lamb, rmsprop, sgd, with_gradient_accumulation

F32 = np.finfo(np.float32)

UNHOLDABLE = [
    (sgd, {"rate": float("inf")}, "rate"),
    (sgd, {"rate": 1e39}, "rate"),  # float32 makes it inf
    (lamb, {"rate": 10**400}, "rate"),  # an int no float holds
    (adam, {"rate": 0.1, "epsilon": float("inf")}, "epsilon"),
    (adamw, {"rate": 0.1, "decay": 1e39}, "decay"),
    (rmsprop, {"rate": 0.1, "decay": -float("inf")}, "decay"),
    (lamb, {"rate": 0.1, "scale": float("inf")}, "scale"),
    (sgd, {"rate": 0.1, "scale": 1e-50}, "scale"),  # float32 makes it 0
    (adam, {"rate": 1e-50}, "rate"),
    (sgd, {"rate": 0.1, "momentum": "0.9"}, "momentum"),  # a string is no number
    (adam, {"rate": True}, "rate"),
]


@pytest.mark.parametrize(
    ("factory", "kwargs", "name"),
    UNHOLDABLE,
    ids=[f"{f.__name__}-{n}-{v!r:.12}" for f, kw, n in UNHOLDABLE for v in [kw.get(n)]],
)
def test_hyper_parameters_float32_cannot_hold_raise_naming_them(factory, kwargs, name):
    kwargs = dict(kwargs)
    rate = kwargs.pop("rate")
    with pytest.raises(CommandError, match=rf"{factory.__name__}: {name}"):
        factory(rate, **kwargs)


def test_hyper_parameters_at_float32_limits_are_kept():
    """The oracle: NumPy's float32 range; its largest and smallest values are taken."""
    big, tiny = float(F32.max), float(F32.smallest_subnormal)
    for factory in (sgd, adam, adamw, rmsprop, lamb):
        factory(big, scale=tiny, decay=big)
        factory(tiny, scale=big, decay=tiny)
    for factory in (adam, adamw, rmsprop, lamb):
        factory(0.1, epsilon=tiny)
        factory(0.1, epsilon=big)


@pytest.mark.parametrize("k", [True, np.bool_(True)])
def test_gradient_accumulation_count_is_no_bool(k):
    with pytest.raises(CommandError, match="k must be an integer, got bool"):
        with_gradient_accumulation(sgd(0.1), k)


def test_gradient_accumulation_count_fits_its_int32_counter():
    """k = 2**40 failed at the first update with a raw OverflowError from JAX; 2**31
    never applied (the int32 count wraps before reaching k - 1)."""
    top = int(np.iinfo(np.int32).max)
    with_gradient_accumulation(sgd(0.1), top)
    for k in (top + 1, 2**40):
        with pytest.raises(CommandError, match=rf"k must be >= 1 and <= {top}"):
            with_gradient_accumulation(sgd(0.1), k)


# ------------------------------------------- hyper-parameters traced by inject_hyperparams

W0 = jnp.array([1.0, -2.0, 0.5])
GRADS = [jnp.array([0.5, 0.25, -1.0]), jnp.array([-0.75, 0.05, 2.0]), jnp.array([0.1, -0.5, 0.0])]
INJECTED = [
    (sgd, {"rate": 0.1, "momentum": 0.9, "decay": 0.01, "scale": 0.5}, {"nesterov": True}),
    (sgd, {"rate": 0.1, "momentum": 0.8, "dampening": 0.3, "decay": 0.02}, {}),
    (adam, {"rate": 0.05, "beta2": 0.95, "decay": 0.01, "scale": 2.0}, {"amsgrad": True}),
    (adamw, {"rate": optax.linear_schedule(0.05, 0.01, 2), "decay": 0.1}, {}),
    (rmsprop, {"rate": 0.01, "decay": 0.01, "alpha": 0.9, "momentum": 0.5}, {"centered": True}),
    (lamb, {"rate": 0.05, "decay": 0.1, "beta1": 0.8}, {}),
]


CASES = [(*case, jnp.float32) for case in INJECTED] + [
    (*INJECTED[i], jnp.bfloat16)
    for i in (0, 2)  # computed in float32, rounded once
]


@pytest.mark.parametrize(
    ("factory", "numbers", "flags", "dtype"),
    CASES,
    ids=[f"{f.__name__}-{i}-{d.__name__}" for i, (f, _, _, d) in enumerate(CASES)],
)
def test_inject_hyperparams_traces_the_numbers_and_steps_as_the_plain_minimizer(
    factory, numbers, flags, dtype
):
    """The oracle: the same minimizer with Python numbers. Inside a jitted update
    ``optax.inject_hyperparams`` rebuilds it with traced hyper-parameters, which were
    refused as 'rate must be a number, got DynamicJaxprTracer' (so a Model with such a
    minimizer failed in compile's init probe); the trajectory is now
    the plain one (float32 hyper-parameters, as NNC's C floats)."""
    plain = factory(**numbers, **flags)
    injected = optax.inject_hyperparams(factory, hyperparam_dtype=jnp.float32)(**numbers, **flags)
    p = q = W0.astype(dtype)
    s, t = plain.init(p), injected.init(q)
    step_plain, step_injected = jax.jit(plain.update), jax.jit(injected.update)
    for g in GRADS:
        u, s = step_plain(g.astype(dtype), s, p)
        v, t = step_injected(g.astype(dtype), t, q)
        p, q = optax.apply_updates(p, u), optax.apply_updates(q, v)
    assert q.dtype == dtype
    # a traced number and a constant may be fused differently by XLA: a rounding apart
    tol = {"rtol": 2e-6, "atol": 1e-7} if dtype == jnp.float32 else {"rtol": 2**-7, "atol": 0}

    def close(got, want):
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), **tol)

    close(q, p)
    jax.tree.map(close, t.inner_state, s)


# ------------------------------------------------------ integer and complex parameters

MINIMIZERS = [
    sgd(0.1, momentum=0.9),
    adam(0.1, decay=0.1),
    adamw(0.1, amsgrad=True),
    rmsprop(0.1, centered=True),
    lamb(0.1),
]


@pytest.mark.parametrize("opt", MINIMIZERS, ids=["sgd", "adam", "adamw", "rmsprop", "lamb"])
@pytest.mark.parametrize("dtype", [np.int32, np.complex64])
def test_integer_or_complex_parameters_are_refused_naming_the_dtype(opt, dtype):
    """An int32 parameter was moved by the truncated float step (sgd(0.1): 1 - 0.1 * 1
    became 0) and its momentum kept truncated; NNC's kernels take floats only."""
    p = np.array([1, 2], dtype)
    with pytest.raises(CommandError, match=rf"a parameter of dtype {np.dtype(dtype).name}"):
        opt.update(p, opt.init(p), p)
    f = np.array([1.0, 2.0], np.float32)  # a float parameter with an int gradient
    with pytest.raises(CommandError, match=rf"a gradient of dtype {np.dtype(dtype).name}"):
        opt.update(p, opt.init(f), f)


def test_rmsprop_momentum_under_a_schedule_multiplies_the_buffer_by_the_step_rate():
    """The oracle: NNC's RMSPROP_FORWARD loop (ccv_nnc_rmsprop_cpu_ref.c) in float64,
    run with the schedule's rate as each step's command rate. Optax's rmsprop, which
    the docstring named as equal, keeps rate-scaled steps in its buffer instead."""
    rate = optax.linear_schedule(0.1, 0.01, 3)
    opt = rmsprop(rate, alpha=0.9, momentum=0.5, decay=0.01)
    a = np.asarray(W0, np.float64)
    m = v = np.zeros_like(a)
    p, state = W0, opt.init(W0)
    for t, g in enumerate(GRADS):
        grad = np.asarray(g, np.float64) + np.float32(0.01) * a
        v = np.float32(0.9) * v + (1 - np.float32(0.9)) * grad * grad
        m = np.float32(0.5) * m + grad / (np.sqrt(v) + np.float32(1e-8))
        a = a - float(rate(t)) * m
        updates, state = opt.update(g, state, p)
        p = optax.apply_updates(p, updates)
    np.testing.assert_allclose(np.asarray(p, np.float64), a, rtol=2e-6, atol=1e-7)


def test_a_16_bit_hyper_parameter_out_of_range_says_where_it_was_rounded():
    """inject_hyperparams over bfloat16 parameters rounds beta2=0.999 to 1.0 (NumPy's
    bfloat16 is the oracle); the range error says why a 0.999 became 1."""
    assert float(jnp.asarray(0.999, jnp.bfloat16)) == 1.0
    opt = optax.inject_hyperparams(adam)(rate=0.1, beta2=0.999)
    with pytest.raises(CommandError, match=r"beta2 must be in \[0, 1\), got 1.0 \(a bfloat16.*"):
        opt.init(jnp.zeros(2, jnp.bfloat16))
    f32 = optax.inject_hyperparams(adam, hyperparam_dtype=jnp.float32)(rate=0.1, beta2=0.999)
    f32.init(jnp.zeros(2, jnp.bfloat16))
