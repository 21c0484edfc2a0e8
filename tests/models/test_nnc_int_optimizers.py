"""NNC's optimizer integration tests (liuliu/ccv ``test/int/nnc/{sgd,adam,lamb,rmsprop}.tests.c``),
ported to fnnc's NNC-named minimizers.

The C tests run each update command once on a GPU and once on the CPU reference kernel
and compare; so the semantics checked here are the CPU kernels'
(``lib/nnc/cmd/<name>/ccv_nnc_<name>_cpu_ref.c``), written below as float64 NumPy
(``nnc_*``), with the C tests' hyper-parameters. Unlike ``test_minimizers.py`` (zero
saved auxiliaries, fnnc's own hyper-parameters), these start, as the C tests do, from
*non-zero* momentum / velocity / max-velocity tensors drawn from (0, 1], run several
steps feeding each step's outputs back (NNC's in-place form, ``b, n, u`` written over
``a, m, v``), and go through the ``optax_update`` command, a compiled minimized graph
with donated buffers, and the dynamic graph; half and mixed precision follow the C
tests' "in half precision" and "in mixed precision" cases.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.graph import DynamicGraph, GraphBuilder, compile
from fnnc.graph.passes.minimize import minimize
from fnnc.models import minimizers
from fnnc.ops.optimizer import optax_update_command
from tests.helpers import assert_close

N = 10  # the C tests' tensors are [10]
STEPS = 4
TOL = {"rtol": 2e-5, "atol": 2e-6}


def c_float(x: float) -> float:
    """A value as a C ``float`` field of ``ccv_nnc_cmd_param_t`` holds it."""
    return float(np.float32(x))


def inv_bias(beta: float, step: int) -> float:
    """``1 / (1 - powf(beta, step))`` rounded to float, as the Adam / LAMB kernels keep it."""
    return c_float(1.0 / (1.0 - float(np.float32(beta) ** np.float32(step))))


def open_close(seed: int, n: int = N) -> np.ndarray:
    """Values in (0, 1], the C tests' ``dsfmt_genrand_open_close`` (other draws)."""
    return (1.0 - np.random.default_rng(seed).random(n)).astype(np.float32).astype(np.float64)


# ------------------------------------------------------------ NNC's CPU kernels, float64


def nnc_sgd(g, a, m, *, nesterov, rate, scale, decay, momentum, dampening):
    """ccv_nnc_sgd_cpu_ref.c: (b, n) from (g, a, m)."""
    rate, scale, decay = c_float(rate), c_float(scale), c_float(decay)
    momentum, dampening = c_float(momentum), c_float(dampening)
    if nesterov:
        grad = scale * g
        n = momentum * m + grad + decay * a
        return a - rate * (grad + momentum * n), n
    n = momentum * m + (1 - dampening) * (scale * g + decay * a)
    return a - rate * n, n


def nnc_adam(g, a, m, v, vm, *, step, rate, beta1, beta2, decay, epsilon, amsgrad, decoupled):
    """ccv_nnc_adam_cpu_ref.c (decoupled=False) and ccv_nnc_adamw_cpu_ref.c (True):
    (b, n, u, um) from (g, a, m, v, vm); ``um`` is None without amsgrad."""
    rate, beta1, beta2 = c_float(rate), c_float(beta1), c_float(beta2)
    decay, epsilon = c_float(decay), c_float(epsilon)
    rate_c1 = c_float(rate / (1 - float(np.float32(beta1) ** np.float32(step))))
    c2 = inv_bias(beta2, step)
    grad = g if decoupled else g + decay * a
    n = beta1 * m + (1 - beta1) * grad
    u = beta2 * v + (1 - beta2) * grad * grad
    um = np.maximum(vm, u * c2) if amsgrad else None
    denom = np.sqrt(um if amsgrad else u * c2) + epsilon
    shrink = rate * decay * a if decoupled else 0.0
    return a - shrink - (n * rate_c1) / denom, n, u, um


def nnc_lamb(g, a, m, v, *, step, rate, beta1, beta2, decay, epsilon):
    """ccv_nnc_lamb_cpu_ref.c: (b, n, u) from (g, a, m, v), one trust ratio per tensor."""
    rate, beta1, beta2 = c_float(rate), c_float(beta1), c_float(beta2)
    decay, epsilon = c_float(decay), c_float(epsilon)
    n = beta1 * m + (1 - beta1) * g
    u = beta2 * v + (1 - beta2) * g * g
    update = (n * inv_bias(beta1, step)) / (np.sqrt(u * inv_bias(beta2, step)) + epsilon)
    update = update + decay * a
    w_norm, u_norm = np.sqrt(np.sum(a * a)), np.sqrt(np.sum(update * update))
    trust = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
    return a - rate * trust * update, n, u


def nnc_rmsprop(g, a, m, v, *, rate, decay, alpha, momentum, epsilon):
    """ccv_nnc_rmsprop_cpu_ref.c: (b, n, u) from (g, a, m, v)."""
    rate, decay, alpha = c_float(rate), c_float(decay), c_float(alpha)
    momentum, epsilon = c_float(momentum), c_float(epsilon)
    grad = g + decay * a
    u = alpha * v + (1 - alpha) * grad * grad
    n = momentum * m + grad / (np.sqrt(u) + epsilon)
    return a - rate * n, n, u


# ------------------------------------------------- the C tests' commands, both sides

# CMD_SGD_FORWARD(nesterov, rate, scale, decay, momentum, dampening) in sgd.tests.c
SGD = {
    "SGD": dict(nesterov=False, rate=0.9, scale=0.5, decay=0.999, momentum=0.9, dampening=0.9),
    "Nesterov SGD": dict(
        nesterov=True, rate=0.9, scale=0.5, decay=0.999, momentum=0.9, dampening=0
    ),
}
# CMD_ADAM_FORWARD / CMD_ADAMW_FORWARD(step, 0.002, 0.9, 0.98, 0, 1e-9, amsgrad) in adam.tests.c
ADAM = dict(rate=0.002, beta1=0.9, beta2=0.98, decay=0.0, epsilon=1e-9)
# CMD_LAMB_FORWARD(step, 0.002, 0.9, 0.98, 0, 1e-9) in lamb.tests.c
LAMB = dict(rate=0.002, beta1=0.9, beta2=0.98, decay=0.0, epsilon=1e-9)
# CMD_RMSPROP_FORWARD(rate 0.001, decay 0.0001, alpha 0.9, momentum 0.9, epsilon 1e-9)
RMSPROP = dict(rate=0.001, decay=0.0001, alpha=0.9, momentum=0.9, epsilon=1e-9)


def fnnc_sgd(h):
    kw = {k: h[k] for k in ("momentum", "nesterov", "dampening", "decay", "scale")}
    return minimizers.sgd(h["rate"], **kw)


def fnnc_adam(h, *, amsgrad, decoupled):
    factory = minimizers.adamw if decoupled else minimizers.adam
    return factory(h["rate"], **{k: v for k, v in h.items() if k != "rate"}, amsgrad=amsgrad)


# Each kind: (fnnc optimizer, NNC oracle step(g, a, aux, step) -> (b, aux'), aux names).
def _sgd_kind(name):
    h = SGD[name]

    def oracle(g, a, aux, step):
        b, n = nnc_sgd(g, a, aux["momentum"], **h)
        return b, {"momentum": n}

    return fnnc_sgd(h), oracle, ("momentum",)


def _adam_kind(amsgrad, decoupled):
    def oracle(g, a, aux, step):
        m, v, vm = aux["momentum"], aux["velocity"], aux.get("velocity_max")
        flags = {"step": step, "amsgrad": amsgrad, "decoupled": decoupled}
        b, n, u, um = nnc_adam(g, a, m, v, vm, **flags, **ADAM)
        return b, {"momentum": n, "velocity": u, **({"velocity_max": um} if amsgrad else {})}

    names = ("momentum", "velocity", "velocity_max")[: 3 if amsgrad else 2]
    return fnnc_adam(ADAM, amsgrad=amsgrad, decoupled=decoupled), oracle, names


def _lamb_kind():
    def oracle(g, a, aux, step):
        b, n, u = nnc_lamb(g, a, aux["momentum"], aux["velocity"], step=step, **LAMB)
        return b, {"momentum": n, "velocity": u}

    opt = minimizers.lamb(LAMB["rate"], **{k: v for k, v in LAMB.items() if k != "rate"})
    return opt, oracle, ("momentum", "velocity")


def _rmsprop_kind():
    def oracle(g, a, aux, step):
        b, n, u = nnc_rmsprop(g, a, aux["momentum"], aux["velocity"], **RMSPROP)
        return b, {"momentum": n, "velocity": u}

    opt = minimizers.rmsprop(RMSPROP["rate"], **{k: v for k, v in RMSPROP.items() if k != "rate"})
    return opt, oracle, ("momentum", "velocity")


KINDS = {
    "SGD in float": lambda: _sgd_kind("SGD"),
    "Nesterov SGD in float": lambda: _sgd_kind("Nesterov SGD"),
    "adam in float": lambda: _adam_kind(False, False),
    "adamw in float": lambda: _adam_kind(False, True),
    "adam amsgrad in float": lambda: _adam_kind(True, False),
    "adamw amsgrad in float": lambda: _adam_kind(True, True),
    "lamb in float": _lamb_kind,
    "rmsprop in float": _rmsprop_kind,
}


def initial(names):
    """The C tests' start: a, g and every saved auxiliary drawn from (0, 1]."""
    return open_close(1), {name: open_close(2 + i) for i, name in enumerate(names)}


def gradients(steps=STEPS):
    return [open_close(10 + s) for s in range(steps)]


def oracle_history(oracle, a, aux, grads):
    out = []
    for step, g in enumerate(grads, start=1):
        a, aux = oracle(g, a, aux, step)
        out.append((a, aux))
    return out


def seeded_state(opt, params, aux, dtype):
    """``opt``'s state for ``params`` with NNC's saved auxiliaries ``aux`` put in."""
    state = opt.init(params)
    put = {k: [jnp.asarray(v, dtype)] for k, v in aux.items()}
    return state._replace(**put)


# ----------------------------------------------------------------------------- float32


@pytest.mark.parametrize("case", list(KINDS))
def test_update_command_steps_match_the_cpu_kernel(case):
    """sgd.tests.c "SGD in float" / "Nesterov SGD in float", adam.tests.c "adam in float",
    "adamw in float", "adam amsgrad in float", "adamw amsgrad in float", lamb.tests.c
    "lamb in float", rmsprop.tests.c "rmsprop in float": the ``optax_update`` command
    with NNC's hyper-parameters, from non-zero saved aux, 4 steps (step = 1, 2, ...)
    each fed the previous outputs, equals the CPU kernel for b and every saved aux."""
    opt, oracle, names = KINDS[case]()
    a, aux = initial(names)
    grads = gradients()
    want = oracle_history(oracle, a, aux, grads)
    param = jnp.asarray(a, jnp.float32)
    cmd = optax_update_command(opt, [jax.ShapeDtypeStruct(param.shape, param.dtype)])
    leaves, tree = jax.tree.flatten(seeded_state(opt, [param], aux, jnp.float32))
    for step, (g, (b, new_aux)) in enumerate(zip(grads, want), start=1):
        outs = cmd(jnp.asarray(g, jnp.float32), *leaves, param)
        param, leaves = outs[0], list(outs[1:])
        state = jax.tree.unflatten(tree, leaves)
        assert_close(param, b, **TOL, what=f"{case}: b after step {step}")
        for name in names:
            assert_close(getattr(state, name)[0], new_aux[name], **TOL, what=f"{case}: {name}")
        assert int(state.count) == step


def test_lamb_trust_ratio_uses_the_whole_tensor_from_seeded_state():
    """lamb.tests.c "lamb in float" on a [2, 5] parameter: the norms are over every
    element of the tensor (NNC's loop over all four dims), not per row."""
    opt, oracle, names = _lamb_kind()
    a, aux = initial(names)
    g = open_close(20)
    b, new = oracle(g, a, aux, 1)
    param = jnp.asarray(a.reshape(2, 5), jnp.float32)
    state = opt.init(param)._replace(
        momentum=jnp.asarray(aux["momentum"].reshape(2, 5), jnp.float32),
        velocity=jnp.asarray(aux["velocity"].reshape(2, 5), jnp.float32),
    )
    updates, state = opt.update(jnp.asarray(g.reshape(2, 5), jnp.float32), state, param)
    assert_close(optax.apply_updates(param, updates), b.reshape(2, 5), **TOL)
    assert_close(state.velocity, new["velocity"].reshape(2, 5), **TOL)


# ------------------------------------------------------------- in-place: donated program


@pytest.mark.parametrize(
    "case", ["Nesterov SGD in float", "adamw amsgrad in float", "lamb in float"]
)
def test_minimized_graph_in_place_steps_match_the_cpu_kernel(case):
    """The C tests' in-place forms (``TENSOR_LIST(ga, gm, gv)`` as both inputs and
    outputs): a compiled minimized graph whose parameters and state are donated and fed
    back, 4 steps from non-zero saved aux. loss = sum(w * c), so the gradient is c."""
    opt, oracle, names = KINDS[case]()
    a, aux = initial(names)
    c = open_close(30)
    want = oracle_history(oracle, a, aux, [c] * STEPS)
    b = GraphBuilder()
    w, x = b.input((N,), name="w"), b.input((N,), name="c")
    loss = b.exec(ops.reduce_sum(axes=(0,)), b.exec(ops.ewprod(), w, x))
    step_graph, layout = minimize(b.build([loss]), loss, [w], opt)
    program = compile(step_graph, donate=range(layout.n_params + layout.n_state))
    assert len(program.donate) == layout.n_params + layout.n_state
    params = [jnp.asarray(a, jnp.float32)]
    state = jax.tree.leaves(seeded_state(opt, params, aux, jnp.float32))
    for step, (b_want, aux_want) in enumerate(want, start=1):
        params, state, _ = layout.split(program(*params, *state, jnp.asarray(c, jnp.float32)))
        assert_close(params[0], b_want, **TOL, what=f"{case}: b after step {step}")
        got = layout.state(state)
        for name in names:
            assert_close(getattr(got, name)[0], aux_want[name], **TOL, what=f"{case}: {name}")


# ------------------------------------------------------------ half and mixed precision


HALF = ["SGD in float", "Nesterov SGD in float", "adam in float", "adamw in float"]
HALF += ["adam amsgrad in float", "adamw amsgrad in float", "lamb in float", "rmsprop in float"]


@pytest.mark.parametrize(
    "case", HALF, ids=[c.replace("in float", "in half precision") for c in HALF]
)
def test_half_precision_update_matches_the_float_kernel(case):
    """ "... in half precision": g, a and the saved aux converted to float16, one update;
    the float16 results (b, n, u) equal the float32 CPU kernel's within NNC's 1e-3
    (the max-velocity within its 1e-1), and stay float16."""
    opt, oracle, names = KINDS[case]()
    a, aux = initial(names)
    g = open_close(40)
    b, new = oracle(g, a, aux, 1)
    param = jnp.asarray(a, jnp.float16)
    state = seeded_state(opt, [param], aux, jnp.float16)
    updates, state = opt.update([jnp.asarray(g, jnp.float16)], state, [param])
    (got,) = optax.apply_updates([param], updates)
    assert got.dtype == jnp.float16
    assert_close(got, b, rtol=0, atol=1e-3, what=f"{case}: b")
    for name in names:
        leaf = getattr(state, name)[0]
        assert leaf.dtype == jnp.float16
        tol = 1e-1 if name == "velocity_max" else 1e-3
        assert_close(leaf, new[name], rtol=0, atol=tol, what=f"{case}: {name}")


@pytest.mark.parametrize(
    "case", HALF, ids=[c.replace("in float", "in mixed precision") for c in HALF]
)
def test_mixed_precision_float16_gradient_float32_state(case):
    """ "... in mixed precision": only g is float16; a, m, v (and vm) stay float32. The
    update equals the CPU kernel run on the float16-rounded gradient (tighter than
    NNC's 1e-3), through the ``optax_update`` command, and the state keeps float32."""
    opt, oracle, names = KINDS[case]()
    a, aux = initial(names)
    g16 = jnp.asarray(open_close(50), jnp.float16)
    b, new = oracle(np.asarray(g16, np.float64), a, aux, 1)
    param = jnp.asarray(a, jnp.float32)
    cmd = optax_update_command(opt, [jax.ShapeDtypeStruct(param.shape, param.dtype)])
    leaves, tree = jax.tree.flatten(seeded_state(opt, [param], aux, jnp.float32))
    outs = cmd(g16, *leaves, param)
    state = jax.tree.unflatten(tree, list(outs[1:]))
    assert outs[0].dtype == jnp.float32
    assert_close(outs[0], b, **TOL, what=f"{case}: b")
    for name in names:
        assert getattr(state, name)[0].dtype == jnp.float32
        assert_close(getattr(state, name)[0], new[name], **TOL, what=f"{case}: {name}")


# ----------------------------------------------------------------------- dynamic graph


def _dynamic_steps(make_opt, grads, a):
    """``dg.minimize`` with a freshly made minimizer per step (NNC makes a new command per
    step: the step count for Adam, a new rate for SGD) on loss = sum(w * g_k)."""
    dg = DynamicGraph()
    w = dg.variable(jnp.asarray(a, jnp.float32), name="w")
    out = []
    for k, g in enumerate(grads):
        c = dg.constant(jnp.asarray(g, jnp.float32))
        loss = dg.exec(ops.reduce_sum(axes=(0,)), dg.exec(ops.ewprod(), w, c))
        dg.minimize(make_opt(k), loss, [w])
        out.append(np.asarray(w.numpy(), np.float64))
    return out


def test_dynamic_graph_new_adam_per_step_continues_nnc_step_count():
    """adam.tests.c's command with step = 1, 2, ... as NNC's dynamic-graph loops set it
    (``CMD_ADAM_FORWARD(i + 1, ...)``): a new ``minimizers.adam`` object every step
    keeps the moments and counts the step, matching the kernel from zero saved aux."""
    a = open_close(1)
    grads = gradients()
    zeros = {"momentum": np.zeros(N), "velocity": np.zeros(N), "velocity_max": np.zeros(N)}
    _, oracle, _ = _adam_kind(True, False)
    want = [b for b, _ in oracle_history(oracle, a, zeros, grads)]
    got = _dynamic_steps(lambda k: fnnc_adam(ADAM, amsgrad=True, decoupled=False), grads, a)
    assert_close(got, want, **TOL)


def test_dynamic_graph_sgd_with_a_new_rate_keeps_its_momentum():
    """NNC lowers the SGD rate by making a new SGD command (the least-squares tests); the
    momentum tensor carries over. Rates 0.9, 0.45, 0.09, 0.009 with sgd.tests.c's other
    hyper-parameters, from zero momentum."""
    a = open_close(1)
    grads = gradients()
    rates = [0.9, 0.45, 0.09, 0.009]
    want, m, b = [], np.zeros(N), a
    for g, rate in zip(grads, rates):
        b, m = nnc_sgd(g, b, m, **{**SGD["SGD"], "rate": rate})
        want.append(b)
    got = _dynamic_steps(lambda k: fnnc_sgd({**SGD["SGD"], "rate": rates[k]}), grads, a)
    assert_close(got, want, **TOL)
