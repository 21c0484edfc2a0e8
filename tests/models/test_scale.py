"""Data-parallel and FSDP models on 1, 2 and 4 virtual CPU devices equal one device.

The device count is fixed when JAX starts, so the multi-device checks run in one
subprocess (``XLA_FLAGS=--xla_force_host_platform_device_count=4``); checkpoints cross
between it (4 devices) and this process (1 device) both ways.
"""

from __future__ import annotations

import json
import os
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

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    env["JAX_PLATFORMS"] = "cpu"
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


def test_one_device_mesh_trains_and_scalar_batch_errors():
    m = _model()
    m.compile(np.zeros((6, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1),
              mesh=jax.make_mesh((1,), ("data",)), parameter_sharding="fsdp")  # fmt: skip
    loss = m.fit(np.ones((6, 3), np.float32), np.zeros((6, 2), np.float32))
    assert np.isfinite(float(loss))
    with pytest.raises(ShapeError, match=r"model .* fit: target 0 has a batch of 0 rows"):
        m.fit(np.ones((6, 3), np.float32), np.float32(0))
