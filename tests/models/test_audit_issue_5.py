"""Audit of issue 5 (cnnp models: functional model API, Optax minimizers, training), from
the issue text.

Checks: ``Input()`` / ``Model(inputs, outputs, name=)`` with several inputs and outputs and a
shared layer, ``Sequential([...], name=)``, ``Model.from_flax``; every listed layer takes
``name`` and ``is_trainable`` (True, False, inherit); NNC parameter ids (``t-linear-0-0``,
``t-0-0``, ``r-`` internals); ``compile``/``fit``/``evaluate(is_test=, requires_grad=)``/
``backward(ingrads=None, outgrads=...)``/``apply_gradients``/``parameters``/
``set_parameters``; new input shapes keep weights; ``set_minimizer(opt, reset=, params=)``;
NNC-exact minimizers stepped through a model; gradient accumulation; ``train`` history
with validation and progress; and the bad-input errors. Oracles: NumPy formulas, ``jax.grad``
and Optax applied directly to the parameter dict.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import FnncError, ModelError
from fnnc.models import (
    LSTM,
    Activation,
    Add,
    AvgPool,
    BatchNorm,
    CommandLayer,
    Concat,
    Conv,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    GroupNorm,
    Input,
    LayerNorm,
    MaxPool,
    Model,
    Mul,
    MultiHeadAttention,
    ReLU,
    Reshape,
    RMSNorm,
    Sequential,
    minimizers,
)

RNG = np.random.default_rng(5)
X = RNG.standard_normal((8, 4)).astype(np.float32)
T = RNG.standard_normal((8, 2)).astype(np.float32)


def sum_squares(outputs, targets):
    """A loss written in JAX (traced by fnnc; lists of outputs and targets): sum of
    squared errors of the first output."""
    return jnp.sum((outputs[0] - targets[0]) ** 2)


def linear(p, x):
    return x @ p["t-fc-0-0"].T + p["t-fc-0-1"][None, :]


def mlp_np(p, x, first="t-h-0", second="t-o-0"):
    h = np.maximum(x @ p[f"{first}-0"].T + p[f"{first}-1"][None, :], 0)
    return h @ p[f"{second}-0"].T + p[f"{second}-1"][None, :]


def fc_model(minimizer=None):
    x = Input()
    model = Model(x, Dense(2, name="fc")(x))
    model.compile(X, loss=sum_squares, minimizer=minimizer or optax.sgd(0.01))
    return model


def grads_of(p, x=X, t=T):
    p = {k: jnp.asarray(v) for k, v in p.items()}
    return jax.grad(lambda p: jnp.sum((linear(p, x) - t) ** 2))(p)


# -- model definition ----------------------------------------------------------------
def test_several_inputs_and_outputs_and_a_layer_applied_twice_shares_its_weights():
    """Model([a, b], [d(a) + d(b), d(a)]): one weight pair, outputs from the same weights."""
    a, b = Input(), Input()
    dense = Dense(3, name="shared")
    model = Model([a, b], [Add()(dense(a), dense(b)), dense(a)], name="two")
    xa, xb = X[:, :4], X[::-1, :4].copy()
    model.compile([xa, xb])
    params = {k: np.asarray(v) for k, v in model.parameters().items()}
    assert len(params) == 2
    (w,) = [v for k, v in params.items() if k.endswith("-0")]
    (bias,) = [v[None, :] for k, v in params.items() if k.endswith("-1")]
    total, first = model.evaluate([xa, xb])
    np.testing.assert_allclose(first, xa @ w.T + bias, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(total, xa @ w.T + xb @ w.T + 2 * bias, rtol=1e-5, atol=1e-5)


def test_sequential_with_a_name_runs_its_layers_in_order():
    """Sequential([Dense, ReLU, Dense], name=) is the MLP of its parameters."""
    model = Sequential([Dense(5, name="h"), ReLU(), Dense(2, name="o")], name="seq")
    model.compile(X)
    p = model.parameters()
    (h0,) = [k for k in p if "-h-" in k and k.endswith("-0")]
    (o0,) = [k for k in p if "-o-" in k and k.endswith("-0")]
    named = {
        "t-h-0-0": p[h0],
        "t-h-0-1": p[h0[:-1] + "1"],
        "t-o-0-0": p[o0],
        "t-o-0-1": p[o0[:-1] + "1"],
    }
    np.testing.assert_allclose(model.evaluate(X), mlp_np(named, X), rtol=1e-5, atol=1e-5)
    assert all(k.startswith("t-seq") for k in p)  # a named model is a level of the id


def test_parameter_ids_follow_nnc():
    """t-linear-0-0 (weight [out, in]) / t-linear-0-1 (bias); t-0-0 for the first unnamed
    layer; BatchNorm's running statistics are internals with r-."""
    x = Input()
    model = Model(x, Dense(2, name="linear")(x))
    model.compile(X)
    assert sorted(model.parameters()) == ["t-linear-0-0", "t-linear-0-1"]
    assert model.parameters()["t-linear-0-0"].shape == (2, 4)
    unnamed = Sequential([Dense(3), BatchNorm()])
    unnamed.compile(X)
    ids = sorted(unnamed.parameters())
    assert "t-0-0" in ids and "t-0-1" in ids
    internals = [k for k in ids if k.startswith("r-")]
    assert len(internals) == 2 and all(unnamed.parameters()[k].shape == (3,) for k in internals)


LAYERS = {
    "Dense": lambda **kw: Dense(3, **kw),
    "Conv": lambda **kw: Conv(2, 3, **kw),
    "BatchNorm": lambda **kw: BatchNorm(**kw),
    "LayerNorm": lambda **kw: LayerNorm(**kw),
    "GroupNorm": lambda **kw: GroupNorm(2, **kw),
    "RMSNorm": lambda **kw: RMSNorm(**kw),
    "Dropout": lambda **kw: Dropout(0.5, **kw),
    "MaxPool": lambda **kw: MaxPool(**kw),
    "AvgPool": lambda **kw: AvgPool(**kw),
    "Flatten": lambda **kw: Flatten(**kw),
    "Reshape": lambda **kw: Reshape((2, 2), **kw),
    "Embedding": lambda **kw: Embedding(10, 4, **kw),
    "LSTM": lambda **kw: LSTM(4, **kw),
    "MultiHeadAttention": lambda **kw: MultiHeadAttention(2, **kw),
    "Activation": lambda **kw: Activation("tanh", **kw),
    "ReLU": lambda **kw: ReLU(**kw),
    "Add": lambda **kw: Add(**kw),
    "Mul": lambda **kw: Mul(**kw),
    "Concat": lambda **kw: Concat(**kw),
    "CommandLayer": lambda **kw: CommandLayer(ops.softmax(), **kw),
}


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_every_listed_layer_takes_name_and_is_trainable(kind):
    """Each layer of the issue's list has ``name`` and ``is_trainable`` (True/False/None)."""
    for flag in (True, False, None):
        layer = LAYERS[kind](name=f"my{kind.lower()}", is_trainable=flag)
        assert layer.name == f"my{kind.lower()}" and layer.is_trainable is flag


def test_is_trainable_none_inherits_the_enclosing_model_and_true_overrides_it():
    """A frozen model freezes its layers that inherit; a layer set True still trains."""
    x = Input()
    inner = Dense(3, name="inherits")
    model = Model(x, Dense(2, name="trains", is_trainable=True)(inner(x)), is_trainable=False)
    model.compile(X, loss=sum_squares, minimizer=optax.sgd(0.01))
    before = model.parameters()
    model.fit(X, T)
    after = model.parameters()
    for k in ("t-inherits-0-0", "t-inherits-0-1"):
        np.testing.assert_array_equal(after[k], before[k])
    assert not np.allclose(after["t-trains-0-0"], before["t-trains-0-0"])


def test_from_flax_nnx_module_trains_one_sgd_step_like_optax_on_its_params():
    """Model.from_flax(nnx.Linear): evaluate is the module; one fit step is plain SGD."""
    from flax import nnx

    lin = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
    model = Model.from_flax(lin, name="flax")
    model.compile(X, loss=sum_squares, minimizer=optax.sgd(0.01))
    np.testing.assert_allclose(model.evaluate(X), lin(X), rtol=1e-5, atol=1e-6)
    kernel, bias = np.asarray(lin.kernel[...]), np.asarray(lin.bias[...])
    gk, gb = jax.grad(lambda k, b: jnp.sum((X @ k + b[None, :] - T) ** 2), argnums=(0, 1))(
        kernel, bias
    )
    model.fit(X, T)
    after = sorted((v for v in model.parameters().values()), key=np.ndim)
    np.testing.assert_allclose(after[0], bias - 0.01 * gb, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after[1], kernel - 0.01 * gk, rtol=1e-5, atol=1e-6)


# -- compile and run -------------------------------------------------------------------
def test_fit_steps_with_adam_equal_optax_applied_to_the_parameter_dict():
    """Three fused fit steps with optax.adam equal optax.adam on {id: array} with jax.grad."""
    model = fc_model(optax.adam(0.05))
    p = {k: jnp.asarray(v) for k, v in model.parameters().items()}
    opt = optax.adam(0.05)
    state = opt.init(p)
    for _ in range(3):
        loss = model.fit(X, T)
        want_loss = jnp.sum((linear(p, X) - T) ** 2)
        updates, state = opt.update(grads_of(p), state, p)
        p = optax.apply_updates(p, updates)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for k, v in model.parameters().items():
        np.testing.assert_allclose(v, p[k], rtol=1e-5, atol=1e-6)


def test_evaluate_backward_accumulates_and_apply_gradients_applies_the_sum():
    """evaluate(requires_grad=True); backward x3 returns input grads each time and
    accumulates; apply_gradients applies the summed gradient once."""
    model = fc_model(optax.sgd(0.5))
    p0 = model.parameters()
    out = model.evaluate(X, requires_grad=True)
    np.testing.assert_allclose(out, linear(p0, X), rtol=1e-5, atol=1e-6)
    cot = RNG.standard_normal((8, 2)).astype(np.float32)
    jp = {k: jnp.asarray(v) for k, v in p0.items()}
    gp, gx = jax.grad(lambda p, x: jnp.sum(linear(p, x) * cot), argnums=(0, 1))(jp, X)
    for _ in range(3):
        (dx,) = model.backward([cot])
        np.testing.assert_allclose(dx, gx, rtol=1e-5, atol=1e-6)
    model.apply_gradients()
    for k, v in model.parameters().items():
        np.testing.assert_allclose(v, p0[k] - 0.5 * 3 * gp[k], rtol=1e-5, atol=1e-5)


def test_backward_with_ingrads_none_seeds_ones_for_a_scalar_output():
    """backward(ingrads=None) on a one-element output seeds 1 (d sum / d x)."""
    x = Input()
    total = CommandLayer(ops.reduce_sum(axes=(0, 1)))(Dense(2, name="fc")(x))
    model = Model(x, total)
    model.compile(X, minimizer=optax.sgd(0.1))
    p = {k: jnp.asarray(v) for k, v in model.parameters().items()}
    model.evaluate(X, requires_grad=True)
    (dx,) = model.backward(ingrads=None)
    want = jax.grad(lambda x: jnp.sum(linear(p, x)))(X)
    np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-6)


def test_backward_takes_the_outgrads_keyword_of_the_issue():
    """``backward(ingrads, outgrads=...)`` as the issue (and DESIGN.md) names it."""
    model = fc_model()
    assert "outgrads" in inspect.signature(model.backward).parameters
    model.evaluate(X, requires_grad=True)
    (dx,) = model.backward(ingrads=[np.ones((8, 2), np.float32)], outgrads=True)
    assert dx.shape == X.shape


def test_new_input_shape_recompiles_with_the_same_weights():
    """Evaluating another batch size uses the trained weights (no re-initialisation)."""
    model = fc_model()
    model.fit(X, T)
    p = model.parameters()
    small = X[:3]
    np.testing.assert_allclose(model.evaluate(small), linear(p, small), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model.parameters()["t-fc-0-0"], p["t-fc-0-0"])


def test_set_parameters_then_evaluate_uses_them():
    """set_parameters by id replaces the weights evaluate reads."""
    model = fc_model()
    new = {"t-fc-0-0": np.ones((2, 4), np.float32), "t-fc-0-1": np.array([1.0, -1.0], np.float32)}
    model.set_parameters(new)
    np.testing.assert_allclose(model.evaluate(X), linear(new, X), rtol=1e-6, atol=1e-6)


# -- minimizers ----------------------------------------------------------------------
def test_set_minimizer_keeps_the_state_unless_reset():
    """set_minimizer(adam) carries Adam's moments over; reset=True starts a fresh Adam."""
    model = fc_model(optax.adam(0.05))
    model.fit(X, T)
    model.fit(X, T)
    model.set_minimizer(optax.adam(0.05))  # state carried: the next step is Adam's third
    p = {k: jnp.asarray(v) for k, v in fc_model(optax.adam(0.05)).parameters().items()}
    opt = optax.adam(0.05)
    state = opt.init(p)
    for _ in range(3):
        updates, state = opt.update(grads_of(p), state, p)
        p = optax.apply_updates(p, updates)
    model.fit(X, T)
    for k, v in model.parameters().items():
        np.testing.assert_allclose(v, p[k], rtol=1e-5, atol=1e-6)
    model.set_minimizer(optax.adam(0.05), reset=True)  # a first Adam step from here
    p = {k: jnp.asarray(v) for k, v in model.parameters().items()}
    updates, _ = opt.update(grads_of(p), opt.init(p), p)
    want = optax.apply_updates(p, updates)
    model.fit(X, T)
    for k, v in model.parameters().items():
        np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-6)


def test_switching_to_sgd_and_back_keeps_adams_moments():
    """Adam x2, SGD with momentum x1, Adam again: the last step is Adam's third step with
    the moments of the first two (switching minimizers never resets state silently)."""
    model = fc_model(optax.adam(0.05))
    p = {k: jnp.asarray(v) for k, v in model.parameters().items()}
    adam, sgd = optax.adam(0.05), optax.sgd(0.02, momentum=0.9)
    adam_state = adam.init(p)
    for _ in range(2):
        model.fit(X, T)
        updates, adam_state = adam.update(grads_of(p), adam_state, p)
        p = optax.apply_updates(p, updates)
    model.set_minimizer(sgd)
    model.fit(X, T)
    updates, _ = sgd.update(grads_of(p), sgd.init(p), p)
    p = optax.apply_updates(p, updates)
    model.set_minimizer(optax.adam(0.05))
    model.fit(X, T)
    updates, _ = adam.update(grads_of(p), adam_state, p)
    p = optax.apply_updates(p, updates)
    for k, v in model.parameters().items():
        np.testing.assert_allclose(v, p[k], rtol=1e-5, atol=1e-6)


def test_evaluate_is_test_turns_dropout_off_and_training_mode_drops():
    """evaluate(is_test=True) is the identity through Dropout; is_test=False zeroes some
    entries and scales the rest by 1 / (1 - p)."""
    x = Input()
    model = Model(x, Dropout(0.5)(x))
    data = np.abs(X) + 0.5
    model.compile(data)
    np.testing.assert_array_equal(model.evaluate(data, is_test=True), data)
    out = np.asarray(model.evaluate(data, is_test=False))
    ratio = np.round(out / data, 5)
    assert set(np.unique(ratio).tolist()) == {0.0, 2.0}


def test_set_minimizer_params_gives_a_subset_its_own_minimizer():
    """set_minimizer(opt, params=[ids]) updates those ids with opt, the rest as before."""
    model = fc_model(optax.sgd(0.01))
    model.set_minimizer(optax.sgd(0.1), params=["t-fc-0-1"])
    p = model.parameters()
    g = grads_of(p)
    model.fit(X, T)
    after = model.parameters()
    np.testing.assert_allclose(after["t-fc-0-0"], p["t-fc-0-0"] - 0.01 * g["t-fc-0-0"], 1e-5, 1e-6)
    np.testing.assert_allclose(after["t-fc-0-1"], p["t-fc-0-1"] - 0.1 * g["t-fc-0-1"], 1e-5, 1e-6)


def test_noop_minimizer_on_a_subset_freezes_it():
    """A no-op minimizer on some ids: they do not move, the others train."""
    model = fc_model(optax.sgd(0.01))
    model.set_minimizer(minimizers.noop(), params=["t-fc-0-0"])
    p = model.parameters()
    model.fit(X, T)
    after = model.parameters()
    np.testing.assert_array_equal(after["t-fc-0-0"], p["t-fc-0-0"])
    assert not np.allclose(after["t-fc-0-1"], p["t-fc-0-1"])


def _nnc_sgd(a, g, m, rate, momentum, dampening, decay):
    grad = g + decay * a  # lib/nnc/cmd/sgd/ccv_nnc_sgd_cpu_ref.c, nesterov off
    m = momentum * m + (1 - dampening) * grad
    return a - rate * m, m


def _nnc_adam(a, g, m, v, vmax, step, rate, b1=0.9, b2=0.999, eps=1e-8, amsgrad=False):
    m = b1 * m + (1 - b1) * g  # lib/nnc/cmd/adam/ccv_nnc_adam_cpu_ref.c
    v = b2 * v + (1 - b2) * g * g
    vhat = v / (1 - b2**step)
    if amsgrad:
        vmax = np.maximum(vmax, vhat)
        vhat = vmax
    return a - rate / (1 - b1**step) * m / (np.sqrt(vhat) + eps), m, v, vmax


def _nnc_rmsprop(a, g, m, v, rate, alpha, momentum, eps=1e-8):
    v = alpha * v + (1 - alpha) * g * g  # lib/nnc/cmd/rmsprop/ccv_nnc_rmsprop_cpu_ref.c
    m = momentum * m + g / (np.sqrt(v) + eps)
    return a - rate * m, m, v


@pytest.mark.parametrize("kind", ["sgd", "adam_amsgrad", "rmsprop"])
def test_nnc_minimizers_stepped_through_a_model_follow_nncs_rules(kind):
    """Three fit steps with fnnc.models.minimizers equal NNC's update rule on jax.grad."""
    minimizer = {
        "sgd": minimizers.sgd(0.01, momentum=0.9, dampening=0.2, decay=0.05),
        "adam_amsgrad": minimizers.adam(0.05, amsgrad=True),
        "rmsprop": minimizers.rmsprop(0.01, alpha=0.9, momentum=0.5),
    }[kind]
    model = fc_model(minimizer)
    p = {k: np.asarray(v, np.float64) for k, v in model.parameters().items()}
    aux = {k: [np.zeros_like(v) for _ in range(3)] for k, v in p.items()}
    for step in range(1, 4):
        g = grads_of({k: v.astype(np.float32) for k, v in p.items()})
        for k in p:
            gk, (m, v, vmax) = np.asarray(g[k], np.float64), aux[k]
            if kind == "sgd":
                p[k], m = _nnc_sgd(p[k], gk, m, 0.01, 0.9, 0.2, 0.05)
            elif kind == "adam_amsgrad":
                p[k], m, v, vmax = _nnc_adam(p[k], gk, m, v, vmax, step, 0.05, amsgrad=True)
            else:
                p[k], m, v = _nnc_rmsprop(p[k], gk, m, v, 0.01, 0.9, 0.5)
            aux[k] = [m, v, vmax]
        model.fit(X, T)
    for k, v in model.parameters().items():
        np.testing.assert_allclose(v, p[k], rtol=2e-5, atol=2e-6)


def test_gradient_accumulation_over_k_steps_applies_once_with_the_sum():
    """with_gradient_accumulation(sgd, 2): the first fit moves nothing, the second applies
    the sum of both gradients."""
    model = fc_model(minimizers.with_gradient_accumulation(minimizers.sgd(0.01), 2))
    p = model.parameters()
    g = grads_of(p)
    model.fit(X, T)
    np.testing.assert_array_equal(model.parameters()["t-fc-0-0"], p["t-fc-0-0"])
    model.fit(X, T)
    for k, v in model.parameters().items():
        np.testing.assert_allclose(v, p[k] - 0.01 * 2 * g[k], rtol=1e-5, atol=1e-6)


# -- training loop ---------------------------------------------------------------------
def _classifier():
    x = Input()
    model = Model(x, Dense(3, name="fc")(x))
    model.compile(X, loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    return model


def test_train_returns_a_history_per_epoch_with_validation():
    """train(data, epochs=, batch_size=, validation=) returns loss and val metrics per epoch."""
    model = _classifier()
    xs = RNG.standard_normal((24, 4)).astype(np.float32)
    ys = (np.arange(24) % 3).astype(np.int32)
    history = model.train((xs, ys), epochs=2, batch_size=8, validation=(xs, ys), verbose=False)
    assert history["epoch"] == [1, 2]
    assert len(history["loss"]) == len(history["val_loss"]) == 2
    logits = np.asarray(model.predict(xs), np.float64)
    assert history["val_accuracy"][-1] == pytest.approx(np.mean(logits.argmax(-1) == ys))
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    assert history["val_loss"][-1] == pytest.approx(-np.mean(log_p[np.arange(24), ys]), rel=1e-5)


def test_train_progress_bar_when_asked_and_nothing_when_not(capsys):
    """progress=True draws a tqdm bar on stderr; verbose=False prints nothing."""
    model = _classifier()
    model.train((X, np.zeros(8, np.int32)), epochs=1, batch_size=4, progress=True)
    err = capsys.readouterr().err
    assert "epoch 1/1" in err and "step" in err and "loss" in err
    model.train((X, np.zeros(8, np.int32)), epochs=1, batch_size=4, verbose=False)
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""


# -- bad input -------------------------------------------------------------------------
def test_fit_before_compile_is_a_clear_error():
    """fit before compile says to compile first."""
    x = Input()
    model = Model(x, Dense(2, name="fc")(x), name="mine")
    with pytest.raises(ModelError, match="compile"):
        model.fit(X, T)


def test_wrong_input_shape_and_dtype_are_named():
    """A batch of the wrong feature count or dtype names the input and what was compiled."""
    model = fc_model()
    with pytest.raises(ModelError, match="input 0"):
        model.fit(X[:, :3], T)
    with pytest.raises(ModelError, match="int32"):
        model.evaluate(X.astype(np.int32))


def test_backward_without_requires_grad_and_unknown_ids_are_clear_errors():
    """backward needs evaluate(requires_grad=True); unknown ids are listed."""
    model = fc_model()
    model.evaluate(X)
    with pytest.raises(ModelError, match="requires_grad"):
        model.backward([np.ones((8, 2), np.float32)])
    with pytest.raises(ModelError, match="t-nothing-0-0"):
        model.set_parameters({"t-nothing-0-0": np.zeros(2, np.float32)})


def test_loading_parameters_of_the_wrong_shape_names_the_parameter(tmp_path):
    """Model.read of a file whose t-fc-0-0 has another shape names that parameter."""
    path = str(tmp_path / "w.sqlite3")
    x = Input()
    wide = Model(x, Dense(5, name="fc")(x))
    wide.compile(X)
    wide.write(path)
    model = fc_model()
    with pytest.raises(FnncError, match=r"t-fc-0-0: stored float32\[5, 4\], expected"):
        model.read(path)
