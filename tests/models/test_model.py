"""cnnp models: compile, fit, evaluate, backward, minimizer state, freezing, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.errors import ModelError
from fnnc.models import (
    BatchNorm,
    Conv,
    Dense,
    Flatten,
    Input,
    Model,
    ReLU,
    Sequential,
    minimizers,
)
from tests.helpers import assert_close, rand


def _mlp(**kw):
    x = Input()
    return Model([x], [Dense(3, name="out")(ReLU()(Dense(8, name="hidden", **kw)(x)))])


def _data(n=8):
    return rand([n, 4]), (np.arange(n) % 3).astype(np.int32)


def test_fit_matches_a_hand_written_jax_step():
    model = _mlp()
    x, y = _data()
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    p = model.parameters()

    def loss(p):
        h = jax.nn.relu(x @ p["t-hidden-0-0"].T + p["t-hidden-0-1"][None, :])
        logits = h @ p["t-out-0-0"].T + p["t-out-0-1"][None, :]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    value, grads = jax.value_and_grad(loss)(p)
    got = model.fit([x], [y])
    assert_close(got, value, rtol=1e-5)
    new = model.parameters()
    for k in p:
        assert_close(new[k], p[k] - 0.1 * grads[k], rtol=1e-5, atol=1e-6)


def test_evaluate_backward_accumulates_and_apply_gradients():
    model = _mlp()
    x, _ = _data()
    model.compile([x], minimizer=optax.sgd(1.0))
    before = model.parameters()
    out = model.evaluate([x], requires_grad=True)
    ones = np.ones_like(np.asarray(out))
    (gx1,) = model.backward([ones])
    (gx2,) = model.backward([ones])  # accumulates the parameter gradients
    assert_close(gx1, gx2)

    def f(p, x):
        h = jax.nn.relu(x @ p["t-hidden-0-0"].T + p["t-hidden-0-1"][None, :])
        return jnp.sum(h @ p["t-out-0-0"].T + p["t-out-0-1"][None, :])

    gp, gx = jax.grad(f, argnums=(0, 1))(before, x)
    assert_close(gx1, gx, rtol=1e-5)
    model.apply_gradients()
    after = model.parameters()
    for k in before:
        assert_close(after[k], before[k] - 2 * gp[k], rtol=1e-5, atol=1e-5)


def test_new_batch_size_recompiles_and_keeps_weights_and_state():
    model = _mlp()
    x, y = _data(8)
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.adam(1e-2))
    model.fit([x], [y])
    w = model.parameters()["t-out-0-0"]
    state = model.engine.optimizer_state("t-out-0-0")
    x4, y4 = _data(4)
    model.fit([x4], [y4])  # new shapes: recompiles
    assert not np.allclose(model.parameters()["t-out-0-0"], w)
    (adam,) = state.values()
    (adam_now,) = model.engine.optimizer_state("t-out-0-0").values()
    assert int(jax.tree.leaves(adam_now)[0]) == int(jax.tree.leaves(adam)[0]) + 1  # count


def test_adam_moments_survive_nnc_failure_sequence():
    """evaluate; evaluate a new batch size; set Adam; evaluate with input gradients;
    set a no-op minimizer; repeat: Adam's moments must survive (NNC's author's bug)."""
    model = _mlp()
    x, y = _data(8)
    model.compile([x], loss="softmax_crossentropy", minimizer=minimizers.sgd(0.1))
    model.set_minimizer(optax.adam(1e-2))
    model.fit([x], [y])
    moments = model.engine.optimizer_state("t-out-0-0")
    for _ in range(2):
        model.evaluate([x])
        model.evaluate([_data(4)[0]])
        model.set_minimizer(optax.adam(1e-2))
        model.evaluate([x], requires_grad=True)
        model.backward([np.ones((8, 3), np.float32)])
        model.set_minimizer(minimizers.noop())
        model.fit([x], [y])  # a no-op step: no gradients, state untouched
    model.set_minimizer(optax.adam(1e-2))
    kept = model.engine.optimizer_state("t-out-0-0")
    assert_close(jax.tree.leaves(kept), jax.tree.leaves(moments))


def test_frozen_parameters_hold_no_gradient_or_optimizer_buffers():
    x, y = _data(8)
    big = dict(count=512)

    def make(frozen):
        xi = Input()
        h = Dense(name="big", is_trainable=not frozen, **big)(xi)
        return Model([xi], [Dense(3, name="out")(ReLU()(h))])

    sizes = {}
    for frozen in (False, True):
        model = make(frozen)
        model.compile([x], loss="softmax_crossentropy", minimizer=optax.adam(1e-3))
        model.fit([x], [y])
        prog = next(p for k, p in model.engine._programs.items() if k[0] == "fit")
        sizes[frozen] = prog.program.memory()
        n_state = sum(n.startswith("opt_state") for n in prog.names)
        trainable = 2 if frozen else 4  # out w/b, plus big w/b unless frozen
        assert n_state == 1 + 2 * trainable  # Adam over the dict: one count; mu, nu each
    # Adam keeps 2 moments per parameter: freezing the 512x4 layer drops them and its gradient.
    saved = sizes[False].peak_estimate_bytes - sizes[True].peak_estimate_bytes
    assert saved >= 2 * 512 * 5 * 4, (sizes[False], sizes[True])
    frozen_model = make(True)
    frozen_model.compile([x], loss="softmax_crossentropy", minimizer=optax.adam(1e-3))
    before = frozen_model.parameters()["t-big-0-0"]
    frozen_model.fit([x], [y])
    assert np.array_equal(frozen_model.parameters()["t-big-0-0"], before)


def test_share_parameters_between_models_by_id():
    small = _mlp()
    x, y = _data()
    small.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    small.fit([x], [y])
    deeper_in = Input()
    h = Dense(8, name="hidden")(deeper_in)
    deeper = Model([deeper_in], [Dense(3, name="out")(Dense(8, name="extra")(ReLU()(h)))])
    deeper.compile([x])
    deeper.set_parameters(small.parameters(), strict=False)
    assert np.array_equal(deeper.parameters()["t-hidden-0-0"], small.parameters()["t-hidden-0-0"])


def test_cnn_with_batchnorm_updates_running_statistics():
    model = Sequential(
        [Conv(4, (3, 3), name="c"), BatchNorm(name="bn"), ReLU(), Flatten(), Dense(3)]
    )
    x = rand([4, 6, 6, 2])
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.01))
    mean0 = model.parameters()["r-bn-0-0"]
    model.fit([x], [np.array([0, 1, 2, 0], np.int32)])
    assert not np.allclose(model.parameters()["r-bn-0-0"], mean0)
    test_out = model.evaluate([x], is_test=True)
    assert np.asarray(test_out).shape == (4, 3)


def test_from_flax_nnx_and_linen():
    from flax import linen as nn
    from flax import nnx

    x = rand([4, 5])
    lin = nnx.Linear(5, 3, rngs=nnx.Rngs(0))
    model = Model.from_flax(lin, name="flax")
    model.compile([x])
    assert_close(model.evaluate([x]), lin(x), rtol=1e-5)
    dense = nn.Dense(3)
    variables = dense.init(jax.random.key(0), x)
    linen = Model.from_flax(dense, variables, name="linen")
    linen.compile([x], loss="mse", minimizer=optax.sgd(0.1))
    assert_close(linen.evaluate([x]), dense.apply(variables, x), rtol=1e-5)
    linen.fit([x], [np.zeros((4, 3), np.float32)])


def test_bad_input_names_the_layer_or_parameter():
    model = _mlp()
    x, y = _data()
    with pytest.raises(ModelError, match="not compiled"):
        model.fit([x], [y])
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    with pytest.raises(ModelError, match=r"input 0 is int32\[8, 4\], compiled for float32"):
        model.fit([x.astype(np.int32)], [y])
    with pytest.raises(ModelError, match="requires_grad=True"):
        model.backward([np.ones((8, 3), np.float32)])
    with pytest.raises(ModelError, match=r"unknown parameter ids \['t-nope-0-0'\]"):
        model.set_parameters({"t-nope-0-0": np.zeros(3)})
    with pytest.raises(ModelError, match=r"t-out-0-0 \(layer Dense\('out'\)\) is \[3, 8\]"):
        model.set_parameters({"t-out-0-0": np.zeros((2, 2))})
    with pytest.raises(ModelError, match="unknown loss"):
        model.compile([x], loss="hinge")
    bad = Sequential([Dense(3), Conv(2, (3, 3), groups=2)])
    with pytest.raises(ModelError, match="Conv"):
        bad.compile([x])
    with pytest.raises(ModelError, match="call layers on"):
        Dense(3)(np.zeros(3))
    assert issubclass(ModelError, ValueError)


def test_noop_detection_is_not_fooled_by_accumulation_or_zero_rate():
    from fnnc.models.optim import is_noop

    assert is_noop(minimizers.noop()) and is_noop(optax.set_to_zero())
    assert not is_noop(minimizers.with_gradient_accumulation(minimizers.sgd(0.1), 2))
    assert not is_noop(minimizers.sgd(0.1)) and not is_noop(optax.adam(1e-3))


def test_set_minimizer_on_a_subset_freezes_exactly_those_parameters():
    model = _mlp()
    x, y = _data()
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    model.set_minimizer(minimizers.noop(), params=["t-hidden-0-0", "t-hidden-0-1"])
    before = model.parameters()
    model.fit([x], [y])
    after = model.parameters()
    assert np.array_equal(after["t-hidden-0-0"], before["t-hidden-0-0"])
    assert not np.allclose(after["t-out-0-0"], before["t-out-0-0"])
    step = next(p for k, p in model.engine._programs.items() if k[0] == "fit")
    assert "t-hidden-0-0" not in step.program.graph.symbols[step.program.graph.inputs[0]].name
    with pytest.raises(ModelError, match=r"unknown parameter ids \['t-nope'\]"):
        model.set_minimizer(optax.sgd(0.1), params=["t-nope"])


def test_a_deep_copy_of_a_trained_model_trains_on_as_the_original_and_apart_from_it():
    """``copy.deepcopy`` after ``fit`` (NNC's ``ccv_cnnp_model_copy``): the copy holds the
    parameters and Adam's moments, so its next steps equal the original's; stepping the
    copy leaves the original alone; the compiled programs are rebuilt, not shared."""
    import copy

    model = _mlp()
    x, y = _data()
    model.compile([x], loss="softmax_crossentropy", minimizer=optax.adam(0.05))
    for _ in range(3):
        model.fit([x], [y])
    model.evaluate([x], requires_grad=True)  # residuals kept for a backward
    copied = copy.deepcopy(model)
    before = {k: np.asarray(v) for k, v in model.parameters().items()}
    copied_losses = [float(copied.fit([x], [y])) for _ in range(2)]
    assert all(np.array_equal(np.asarray(v), before[k]) for k, v in model.parameters().items())
    losses = [float(model.fit([x], [y])) for _ in range(2)]
    assert copied_losses == losses
    for k, v in model.parameters().items():
        np.testing.assert_array_equal(np.asarray(copied.parameters()[k]), np.asarray(v))
    assert copied.engine._programs is not model.engine._programs


def test_set_parameters_takes_a_value_that_differs_by_size_1_axes_only():
    """NNC's set_parameter copies a [1] value into a [1, 1] weight: a value whose shape
    differs only by size-1 axes is reshaped (the model then computes with it); the same
    elements in another arrangement ([8, 3] for [3, 8]) are still refused."""
    x = Input()
    model = Model([x], [Dense(1, name="one", no_bias=True)(x)])
    model.compile([np.ones((2, 1), np.float32)])
    (pid,) = model.parameters()
    model.set_parameters({pid: np.float32([2.5])})
    assert np.asarray(model.parameters()[pid]).shape == (1, 1)
    np.testing.assert_allclose(
        np.asarray(model.evaluate([np.float32([[2.0], [4.0]])])), [[5.0], [10.0]]
    )
    wide = _mlp()
    wide.compile([_data()[0]], loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    with pytest.raises(ModelError, match=r"is \[3, 8\], the value given is \[8, 3\]"):
        wide.set_parameters({"t-out-0-0": np.zeros((8, 3))})
