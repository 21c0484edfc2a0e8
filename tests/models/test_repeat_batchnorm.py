"""BatchNorm inside a Repeat: each block keeps and updates its own running statistics.

The oracle is the unrolled model (``Sequential`` of fresh copies, no loop) fed the same
parameters and statistics: the losses of several training steps, the parameters, the
running statistics after them and the testing-mode outputs must match. The statistics'
first update is also checked against NumPy's batch mean and variance.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc.io import Checkpoints
from fnnc.models import (
    BatchNorm,
    Dense,
    Input,
    Model,
    Pipeline,
    ReLU,
    Repeat,
    Sequential,
    stacked_ids,
    unstack_parameters,
)
from tests.helpers import run_on_cpu_devices

N, WIDTH = 3, 4
RNG = np.random.default_rng(1)
X = RNG.normal(size=(6, 3)).astype(np.float32)
Y = RNG.normal(size=(6, 2)).astype(np.float32)
MEAN = "r-blocks-0-block-[0:3]-bn-0-0"


def loss(ys, ts):
    return jnp.mean((ys[0] - ts[0]) ** 2)


def block() -> Model:
    """Dense without a bias before BatchNorm: a bias there has a zero gradient, which
    Adam turns into full-size steps of the sign of rounding noise (a GPU's noise differs
    between the loop and the unrolled model, and so did those biases). The same holds
    for any bias whose only path to the loss is through such a Dense into BatchNorm, so
    :func:`build`'s input layer has none either."""
    x = Input()
    fc = Dense(WIDTH, no_bias=True, name="fc")
    return Model(x, ReLU()(BatchNorm(name="bn")(fc(x))), name="block")


def build(stack, minimizer=None, **options) -> Model:
    x = Input()
    # no bias: BatchNorm removes what it would add (its gradient is 1e-7 of rounding)
    m = Model(x, Dense(2, name="head")(stack(Dense(WIDTH, no_bias=True, name="inp")(x))))
    m.compile(X, loss=loss, minimizer=minimizer or optax.adam(0.05), **options)
    return m


def close(a, b) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=2e-5, atol=2e-5)


def unrolled(minimizer=None, **options) -> Model:
    return build(Sequential([block() for _ in range(N)], name="blocks"), minimizer, **options)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_training_equals_the_unrolled_model(checkpoint):
    rep = build(Repeat(block, N, name="blocks", checkpoint=checkpoint))
    unr = unrolled()
    assert rep.parameters()[MEAN].shape == (N, WIDTH)
    assert stacked_ids(rep)[MEAN][2] == "r-blocks-0-block-2-bn-0-0"
    unr.set_parameters(unstack_parameters(rep.parameters(), rep))
    for _ in range(3):
        np.testing.assert_allclose(float(rep.fit(X, Y)), float(unr.fit(X, Y)), rtol=2e-5)
    per_block = unstack_parameters(rep.parameters(), rep)
    close(per_block, unr.parameters())
    means = np.asarray(rep.parameters()[MEAN])
    assert np.abs(means).min() > 0 and not np.allclose(means[0], means[1])  # each its own
    np.testing.assert_allclose(rep.evaluate(X), unr.evaluate(X), rtol=2e-5, atol=2e-5)


def test_the_first_update_is_each_blocks_batch_statistics():
    """From the initial statistics (mean 0, variance 1), one step moves each block's
    running mean toward the batch mean of its own BatchNorm input, computed in NumPy
    from the parameters the step started with."""
    rep = build(Repeat(block, N, name="blocks"), optax.sgd(0.0))
    p = {k: np.asarray(v, np.float64) for k, v in unstack_parameters(rep.parameters(), rep).items()}
    before = np.asarray(rep.parameters()[MEAN]).copy()
    rep.fit(X, Y)
    after = np.asarray(rep.parameters()[MEAN])
    h = X @ p["t-inp-0-0"].T
    momentum = None
    for i in range(N):
        pre = f"t-blocks-0-block-{i}"
        z = h @ p[f"{pre}-fc-0-0"].T
        mean, var = z.mean(0), z.var(0)
        # the running mean is (1 - m) * old + m * batch mean for the layer's momentum m
        m = (after[i] - before[i]) / (mean - before[i])
        momentum = m if momentum is None else momentum
        np.testing.assert_allclose(m, momentum, rtol=1e-4)
        np.testing.assert_allclose(m, np.full(WIDTH, m[0]), rtol=1e-4)
        gamma, beta = p[f"{pre}-bn-0-0"], p[f"{pre}-bn-0-1"]
        h = np.maximum((z - mean) / np.sqrt(var + 1e-5) * gamma + beta, 0.0)
    assert 0.0 < momentum[0] < 1.0


def test_files_hold_per_block_statistics(tmp_path):
    rep = build(Repeat(block, N, name="blocks"))
    rep.fit(X, Y)
    rep.write(tmp_path / "rep.sqlite")
    unr = unrolled()
    assert unr.read(tmp_path / "rep.sqlite") == []
    close(unr.parameters(), unstack_parameters(rep.parameters(), rep))
    np.testing.assert_allclose(rep.evaluate(X), unr.evaluate(X), rtol=2e-5, atol=2e-5)


def test_checkpoints_resume_across_repeat_and_unrolled(tmp_path):
    """A run saved by either model (statistics under per-block ids) resumes in the other."""
    rep, unr = build(Repeat(block, N, name="blocks")), unrolled()
    for source, target, path in ((rep, unr, tmp_path / "a"), (unr, rep, tmp_path / "b")):
        source.fit(X, Y)
        with Checkpoints(path) as ckpt:
            ckpt.save(1, source)
            assert "r-blocks-0-block-1-bn-0-1" in ckpt.restore(1).state
            ckpt.restore_into(target)
        np.testing.assert_allclose(float(source.fit(X, Y)), float(target.fit(X, Y)), rtol=2e-5)
        close(unstack_parameters(rep.parameters(), rep), unr.parameters())


def test_bfloat16_blocks_keep_float32_statistics():
    """The precision pass retypes the loop's body and keeps the statistics' type; the
    unrolled bfloat16 model rounds alike, so one step's statistics agree."""
    rep = build(Repeat(block, N, name="blocks"), optax.sgd(0.0), precision="bfloat16")
    unr = unrolled(optax.sgd(0.0), precision="bfloat16")
    unr.set_parameters(unstack_parameters(rep.parameters(), rep))
    np.testing.assert_allclose(float(rep.fit(X, Y)), float(unr.fit(X, Y)), rtol=1e-2)
    assert rep.parameters()[MEAN].dtype == np.float32
    got = unstack_parameters(rep.parameters(), rep)
    close(got, unr.parameters())


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_pipelined_step_is_the_mean_of_its_microbatches_steps(checkpoint):
    """GPipe's batch norm: each microbatch (rows ``j, j + 2, ...``) is normalized by its
    own statistics, so the pipelined model's step is the mean of the plain Repeat's
    steps on each microbatch from the same start: the loss, the SGD update (the mean
    loss's gradient is the mean of the microbatches') and the running statistics
    (the mean of each microbatch's update). Testing mode then matches the plain model."""
    pipe = Pipeline(stages=2, microbatches=2)
    piped = build(Repeat(block, 2, name="blocks", pipeline=pipe, checkpoint=checkpoint),
                  optax.sgd(0.1))  # fmt: skip
    plain = build(Repeat(block, 2, name="blocks"), optax.sgd(0.1))
    for _ in range(2):
        start = {k: np.asarray(v).copy() for k, v in piped.parameters().items()}
        losses, after = [], []
        for j in range(2):
            plain.set_parameters(start)
            losses.append(float(plain.fit(X[j::2], Y[j::2])))
            after.append({k: np.asarray(v) for k, v in plain.parameters().items()})
        np.testing.assert_allclose(float(piped.fit(X, Y)), np.mean(losses), rtol=2e-5)
        close(piped.parameters(), {k: (after[0][k] + after[1][k]) / 2 for k in start})
    means = np.asarray(piped.parameters()[MEAN.replace("[0:3]", "[0:2]")])
    assert not np.allclose(means[0], means[1])  # each block its own statistics
    plain.set_parameters(piped.parameters())
    np.testing.assert_allclose(piped.evaluate(X), plain.evaluate(X), rtol=2e-5, atol=2e-5)


SHARDED = """
import jax, numpy as np, optax
from tests.models.test_repeat_batchnorm import N, Input, Model, Dense, Repeat, block, loss, WIDTH
assert jax.device_count() == 4
rng = np.random.default_rng(3)
x8, y8 = rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=(8, 2)).astype(np.float32)

def compiled(**options):
    x = Input()
    h = Repeat(block, N, name="blocks")(Dense(WIDTH, name="inp")(x))
    m = Model(x, Dense(2, name="head")(h))
    m.compile(x8, loss=loss, minimizer=optax.sgd(0.1), **options)
    return m

ref = compiled()
got = compiled(mesh=jax.make_mesh((4,), ("data",)), parameter_sharding="fsdp")
got.set_parameters(ref.parameters())
want, losses = ([float(m.fit(x8, y8)) for _ in range(2)] for m in (ref, got))
np.testing.assert_allclose(losses, want, rtol=1e-5)
for k, v in ref.parameters().items():
    np.testing.assert_allclose(got.parameters()[k], v, rtol=1e-5, atol=1e-5, err_msg=k)
print("OK")
"""


def test_fsdp_over_four_devices_equals_one_device():
    """The batch split over 4 devices: each block's statistics are the whole batch's."""
    run_on_cpu_devices(SHARDED)


STAGED = """
import jax, numpy as np, optax
from tests.models.test_repeat_batchnorm import Input, Model, Dense, Pipeline, Repeat, block, loss
from tests.models.test_repeat_batchnorm import WIDTH
rng = np.random.default_rng(4)
x8, y8 = rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=(8, 2)).astype(np.float32)

def compiled(**options):
    x = Input()
    pipe = Pipeline(stages=2, microbatches=2)
    h = Repeat(block, 2, name="blocks", pipeline=pipe)(Dense(WIDTH, name="inp")(x))
    m = Model(x, Dense(2, name="head")(h))
    m.compile(x8, loss=loss, minimizer=optax.sgd(0.1), **options)
    return m

ref = compiled()
got = compiled(mesh=jax.make_mesh((2, 2), ("stage", "data")))
got.set_parameters(ref.parameters())
stats = [k for k in got.parameters() if k.startswith("r-")]
want, losses = ([float(m.fit(x8, y8)) for _ in range(2)] for m in (ref, got))
assert stats and all(got.engine.values[k].sharding.spec[0] == "stage" for k in stats)
np.testing.assert_allclose(losses, want, rtol=1e-5)
for k, v in ref.parameters().items():
    np.testing.assert_allclose(got.parameters()[k], v, rtol=1e-5, atol=1e-5, err_msg=k)
print("OK")
"""


def test_pipelined_statistics_on_a_stage_by_data_mesh_equal_one_device():
    """2 stages x 2 data devices: each microbatch is split over the data axis, and its
    statistics are still the whole microbatch's; the statistics' stacks lie on the stage
    axis like the weights."""
    run_on_cpu_devices(STAGED)
