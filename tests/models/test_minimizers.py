"""fnnc.models.minimizers against NNC's C update rules, transcribed as float64 NumPy.

Each ``nnc_*`` oracle below is a line-by-line transcription of the per-element loop of
the named liuliu/ccv file (variables keep NNC's names: ``a`` parameter, ``g`` gradient,
``m``/``n`` momentum in/out, ``v``/``u`` velocity in/out, ``b`` new parameter). They
never call fnnc, so they check the implementation independently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import CommandError, FnncError
from fnnc.models.minimizers import (
    adam,
    adamw,
    lamb,
    noop,
    rmsprop,
    sgd,
    with_gradient_accumulation,
)
from tests.helpers import assert_close

W = np.array([1.0, -2.0, 3.0])
GRADS = [
    np.array([0.5, 0.25, -1.0]),
    np.array([-0.75, 0.05, 2.0]),  # |g| falls for element 1: exercises amsgrad's max
    np.array([0.1, -0.5, 0.0]),
]
TOL = {"rtol": 2e-6, "atol": 1e-6}


# ---------------------------------------------------------------- NNC oracles (float64)


def F(x):
    """A C ``float`` (NNC's scalar type), back as a float64 for the element arithmetic."""
    return np.float64(np.float32(x))


def powf(x, step):
    """C's ``powf(x, step)``: float32 in, float32 out (so ``1 - powf`` is float32, too)."""
    return np.float32(x) ** np.float32(step)


def nnc_sgd(g, a, m, *, rate, scale=1.0, decay=0.0, momentum=0.0, dampening=0.0, nesterov=False):
    # lib/nnc/cmd/sgd/ccv_nnc_sgd_cpu_ref.c
    inv_dampening = 1 - dampening
    if nesterov:
        grad = scale * g
        mom = n = momentum * m + grad + decay * a
        grad = grad + momentum * mom
        b = a - rate * grad
    else:
        mom = n = momentum * m + inv_dampening * (scale * g + decay * a)
        b = a - rate * mom
    return b, {"momentum": n}


def nnc_adam(
    g,
    a,
    m,
    v,
    vm,
    *,
    step,
    rate,
    beta1=F(0.9),
    beta2=F(0.999),
    decay=0.0,
    epsilon=F(1e-8),
    amsgrad=False,
    scale=1.0,
):
    # lib/nnc/cmd/adam/ccv_nnc_adam_cpu_ref.c
    rate_inv_bias_correction1 = F(F(rate) / (1 - powf(beta1, step)))
    inv_bias_correction2 = F(1.0 / np.float64(1 - powf(beta2, step)))
    grad = scale * g
    grad = grad + decay * a
    mom = n = beta1 * m + (1 - beta1) * grad
    vel = u = beta2 * v + (1 - beta2) * grad * grad
    if amsgrad:
        vel_hat = vel * inv_bias_correction2
        vel_max_hat = um = np.maximum(vm, vel_hat)
        b = a - (mom * rate_inv_bias_correction1) / (np.sqrt(vel_max_hat) + epsilon)
        return b, {"momentum": n, "velocity": u, "velocity_max": um}
    b = a - (mom * rate_inv_bias_correction1) / (np.sqrt(vel * inv_bias_correction2) + epsilon)
    return b, {"momentum": n, "velocity": u}


def nnc_adamw(
    g,
    a,
    m,
    v,
    vm,
    *,
    step,
    rate,
    beta1=F(0.9),
    beta2=F(0.999),
    decay=0.0,
    epsilon=F(1e-8),
    amsgrad=False,
    scale=1.0,
):
    # lib/nnc/cmd/adam/ccv_nnc_adamw_cpu_ref.c
    rate_inv_bias_correction1 = F(F(rate) / (1 - powf(beta1, step)))
    inv_bias_correction2 = F(1.0 / np.float64(1 - powf(beta2, step)))
    rate_decay = rate * decay
    grad = scale * g
    mom = n = beta1 * m + (1 - beta1) * grad
    vel = u = beta2 * v + (1 - beta2) * grad * grad
    if amsgrad:
        vel_hat = vel * inv_bias_correction2
        vel_max_hat = um = np.maximum(vm, vel_hat)
        b = (
            a
            - rate_decay * a
            - (mom * rate_inv_bias_correction1) / (np.sqrt(vel_max_hat) + epsilon)
        )
        return b, {"momentum": n, "velocity": u, "velocity_max": um}
    b = (
        a
        - rate_decay * a
        - (mom * rate_inv_bias_correction1) / (np.sqrt(vel * inv_bias_correction2) + epsilon)
    )
    return b, {"momentum": n, "velocity": u}


def nnc_rmsprop(
    g,
    a,
    m,
    v,
    ga,
    *,
    rate,
    decay=0.0,
    alpha=F(0.99),
    momentum=0.0,
    epsilon=F(1e-8),
    centered=False,
    scale=1.0,
):
    # lib/nnc/cmd/rmsprop/ccv_nnc_rmsprop_cpu_ref.c
    grad = scale * g
    grad = grad + decay * a
    vel = u = alpha * v + (1 - alpha) * grad * grad
    if centered:
        # Not in NNC: torch.optim.RMSprop(centered=True), same order otherwise.
        grad_avg = alpha * ga + (1 - alpha) * grad
        mom = n = momentum * m + grad / (np.sqrt(vel - grad_avg * grad_avg) + epsilon)
        return a - rate * mom, {"momentum": n, "velocity": u, "grad_average": grad_avg}
    mom = n = momentum * m + grad / (np.sqrt(vel) + epsilon)
    b = a - rate * mom
    return b, {"momentum": n, "velocity": u}


def nnc_lamb(
    g, a, m, v, *, step, rate, beta1=F(0.9), beta2=F(0.999), decay=0.0, epsilon=F(1e-6), scale=1.0
):
    # lib/nnc/cmd/lamb/ccv_nnc_lamb_cpu_ref.c (one parameter tensor)
    inv_bias_correction1 = F(1.0 / np.float64(1 - powf(beta1, step)))
    inv_bias_correction2 = F(1.0 / np.float64(1 - powf(beta2, step)))
    grad = scale * g
    w = a
    mom = n = beta1 * m + (1 - beta1) * grad
    vel = u = beta2 * v + (1 - beta2) * grad * grad
    update = (mom * inv_bias_correction1) / (np.sqrt(vel * inv_bias_correction2) + epsilon) + (
        w * decay
    )
    w_norm = np.sqrt(np.sum(w * w))
    update_norm = np.sqrt(np.sum(update * update))
    trust_ratio = w_norm / update_norm if w_norm > 0 and update_norm > 0 else 1.0
    rate_trust_ratio = rate * trust_ratio
    b = a - rate_trust_ratio * update
    return b, {"momentum": n, "velocity": u}


def c_floats(hyper):
    """NNC keeps hyper-parameters in C ``float`` fields (ccv_nnc.h's cmd_param_t), so
    0.999 is 0.99900001287...; the oracles compute with those values in float64."""
    return {k: v if isinstance(v, bool) else float(np.float32(v)) for k, v in hyper.items()}


def oracle_run(kind, hyper, a, grads):
    """NNC's states after each step (zero-initialized saved aux, step = 1, 2, ...)."""
    hyper = c_floats(hyper)
    zeros = np.zeros_like(a)
    aux = {"momentum": zeros, "velocity": zeros, "velocity_max": zeros, "grad_average": zeros}
    history = []
    for step, g in enumerate(grads, start=1):
        if kind == "sgd":
            a, new = nnc_sgd(g, a, aux["momentum"], **hyper)
        elif kind in ("adam", "adamw"):
            rule = nnc_adam if kind == "adam" else nnc_adamw
            args = (aux["momentum"], aux["velocity"], aux["velocity_max"])
            a, new = rule(g, a, *args, step=step, **hyper)
        elif kind == "rmsprop":
            args = (aux["momentum"], aux["velocity"], aux["grad_average"])
            a, new = nnc_rmsprop(g, a, *args, **hyper)
        else:
            a, new = nnc_lamb(g, a, aux["momentum"], aux["velocity"], step=step, **hyper)
        aux = {**aux, **new}
        history.append((a, new))
    return history


FACTORIES = {"sgd": sgd, "adam": adam, "adamw": adamw, "rmsprop": rmsprop, "lamb": lamb}


def make(kind, hyper):
    """The fnnc minimizer for an oracle's keyword arguments (``rate`` is positional)."""
    return FACTORIES[kind](hyper["rate"], **{k: v for k, v in hyper.items() if k != "rate"})


def fnnc_run(opt, params, grads, jit=False):
    update = jax.jit(opt.update) if jit else opt.update
    state = opt.init(params)
    history = []
    for g in grads:
        # NumPy gradients become float32; jax arrays keep their dtype (half, bfloat16).
        g = jax.tree.map(
            lambda x: jnp.asarray(x, jnp.float32) if isinstance(x, np.ndarray) else x, g
        )
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
        history.append((params, state))
    return history


# ------------------------------------------------------------- every option vs. NNC's C

CASES = [
    ("sgd", {"rate": 0.1}),
    ("sgd", {"rate": 0.1, "momentum": 0.9}),
    ("sgd", {"rate": 0.1, "momentum": 0.9, "dampening": 0.9}),
    ("sgd", {"rate": 0.1, "momentum": 0.5, "dampening": 0.25, "decay": 0.01, "scale": 0.5}),
    ("sgd", {"rate": 0.1, "momentum": 0.9, "nesterov": True}),
    ("sgd", {"rate": 0.1, "momentum": 0.9, "nesterov": True, "decay": 0.05, "scale": 0.25}),
    ("sgd", {"rate": 0.05, "decay": 0.995}),  # test/unit/nnc/minimize.tests.c's decay
    ("adam", {"rate": 0.01}),
    ("adam", {"rate": 0.002, "beta1": 0.9, "beta2": 0.98, "epsilon": 1e-9}),  # adam.tests.c
    ("adam", {"rate": 0.01, "decay": 0.1, "scale": 0.5}),
    ("adam", {"rate": 0.01, "amsgrad": True}),
    ("adam", {"rate": 0.01, "amsgrad": True, "decay": 0.1, "beta2": 0.9}),
    ("adamw", {"rate": 0.01, "decay": 0.1}),
    ("adamw", {"rate": 0.01, "decay": 0.1, "amsgrad": True, "scale": 2.0}),
    ("rmsprop", {"rate": 0.01}),
    ("rmsprop", {"rate": 0.01, "momentum": 0.9, "alpha": 0.9}),
    ("rmsprop", {"rate": 0.01, "decay": 0.1, "epsilon": 1e-3, "scale": 0.5}),
    ("rmsprop", {"rate": 0.01, "centered": True, "alpha": 0.9}),
    ("rmsprop", {"rate": 0.01, "centered": True, "momentum": 0.5, "decay": 0.1, "alpha": 0.8}),
    ("lamb", {"rate": 0.01}),
    ("lamb", {"rate": 0.01, "decay": 0.1, "beta2": 0.98, "scale": 0.5}),
]


@pytest.mark.parametrize(("kind", "hyper"), CASES, ids=[f"{k}-{h}" for k, h in CASES])
def test_matches_nnc_rule(kind, hyper):
    opt = make(kind, hyper)
    want = oracle_run(kind, hyper, W, GRADS)
    got = fnnc_run(opt, jnp.asarray(W, jnp.float32), GRADS)
    for step, ((a, aux), (params, state)) in enumerate(zip(want, got), start=1):
        assert_close(params, a, **TOL, what=f"{kind} params after step {step}")
        assert int(state.count) == step
        for name, value in aux.items():
            assert_close(getattr(state, name), value, **TOL, what=f"{kind} {name} step {step}")


def test_nesterov_without_momentum_drops_decay_as_nnc_does_and_warns():
    """ccv_nnc_sgd_cpu_ref.c, nesterov: b = a - rate * (scale * g + momentum * mom), so
    with momentum == 0 the decay inside mom never reaches b."""
    hyper = {"rate": 0.1, "nesterov": True, "decay": 0.5}
    with pytest.warns(UserWarning, match="ignores decay"):
        opt = make("sgd", hyper)
    want = oracle_run("sgd", hyper, W, GRADS)
    got = fnnc_run(opt, jnp.asarray(W, jnp.float32), GRADS)
    assert_close([p for p, _ in got], [a for a, _ in want], **TOL)
    assert_close(got[0][0], W - 0.1 * GRADS[0], **TOL)


def test_adam_step_is_count_plus_one():
    """NNC's ``adam.step`` is set by the caller; here it is ``count + 1``: a state that has
    counted 9 applies corrects with t = 10 (ccv_nnc_adam_cpu_ref.c's powf(beta, step))."""
    opt = adam(0.01, beta2=0.9)
    m, v = np.array([0.1, -0.2, 0.3]), np.array([0.01, 0.02, 0.5])
    state = opt.init(jnp.asarray(W, jnp.float32))
    state = state._replace(
        count=jnp.asarray(9, jnp.int32),
        momentum=jnp.asarray(m, jnp.float32),
        velocity=jnp.asarray(v, jnp.float32),
    )
    updates, state = opt.update(jnp.asarray(GRADS[0], jnp.float32), state, jnp.asarray(W))
    b, aux = nnc_adam(GRADS[0], W, m, v, None, step=10, **c_floats({"rate": 0.01, "beta2": 0.9}))
    assert_close(optax.apply_updates(jnp.asarray(W, jnp.float32), updates), b, **TOL)
    assert_close(state.velocity, aux["velocity"], **TOL)


def test_lamb_trust_ratio_is_per_tensor_and_one_for_zero_params():
    params = {"w": jnp.asarray(W, jnp.float32), "zero": jnp.zeros(2, jnp.float32)}
    grads = {"w": GRADS[0], "zero": np.array([0.5, -2.0])}
    got = fnnc_run(lamb(0.01, decay=0.1), params, [grads])[0][0]
    for key in params:
        a = np.asarray(params[key], np.float64)
        b, _ = nnc_lamb(grads[key], a, 0.0, 0.0, step=1, **c_floats({"rate": 0.01, "decay": 0.1}))
        assert_close(got[key], b, **TOL, what=key)
    # a zero tensor has trust ratio 1: it moves by rate * g / (|g| + epsilon)
    assert_close(got["zero"], np.array([-0.01, 0.01]), rtol=1e-5, atol=0)


# ---------------------------------------------------- where NNC's rule is Optax's rule

OPTAX_SAME = [
    # NNC SGD without dampening, decay or scale is optax.sgd (ccv_nnc_sgd_cpu_ref.c).
    (sgd(0.1), optax.sgd(0.1)),
    (sgd(0.1, momentum=0.9), optax.sgd(0.1, momentum=0.9)),
    (sgd(0.1, momentum=0.9, nesterov=True), optax.sgd(0.1, momentum=0.9, nesterov=True)),
    # Adam: coupled decay is add_decayed_weights before adam; amsgrad keeps the max of
    # the corrected velocity in both.
    (adam(0.01), optax.adam(0.01)),
    (adam(0.01, decay=0.1), optax.chain(optax.add_decayed_weights(0.1), optax.adam(0.01))),
    (adam(0.01, amsgrad=True), optax.amsgrad(0.01)),
    (adamw(0.01, decay=0.1), optax.adamw(0.01, weight_decay=0.1)),
    # RMSProp: epsilon outside the sqrt, momentum on the normalized gradient.
    (rmsprop(0.01, alpha=0.9), optax.rmsprop(0.01, decay=0.9, eps_in_sqrt=False)),
    (
        rmsprop(0.01, alpha=0.9, momentum=0.5),
        optax.rmsprop(0.01, decay=0.9, eps_in_sqrt=False, momentum=0.5),
    ),
    (
        rmsprop(0.01, alpha=0.9, centered=True),
        optax.rmsprop(0.01, decay=0.9, eps_in_sqrt=False, centered=True),
    ),
    # LAMB: per-tensor trust ratio with 1 for zero norms, as optax.scale_by_trust_ratio.
    (lamb(0.01, decay=0.1), optax.lamb(0.01, eps=1e-6, weight_decay=0.1)),
]


@pytest.mark.parametrize(("ours", "theirs"), OPTAX_SAME)
def test_coincides_with_optax(ours, theirs):
    params = {"w": jnp.asarray(W, jnp.float32), "b": jnp.asarray([[0.5, -0.25]], jnp.float32)}
    grads = [{"w": g, "b": g[:2][None] * 3} for g in GRADS]
    for (p1, _), (p2, _) in zip(fnnc_run(ours, params, grads), fnnc_run(theirs, params, grads)):
        assert_close(p1, p2, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------- jit, pytrees, dtypes, rate


@pytest.mark.parametrize(("kind", "hyper"), [CASES[5], CASES[11], CASES[13], CASES[18], CASES[20]])
def test_jit_matches_eager(kind, hyper):
    opt = make(kind, hyper)
    params = jnp.asarray(W, jnp.float32)
    eager = fnnc_run(opt, params, GRADS)
    jitted = fnnc_run(opt, params, GRADS, jit=True)
    assert_close([p for p, _ in jitted], [p for p, _ in eager], rtol=1e-6, atol=1e-7)
    assert_close([s for _, s in jitted], [s for _, s in eager], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("kind", "hyper"), [CASES[3], CASES[11], CASES[13], CASES[18], CASES[20]])
def test_pytree_params_each_leaf_follows_the_rule(kind, hyper):
    opt = make(kind, hyper)
    rng = np.random.default_rng(0)
    shapes = {"dense": {"w": (3, 4), "b": (4,)}, "scalar": (), "conv": [(2, 3, 3, 1)]}
    params = jax.tree.map(
        lambda s: rng.uniform(-1, 1, s), shapes, is_leaf=lambda s: isinstance(s, tuple)
    )
    grads = [jax.tree.map(lambda p: rng.uniform(-1, 1, np.shape(p)), params) for _ in range(2)]
    got = fnnc_run(
        opt, jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params), grads, jit=True
    )
    leaves, treedef = jax.tree.flatten(params)
    per_leaf = [
        oracle_run(kind, hyper, a, [treedef.flatten_up_to(g)[i] for g in grads])
        for i, a in enumerate(leaves)
    ]
    for step in range(2):
        want = treedef.unflatten([h[step][0] for h in per_leaf])
        assert jax.tree.structure(got[step][0]) == jax.tree.structure(want)
        assert_close(got[step][0], want, rtol=1e-5, atol=1e-6, what=f"{kind} step {step + 1}")
        assert jax.tree.structure(got[step][1].momentum) == treedef


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize(("kind", "hyper"), [CASES[5], CASES[11], CASES[13], CASES[18], CASES[20]])
def test_half_params_compute_in_float32_and_keep_their_dtype(kind, hyper, dtype):
    """As gpu/ccv_nnc_*_gpu_ref.cu: read in the tensor's dtype, compute in float, write
    the parameter and the saved aux back in the parameter's dtype."""
    opt = make(kind, hyper)
    params = jnp.asarray(W, dtype)
    grads = [np.asarray(jnp.asarray(g, dtype), np.float64) for g in GRADS[:1]]
    ((got, state),) = fnnc_run(opt, params, [jnp.asarray(g, dtype) for g in grads])
    assert got.dtype == dtype
    assert all(leaf.dtype == dtype for leaf in jax.tree.leaves(state) if leaf.ndim)
    ((b, _),) = oracle_run(kind, hyper, np.asarray(params, np.float64), grads)
    want = np.asarray(jnp.asarray(b.astype(np.float32), dtype), np.float64)  # NNC's (NUM2) cast
    np.testing.assert_array_equal(np.asarray(got, np.float64), want)


def test_rate_schedule_is_called_with_the_count():
    schedule = optax.linear_schedule(0.1, 0.0, transition_steps=4)
    got = fnnc_run(sgd(schedule, momentum=0.5), jnp.asarray(W, jnp.float32), GRADS, jit=True)
    a, m = W, np.zeros(3)
    for step, g in enumerate(GRADS):
        a, aux = nnc_sgd(g, a, m, rate=0.1 * (1 - step / 4), momentum=0.5)
        m = aux["momentum"]
        assert_close(got[step][0], a, **TOL, what=f"step {step + 1}")


# ------------------------------------------------------------- noop and accumulation


def test_noop_leaves_parameters_alone():
    opt = noop()
    params = {"w": jnp.asarray(W, jnp.float32)}
    ((got, state),) = fnnc_run(opt, params, [{"w": GRADS[0]}], jit=True)
    assert_close(got, params, rtol=0, atol=0)
    assert state == optax.EmptyState()


def test_gradient_accumulation_sums_k_backward_calls_then_applies_once():
    """ccv_cnnp_model.c: backward calls after the first EWSUM into the accumulated
    gradients; apply_gradients runs the minimizer once (NNC's step advances once)."""
    k = 3
    opt = with_gradient_accumulation(adam(0.01, decay=0.1), k)
    params = jnp.asarray(W, jnp.float32)
    got = fnnc_run(opt, params, GRADS * 2, jit=True)
    for p, s in got[: k - 1]:
        assert_close(p, W, rtol=0, atol=0)
        assert int(s.inner.count) == 0
    summed = GRADS[0] + GRADS[1] + GRADS[2]
    (b1, _), (b2, _) = oracle_run("adam", {"rate": 0.01, "decay": 0.1}, W, [summed, summed])
    assert_close(got[k - 1][0], b1, **TOL)
    assert int(got[k - 1][1].inner.count) == 1
    assert int(got[k - 1][1].mini_step) == 0
    assert_close(got[k - 1][1].gradients, np.zeros(3), rtol=0, atol=0)
    assert_close(got[2 * k - 1][0], b2, **TOL)
    assert int(got[2 * k - 1][1].inner.count) == 2


def test_gradient_accumulation_is_multisteps_with_sums():
    params = {"w": jnp.asarray(W, jnp.float32)}
    grads = [{"w": g} for g in GRADS * 2]
    ours = fnnc_run(with_gradient_accumulation(sgd(0.1, momentum=0.9), 2), params, grads)
    theirs = optax.MultiSteps(optax.sgd(0.1, momentum=0.9), 2, use_grad_mean=False)
    for (p1, _), (p2, _) in zip(ours, fnnc_run(theirs.gradient_transformation(), params, grads)):
        assert_close(p1, p2, rtol=1e-6, atol=1e-7)


def test_gradient_accumulation_of_one_is_the_minimizer():
    params = jnp.asarray(W, jnp.float32)
    ours = fnnc_run(with_gradient_accumulation(rmsprop(0.01, momentum=0.9), 1), params, GRADS)
    plain = fnnc_run(rmsprop(0.01, momentum=0.9), params, GRADS)
    assert_close([p for p, _ in ours], [p for p, _ in plain], rtol=0, atol=0)


# ------------------------------------------------------------------ bad hyper-parameters

BAD = [
    (sgd, {"rate": -0.1}, "rate"),
    (sgd, {"rate": 0.1, "momentum": 1.0}, "momentum"),
    (sgd, {"rate": 0.1, "momentum": -0.1}, "momentum"),
    (sgd, {"rate": 0.1, "dampening": 1.5}, "dampening"),
    (sgd, {"rate": 0.1, "momentum": 0.9, "nesterov": True, "dampening": 0.9}, "dampening"),
    (sgd, {"rate": 0.1, "decay": -1.0}, "decay"),
    (sgd, {"rate": 0.1, "scale": 0.0}, "scale"),
    (sgd, {"rate": "fast"}, "rate"),
    (adam, {"rate": 0.1, "beta1": 1.0}, "beta1"),
    (adam, {"rate": 0.1, "beta2": -0.5}, "beta2"),
    (adam, {"rate": 0.1, "epsilon": -1e-8}, "epsilon"),
    (adam, {"rate": float("nan")}, "rate"),
    (adamw, {"rate": 0.1, "decay": -0.01}, "decay"),
    (rmsprop, {"rate": 0.1, "alpha": 1.5}, "alpha"),
    (rmsprop, {"rate": 0.1, "momentum": 1.0}, "momentum"),
    (rmsprop, {"rate": -1.0}, "rate"),
    (lamb, {"rate": 0.1, "beta1": 2.0}, "beta1"),
    (lamb, {"rate": 0.1, "scale": -1.0}, "scale"),
]


@pytest.mark.parametrize(
    ("factory", "kwargs", "name"), BAD, ids=[f"{f.__name__}-{n}" for f, _, n in BAD]
)
def test_bad_hyper_parameters_raise_naming_them(factory, kwargs, name):
    kwargs = dict(kwargs)
    rate = kwargs.pop("rate")
    with pytest.raises(CommandError, match=name) as info:
        factory(rate, **kwargs)
    assert isinstance(info.value, FnncError) and isinstance(info.value, ValueError)
    assert factory.__name__ in str(info.value)


@pytest.mark.parametrize("k", [0, -2, 1.5, "2"])
def test_bad_accumulation_count_raises(k):
    with pytest.raises(CommandError, match="k must be"):
        with_gradient_accumulation(sgd(0.1), k)


@pytest.mark.parametrize("opt", [adam(0.1, decay=0.1), sgd(0.1, decay=0.1), lamb(0.1)])
def test_missing_params_raise_when_the_rule_needs_them(opt):
    g = jnp.asarray(GRADS[0], jnp.float32)
    with pytest.raises(CommandError, match="params"):
        opt.update(g, opt.init(g))


def test_params_are_optional_when_the_rule_does_not_read_them():
    opt = adam(0.01, amsgrad=True)
    g = jnp.asarray(GRADS[0], jnp.float32)
    with_params, _ = opt.update(g, opt.init(g), jnp.asarray(W, jnp.float32))
    without, _ = opt.update(g, opt.init(g))
    assert_close(without, with_params, rtol=0, atol=0)
