"""Derivatives of the Pallas kernels' derivatives (interpret mode on CPU): grad of grad
and Hessian-vector products of eager calls and compiled Programs equal the ``"xla"``
backend's; forward mode through a kernel is a BackendError naming it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.errors import BackendError
from fnnc.graph import GraphBuilder, compile
from tests.helpers import assert_close
from tests.ops.pallas.checks import small_cases

CASES = small_cases(np.float32)


def _args(specs, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in specs:
        if np.dtype(dtype) == np.bool_:
            out.append(jnp.asarray(rng.uniform(size=shape) > 0.3))
        elif np.issubdtype(dtype, np.integer):
            out.append(jnp.asarray(rng.integers(0, 7, shape).astype(dtype)))
        else:
            out.append(jnp.asarray(rng.uniform(-1, 1, shape).astype(dtype)))
    return out


def _second_order(cmd, args, backend):
    """Hessian-vector product and grad of grad of ``sum(sin(outputs))`` in the float
    inputs, the command forced onto ``backend`` (one jitted program: interpret mode)."""
    diff = [i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating)]

    def loss(*xs):
        full = list(args)
        for i, x in zip(diff, xs):
            full[i] = x
        outs = cmd(*full)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return sum(jnp.sum(jnp.sin(o.astype(jnp.float32))) for o in outs)

    grad = jax.grad(loss, argnums=tuple(range(len(diff))))
    xs = tuple(args[i] for i in diff)
    ts = tuple(jnp.cos(3 * x) for x in xs)

    @jax.jit
    def both(xs, ts):
        hvp = jax.jvp(lambda *y: grad(*y), xs, ts)[1]
        gg = jax.grad(lambda *y: sum(jnp.sum(g**2) for g in grad(*y)), argnums=(0,))(*xs)
        return hvp, gg

    with config.override(backend_per_command={cmd.name: backend}):
        assert (
            ops.select_backend(cmd, [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args], "cpu")
            == backend
        )
        return both(xs, ts)


@pytest.mark.parametrize("name", sorted(CASES))
def test_second_order_of_an_eager_call_equals_the_reference(name):
    cmd, specs = CASES[name]
    args = _args(specs)
    want = _second_order(cmd, args, "xla")
    got = _second_order(cmd, args, "pallas")
    # float32 sums in another order: errors scale with the largest entry (260 for gemm)
    atol = 1e-4 + 1e-5 * max(float(jnp.max(jnp.abs(w))) for w in jax.tree.leaves(want))
    assert_close(got, want, 2e-4, atol, what=f"{name}: second order, pallas vs xla")


def _program():
    b = GraphBuilder()
    x, w = b.input((4, 8), name="x"), b.input((16, 8), name="w")
    y = b.exec(ops.gemm(transpose_b=True), x, w, name="fc")
    z, _, _ = b.exec(ops.layer_norm(), y, name="ln")
    return b.build([z])


def test_hessian_of_a_program_on_kernels_equals_the_reference():
    graph = _program()
    x, w = _args([((4, 8), np.float32), ((16, 8), np.float32)])
    got = {}
    for backend in ("xla", "pallas"):
        with config.override(backend_per_command={"gemm": backend, "layer_norm": backend}):
            program = compile(graph)
            assert [b for _, _, b in program.backends] == [backend] * 2
            got[backend] = jax.hessian(lambda v: jnp.sum(jnp.sin(program(v, w))))(x)
    assert_close(got["pallas"], got["xla"], 1e-4, 1e-4, what="hessian of a Program")

    # and against plain JAX, written out
    def plain(v):
        y = v @ w.T
        mean = jnp.mean(y, -1, keepdims=True)
        z = (y - mean) / jnp.sqrt(jnp.var(y, -1, keepdims=True) + 1e-5)
        return jnp.sum(jnp.sin(z))

    assert_close(got["pallas"], jax.hessian(plain)(x), 1e-3, 1e-3, what="hessian vs JAX")


def test_forward_mode_through_a_kernel_names_it_and_the_way_out():
    cmd, specs = CASES["attention_causal_gqa"]
    q, k, v = _args(specs)
    loss = lambda q: jnp.sum(cmd(q, k, v) ** 2)
    with (
        config.override(backend_per_command={cmd.name: "pallas"}),
        pytest.raises(
            BackendError,
            match=r"scaled_dot_product_attention.*'pallas' backend.*"
            r"forward mode.*backend_per_command=\{\"scaled_dot_product_attention\": "
            r"\"xla\"\}.*FNNC_BACKEND=xla",
        ),
    ):
        jax.jvp(loss, (q,), (q,))
    with config.override(backend_per_command={cmd.name: "xla"}):
        _, t = jax.jvp(loss, (q,), (q,))
    assert np.isfinite(float(t))


def test_forward_mode_through_a_program_names_the_kernel_nodes():
    graph = _program()
    x, w = _args([((4, 8), np.float32), ((16, 8), np.float32)])
    with config.override(backend_per_command={"layer_norm": "pallas"}):
        program = compile(graph)
        with pytest.raises(BackendError, match=r"node 1 \(ln\) runs the 'pallas' backend"):
            jax.jvp(lambda v: program(v, w), (x,), (x,))
