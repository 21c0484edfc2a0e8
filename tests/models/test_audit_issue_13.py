"""Audit of issue 13 (data-parallel and sharded training, mixed precision) against the
issue's own words; the multi-process parts are left out.

Promises checked:

- sharded compile: ``fnnc.graph.data_parallel`` marks batch inputs split over a mesh
  axis and parameters / optimizer state replicated or FSDP-split; ``compile(graph,
  shardings=)`` hands them to ``jax.jit`` (a training step equals the one-device
  step and ``jax.grad``; its outputs carry the asked layout);
- models: ``Model.set_data_parallel(n)`` (``0`` = every device) and
  ``Model.compile(..., mesh=, parameter_sharding="replicated" | "fsdp")``: 1 and 20
  ``fit`` steps on 2 and 4 devices equal one device to 1e-5, parameter arrays carry
  the asked ``.sharding``; ``evaluate``, ``train`` (100 steps, no deadlock),
  ``parameters()`` (full arrays), ``write``/``read`` and ``Checkpoints`` work unchanged
  and cross between 4 devices and 1 both ways;
- bad input names what to change: a batch that does not divide (what divides), a mesh
  axis that does not exist, more devices than the run has;
- mixed precision: ``compile(precision="bfloat16" | "float16")`` keeps parameters,
  optimizer state and the loss float32; the ``cast_precision`` pass inserts
  ``datatype_conversion`` (matmuls low, reductions / losses float32); float16 dynamic
  loss scaling skips the step and halves the scale on Inf **or NaN**, and doubles it
  after N good steps;
- Pallas kernels at ragged sizes (interpret mode on CPU): softmax cross-entropy over
  1001 classes (float32 and bfloat16) and attention of 67 queries over 45 keys, forward
  and gradient, against closed forms / ``jax.grad``.

The 4-device checks run in one subprocess (4 virtual CPU devices), started with the
module's first test so it runs beside the in-process ones.
"""

from __future__ import annotations

import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fnnc import ops
from fnnc.errors import FnncError
from fnnc.graph import GraphBuilder, interpret
from fnnc.graph.passes.precision import cast_precision
from fnnc.models import Dense, Input, LossScale, Model, ReLU
from fnnc.ops.pallas import scaled_dot_product_attention as pallas_attention
from fnnc.ops.pallas import softmax_crossentropy as pallas_crossentropy
from tests.helpers import BackgroundDevices

DEVICE_SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys, tempfile, traceback
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import PartitionSpec as P
    from fnnc.io import Checkpoints
    from fnnc.models import Dense, Input, Model, ReLU

    assert jax.device_count() == 4, jax.devices()
    RESULTS = {}

    def check(fn):
        try:
            fn()
            RESULTS[fn.__name__] = "ok"
        except BaseException as e:  # reported to the parent test of the same name
            RESULTS[fn.__name__] = "".join(traceback.format_exception(e))[-3000:]
        return fn

    rng = np.random.default_rng(0)
    XS = rng.normal(size=(16, 6)).astype(np.float32)
    YS = rng.normal(size=(16, 4)).astype(np.float32)
    SHAPES = {"t-net-0-fc1-0-0": (8, 6), "t-net-0-fc1-0-1": (8,), "t-net-0-fc2-0-0": (4, 8),
              "t-net-0-fc2-0-1": (4,)}

    def mlp():
        x = Input()
        return Model(x, Dense(4, name="fc2")(ReLU()(Dense(8, name="fc1")(x))), name="net")

    def trained(steps, n=None, mode="replicated", **kw):
        m = mlp()
        if n is not None:
            m.set_data_parallel(n, parameter_sharding=mode)
        m.compile(XS, loss="mse", minimizer=optax.adam(1e-2), **kw)
        return m, [float(m.fit(XS, YS)) for _ in range(steps)]

    def equal(m, ref):
        want, got = ref.parameters(), m.parameters()
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5,
                                       atol=1e-5, err_msg=k)

    def held(m, pid):
        m.engine._sync_live()
        return m.engine.values[pid]

    def run20(**kw):
        # 20 Adam steps: the losses, the parameters after step 1 and after step 20
        m = mlp()
        m.compile(XS, loss="mse", minimizer=optax.adam(1e-2), **kw)
        losses, snaps = [], []
        for i in range(20):
            losses.append(float(m.fit(XS, YS)))
            if i in (0, 19):
                snaps.append({k: np.array(v, copy=True) for k, v in m.parameters().items()})
        return m, losses, snaps

    REF = {1: trained(1)}
    _, REF_LOSSES, REF_SNAPS = run20()

    @check
    def compile_mesh_replicated_and_fsdp():
        for n in (2, 4):
            for mode in ("replicated", "fsdp"):
                m, losses, snaps = run20(mesh=jax.make_mesh((n,), ("data",)),
                                         parameter_sharding=mode)
                np.testing.assert_allclose(losses, REF_LOSSES, rtol=1e-5)
                for got, want in zip(snaps, REF_SNAPS):  # after 1 step and after 20
                    for k in want:
                        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5,
                                                   err_msg=f"{n} {mode} {k}")
                v = held(m, "t-net-0-fc1-0-0")
                assert len(v.sharding.device_set) == n
                want = (P("data"), (8 // n, 6)) if mode == "fsdp" else (P(), (8, 6))
                assert v.sharding.spec == want[0], (n, mode, v.sharding)
                assert {tuple(s.data.shape) for s in v.addressable_shards} == {want[1]}
                states = [a for a in jax.tree.leaves(m.engine.store.all_states("t-net-0-fc1-0-0"))
                          if a.ndim]
                assert [a.sharding.spec for a in states] == [want[0]] * 2, states

    @check
    def set_data_parallel_zero_takes_every_device():
        m, losses = trained(1, n=0)
        assert m.engine.parallel.size == 4
        assert len(held(m, "t-net-0-fc1-0-0").sharding.device_set) == 4
        np.testing.assert_allclose(losses, REF[1][1], rtol=1e-5)

    @check
    def evaluate_and_parameters_of_a_sharded_model():
        m, _ = trained(1, n=4, mode="fsdp")
        np.testing.assert_allclose(np.asarray(m.evaluate(XS)), np.asarray(REF[1][0].evaluate(XS)),
                                   rtol=1e-5, atol=1e-6)
        params = m.parameters()
        assert {k: tuple(v.shape) for k, v in params.items()} == SHAPES
        for v in params.values():
            np.asarray(v)  # a full array, readable on the host

    @check
    def train_100_steps_equals_one_device():
        xs = np.random.default_rng(3).normal(size=(400, 6)).astype(np.float32)
        ys = np.random.default_rng(4).normal(size=(400, 4)).astype(np.float32)
        models = []
        for n in (None, 4):
            m = mlp()
            if n is not None:
                m.set_data_parallel(n)
            m.compile(xs[:4], loss="mse", minimizer=optax.sgd(0.01, momentum=0.9))
            m.train((xs, ys), epochs=1, batch_size=4, verbose=False)
            models.append(m)
        assert models[1].train_progress.step == 100
        equal(models[1], models[0])

    @check
    def holding_parameters_across_many_fit_steps():
        # parameters() hands out copies: a user keeping NumPy views of them while
        # training on goes on past the in-flight bound of queued sharded steps
        m, _ = trained(1, n=2)
        kept = {k: np.asarray(v) for k, v in m.parameters().items()}
        snapshot = {k: v.copy() for k, v in kept.items()}
        for _ in range(12):
            m.fit(XS, YS)
        for k, v in kept.items():
            np.testing.assert_array_equal(v, snapshot[k], err_msg=k)

    TMP = tempfile.mkdtemp()

    @check
    def files_and_checkpoints_cross_between_4_devices_and_1():
        four, _ = trained(3, n=4, mode="fsdp")
        four.write(os.path.join(TMP, "m.sqlite"))
        one = mlp()
        one.compile(XS, loss="mse", minimizer=optax.adam(1e-2))
        assert one.read(os.path.join(TMP, "m.sqlite")) == []
        equal(one, four)
        with Checkpoints(os.path.join(TMP, "run.ckpt")) as ckpt:
            ckpt.save(3, four)
            one = mlp()
            one.compile(XS, loss="mse", minimizer=optax.adam(1e-2))
            ckpt.restore_into(one)  # 4 devices -> 1: the Adam state too
            np.testing.assert_allclose([float(one.fit(XS, YS)) for _ in range(2)],
                                       [float(four.fit(XS, YS)) for _ in range(2)], rtol=1e-5)
            ckpt.save(5, one)
            back = mlp()
            back.set_data_parallel(4, parameter_sharding="fsdp")
            back.compile(XS, loss="mse", minimizer=optax.adam(1e-2))
            ckpt.restore_into(back)  # 1 -> 4 devices, resharded
            assert held(back, "t-net-0-fc1-0-0").sharding.spec == P("data")
            np.testing.assert_allclose(float(back.fit(XS, YS)), float(one.fit(XS, YS)), rtol=1e-5)

    def error_of(fn):
        try:
            fn()
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        raise AssertionError("no error")

    @check
    def a_batch_that_does_not_divide_says_what_divides():
        m, _ = trained(0, n=4)
        msg = error_of(lambda: m.fit(XS[:6], YS[:6]))
        assert "6" in msg and "multiple of 4" in msg, msg

    @check
    def a_mesh_without_the_data_axis_is_named():
        m = mlp()
        msg = error_of(lambda: m.compile(XS, loss="mse", minimizer=optax.sgd(0.1),
                                         mesh=jax.make_mesh((4,), ("batch",))))
        assert "'data'" in msg and "batch" in msg, msg

    @check
    def more_devices_than_the_run_has_is_named():
        msg = error_of(lambda: mlp().set_data_parallel(8))
        assert "8" in msg and "4 devices" in msg, msg

    @check
    def graph_data_parallel_training_step():
        from fnnc import ops
        from fnnc.graph import GraphBuilder, compile, data_parallel
        from fnnc.graph.passes import minimize
        b = GraphBuilder()
        x, t, w = b.input((8, 6), name="x"), b.input((8, 4), name="t"), b.input((4, 6), name="w")
        d = b.exec(ops.ewsum(), b.exec(ops.gemm(transpose_b=True), x, w),
                   b.exec(ops.scalar_mul(a=-1.0), t))
        loss = b.exec(ops.reduce_mean(axes=(0, 1)), b.exec(ops.ewprod(), d, d))
        step, layout = minimize(b.build([loss]), loss, [w], optax.sgd(0.1, momentum=0.9))
        names = [step.symbols[s].name for s in step.inputs]
        wv = np.random.default_rng(5).normal(size=(4, 6)).astype(np.float32)
        feed = {"x": XS[:8], "t": YS[:8], "w": wv}
        args = [feed.get(n, np.zeros((4, 6), np.float32)) for n in names]
        want = compile(step)(*args)
        for mode in ("replicated", "fsdp"):
            plan = data_parallel(step, jax.make_mesh((4,), ("data",)), parameter_sharding=mode,
                                 layout=layout)
            assert plan.inputs[names.index("x")] == P("data"), plan.inputs
            got = compile(step, shardings=plan)(*args)
            for a, b_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b_), rtol=1e-5, atol=1e-6)
            new_w = jax.tree.leaves(got)[0]
            assert new_w.sharding.spec == (P("data") if mode == "fsdp" else P()), new_w.sharding
        grad = jax.grad(lambda w_: jnp.mean((XS[:8] @ w_.T - YS[:8]) ** 2))(wv)
        np.testing.assert_allclose(np.asarray(jax.tree.leaves(want)[0]), wv - 0.1 * grad,
                                   rtol=1e-5, atol=1e-6)

    print("RESULTS " + json.dumps(RESULTS))
    """
)


@pytest.fixture(scope="module", autouse=True)
def devices():
    """Starts the 4-device script before the first test, so it runs beside the others."""
    d = BackgroundDevices(DEVICE_SCRIPT)
    yield d
    d.close()


DEVICE_CHECKS = [
    "compile_mesh_replicated_and_fsdp",
    "holding_parameters_across_many_fit_steps",
    "set_data_parallel_zero_takes_every_device",
    "evaluate_and_parameters_of_a_sharded_model",
    "train_100_steps_equals_one_device",
    "files_and_checkpoints_cross_between_4_devices_and_1",
    "a_batch_that_does_not_divide_says_what_divides",
    "a_mesh_without_the_data_axis_is_named",
    "more_devices_than_the_run_has_is_named",
    "graph_data_parallel_training_step",
]

RNG = np.random.default_rng(13)
XS = RNG.normal(size=(8, 4)).astype(np.float32)
YS = RNG.normal(size=(8, 3)).astype(np.float32)


def _mlp() -> Model:
    x = Input()
    return Model(x, Dense(3, name="o")(ReLU()(Dense(8, name="h")(x))))


# -- mixed precision --------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_parameters_state_and_loss_stay_float32(precision):
    m = _mlp()
    m.compile(XS, loss="mse", minimizer=optax.adam(1e-2), precision=precision)
    losses = [m.fit(XS, YS) for _ in range(3)]
    assert all(np.asarray(v).dtype == np.float32 for v in losses)
    assert all(np.asarray(v).dtype == np.float32 for v in m.parameters().values())
    state = jax.tree.leaves(m.engine.optimizer_state("t-h-0-0"))
    assert state and all(np.asarray(a).dtype in (np.float32, np.int32) for a in state)
    assert np.asarray(m.evaluate(XS)).dtype == np.float32


def test_bfloat16_training_stays_close_to_float32():
    """Same start, 5 SGD steps: parameters within bfloat16's precision of float32's."""
    runs = []
    for precision in (None, "bfloat16"):
        m = _mlp()
        m.compile(XS, loss="mse", minimizer=optax.sgd(0.05), precision=precision)
        if runs:
            m.set_parameters(runs[0][1])
        start = m.parameters()
        for _ in range(5):
            m.fit(XS, YS)
        runs.append((m.parameters(), start))
    for k, v in runs[0][0].items():
        np.testing.assert_allclose(np.asarray(runs[1][0][k]), np.asarray(v), rtol=0.05, atol=0.02)


def test_the_precision_pass_inserts_conversions_by_the_policy():
    """Matmul in bfloat16; softmax cross-entropy and the mean in float32; outputs keep
    their types; values close to the float32 graph."""
    b = GraphBuilder()
    x, w = b.input((4, 6), name="x"), b.input((5, 6), name="w")
    label = b.input((4,), np.int32, name="label")
    logits = b.exec(ops.gemm(transpose_b=True), x, w)
    loss, _ = b.exec(ops.softmax_crossentropy(), logits, label)
    mean = b.exec(ops.reduce_mean(axes=(0, 1)), loss)
    g = b.build([mean, logits])
    low = cast_precision(g, "bfloat16")
    kinds = [n.cmd.name for n in low.nodes]
    assert "datatype_conversion" in kinds
    by_cmd = {n.cmd.name: low.symbols[n.outputs[0]].dtype for n in low.nodes}
    assert np.dtype(by_cmd["gemm"]) == jnp.bfloat16
    assert np.dtype(by_cmd["softmax_crossentropy"]) == np.float32
    assert np.dtype(by_cmd["reduce_mean"]) == np.float32
    assert [low.symbols[s].dtype for s in low.outputs] == [g.symbols[s].dtype for s in g.outputs]
    args = (RNG.normal(size=(4, 6)).astype(np.float32), RNG.normal(size=(5, 6)).astype(np.float32),
            np.array([0, 1, 4, 2], np.int32))  # fmt: skip
    for a, b_ in zip(interpret(low, *args), interpret(g, *args)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b_), rtol=3e-2, atol=3e-2)


def test_an_unknown_precision_names_the_choices():
    with pytest.raises(FnncError, match=r"bfloat16.*float16"):
        _mlp().compile(XS, loss="mse", minimizer=optax.sgd(0.1), precision="float8")


def test_float16_turns_dynamic_loss_scaling_on_and_bfloat16_does_not():
    m16, mb16 = _mlp(), _mlp()
    m16.compile(XS, loss="mse", minimizer=optax.sgd(0.1), precision="float16")
    mb16.compile(XS, loss="mse", minimizer=optax.sgd(0.1), precision="bfloat16")
    assert m16.loss_scale is not None and m16.loss_scale.scale > 1
    assert mb16.loss_scale is None


def _scaled(initial: float, growth: int) -> Model:
    m = _mlp()
    m.compile(XS, loss="mse", minimizer=optax.adam(1e-2), precision="float16",
              loss_scale=LossScale(initial=initial, growth_interval=growth))  # fmt: skip
    return m


def test_the_scale_doubles_after_n_good_steps():
    m = _scaled(1024.0, 3)
    seen = []
    for _ in range(7):
        m.fit(XS, YS)
        seen.append((m.loss_scale.scale, m.loss_scale.good_steps))
    assert seen == [(1024.0, 1), (1024.0, 2), (2048.0, 0), (2048.0, 1), (2048.0, 2),
                    (4096.0, 0), (4096.0, 1)]  # fmt: skip


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nan_or_inf_gradient_skips_the_step_and_halves_the_scale(bad):
    """NNC's fp16 training: on Inf/NaN the update is skipped (parameters and Adam state
    bitwise unchanged) and the scale halves."""
    m = _scaled(1024.0, 100)
    m.fit(XS, YS)
    before = {k: np.asarray(v).copy() for k, v in m.parameters().items()}
    adam = [np.asarray(a).copy() for a in jax.tree.leaves(m.engine.optimizer_state("t-h-0-0"))]
    xs = XS.copy()
    xs[0, 0] = bad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.fit(xs, YS)
    assert m.loss_scale.scale == 512.0 and m.loss_scale.good_steps == 0, m.loss_scale
    for k, v in m.parameters().items():
        assert np.asarray(v).dtype == np.float32
        np.testing.assert_array_equal(np.asarray(v), before[k], err_msg=k)
    for a, b in zip(adam, jax.tree.leaves(m.engine.optimizer_state("t-h-0-0"))):
        np.testing.assert_array_equal(np.asarray(b), a)
    m.fit(XS, YS)  # a finite step updates again
    assert any(not np.array_equal(np.asarray(v), before[k]) for k, v in m.parameters().items())


# -- Pallas kernels at ragged sizes (interpret mode on CPU) ------------------------------
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_softmax_crossentropy_kernel_over_1001_classes(dtype):
    x = jnp.asarray(RNG.normal(size=(3, 1001)).astype(np.float32) * 3, dtype)
    label = np.array([0, 500, 1000], np.int32)
    loss, _ = jax.jit(lambda a: pallas_crossentropy.softmax_crossentropy(a, label))(x)
    grad = jax.jit(
        jax.grad(
            lambda a: (
                pallas_crossentropy.softmax_crossentropy(a, label)[0].astype(jnp.float32).sum()
            )
        )
    )(x)
    x64 = np.asarray(x.astype(jnp.float32), np.float64)
    top = x64.max(-1, keepdims=True)
    lse = np.log(np.exp(x64 - top).sum(-1)) + top[:, 0]
    want = lse - x64[np.arange(3), label]
    soft = np.exp(x64 - lse[:, None])
    soft[np.arange(3), label] -= 1.0
    tol = 1e-5 if dtype == jnp.float32 else 1e-2 * np.abs(want).max()
    assert loss.shape == (3, 1) and grad.shape == (3, 1001)
    np.testing.assert_allclose(np.asarray(loss, np.float64)[:, 0], want, atol=tol)
    np.testing.assert_allclose(
        np.asarray(grad, np.float64), soft, atol=1e-5 if dtype == jnp.float32 else 4e-3
    )


def test_attention_kernel_67_queries_over_45_keys():
    q = RNG.normal(size=(1, 67, 1, 8)).astype(np.float32)
    k = RNG.normal(size=(1, 45, 1, 8)).astype(np.float32)
    v = RNG.normal(size=(1, 45, 1, 8)).astype(np.float32)
    ct = RNG.normal(size=(1, 67, 1, 8)).astype(np.float32)

    def reference(q, k, v):  # the default scale is 1 / sqrt(head dim)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8.0)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)

    kernel = pallas_attention.scaled_dot_product_attention
    np.testing.assert_allclose(np.asarray(jax.jit(kernel)(q, k, v)), reference(q, k, v), atol=2e-5)
    got = jax.jit(jax.grad(lambda *a: (kernel(*a) * ct).sum(), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(lambda *a: (reference(*a) * ct).sum(), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-5)


# -- 4 virtual CPU devices ------------------------------------------------------------------
@pytest.mark.parametrize("name", DEVICE_CHECKS)
def test_on_four_devices(devices, name):
    """Each check of DEVICE_SCRIPT (data parallel, FSDP, files, errors, graph shardings)."""
    results = devices.results()
    assert results.get(name) == "ok", results.get(name, f"{name} did not run")
