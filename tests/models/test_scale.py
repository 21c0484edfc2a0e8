"""Data-parallel and FSDP models on 1, 2 and 4 virtual CPU devices equal one device.

The device count is fixed when JAX starts, so the multi-device checks run in one
subprocess (``XLA_FLAGS=--xla_force_host_platform_device_count=4``); checkpoints cross
between it (4 devices) and this process (1 device) both ways.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import numpy as np
import optax
import pytest

from fnnc.errors import ModelError, ShapeError
from fnnc.io import Checkpoints
from fnnc.models import BatchNorm, Dense, Input, Model, ReLU
from tests.helpers import run_on_cpu_devices, subprocess_env

COMMON = textwrap.dedent(
    """
    import numpy as np, optax
    from fnnc.models import BatchNorm, Dense, Input, Model, ReLU

    def make():
        x = Input()
        h = BatchNorm(name="bn")(ReLU()(Dense(12, name="h")(x)))
        return Model(x, Dense(4, name="out")(h), name="mlp")

    rng = np.random.default_rng(0)
    XS = rng.normal(size=(16, 8)).astype(np.float32)
    YS = rng.normal(size=(16, 4)).astype(np.float32)

    def trained(steps, n=None, mode="replicated"):
        m = make()
        if n is not None:
            m.set_data_parallel(n, parameter_sharding=mode)
        m.compile(XS, loss="mse", minimizer=optax.adam(1e-2))
        for _ in range(steps):
            m.fit(XS, YS)
        return m
    """
)

SCRIPT = COMMON + textwrap.dedent(
    """
    import json, sys, jax
    from fnnc.io import Checkpoints
    assert jax.device_count() == 4, jax.devices()
    for steps in (1, 20):
        want = trained(steps).parameters()
        for n in (1, 2, 4):
            for mode in ("replicated", "fsdp"):
                m = trained(steps, n, mode)
                for k, v in m.parameters().items():
                    np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-5, err_msg=k)
                    assert len(v.sharding.device_set) == 1  # full arrays on one device
                specs = {k: tuple(v.sharding.spec) for k, v in m.engine.values.items()}
                if mode == "replicated":
                    assert all(s == () for s in specs.values()), specs
                if mode == "fsdp" and n == 4:
                    assert specs["t-mlp-0-h-0-0"] == ("data",), specs          # [12, 8]
                    assert specs["t-mlp-0-out-0-0"] == ("data",), specs        # [4, 12]
                    assert specs["t-mlp-0-out-0-1"] == ("data",), specs        # [4]
                    assert specs["r-mlp-0-bn-0-0"] == (), specs                # an internal
    def backward_applied(n=None, mode="replicated"):
        # evaluate, two backward calls (parameter gradients accumulate), apply; twice
        m = make()
        if n is not None:
            m.set_data_parallel(n, parameter_sharding=mode)
        m.compile(XS, loss="mse", minimizer=optax.adam(1e-2))
        input_grads = []
        for _ in range(2):
            m.evaluate(XS, is_test=False, requires_grad=True)
            input_grads += m.backward([YS]) + m.backward([YS * YS])
            grads = dict(m.engine.grads)
            m.apply_gradients()
        return m, input_grads, grads

    ref, ref_grads, _ = backward_applied()
    for mode in ("replicated", "fsdp"):
        m, input_grads, grads = backward_applied(4, mode)
        for k, v in m.parameters().items():
            np.testing.assert_allclose(v, ref.parameters()[k], rtol=1e-5, atol=1e-5, err_msg=k)
        for got, want in zip(input_grads, ref_grads):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
        kinds = {key[0]: p for key, p in m.engine._programs.items()}
        assert all(type(kinds[k].program).__name__ == "Placed" for k in ("backward", "apply"))
        w = "t-mlp-0-h-0-0"                                                # [12, 8]
        P = jax.sharding.PartitionSpec
        split = P("data") if mode == "fsdp" else P()
        adam = jax.tree.leaves(m.engine.store.all_states(w))
        assert grads[w].sharding.spec == split, grads[w].sharding
        assert m.engine.values[w].sharding.spec == split, m.engine.values[w].sharding
        assert [a.sharding.spec for a in adam if a.ndim] == [split, split], adam
        assert len(grads[w].sharding.device_set) == 4
    from fnnc.models.loss_scale import LossScale
    fp16 = []  # float16 with loss scaling: the scale state is replicated, steps agree
    for n in (None, 4):
        m = make()
        if n is not None:
            m.set_data_parallel(n, parameter_sharding="fsdp")
        m.compile(XS, loss="mse", minimizer=optax.adam(1e-2), precision="float16",
                  loss_scale=LossScale(initial=2.0**20, growth_interval=2))
        for _ in range(6):
            m.fit(XS, YS)
        fp16.append((m.loss_scale, m.parameters()))
    assert fp16[0][0] == fp16[1][0] and fp16[0][0].scale < 2.0**20, fp16[0][0]
    for k, v in fp16[1][1].items():
        np.testing.assert_allclose(v, fp16[0][1][k], rtol=1e-4, atol=1e-5, err_msg=k)
    m = trained(3, 4, "fsdp")
    Checkpoints(sys.argv[1]).save(3, m)
    m.write(sys.argv[1] + ".nnc")
    json.dump({k: np.asarray(v).tolist() for k, v in m.parameters().items()},
              open(sys.argv[1] + ".json", "w"))
    r = make(); r.set_data_parallel(4, parameter_sharding="fsdp")
    r.compile(XS, loss="mse", minimizer=optax.adam(1e-2))
    Checkpoints(sys.argv[2]).restore_into(r)       # written on 1 device
    r.fit(XS, YS)
    one = json.load(open(sys.argv[2] + ".json"))
    for k, v in r.parameters().items():
        np.testing.assert_allclose(v, one[k], rtol=1e-5, atol=1e-5, err_msg=k)
    assert r.engine.values["t-mlp-0-h-0-0"].sharding.spec == jax.sharding.PartitionSpec("data")
    try:
        r.fit(XS[:6], YS[:6])
        raise AssertionError("no error")
    except Exception as e:
        assert "input 0 has a batch of 6 rows" in str(e) and "multiple of 4" in str(e), e
    # a dataframe batched by itself: 4, 4, then a short last batch of 2 rows
    from fnnc.data import DataFrame
    from fnnc.errors import ShapeError
    s = make(); s.set_data_parallel(4)
    s.compile(XS[:4], loss="mse", minimizer=optax.sgd(0.1))
    try:
        s.train(DataFrame.from_arrays(x=XS[:10], y=YS[:10]).batch(4), verbose=False)
        raise AssertionError("no error")
    except ShapeError as e:
        assert str(e).startswith("train: epoch 0, batch 2: ") and "of 2 rows" in str(e), e
        assert "batch(..., drop_remainder=True)" in str(e) and "multiple of 4" not in str(e), e
    assert s.train_progress.step == 2
    s.train(DataFrame.from_arrays(x=XS[:10], y=YS[:10]).batch(4, drop_remainder=True),
            verbose=False)
    print("OK")
    """
)


def test_one_two_four_devices_match_one_device_and_checkpoints_cross(tmp_path):
    ns: dict = {}
    exec(COMMON, ns)
    one = ns["trained"](3)  # written on this 1-device process, restored on 4 devices
    Checkpoints(tmp_path / "one.ckpt").save(3, one)
    one.fit(ns["XS"], ns["YS"])
    with open(tmp_path / "one.ckpt.json", "w") as f:
        json.dump({k: np.asarray(v).tolist() for k, v in one.parameters().items()}, f)

    env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    four = str(tmp_path / "four.ckpt")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, four, str(tmp_path / "one.ckpt")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK" in done.stdout

    with open(four + ".json") as f:
        saved = json.load(f)
    for restore in ("checkpoint", "read"):
        m = ns["make"]()
        m.compile(ns["XS"], loss="mse", minimizer=optax.adam(1e-2))
        if restore == "checkpoint":
            Checkpoints(four).restore_into(m)
        else:
            m.read(four + ".nnc")
        for k, v in m.parameters().items():
            np.testing.assert_allclose(v, saved[k], rtol=1e-6, err_msg=k)


def _model():
    x = Input()
    return Model(x, Dense(2, name="fc")(ReLU()(BatchNorm(name="bn")(Dense(4)(x)))))


def test_bad_layouts_name_what_to_change():
    xs = np.zeros((6, 3), np.float32)
    with pytest.raises(ModelError, match=r"this run has 1 devices .* pass 0 for all or 1\.\.1"):
        _model().set_data_parallel(4)
    mesh = jax.make_mesh((1,), ("batch",))
    with pytest.raises(ModelError, match=r"no axis 'data' \(its axes: \['batch'\]\)"):
        _model().compile(xs, loss="mse", minimizer=optax.sgd(0.1), mesh=mesh)
    with pytest.raises(ModelError, match="parameter_sharding='zero'"):
        _model().set_data_parallel(1, parameter_sharding="zero")
    with pytest.raises(ModelError, match=r"must be a jax\.sharding\.Mesh"):
        _model().compile(xs, loss="mse", minimizer=optax.sgd(0.1), mesh="data")
    # the method called, not compile; a bool is no device count (True is not 1 device)
    with pytest.raises(ModelError, match=r"^set_data_parallel\(1\): parameter_sharding='fsdp2'"):
        _model().set_data_parallel(1, parameter_sharding="fsdp2")
    for flag in (True, False):
        with pytest.raises(ModelError, match=rf"^set_data_parallel\({flag}\): this run has 1 dev"):
            _model().set_data_parallel(flag)


def test_one_device_mesh_trains_and_scalar_batch_errors():
    m = _model()
    m.compile(np.zeros((6, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1),
              mesh=jax.make_mesh((1,), ("data",)), parameter_sharding="fsdp")  # fmt: skip
    loss = m.fit(np.ones((6, 3), np.float32), np.zeros((6, 2), np.float32))
    assert np.isfinite(float(loss))
    with pytest.raises(
        ShapeError, match=r"model .* fit: target 0 is a scalar float32, with no batch"
    ):
        m.fit(np.ones((6, 3), np.float32), np.float32(0))


class _Device:
    """A stand-in for a device of another process (only what the checks read)."""

    def __init__(self, id: int, process_index: int):
        self.id, self.process_index = id, process_index


def _devices(*per_process: int) -> list[_Device]:
    return [_Device(10 * p + i, p) for p, n in enumerate(per_process) for i in range(n)]


def _two_processes(monkeypatch, devices, other_rows=None):
    """Makes this process process 0 of 2; the other passes as many rows as this one,
    or ``other_rows`` (what the row-count all-gather of fnnc.models.processes sees)."""
    from jax.experimental import multihost_utils

    def allgather(x, tiled=False):
        other = np.asarray(x) if other_rows is None else np.full_like(x, other_rows)
        return np.stack([np.asarray(x), other])

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "devices", lambda: devices)
    monkeypatch.setattr(jax, "local_device_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)


def test_process_count_mismatches_name_what_to_change(monkeypatch):
    from jax.sharding import Mesh

    from fnnc.models.parallel import Parallel

    xs = np.zeros((6, 3), np.float32)
    foreign = Mesh(np.array(_devices(1, 1)), ("data",))  # built for a 2-process run
    with pytest.raises(ModelError, match=r"processes up to 1 .* this run has 1 process"):
        _model().compile(xs, loss="mse", minimizer=optax.sgd(0.1), mesh=foreign)

    _two_processes(monkeypatch, _devices(2, 2))  # 2 processes of 2 devices each
    with pytest.raises(ModelError, match=r"set_data_parallel\(3\): with 2 processes .* "
                       r"pass 0 \(all 4\), or start 1 or 3 processes"):  # fmt: skip
        _model().set_data_parallel(3)
    with pytest.raises(ModelError, match=r"set_data_parallel\(8\): this run has 4 devices"):
        _model().set_data_parallel(8)
    with pytest.raises(ModelError, match=r"processes \[0\] of 2.*\(not jax\.local_devices"):
        Parallel.of(jax.make_mesh((1,), ("data",)), "replicated")
    uneven = Mesh(np.array(_devices(2, 1)), ("data",))
    with pytest.raises(ModelError, match="2 of process 0, 1 of process 1; each process"):
        Parallel.of(uneven, "replicated")
    par = Parallel(Mesh(np.array(_devices(2, 2)), ("data",)))
    with pytest.raises(ShapeError, match=r"input 0 has a batch of 6 rows.* \(3 rows in each "
                       r"of 2 processes, 2 devices each\); give each process a batch that is "
                       r"a multiple of 2 \(a global batch that is a multiple of 4\)"):  # fmt: skip
        par.batch([np.zeros((3, 5), np.float32)], "fit")


def test_processes_passing_different_rows_name_each_count(monkeypatch):
    """The global batch is the local rows times the processes: a process passing other
    rows must get an error on every process (a real 2-process run in
    test_scale_processes.py), not a collective that aborts or hangs."""
    from jax.sharding import Mesh

    from fnnc.models.parallel import Parallel

    _two_processes(monkeypatch, _devices(2, 2), other_rows=4)
    par = Parallel(Mesh(np.array(_devices(2, 2)), ("data",)))
    want = r"^fit: the processes disagree on the rows of each input \(process 0: 2; process 1: 4\)"
    with pytest.raises(ShapeError, match=want):
        par.batch([np.zeros((2, 5), np.float32)], "fit")


def test_checkpoint_data_position_needs_the_same_process_count(tmp_path, monkeypatch):
    from fnnc.errors import CheckpointError
    from fnnc.models.batches import Progress

    m = _model_compiled()
    m.train_progress = Progress(epoch=0, batch=2, step=2, data={"shard": 2})
    Checkpoints(tmp_path / "mid.ckpt").save(2, m)  # one process, mid-epoch, a data position
    m.train_progress.data = None
    Checkpoints(tmp_path / "end.ckpt").save(2, m)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(CheckpointError, match=r"run of 1 process\(es\).* this run has 2. "
                       r"Restore it with 1 process\(es\)"):  # fmt: skip
        Checkpoints(tmp_path / "mid.ckpt").restore_into(_model_compiled())
    r = _model_compiled()
    Checkpoints(tmp_path / "end.ckpt").restore_into(r)  # no data position: any count
    assert r.train_progress.step == 2


def _model_compiled():
    m = _model()
    m.compile(np.zeros((6, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
    return m


LIVE = textwrap.dedent(
    """
    import jax, numpy as np, optax
    from fnnc.models import Dense, Sequential
    assert jax.device_count() == 4, jax.devices()
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    y = np.zeros((8, 8), np.float32)

    def trained(mode=None):
        m = Sequential([Dense(8, name="fc")])
        if mode:
            m.set_data_parallel(4, parameter_sharding=mode)
        m.compile(x, loss="mse", minimizer=optax.sgd(0.1))
        m.fit(x, y)
        return m

    want = trained().parameters()  # one device: the oracle for the values
    for mode in ("fsdp", "replicated"):
        m = trained(mode)
        live, gathered = m.parameters(gather=False), m.parameters()
        assert sorted(live) == sorted(gathered) == sorted(want)
        w = live["t-fc-0-0"]
        assert len(w.sharding.device_set) == 4, w.sharding
        shards = {tuple(s.data.shape) for s in w.addressable_shards}
        if mode == "fsdp":  # [8, 4] split along its first axis: a quarter per device
            assert w.sharding.spec[0] == "data" and shards == {(2, 4)}, (w.sharding, shards)
        else:
            assert w.sharding.is_fully_replicated and shards == {(8, 4)}, (w.sharding, shards)
        g = gathered["t-fc-0-0"]
        assert len(g.sharding.device_set) == 1, g.sharding  # the default gathers
        for k in want:
            np.testing.assert_allclose(np.asarray(live[k]), np.asarray(want[k]), rtol=1e-5,
                                       atol=1e-6, err_msg=k)
            np.testing.assert_array_equal(np.asarray(live[k]), np.asarray(gathered[k]))
    print("OK")
    """
)


def test_parameters_gather_false_gives_the_live_sharded_arrays():
    """``parameters(gather=False)`` hands back the engine's arrays as laid out on four
    devices (FSDP: a quarter of the weight per device; replicated: all of it on each),
    holding the values one device trains; the default gathers to one device."""
    run_on_cpu_devices(LIVE)
