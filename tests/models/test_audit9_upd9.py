"""NNC's minimizers round a 16-bit parameter once, as NNC's kernels do.

NNC's update kernels compute ``b = a - delta`` in float32 and write ``b`` to the
parameter's 16-bit type once (``gpu/ccv_nnc_*_gpu_ref.cu``). fnnc's rules had turned
``round(b) - a`` into a 16-bit Optax update, which ``optax.apply_updates`` rounded a second
time: at ``sgd(0.01)`` on bfloat16 or float16 weights near 0.01, ~18% of the elements
differed from NNC. The oracle here is each rule written in NumPy float32 (state kept in
the parameter's dtype, as NNC keeps it), ``b`` rounded once to the 16-bit type.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from fnnc.errors import CommandError
from fnnc.graph import DynamicGraph
from fnnc.graph.passes.loss_scale import LossScale
from fnnc.models import Dense, Input, Model
from fnnc.models.minimizers import (
    adam,
    adamw,
    float32_gradients,
    lamb,
    rmsprop,
    sgd,
    with_gradient_accumulation,
)

F32 = np.float32
N, STEPS = 64, 3
RNG = np.random.default_rng(9)
A0 = RNG.normal(0.0, 0.01, N)  # weights near 0.01: the step is a fraction of an ulp-ish
GRADS = [RNG.normal(0.0, 1.0, N) for _ in range(STEPS)]
DTYPES = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


def _r(x, dtype):
    """``x`` (float32) rounded once to ``dtype``, back in float32."""
    return np.asarray(x, F32).astype(dtype).astype(F32)


def oracle(kind: str, hyper: dict, a, grads, dtype):
    """NNC's rule in NumPy float32 (``ccv_nnc_*_cpu_ref.c``'s order), the new parameter
    and the saved auxiliaries rounded once per step to ``dtype``; the parameters per step."""
    a = _r(a, dtype)
    m = np.zeros(N, F32)
    v = np.zeros(N, F32)
    rate = F32(hyper["rate"])
    out = []
    for t, g in enumerate(grads, start=1):
        g = _r(g, dtype)
        if kind == "sgd":
            mu, nesterov = F32(hyper.get("momentum", 0.0)), hyper.get("nesterov", False)
            decay = F32(hyper.get("decay", 0.0))
            if nesterov:
                new_m = mu * m + g + decay * a
                delta = rate * (g + mu * new_m)
            else:
                new_m = mu * m + F32(1.0) * (g + decay * a)
                delta = rate * new_m
        elif kind in ("adam", "adamw", "lamb"):
            b1, b2 = F32(0.9), F32(0.999)
            eps, decay = F32(hyper.get("epsilon", 1e-8)), F32(hyper.get("decay", 0.0))
            grad = g + decay * a if kind == "adam" else g
            new_m = b1 * m + F32(1.0 - b1) * grad
            new_v = b2 * v + F32(1.0 - b2) * grad * grad
            c1 = F32(1.0) - b1 ** F32(t)
            c2 = F32(1.0) / (F32(1.0) - b2 ** F32(t))
            if kind == "lamb":
                u = (new_m * (F32(1.0) / c1)) / (np.sqrt(new_v * c2) + eps) + a * decay
                trust = np.sqrt(np.sum(a * a)) / np.sqrt(np.sum(u * u))
                delta = (rate * trust) * u
            else:
                delta = (new_m * (rate / c1)) / (np.sqrt(new_v * c2) + eps)
                if kind == "adamw":
                    delta = (rate * decay) * a + delta
            v = _r(new_v, dtype)
        else:  # rmsprop
            alpha, mu = F32(hyper.get("alpha", 0.99)), F32(hyper.get("momentum", 0.0))
            grad = g + F32(hyper.get("decay", 0.0)) * a
            new_v = alpha * v + F32(1.0 - alpha) * grad * grad
            new_m = mu * m + grad / (np.sqrt(new_v) + F32(1e-8))
            delta = rate * new_m
            v = _r(new_v, dtype)
        m = _r(new_m, dtype)
        a = _r(a - delta, dtype)  # NNC's one rounding of b
        out.append(a)
    return out


CASES = [
    ("sgd", {"rate": 0.01}),
    ("sgd", {"rate": 0.01, "momentum": 0.9, "decay": 0.01}),
    ("sgd", {"rate": 0.01, "momentum": 0.9, "nesterov": True}),
    ("adam", {"rate": 0.001, "decay": 0.01}),
    ("adamw", {"rate": 0.001, "decay": 0.1}),
    ("lamb", {"rate": 0.001, "decay": 0.01}),
    ("rmsprop", {"rate": 0.001, "momentum": 0.5, "decay": 0.01}),
]
MAKERS = {"sgd": sgd, "adam": adam, "adamw": adamw, "lamb": lamb, "rmsprop": rmsprop}


def make(kind: str, hyper: dict) -> optax.GradientTransformation:
    return MAKERS[kind](hyper["rate"], **{k: v for k, v in hyper.items() if k != "rate"})


def _run(opt, a, grads, dtype, *, with_params=True):
    """The parameters after each step of the raw Optax loop (jitted update)."""
    params = jnp.asarray(_r(a, dtype), dtype)
    state = opt.init(params)
    update = jax.jit(lambda g, s, p: opt.update(g, s, p if with_params else None))
    out = []
    for g in grads:
        updates, state = update(jnp.asarray(_r(g, dtype), dtype), state, params)
        params = optax.apply_updates(params, updates)
        out.append(np.asarray(params, F32))
    return out, updates, state


def _same(got, want, what):
    for step, (x, y) in enumerate(zip(got, want)):
        bad = np.flatnonzero(x != y)
        assert not bad.size, (
            f"{what} step {step + 1}: {bad.size}/{N} differ, e.g. {x[bad[:3]]} vs {y[bad[:3]]}"
        )


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize(
    ("kind", "hyper"), CASES, ids=[f"{k}{i}" for i, (k, _) in enumerate(CASES)]
)
def test_sixteen_bit_parameters_are_rounded_once(kind, hyper, dtype):
    got, updates, state = _run(make(kind, hyper), A0, GRADS, dtype)
    _same(got, oracle(kind, hyper, A0, GRADS, dtype), kind)
    assert updates.dtype == jnp.float32  # apply_updates adds in float32, rounds once
    assert all(x.dtype == dtype for x in jax.tree.leaves(state) if x.ndim)  # NNC's aux


def test_without_params_the_update_still_rounds_once():
    """sgd without decay needs no parameters: its float32 update rounds once too."""
    got, _, _ = _run(sgd(0.01), A0, GRADS, ml_dtypes.bfloat16, with_params=False)
    _same(got, oracle("sgd", {"rate": 0.01}, A0, GRADS, ml_dtypes.bfloat16), "sgd")


TO_F32 = float32_gradients()
WRAPS = {  # wrapper, factor on the gradients
    "loss_scale": (lambda o: LossScale(initial=4.0).transform(o), 4.0),
    "accumulation": (lambda o: with_gradient_accumulation(o, 1), 1.0),
    "multisteps": (lambda o: optax.MultiSteps(o, 1).gradient_transformation(), 1.0),
    "inject": (
        lambda o: optax.inject_hyperparams(sgd, hyperparam_dtype=jnp.float32)(
            rate=0.01, momentum=0.9
        ),
        1.0,
    ),
    "apply_if_finite": (lambda o: optax.chain(TO_F32, optax.apply_if_finite(o, 3)), 1.0),
}


@pytest.mark.parametrize("name", WRAPS)
def test_wrappers_keep_the_single_rounding(name):
    """Wrappers pass the float32 update through (apply_if_finite, whose skip branch
    gives the gradients' dtype, with float32 gradients as the module docstring says)."""
    wrap, factor = WRAPS[name]
    hyper = {"rate": 0.01, "momentum": 0.9}
    got, _, _ = _run(wrap(make("sgd", hyper)), A0, [g * factor for g in GRADS], ml_dtypes.bfloat16)
    _same(got, oracle("sgd", hyper, A0, GRADS, ml_dtypes.bfloat16), f"{name} sgd")


def test_model_fit_rounds_bfloat16_parameters_once():
    """A model with bfloat16 parameters; loss sum(o * t) of a one-hot input, so the
    gradients are t x^T and t, exact in bfloat16."""
    bf = ml_dtypes.bfloat16
    x = Input()
    model = Model(x, Dense(N // 4, name="d")(x))
    xs = np.zeros((1, 4), np.float32)
    xs[0, 2] = 1.0
    xs = jnp.asarray(xs, bf)
    t = _r(GRADS[0][: N // 4], bf)
    hyper = {"rate": 0.01, "momentum": 0.9}
    model.compile(
        xs,
        loss=lambda o, ts: jnp.sum(o[0].astype(jnp.float32) * ts[0].astype(jnp.float32)),
        minimizer=make("sgd", hyper),
    )
    start = {"t-d-0-0": _r(A0.reshape(N // 4, 4), bf), "t-d-0-1": _r(A0[: N // 4] * 2, bf)}
    model.set_parameters({k: jnp.asarray(v, bf) for k, v in start.items()})
    for _ in range(2):
        model.fit(xs, jnp.asarray(t[None], bf))
    got = model.parameters()
    for pid, g in (("t-d-0-0", np.outer(t, np.asarray(xs, F32)[0])), ("t-d-0-1", t)):
        a = start[pid].reshape(-1)
        want = oracle(
            "sgd",
            hyper,
            np.pad(a, (0, N - a.size)),
            [np.pad(g.reshape(-1), (0, N - a.size))] * 2,
            bf,
        )
        assert got[pid].dtype == bf
        _same([np.asarray(got[pid], F32).reshape(-1)], [want[1][: a.size]], f"fit {pid}")


@pytest.mark.parametrize("fused", [True, False], ids=["minimize", "apply_gradients"])
def test_dynamic_graph_rounds_bfloat16_variables_once(fused):
    """DynamicGraph.minimize / apply_gradients of sum(w * c): the gradient is c."""
    bf = ml_dtypes.bfloat16
    hyper = {"rate": 0.001, "decay": 0.1}
    dg = DynamicGraph()
    w = dg.variable(jnp.asarray(_r(A0, bf), bf))
    c = dg.constant(jnp.asarray(_r(GRADS[0], bf), bf))
    for _ in range(2):
        loss = (w * c).sum()
        if fused:
            dg.minimize(make("adamw", hyper), loss, [w])
        else:
            dg.backward(loss, [w])
            dg.apply_gradients(make("adamw", hyper), [w])
    want = oracle("adamw", hyper, A0, [GRADS[0]] * 2, bf)
    _same([np.asarray(dg.value_of(w), F32)], [want[1]], "dynamic graph adamw")


def test_a_wrapper_with_branches_of_two_dtypes_says_what_to_chain():
    """apply_if_finite's skip branch gives the gradients' bfloat16, the step float32: a
    CommandError naming the fix, not lax.cond's bare TypeError."""
    dg = DynamicGraph()
    w = dg.variable(jnp.ones(4, jnp.bfloat16))
    c = dg.constant(jnp.ones(4, jnp.bfloat16))
    with pytest.raises(CommandError, match=r"float32 updates of 16-bit.*float32_gradients\(\)"):
        dg.minimize(optax.apply_if_finite(sgd(0.01), 3), (w * c).sum(), [w])


def test_loss_scale_unscales_float16_gradients_in_float32():
    """Scaled float16 gradients 2**15 * [1e-8, -3e-8] unscaled back into float16 were
    [0, -6e-8] (underflow, what the scale is for); NNC's kernels multiply a 16-bit g
    by their scale in float32. Oracle: b = round16(a - rate * (g16 / 2**15)) in float32."""
    f16 = np.float16
    a = np.zeros(2, f16)
    g16 = np.asarray(np.float32([1e-8, -3e-8]) * 2**15, f16)
    opt = LossScale(initial=2.0**15).transform(sgd(1000.0))
    updates, _ = opt.update(jnp.asarray(g16), opt.init(jnp.asarray(a)), jnp.asarray(a))
    got = np.asarray(optax.apply_updates(jnp.asarray(a), updates), F32)
    want = _r(a.astype(F32) - F32(1000.0) * (g16.astype(F32) / F32(2.0**15)), f16)
    np.testing.assert_array_equal(got, want)
    assert np.all(got != 0)


def test_loss_scaled_optax_state_of_float16_parameters_keeps_its_dtype():
    """optax.adam's moments of float16 parameters, fed the float32 unscaled gradients,
    stay float16 (the program's state specs), and the step is Optax's in float32."""
    a = jnp.asarray([0.5, -0.25], jnp.float16)
    opt = LossScale(initial=4.0).transform(optax.adam(0.1))
    updates, state = opt.update(jnp.asarray([4.0, -8.0], jnp.float16), opt.init(a), a)
    assert [x.dtype for x in jax.tree.leaves(state[0]) if x.ndim] == [jnp.float16] * 2
    ref = optax.adam(0.1)
    want, _ = ref.update(jnp.float32([1.0, -2.0]), ref.init(a), a)
    np.testing.assert_array_equal(np.asarray(updates), np.asarray(want))
