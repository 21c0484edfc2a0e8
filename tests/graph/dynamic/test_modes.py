"""Memoisation, no_grad and lazy mode."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from fnnc import config, ops
from fnnc.errors import BackendError
from fnnc.graph import DynamicGraph
from tests.helpers import assert_close, rand

F32 = np.float32


def _version(v):
    return v._slot.version


def test_memo_reuses_pure_commands_on_the_same_versions() -> None:
    dg = DynamicGraph()
    x = dg.variable(rand((3,)))
    a, b = dg.exec(ops.ewexp(), x), dg.exec(ops.ewexp(), x)
    assert _version(a) is _version(b) and dg.num_nodes == 1
    assert a.label != b.label  # two variables, one shared version: errors tell them apart
    dg.set(x, rand((3,), seed=9))
    c = dg.exec(ops.ewexp(), x)
    assert _version(c) is not _version(a)
    np.testing.assert_allclose(c.numpy(), np.exp(rand((3,), seed=9)), rtol=1e-6)
    with dg.no_grad():
        d = dg.exec(ops.ewexp(), x)
    assert _version(d) is not _version(c) and not d.requires_grad


def test_memo_is_off_for_random_commands_and_when_asked() -> None:
    dg = DynamicGraph()
    key = dg.constant(np.array([0, 1], np.uint32))
    cmd = ops.random_uniform(shape=(2,))
    assert _version(dg.exec(cmd, key)) is not _version(dg.exec(cmd, key))
    dg = DynamicGraph(memo=False)
    x = dg.variable(rand((3,)))
    assert _version(dg.exec(ops.ewexp(), x)) is not _version(dg.exec(ops.ewexp(), x))


def test_cached_plans_follow_command_values_specs_and_config() -> None:
    """exec finds its plan by the command's identity and the inputs' specs: an equal
    command made apart, the same command on new shapes, a view, and a configuration
    changed after the plan was cached must each still run what they ask for."""
    dg = DynamicGraph(memo=False)
    x, y = rand((4, 4)), rand((2, 3), seed=1)
    vx, vy = dg.variable(x), dg.variable(y)
    first, twin = ops.tanh(), ops.tanh()
    for cmd in (first, twin, first):
        assert_close(dg.exec(cmd, vx).numpy(), np.tanh(x))
    assert_close(dg.exec(first, vy).numpy(), np.tanh(y))
    assert_close(dg.exec(first, vx[1:3, :2]).numpy(), np.tanh(x[1:3, :2]))
    assert_close(dg.exec(ops.ewsum(), vx, vx).numpy(), 2 * x)
    forced = config.override(backend_per_command={"tanh": "no-such-backend"})
    with forced, pytest.raises(BackendError, match="no-such-backend"):
        dg.exec(first, vx)
    assert_close(dg.exec(first, vx).numpy(), np.tanh(x))


def test_no_grad_records_nothing() -> None:
    dg = DynamicGraph()
    x = dg.variable(rand((3,)))
    with dg.no_grad():
        y = (x * 2.0).sum()
    assert dg.num_nodes == 0 and not y.requires_grad
    z = (x * 2.0).sum()
    assert dg.num_nodes == 2 and z.requires_grad


def test_lazy_runs_at_a_sync_point_as_one_program() -> None:
    dg = DynamicGraph(lazy=True)
    x = dg.constant(rand((4, 4)))
    h = x
    for _ in range(5):
        h = dg.exec(ops.tanh(), h @ x)
    assert _version(h).value is None and dg.num_nodes == 10
    before = dg.num_compiled
    want = rand((4, 4))
    for _ in range(5):
        want = np.tanh(want @ rand((4, 4)))
    assert_close(h.numpy(), want, rtol=1e-5)
    assert dg.num_compiled == before + 1
    assert dg.num_nodes == 0  # constants only: nothing left to differentiate


def test_lazy_and_eager_train_alike() -> None:
    results = []
    for lazy in (False, True):
        dg = DynamicGraph(lazy=lazy)
        w = dg.variable(rand((3, 2), seed=1), name="w")
        opt = optax.adam(0.1)
        for step in range(4):
            x = dg.constant(rand((5, 3), seed=step))
            loss = dg.exec(ops.relu(), x @ w).sum()
            dg.backward(loss, [w])
            dg.apply_gradients(opt, [w])
        results.append((w.numpy(), loss.numpy()))
    assert_close(results[0], results[1], rtol=1e-5)


def test_lazy_drops_dead_work_and_checks_shapes_at_once() -> None:
    dg = DynamicGraph(lazy=True)
    x = dg.variable(rand((2, 3)))
    dead = dg.exec(ops.ewexp(), x)
    dg.free(dead)
    y = dg.exec(ops.ewsum(), x, x)
    np.testing.assert_allclose(y.numpy(), 2 * rand((2, 3)), rtol=1e-6)
    try:
        dg.exec(ops.gemm(), x, x)
    except ValueError as e:
        assert "gemm" in str(e)
    else:
        raise AssertionError("lazy exec must check shapes when recording")


@pytest.mark.parametrize("lazy", [False, True])
def test_fast_and_general_paths_agree_for_any_number_of_inputs(lazy: bool) -> None:
    """exec has one fast path (whole live variables, a planned command) for any number
    of inputs and one general path (arrays, views, a first use): a command gives the
    same result and the same recorded gradient either way."""
    dg = DynamicGraph(lazy=lazy)
    xs = [rand((2, 3), seed=i) for i in range(4)]
    vs = [dg.variable(x) for x in xs]
    view = dg.variable(np.concatenate([xs[0], xs[1]]))[:2]
    for n in (1, 2, 3, 4):
        want = sum(xs[:n])
        for _ in range(2):  # the first call plans (general path), the second is fast
            assert_close(dg.exec(ops.ewsum(), *vs[:n]).numpy(), want)
        mixed = [view, *vs[1 : n - 1], xs[n - 1]] if n > 1 else [view]
        assert_close(dg.exec(ops.ewsum(), *mixed).numpy(), want)
    f = dg.exec(ops.ewprod(), vs[0], vs[1], vs[2]).sum()
    dx = dg.backward(f, [vs[0]])[0].numpy()
    assert_close(dx, xs[1] * xs[2])


def test_memo_covers_the_fast_path_with_three_inputs() -> None:
    dg = DynamicGraph()
    a, b, c = (dg.variable(rand((2,), seed=i)) for i in range(3))
    first, again = dg.exec(ops.ewsum(), a, b, c), dg.exec(ops.ewsum(), a, b, c)
    assert _version(first) is _version(again)
    assert _version(dg.exec(ops.ewsum(), a, c, b)) is not _version(first)


def test_dynamic_graph_is_a_plain_class() -> None:
    """Every method of DynamicGraph is defined in its class body (none is assigned
    from the helper modules it delegates to)."""
    for name, attr in vars(DynamicGraph).items():
        fn = getattr(attr, "fget", None) or getattr(attr, "__func__", None) or attr
        fn = getattr(fn, "__wrapped__", fn)  # no_grad's contextmanager
        if callable(fn):
            assert fn.__qualname__ == f"DynamicGraph.{name}", name


@pytest.mark.parametrize("lazy", [False, True])
def test_a_no_grad_result_is_a_constant_of_the_gradient(lazy: bool) -> None:
    # lazy mode records the no_grad command to run it later; no gradient flows through
    # it: d/dx sum(c * x) = c, as jax.grad with c = stop_gradient(2 x)
    dg = DynamicGraph(lazy=lazy)
    x = dg.variable(F32([1.0, 2.0, 3.0]), name="x")
    with dg.no_grad():
        c = x * 2.0
    (dx,) = dg.backward((c * x).sum(), [x])
    np.testing.assert_allclose(dx.numpy(), [2.0, 4.0, 6.0])
