"""Data-parallel and FSDP compile on 4 virtual CPU devices equals one device.

Each check runs in a subprocess: the device count is fixed when JAX starts
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``).
"""

from __future__ import annotations

import textwrap

import pytest

from fnnc import ops
from fnnc.errors import GraphError
from fnnc.graph import GraphBuilder, data_parallel
from tests.helpers import run_on_cpu_devices

SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np, optax
    from fnnc import ops
    from fnnc.graph import GraphBuilder, compile, data_parallel, minimize

    assert jax.device_count() == 4, jax.devices()
    b = GraphBuilder()
    x, y = b.input((16, 8), name="x"), b.input((16, 4), name="y")
    w1, w2 = b.input((12, 8), name="w1"), b.input((4, 12), name="w2")
    h = b.exec(ops.tanh(), b.exec(ops.gemm(transpose_b=True), x, w1))
    out = b.exec(ops.gemm(transpose_b=True), h, w2)
    diff = b.exec(ops.add(q=-1.0), out, y)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.mul(), diff, diff))
    step, layout = minimize(b.build([loss]), loss, [w1, w2], optax.adam(1e-2))
    rng = np.random.default_rng(0)
    params = [rng.normal(size=(12, 8)).astype(np.float32) * 0.3,
              rng.normal(size=(4, 12)).astype(np.float32) * 0.3]
    state = layout.init(params)
    data = [rng.normal(size=(16, n)).astype(np.float32) for n in (8, 4)]

    def run(program, steps):
        p, s = list(params), list(state)
        for _ in range(steps):
            outs = program(*p, *s, *data)
            p, s, loss = layout.split(outs)
        return p, s, loss

    single = compile(step)
    mesh = jax.make_mesh((4,), ("data",))
    for mode in ("replicated", "fsdp"):
        plan = data_parallel(step, mesh, layout=layout, parameter_sharding=mode)
        program = compile(step, shardings=plan)
        for steps in (1, 20):
            want = run(single, steps)
            got = run(program, steps)
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
                np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
        p, _, loss = run(program, 1)
        specs = [tuple(a.sharding.spec) for a in p]
        if mode == "replicated":
            assert all(s == () for s in specs), specs
        else:
            assert specs == [("data",), ("data",)], specs
        assert len(loss.sharding.device_set) == 4
    # a hundred queued steps without blocking (XLA:CPU's all-reduce must not deadlock)
    p, s = list(params), list(state)
    for _ in range(100):
        p, s, loss = layout.split(program(*p, *s, *data))
    from fnnc.graph.compile import IN_FLIGHT
    assert len(program._in_flight) == IN_FLIGHT  # the older calls were waited for
    jax.block_until_ready(loss)
    # a batch that does not divide by the devices says what divides
    from fnnc.errors import ShapeError
    b = GraphBuilder()
    x6, w = b.input((6, 3), name="x"), b.input((4, 3), name="w")
    g6 = b.build([b.exec(ops.gemm(transpose_b=True), x6, w)])
    try:
        data_parallel(g6, mesh, batch=["x"])
        raise AssertionError("no error")
    except ShapeError as e:
        assert "6 rows" in str(e) and "multiple of 4" in str(e), e
    print("OK")
    """
)


SCALED = textwrap.dedent(
    """
    import jax, numpy as np, optax
    from fnnc import ops
    from fnnc.graph import GraphBuilder, compile, data_parallel, interpret
    from fnnc.graph.passes.loss_scale import LossScale, minimize_scaled

    assert jax.device_count() == 4, jax.devices()
    b = GraphBuilder()
    x, w, y = b.input((8, 3), name="x"), b.input((2, 3), name="w"), b.input((8, 2), name="y")
    diff = b.exec(ops.add(q=-1.0), b.exec(ops.gemm(transpose_b=True), x, w), y)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.mul(), diff, diff))
    step, layout = minimize_scaled(b.build([loss]), loss, [w], optax.adam(1e-2),
                                   scaling=LossScale(growth_interval=1))
    rng = np.random.default_rng(0)
    wv = rng.normal(size=(2, 3)).astype(np.float32)
    args = [wv, *layout.init([wv]), rng.normal(size=(8, 3)).astype(np.float32),
            rng.normal(size=(8, 2)).astype(np.float32), *LossScale().init()]
    want = interpret(step, *args)
    mesh = jax.make_mesh((4,), ("data",))
    for mode in ("replicated", "fsdp"):
        plan = data_parallel(step, mesh, layout=layout, parameter_sharding=mode)
        names = [step.symbols[i].name for i in step.inputs]
        split = [n for n, s in zip(names, plan.inputs) if s == jax.P("data")]
        assert split == ["x", "y"], (names, plan.inputs)
        assert plan.inputs[-2:] == plan.outputs[-2:] == (jax.P(), jax.P()), plan
        got = compile(step, shardings=plan)(*args)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        assert float(got[-2]) == 2.0**16  # one finite step at growth_interval=1: doubled
    print("OK")
    """
)


def _on_four_cpu_devices(script: str) -> None:
    run_on_cpu_devices(script, devices=4, timeout=300)


def test_data_parallel_and_fsdp_match_one_device():
    _on_four_cpu_devices(SCRIPT)


def test_a_scaled_step_splits_only_its_batch_and_matches_one_device():
    # the default batch leaves minimize_scaled's loss_scale and good_steps replicated
    _on_four_cpu_devices(SCALED)


def _graph():
    b = GraphBuilder()
    x, w = b.input((6, 3), name="x"), b.input((4, 3), name="w")
    return b.build([b.exec(ops.gemm(transpose_b=True), x, w)])


def test_bad_axis_and_batch_name_what_to_change():
    import jax

    mesh = jax.make_mesh((1,), ("data",))
    with pytest.raises(GraphError, match=r"no axis 'batch' \(its axes: \['data'\]\)"):
        data_parallel(_graph(), mesh, axis="batch")
    with pytest.raises(GraphError, match="no input named 'z'"):
        data_parallel(_graph(), mesh, batch=["z"])
    with pytest.raises(GraphError, match="parameter_sharding"):
        data_parallel(_graph(), mesh, parameter_sharding="zero")
