"""Audit of issue 25 (silent wrong numbers and broken bridges), checked as a user would.

Promises checked, each against an independent oracle (plain Optax on the parameter dict,
``jax.grad``, NumPy, Flax's BatchNorm formula):

- item 1: a cnnp model's minimizer is one Optax transformation over the whole parameter
  dict: the issue's own example (global-norm clip + SGD on a classifier), the must-hold
  ``chain(clip_by_global_norm, adamw(schedule))`` through ``Model.train`` and across a
  resume, tree-wide transformations (callable masks and labels, ``masked``,
  ``apply_if_finite``, ``noisy_sgd`` with its PRNG key), one ``set_minimizer`` object =
  one partition;
- items 2-3: ``Model.from_flax`` of NNX modules holding ``nnx.Rngs`` (Dropout and a direct
  ``rngs.noise()`` stream) and ``nnx.BatchNorm``: keys are not parameters, the model writes,
  reads and checkpoints; running statistics follow Flax's momentum update, untouched by
  weight decay;
- item 4: ``save(backward(g, ...)[0], "g.json")`` for the issue's primitives (sin, cos,
  arctan, sign, cumsum, sort) and a Fourier-feature training graph;
- item 5: ``Variable`` operators with Python scalars on either side, ``a + np_arr`` equal to
  ``dg.exec(ops.ewsum(), a, np_arr)``, reflected operators naming a bad operand;
- item 6: ``predict`` on zero samples of a one-output model;
- item 8: the named-model hint for a file ``Model.write`` wrote with ``name="mlp"``;
- item 10: a changed ``"epoch"`` byte is named by ``restore()``, ``restore(step)`` and
  ``python -m fnnc inspect FILE --verify`` (a real child process).
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from fnnc import ops
from fnnc.errors import CheckpointError, FnncError, ParameterError
from fnnc.graph import DynamicGraph, backward, compile, interpret, load, save, trace
from fnnc.io import Checkpoints
from fnnc.models import CheckpointEvery, Dense, Input, Model, ReLU, Sequential
from tests.helpers import assert_close, subprocess_env

F32 = np.float32
RNG = np.random.default_rng(25)
X = RNG.standard_normal((8, 4)).astype(F32)
LABELS = (np.arange(8) % 3).astype(np.int32)


# -- item 1: one Optax transformation over the whole parameter dict -----------------------


def _classifier(minimizer) -> Model:
    x = Input()
    model = Model(x, Dense(3, name="out")(ReLU()(Dense(5, name="h")(x))))
    model.compile(X, loss="softmax_crossentropy", minimizer=minimizer)
    return model


def _xent(p, x, y):
    """The classifier's mean softmax cross-entropy in plain JAX (fnnc's ids as keys)."""
    h = jax.nn.relu(x @ p["t-h-0-0"].T + p["t-h-0-1"][None])
    logits = h @ p["t-out-0-0"].T + p["t-out-0-1"][None]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(x.shape[0]), y])


_GRAD = jax.jit(jax.grad(_xent))


def _params(model: Model) -> dict[str, jax.Array]:
    return {k: jnp.asarray(v) for k, v in model.parameters().items()}


def _optax_steps(opt, params, steps):
    """``steps`` steps of plain Optax ``opt`` on the dict ``params`` (the oracle)."""
    state = opt.init(params)
    update = jax.jit(opt.update)
    for _ in range(steps):
        updates, state = update(_GRAD(params, X, LABELS), state, params)
        params = optax.apply_updates(params, updates)
    return params


def test_issue_example_global_norm_clip_then_sgd_equals_optax_on_the_dict():
    """The issue's repro: chain(clip_by_global_norm(0.05), sgd(0.5)), three fits."""

    def make():
        return optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(0.5))

    model = _classifier(make())
    p0 = _params(model)
    grads = _GRAD(p0, X, LABELS)
    assert float(optax.tree.norm(grads)) > 0.05  # the global clip acts
    # a per-parameter clip would be a different step: the oracle must tell them apart
    per_param = {k: g * jnp.minimum(1.0, 0.05 / jnp.linalg.norm(g)) for k, g in grads.items()}
    assert float(optax.tree.norm(per_param)) > 0.051
    for _ in range(3):
        model.fit(X, LABELS)
    assert_close(model.parameters(), _optax_steps(make(), p0, 3), rtol=1e-6, atol=1e-6)


def _clip_adamw():
    schedule = optax.warmup_cosine_decay_schedule(0.0, 0.05, warmup_steps=2, decay_steps=5)
    return optax.chain(optax.clip_by_global_norm(0.05), optax.adamw(schedule, weight_decay=0.1))


def test_clip_and_adamw_schedule_through_train_equal_optax_over_five_steps():
    """The must-hold, through ``Model.train``: one full batch per epoch, five epochs."""
    model = _classifier(_clip_adamw())
    p0 = _params(model)
    model.train((X, LABELS), epochs=5, batch_size=8, verbose=False)
    assert model.train_progress.step == 5
    # the batch is the whole set, so its shuffled order changes only summation order
    assert_close(model.parameters(), _optax_steps(_clip_adamw(), p0, 5), rtol=1e-5, atol=2e-6)


def test_resumed_train_keeps_the_schedule_count_and_equals_optax(tmp_path):
    """Checkpoints keep the whole-tree state: 2 epochs, a fresh model resumes to 5."""
    path = str(tmp_path / "run.ckpt")
    first = _classifier(_clip_adamw())
    p0 = _params(first)
    first.train((X, LABELS), epochs=2, batch_size=8, verbose=False,
                callbacks=[CheckpointEvery(path, steps=1)])  # fmt: skip
    second = _classifier(_clip_adamw())  # another initialisation: all of it comes from the file
    second.train((X, LABELS), epochs=5, batch_size=8, resume=path, verbose=False)
    assert second.train_progress.step == 5
    assert_close(second.parameters(), _optax_steps(_clip_adamw(), p0, 5), rtol=1e-5, atol=2e-6)


def _is_matrix(tree):
    return jax.tree.map(lambda v: v.ndim > 1, tree)


TREE_TRANSFORMS = {
    "adamw with a callable mask": lambda: optax.adamw(0.05, weight_decay=0.5, mask=_is_matrix),
    "multi_transform with callable labels": lambda: optax.multi_transform(
        {"w": optax.sgd(0.3, momentum=0.9), "b": optax.adam(0.1)},
        lambda p: {k: "w" if v.ndim > 1 else "b" for k, v in p.items()},
    ),
    "masked by a dict of ids": lambda: optax.masked(
        optax.sgd(0.3),
        {"t-h-0-0": True, "t-h-0-1": False, "t-out-0-0": True, "t-out-0-1": False},
    ),
    "apply_if_finite around a global clip": lambda: optax.apply_if_finite(
        optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(0.5)), 3
    ),
}


@pytest.mark.parametrize("name", list(TREE_TRANSFORMS))
def test_tree_wide_optax_transformations_equal_optax_on_the_dict(name):
    make = TREE_TRANSFORMS[name]
    model = _classifier(make())
    p0 = _params(model)
    for _ in range(4):
        model.fit(X, LABELS)
    assert_close(model.parameters(), _optax_steps(make(), p0, 4), rtol=1e-6, atol=1e-6, what=name)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: optax.noisy_sgd(0.1, eta=0.01, key=jax.random.key(3)), id="key"),
        pytest.param(lambda: optax.noisy_sgd(0.1, eta=0.01, key=3), id="int key made a key"),
        pytest.param(
            lambda: optax.chain(optax.add_noise(0.05, 0.55, key=7), optax.adam(0.1)), id="chain"
        ),
    ],
)
def test_noisy_sgd_whose_state_holds_a_prng_key_equals_optax(make):
    """optax.noisy_sgd keeps a typed PRNG key in its state: the model carries its bits,
    so four fits add the same noise as plain Optax on the dict."""
    model = _classifier(make())
    p0 = _params(model)
    for _ in range(4):
        model.fit(X, LABELS)
    assert_close(model.parameters(), _optax_steps(make(), p0, 4), rtol=1e-5, atol=1e-6)


def test_dynamic_graph_apply_gradients_with_noisy_sgd_equals_optax():
    """The same through DynamicGraph.apply_gradients, state carried across steps."""
    dg = DynamicGraph()
    a = dg.variable(np.array([3.0, 4.0], F32), name="a")
    tx = optax.noisy_sgd(0.1, eta=0.5, key=0)
    want, state = jnp.array([3.0, 4.0]), tx.init([jnp.array([3.0, 4.0])])
    for _ in range(3):
        dg.backward((a * a).sum(), [a])
        dg.apply_gradients(tx, [a])
        updates, state = tx.update([2 * want], state, [want])
        want = optax.apply_updates([want], updates)[0]
    assert_close(a.numpy(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("multi_steps", [False, True])
def test_one_minimizer_object_set_on_two_id_lists_is_one_partition(multi_steps):
    """set_minimizer(head, params=[w]) then (head, params=[b]): the clip sees both. Also
    for one optax.MultiSteps object (every_k=1: the chain's own steps), whose
    gradient_transformation() is a new object at each call and so split the partition."""
    body = optax.sgd(0.05)
    head = optax.chain(optax.clip_by_global_norm(0.01), optax.sgd(0.5))
    model = _classifier(body)
    given = optax.MultiSteps(head, every_k_schedule=1) if multi_steps else head
    model.set_minimizer(given, params=["t-out-0-0"])
    model.set_minimizer(given, params=["t-out-0-1"])
    p0 = _params(model)
    for _ in range(3):
        model.fit(X, LABELS)
    labels = {k: "head" if k.startswith("t-out") else "body" for k in p0}
    one = optax.multi_transform({"body": body, "head": head}, labels)
    want = _optax_steps(one, p0, 3)
    assert_close(model.parameters(), want, rtol=1e-6, atol=1e-6)
    split = optax.multi_transform(
        {"body": body, "w": head, "b": head}, {**labels, "t-out-0-0": "w", "t-out-0-1": "b"}
    )
    other = _optax_steps(split, p0, 3)  # two partitions would be another step
    assert not np.allclose(other["t-out-0-0"], want["t-out-0-0"], atol=1e-5)


# -- items 2 and 3: the Flax bridge -------------------------------------------------------


def _mse(outputs, targets):
    return jnp.mean((outputs[0] - targets[0]) ** 2)


class DropoutBatchNormNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.fc1 = nnx.Linear(4, 8, rngs=rngs)
        self.bn = nnx.BatchNorm(8, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.fc2 = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x):
        return self.fc2(self.drop(nnx.relu(self.bn(self.fc1(x)))))


def _bridged(seed: int) -> Model:
    model = Model.from_flax(DropoutBatchNormNet(nnx.Rngs(seed)), name="net")
    model.compile(X[:6], loss=_mse, minimizer=optax.adam(0.01))
    return model


def test_a_module_with_rngs_and_batchnorm_writes_reads_and_checkpoints(tmp_path):
    """The crash was np.asarray on every state leaf: files must take such a model."""
    targets = RNG.standard_normal((6, 2)).astype(F32)
    model = _bridged(0)
    paths = model.parameter_paths()
    assert sorted(paths.values()) == sorted(
        ["fc1.kernel", "fc1.bias", "bn.scale", "bn.bias", "bn.mean", "bn.var",
         "fc2.kernel", "fc2.bias"]
    )  # fmt: skip
    assert not any("rngs" in p or "key" in p or "count" in p for p in paths.values())
    for _ in range(2):
        assert np.isfinite(float(model.fit(X[:6], targets)))
    values = model.parameters()
    assert all(np.asarray(v).dtype == F32 for v in values.values())

    model.write(tmp_path / "net.sqlite3")
    read = _bridged(1)
    assert read.read(tmp_path / "net.sqlite3") == []
    for pid, value in values.items():
        np.testing.assert_array_equal(read.parameters()[pid], value, err_msg=paths[pid])
    np.testing.assert_array_equal(read.evaluate(X[:6]), model.evaluate(X[:6]))

    read.fit(X[:6], targets)  # moves every trainable value and the statistics away
    with Checkpoints(tmp_path / "run.ckpt") as ckpt:
        ckpt.save(2, model)
        restored = read
        ckpt.restore_into(restored)
    for pid, value in values.items():
        np.testing.assert_array_equal(restored.parameters()[pid], value, err_msg=paths[pid])
    np.testing.assert_array_equal(restored.evaluate(X[:6]), model.evaluate(X[:6]))


class NoiseStream(nnx.Module):
    """Draws from an ``nnx.Rngs`` stream itself (no Dropout layer)."""

    def __init__(self, rngs: nnx.Rngs):
        self.fc = nnx.Linear(4, 3, rngs=rngs)
        self.rngs = rngs

    def __call__(self, x):
        return self.fc(x) + 0.1 * jax.random.normal(self.rngs.noise(), (x.shape[0], 3))


def test_a_module_drawing_from_its_own_rng_stream_trains_with_fresh_keys():
    module = NoiseStream(nnx.Rngs(0, noise=1))
    model = Model.from_flax(module, name="noisy")
    model.compile(X, loss=_mse, minimizer=optax.sgd(0.1))
    assert sorted(model.parameter_paths().values()) == ["fc.bias", "fc.kernel"]
    params = model.parameters()
    kernel = next(v for k, v in params.items() if np.ndim(v) == 2)
    bias = next(v for k, v in params.items() if np.ndim(v) == 1)
    clean = X @ np.asarray(kernel) + np.asarray(bias)  # Flax's kernel is [in, out]
    first = np.asarray(model.evaluate(X, is_test=False))
    second = np.asarray(model.evaluate(X, is_test=False))
    assert not np.array_equal(first, second)  # a fresh key per training-mode call
    for got in (first, second):
        noise = (got - clean) / 0.1
        assert 0.3 < noise.std() < 2.0 and abs(noise.mean()) < 0.8  # standard normal draws
    assert np.isfinite(float(model.fit(X, np.zeros((8, 3), F32))))


class NormFirst(nnx.Module):
    """BatchNorm on the raw input: its batch statistics do not depend on the weights."""

    def __init__(self, rngs: nnx.Rngs):
        self.bn = nnx.BatchNorm(4, momentum=0.8, rngs=rngs)
        self.fc = nnx.Linear(4, 2, rngs=rngs)

    def __call__(self, x):
        return self.fc(self.bn(x))


def test_batchnorm_statistics_follow_flax_momentum_and_no_weight_decay_reaches_them():
    batches = [3.0 + 2.0 * RNG.standard_normal((6, 4)).astype(F32) for _ in range(3)]
    model = Model.from_flax(NormFirst(nnx.Rngs(0)), name="bnnet")
    model.compile(batches[0], loss=_mse, minimizer=optax.adamw(0.05, weight_decay=0.9))
    paths = model.parameter_paths()
    ids = {path: pid for pid, path in paths.items()}
    assert ids["bn.mean"] not in model.engine.trainable()
    assert ids["bn.var"] not in model.engine.trainable()
    mean, var = np.zeros(4), np.ones(4)  # nnx.BatchNorm's initial running statistics
    for x in batches:
        model.fit(x, np.zeros((6, 2), F32))
        x64 = x.astype(np.float64)
        mean = 0.8 * mean + 0.2 * x64.mean(0)
        var = 0.8 * var + 0.2 * x64.var(0)  # Flax: the biased batch variance
    got = {k: np.asarray(v, np.float64) for k, v in model.parameters().items()}
    np.testing.assert_allclose(got[ids["bn.mean"]], mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[ids["bn.var"]], var, rtol=1e-5, atol=1e-5)
    # test mode normalises with the running statistics (NumPy forward, Flax's layout)
    x = batches[0]
    normed = (x - mean) / np.sqrt(var + 1e-5) * got[ids["bn.scale"]] + got[ids["bn.bias"]]
    want = normed @ got[ids["fc.kernel"]] + got[ids["fc.bias"]]
    np.testing.assert_allclose(model.evaluate(x), want, rtol=1e-4, atol=1e-4)


# -- item 4: gradients of generic nodes save and load --------------------------------------

PRIMITIVES = {
    "sin": jnp.sin,
    "cos": jnp.cos,
    "arctan": jnp.arctan,
    "sign": lambda v: jnp.sign(v) * v * v,
    "cumsum": lambda v: jnp.cumsum(v, axis=-1) * v,
    "sort": lambda v: jnp.sort(v, axis=-1) * jnp.arange(1.0, 5.0)[None],
}
XP = np.linspace(-1.7, 2.3, 12, dtype=F32).reshape(3, 4)


@pytest.mark.parametrize("name", list(PRIMITIVES))
def test_backward_graph_of_a_traced_primitive_saves_to_a_file_and_loads(name, tmp_path):
    f = PRIMITIVES[name]

    def total(v):
        return jnp.sum(f(v))

    graph = trace(total, XP)
    grad_graph = backward(graph, graph.outputs[0], [graph.inputs[0]])[0]
    path = str(tmp_path / "g.json")
    save(grad_graph, path)
    loaded = load(path)
    got = compile(loaded)(XP)
    assert_close(got[-1], jax.grad(total)(XP), rtol=1e-5, atol=1e-5, what=name)
    assert_close(interpret(loaded, XP)[-1], got[-1], rtol=1e-6, atol=1e-6, what=name)


def test_a_fourier_feature_training_graph_saves_and_its_gradient_equals_jax(tmp_path):
    w = RNG.standard_normal((4, 5)).astype(F32)

    def loss(x, w):
        z = x @ w
        features = jnp.concatenate([jnp.sin(z), jnp.cos(z), jnp.arctan(z)], axis=-1)
        return jnp.mean(features**2)

    graph = trace(loss, XP, w)
    grad_graph = backward(graph, graph.outputs[0], [graph.inputs[1]])[0]
    save(grad_graph, str(tmp_path / "train.json"))
    got = compile(load(str(tmp_path / "train.json")))(XP, w)
    assert_close(got[0].reshape(()), loss(XP, w), rtol=1e-6, atol=1e-6)
    assert_close(got[-1], jax.grad(loss, argnums=1)(XP, w), rtol=1e-5, atol=1e-6)


# -- item 5: Variable operators ------------------------------------------------------------

A = np.array([[1.5, 2.0, 3.0], [0.5, 1.0, 2.5]], F32)

SCALAR_EXPRESSIONS = {
    "2 + x": lambda x: 2 + x,
    "x - 1.5": lambda x: x - 1.5,
    "1.5 - x": lambda x: 1.5 - x,
    "x / 4": lambda x: x / 4,
    "4 / x": lambda x: 4 / x,
    "-x": lambda x: -x,
    "x ** 3 - x.mean()": lambda x: x**3 - x.mean(),
    "x.T @ x / 2": lambda x: x.T @ x / 2,
}


@pytest.mark.parametrize("name", list(SCALAR_EXPRESSIONS))
def test_python_numbers_on_either_side_value_equals_numpy_gradient_equals_jax(name):
    f = SCALAR_EXPRESSIONS[name]
    dg = DynamicGraph()
    x = dg.variable(A, name="x")
    y = f(x)
    want = np.asarray(f(A.astype(np.float64)))
    assert y.shape == want.shape and np.dtype(y.dtype) == F32
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=name)
    seed = RNG.standard_normal(want.shape).astype(F32)
    (dx,) = dg.backward(y, [x], df=[seed])
    want_dx = jax.grad(lambda v: jnp.sum(f(v) * seed))(jnp.asarray(A))
    np.testing.assert_allclose(dx.numpy(), want_dx, rtol=1e-5, atol=1e-5, err_msg=name)


def test_variable_plus_ndarray_equals_exec_ewsum_and_matmul_ndarray_works():
    """The issue's pair: ``dg.exec(ops.ewsum(), a, np_arr)`` worked, ``a + np_arr`` did not."""
    dg = DynamicGraph()
    a = dg.variable(A, name="a")
    np_arr = np.linspace(-1.0, 1.0, 6, dtype=F32).reshape(2, 3)
    np.testing.assert_array_equal((a + np_arr).numpy(), dg.exec(ops.ewsum(), a, np_arr).numpy())
    np.testing.assert_allclose((a + np_arr).numpy(), A + np_arr, rtol=1e-6)
    w = np.arange(6, dtype=F32).reshape(3, 2)
    np.testing.assert_allclose((a @ w).numpy(), A @ w, rtol=1e-6)


@pytest.mark.parametrize(
    "op",
    [lambda x, o: o - x, lambda x, o: o / x, lambda x, o: o @ x, lambda x, o: x - o],
    ids=["r-", "r/", "r@", "-"],
)
@pytest.mark.parametrize("operand", ["abc", None], ids=["str", "None"])
def test_a_bad_operand_on_either_side_is_an_fnnc_error_naming_it(op, operand):
    dg = DynamicGraph()
    x = dg.variable(A, name="x")
    with pytest.raises(FnncError, match=r"variable 'x'") as e:
        op(x, operand)
    assert repr(operand) in str(e.value)


# -- item 6: predict on zero samples -------------------------------------------------------


def test_predict_on_zero_samples_of_a_one_output_model_has_evaluate_shape():
    x = Input()
    model = Model(x, Dense(3, name="fc")(x))
    model.compile(X, loss="softmax_crossentropy", minimizer=optax.sgd(0.1))
    got = model.predict(X[:0])
    want = np.asarray(model.evaluate(X[:0]))
    assert isinstance(got, np.ndarray)
    assert got.shape == want.shape == (0, 3) and got.dtype == want.dtype


# -- item 8: the named-model hint ----------------------------------------------------------


def test_reading_a_named_model_file_without_name_says_the_file_holds_mlp(tmp_path):
    def mlp():
        model = Sequential([Dense(8), ReLU(), Dense(3)])
        model.compile([np.zeros((2, 4), F32)])
        return model

    mlp().write(tmp_path / "model_named.sqlite3", name="mlp")
    reader = mlp()
    with pytest.raises(ParameterError) as e:
        reader.read(tmp_path / "model_named.sqlite3")
    text = str(e.value)
    assert "t-0-0" in text and "model named 'mlp'" in text and "name='mlp'" in text
    assert reader.read(tmp_path / "model_named.sqlite3", name="mlp") == []


# -- item 10: the checkpoint manifest is checked --------------------------------------------


def _damaged_checkpoint(tmp_path):
    x = Input()
    model = Model(x, Dense(3, name="fc")(x))
    model.compile(X[:4], loss="softmax_crossentropy", minimizer=optax.adam(0.1))
    model.train((X, LABELS), epochs=1, batch_size=4, verbose=False)
    path = tmp_path / "run.ckpt"
    with Checkpoints(path) as ckpt:
        ckpt.save(2, model)
    data = path.read_bytes()
    assert data.count(b'"epoch":1') == 1
    path.write_bytes(data.replace(b'"epoch":1', b'"epoch":3'))  # the issue's edit, in place
    return str(path)


def test_an_edited_epoch_is_named_by_restore_and_the_verify_command(tmp_path):
    path = _damaged_checkpoint(tmp_path)
    for call in (lambda c: c.restore(), lambda c: c.restore(2)):
        with Checkpoints(path) as ckpt, pytest.raises(CheckpointError) as e:
            call(ckpt)
        assert f"step 2 in {path}" in str(e.value) and "manifest" in str(e.value)
    done = subprocess.run(
        [sys.executable, "-m", "fnnc", "inspect", path, "--verify"],
        env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "Traceback" not in done.stdout + done.stderr
    assert "step 2" in done.stdout + done.stderr
