"""Pipelined Repeat (``Repeat(..., pipeline=Pipeline(stages, microbatches))``) trains as
the plain Repeat (one scan), in process on one device and, in one subprocess, on 4
virtual CPU devices with meshes ("stage": 2, "data": 2), ("stage": 4) and 2x2 FSDP,
each device holding ``1 / stages`` of each stacked parameter and of its momentum."""

from __future__ import annotations

import textwrap

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from fnnc.models import Dense, Input, Model, ModelError, Pipeline, ReLU, Repeat, Sequential
from tests.helpers import run_on_cpu_devices


def make(pipeline: Pipeline | None = None, n: int = 4) -> Model:
    """Dense in, ``n`` MLP blocks (pipelined or one scan), Dense out."""
    x = Input()

    def mlp():
        return Sequential([Dense(16, name="up"), ReLU(), Dense(8, name="down")], name="mlp")

    blocks = Repeat(mlp, n, name="blocks", pipeline=pipeline)
    return Model(x, Dense(2, name="out")(blocks(Dense(8, name="in")(x))))


RNG = np.random.default_rng(0)
XS = RNG.normal(size=(8, 3)).astype(np.float32)
YS = RNG.normal(size=(8, 2)).astype(np.float32)
UP, DOWN = "t-blocks-0-mlp-[0:4]-up-0-0", "t-blocks-0-mlp-[0:4]-down-0-0"


def trained(pipeline=None, steps=3, mesh=None, sharding=None) -> tuple[Model, list[float]]:
    m = make(pipeline)
    m.compile(XS, loss="mse", minimizer=optax.sgd(0.05, momentum=0.9), mesh=mesh,
              parameter_sharding=sharding)  # fmt: skip
    return m, [float(m.fit(XS, YS)) for _ in range(steps)]


SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np, optax
    from jax.sharding import PartitionSpec as P
    from fnnc.models import ModelError, Pipeline
    from tests.models.test_pipeline_model import DOWN, UP, XS, make, trained
    assert jax.device_count() == 4, jax.devices()

    ref, ref_losses = trained()
    want = ref.parameters()
    cases = [((2, 2), ("stage", "data"), None, 2, P("stage")),
             ((4,), ("stage",), "pipeline", 4, P("stage")),
             ((2, 2), ("stage", "data"), "fsdp", 2, P("stage", "data"))]
    for shape, names, sharding, stages, spec in cases:
        mesh = jax.make_mesh(shape, names)
        m, losses = trained(Pipeline(stages, 4), mesh=mesh, sharding=sharding)
        where = str((shape, sharding))
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, err_msg=where)
        for k, v in m.parameters().items():
            np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-5, err_msg=k + where)
        m.engine._sync_live()
        sizes = dict(m.engine.parallel.mesh.shape)
        for pid in (UP, DOWN):
            v = m.engine.values[pid]
            momentum = [a for a in jax.tree.leaves(m.engine.store.all_states(pid)) if a.ndim]
            assert len(momentum) == 1, (pid, momentum)
            for a in (v, momentum[0]):
                assert a.sharding.spec == spec, (pid, where, a.sharding.spec)
                split = [sizes[e] if e else 1 for e in (*spec, *[None] * (a.ndim - len(spec)))]
                shard = tuple(n // s for n, s in zip(a.shape, split))
                assert shard[0] == 4 // stages, (pid, shard)
                assert all(s.data.shape == shard for s in a.addressable_shards), (pid, where)
        assert m.engine.values["t-in-0-0"].sharding.spec == (P("data") if sharding == "fsdp"
                                                            else P())
        fit = next(p for key, p in m.engine._programs.items() if key[0] == "fit")
        assert "collective-permute" in fit.program.compiled_text(), where
        if sharding is None:
            out = m.evaluate(XS)
            np.testing.assert_allclose(out, ref.evaluate(XS), rtol=1e-5, atol=1e-5)

    # evaluate / backward / apply_gradients on the 2x2 mesh equal one device
    def stepped(mesh=None):
        m = make(Pipeline(2, 4))
        m.compile(XS, loss="mse", minimizer=optax.sgd(0.05, momentum=0.9), mesh=mesh)
        out = m.evaluate(XS, is_test=False, requires_grad=True)
        m.backward([np.ones_like(np.asarray(out))])
        m.apply_gradients()
        return m
    one, two = stepped(), stepped(jax.make_mesh((2, 2), ("stage", "data")))
    for k, v in two.parameters().items():
        np.testing.assert_allclose(v, one.parameters()[k], rtol=1e-5, atol=1e-6, err_msg=k)
    two.engine._sync_live()
    assert two.engine.values[UP].sharding.spec == P("stage")
    assert [a.sharding.spec for a in jax.tree.leaves(two.engine.store.all_states(UP))
            if a.ndim] == [P("stage")]

    try:  # 2 stages do not spread over 4 devices
        make(Pipeline(2, 4)).compile(XS, loss="mse", minimizer=optax.sgd(0.1),
                                     mesh=jax.make_mesh((4,), ("stage",)),
                                     parameter_sharding="pipeline")
        raise AssertionError("no error")
    except ModelError as e:
        assert "stages=2" in str(e) and "4 devices of mesh axis 'stage'" in str(e), e
    print("OK")
    """
)


def test_pipelined_training_on_4_devices_matches_one_device():
    run_on_cpu_devices(SCRIPT)


def test_pipelined_repeat_trains_as_the_plain_repeat_on_one_device():
    ref, ref_losses = trained()
    m, losses = trained(Pipeline(4, 2))  # (2, 4) runs in the 4-device test
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    want = ref.parameters()
    assert sorted(m.parameters()) == sorted(want)
    for k, v in m.parameters().items():
        np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-5, err_msg=k)
    np.testing.assert_allclose(m.evaluate(XS), ref.evaluate(XS), rtol=1e-5, atol=1e-5)
    fit = next(p for key, p in m.engine._programs.items() if key[0] == "fit")
    assert "pipeline[stages=4; microbatches=2" in str(fit.program.graph)


def test_predict_score_and_validation_take_batches_of_any_size():
    """11 rows in batches of 8 for microbatches=4: the last batch (3 rows) is padded to 4
    and cut back, so every row's output is the plain Repeat's (rows are independent)."""
    plain, piped = make(), make(Pipeline(2, 4))
    for m in (plain, piped):
        m.compile(XS, loss="mse", minimizer=optax.sgd(0.05))
    piped.set_parameters(plain.parameters())
    xs = np.random.default_rng(5).normal(size=(11, 3)).astype(np.float32)
    ys = np.random.default_rng(6).normal(size=(11, 2)).astype(np.float32)
    want = plain.predict(xs, batch_size=8)
    np.testing.assert_allclose(piped.predict(xs, batch_size=8), want, rtol=1e-5, atol=1e-6)
    got = piped.score((xs, ys), batch_size=8)
    np.testing.assert_allclose(got["loss"], plain.score((xs, ys), batch_size=8)["loss"], 1e-5)
    history = piped.train((XS, YS), epochs=1, batch_size=8, validation=(xs, ys), verbose=False)
    assert np.isfinite(history["val_loss"][-1])
    with pytest.raises(ModelError, match=r"has 6 rows.*predict and score pad"):
        piped.evaluate(xs[:6])


def test_export_takes_any_batch_and_leaves_the_pipeline_in_place():
    """The exported one-sample graph (vmapped over a symbolic batch) cannot split its row
    into microbatches: it builds the pipelined Repeat as the plain one, which computes
    the same rows; the model trains pipelined after."""
    plain, piped = make(), make(Pipeline(2, 4))
    for m in (plain, piped):
        m.compile(XS, loss="mse", minimizer=optax.sgd(0.05))
    piped.set_parameters(plain.parameters())
    exported = piped.export()
    xs = np.random.default_rng(7).normal(size=(5, 3)).astype(np.float32)
    for rows in (xs, xs[:1], XS):
        want = plain.evaluate(rows)
        np.testing.assert_allclose(exported.call(rows), want, rtol=1e-5, atol=1e-6)
    piped.fit(XS, YS)
    fit = next(p for key, p in piped.engine._programs.items() if key[0] == "fit")
    assert "pipeline[stages=2; microbatches=4" in str(fit.program.graph)


def test_one_device_stage_mesh_lays_stacks_on_the_stage_axis():
    mesh = jax.make_mesh((1,), ("stage",))
    m, _ = trained(Pipeline(2, 4), steps=1, mesh=mesh, sharding="pipeline")
    m.engine._sync_live()
    assert m.engine.parallel.mesh.axis_names == ("stage", "data")  # "data" of size 1 added
    specs = {k: v.sharding.spec for k, v in m.engine.values.items()}
    assert specs[UP] == specs[DOWN] == P("stage"), specs
    assert specs["t-in-0-0"] == P()
    momentum = [a for a in jax.tree.leaves(m.engine.store.all_states(UP)) if a.ndim]
    assert [a.sharding.spec for a in momentum] == [P("stage")]


def test_bad_pipelines_name_the_layer_and_what_to_change():
    args = dict(loss="mse", minimizer=optax.sgd(0.1))
    with pytest.raises(ModelError, match=r"layer .*blocks.*: 4 blocks .* stages=3"):
        make(Pipeline(3, 2))
    with pytest.raises(ModelError, match=r"layer .*blocks.*\[6, 8\] has 6 rows.*microbatches=4"):
        make(Pipeline(2, 4)).compile(np.zeros((6, 3), np.float32), **args)
    with pytest.raises(ModelError, match=r"microbatches must be an int >= 1, got 0"):
        Pipeline(2, 0)
    with pytest.raises(ModelError, match=r"pipeline must be a fnnc.models.Pipeline"):
        Repeat(lambda: Dense(4), 2, pipeline=(2, 2))
    with pytest.raises(
        ModelError, match=r"pipelines its blocks over mesh axis 'stage'.*\['data'\]"
    ):
        make(Pipeline(2, 4)).compile(XS, mesh=jax.make_mesh((1,), ("data",)), **args)
    with pytest.raises(ModelError, match=r"no axis 'data'.*parameter_sharding='pipeline'"):
        make(Pipeline(2, 4)).compile(XS, mesh=jax.make_mesh((1,), ("stage",)), **args)
