"""NNC's null output gradient, held centrally by ``OpDef.backward``: a backward given no
output gradient at all (``None`` for every output, ``g = 0`` in ``ccv_nnc_cmd_exec``'s
inputs) computes the command's own derivative, as NNC's kernels read it
(``_ccv_nnc_ewsum_back``: "Set them to 1"). 54 hand-written backwards raised on it and
the derived ones took zeros. Oracle: ``jax.vjp`` of the reference forward with a ones
cotangent; a graph's ``backward`` pass, which passes ``None`` for an output no gradient
reaches, still adds nothing for it (oracle ``jax.grad``)."""

from __future__ import annotations

import importlib
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import ops
from fnnc.core.command import is_float
from fnnc.graph import GraphBuilder, interpret
from fnnc.graph.passes.backward import backward
from tests import ops as ops_tests

# The commands whose backward raised on None, then a derived backward (which took zeros),
# a multi-output one with an integer output, and the commands whose null gradient is not
# plain ones (NNC's: complex ones for CMUL, the loss only for a two-output loss).
NAMES = [
    "relu",
    "leaky_relu",
    "sigmoid",
    "tanh",
    "softplus",
    "swish",
    "gelu",
    "mish",
    "softmax",
    "log_softmax",
    "gemm",
    "convolution",
    "convolution_transpose",
    "reshape",
    "transpose",
    "format_transform",
    "concat",
    "slice",
    "index_select",
    "pad",
    "upsample",
    "masked_fill",
    "broadcast_to",
    "write_view",
    "ewsum",
    "ewprod",
    "ewdiv",
    "ewexp",
    "ewlog",
    "ewsqrt",
    "ewabs",
    "ewrsqrt",
    "ewexpm1",
    "ewlog1p",
    "ewerf",
    "ewerfc",
    "ewsin",
    "ewcos",
    "ewpow",
    "clamp",
    "select",
    "signed_sqrt",
    "mse",
    "smooth_l1",
    "avg_pool",
    "sum_pool",
    "embedding",
    "walsh_hadamard_transform",
    "rotate_half",
    "sharding_constraint",
    "scatter_add",
    "reduce_logsumexp",
    "fill_if_less_than",
    "roi_align",
    "swish_mul",
    "sort",
    "cmul",
    "softmax_crossentropy",
    "sigmoid_binary_crossentropy",
]


def _first_cases() -> dict:
    first: dict = {}
    for info in pkgutil.iter_modules(ops_tests.__path__):
        if info.name.startswith("cases_"):
            for case in importlib.import_module(f"tests.ops.{info.name}").CASES:
                first.setdefault(case.cmd.name, case)
    return first


CASES = _first_cases()


def _cotangent(name: str, i: int, out):
    """What NNC's null gradient stands for, written out independently of fnnc."""
    if not is_float(out):
        return np.zeros(out.shape, jax.dtypes.float0)
    if name == "cmul":  # complex ones: (1, 0) pairs
        return jnp.asarray(
            np.broadcast_to(np.tile([1, 0], out.shape[-1] // 2), out.shape), out.dtype
        )
    if name in ("softmax_crossentropy", "sigmoid_binary_crossentropy") and i == 1:
        return jnp.zeros(out.shape, out.dtype)  # the probabilities get nothing
    return jnp.ones(out.shape, out.dtype)


@pytest.mark.parametrize("name", NAMES)
def test_a_null_output_gradient_is_the_commands_own_derivative(name: str) -> None:
    case = CASES[name]
    opdef, kwargs = case.cmd.definition, case.cmd.kwargs
    xs = tuple(map(jnp.asarray, case.inputs))
    which = (
        list(case.grad_inputs)
        if case.grad_inputs is not None
        else [i for i, x in enumerate(xs) if is_float(x)]
    )

    def both(xs):
        def f(*diff):
            args = list(xs)
            for i, d in zip(which, diff):
                args[i] = d
            out = opdef.forward(*args, **kwargs)
            return out if isinstance(out, tuple) else (out,)

        outs, pullback = jax.vjp(f, *[xs[i] for i in which])
        want = pullback(tuple(_cotangent(name, i, o) for i, o in enumerate(outs)))
        got = opdef.backward((None,) * len(outs), xs, outs, **kwargs)
        return [got[i] for i in which], list(want)

    got, want = jax.jit(both)(xs)  # one compile for both sides
    for i, g, w in zip(which, got, want):
        assert g is not None, f"{name}: no gradient for input {i}"
        np.testing.assert_allclose(
            np.asarray(g, np.float64),
            np.asarray(w, np.float64),
            rtol=case.rtol,
            atol=case.atol,
            err_msg=f"{name}: input {i}",
        )


def test_null_outputs_need_no_outputs_given() -> None:
    # Without the forward outputs (NNC passes none to a backward that reads none), the
    # ones are shaped by the shape rule: d(sum sin)/dx = cos(x), d(a/b) = 1/b, -a/b^2.
    x = np.array([[0.5, -1.0, 2.0]], np.float32)
    (dx,) = ops.ewsin().definition.backward((None,), (x,), (None,))
    np.testing.assert_allclose(np.asarray(dx), np.cos(x), rtol=1e-6)
    a, b = np.array([3.0, -2.0], np.float32), np.array([2.0, 4.0], np.float32)
    da, db = ops.ewdiv().definition.backward((None,), (a, b), ())
    np.testing.assert_allclose(np.asarray(da), 1 / b, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(db), -a / b**2, rtol=1e-6)


def _layer_norm_graph(used: int):
    b = GraphBuilder()
    x = b.input((3, 5), name="x")
    outs = b.exec(ops.layer_norm(), x)
    loss = b.exec(ops.reduce_sum(axes=(0, 1)), b.exec(ops.ewexp(), outs[used]))
    return backward(b.build([loss]), loss, [x])[0]


@pytest.mark.parametrize("used", [0, 1])
def test_the_backward_pass_still_takes_an_unused_output_as_no_gradient(used: int) -> None:
    # layer_norm's (y, mean, inv_std): only output `used` reaches the loss, so the
    # gradient node gets None for the others, which must add nothing (not ones).
    x = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    _, got = interpret(_layer_norm_graph(used), x)  # (loss, dx)
    forward = ops.layer_norm().definition.forward

    def f(x):
        return jnp.sum(jnp.exp(forward(x, **ops.layer_norm().kwargs)[used]))

    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.grad(f)(x)), rtol=1e-5, atol=1e-6)
