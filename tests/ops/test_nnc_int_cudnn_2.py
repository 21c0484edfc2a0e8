"""NNC's cuDNN integration tests (liuliu/ccv ``test/int/nnc/cudnn.tests.c``), continued from
``test_nnc_int_cudnn.py``: batch / layer / group / RMS norm, their "only gradient" cases
through fnnc's backward pass, and the Pallas kernels (interpret mode on CPU, standing in
for NNC's GPU kernels) on the norm and cross-entropy configurations.

As there, each C test's cuDNN-against-CPU comparison becomes fnnc's command against an
independent float64 oracle: closed forms for values, ``jax.vjp`` of a float64 ``jnp``
formula (under ``jax.enable_x64``) for gradients, which come from each command's
backward in NNC's convention. Shapes are the C test's; half-precision runs are float16
commands at NNC's float16 tolerances. NNC's "only gradient" cases (a symbolic graph
differentiated with respect to x alone) run through ``fnnc.graph.backward``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fnnc import config, ops
from fnnc.graph import GraphBuilder, backward, compile
from fnnc.ops.pallas import layer_norm as ln_kernel
from fnnc.ops.pallas import rms_norm as rms_kernel
from fnnc.ops.pallas import softmax_crossentropy as sce_kernel
from tests.helpers import assert_close

f16, f32, f64 = np.float16, np.float32, np.float64
HALF = 2e-3
"""NNC's float16 tolerance for values of order one (1e-3 to 5e-3 in the C tests)."""


def uniform(shape, seed: int, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(f32)


@functools.cache
def _value_and_grads(f):
    def run(g, *args):
        y, pull = jax.vjp(f, *args)
        return y, pull(g)

    return jax.jit(run)


def vjp64(f, args, g):
    """``(value, gradients)`` of ``f`` (written with ``jnp``) at ``args`` for the output
    gradient ``g``, all in float64."""
    with jax.enable_x64(True):
        y, grads = _value_and_grads(f)(*(jnp.asarray(a, f64) for a in (g, *args)))
        return np.asarray(y), [np.asarray(t) for t in grads]


@functools.cache
def _jitted_backward(cmd):
    return jax.jit(lambda *t: cmd.definition.backward(*t, **cmd.kwargs))


def run_backward(cmd, grads, inputs, outputs):
    """``cmd``'s backward in NNC's convention, compiled as one program (as a graph runs
    it; op by op, the unrolled pooling backward alone takes seconds)."""
    return _jitted_backward(cmd)(tuple(grads), tuple(inputs), tuple(outputs))


def _check_grads(got, want, names, rtol=1e-4, atol=1e-5) -> None:
    for name, a, b in zip(names, got, want):
        assert_close(a, b, rtol=rtol, atol=atol * max(1.0, np.abs(b).max()), what=name)


# -- batch norm: axes (0, 1, 2), epsilon 1e-4, momentum 0.9, scale 1, bias 0 ---------------

BN = ops.batch_norm(axes=(0, 1, 2), epsilon=1e-4, momentum=0.9)


def _bn_oracle(x, scale, bias):
    mu = jnp.mean(x, axis=(0, 1, 2), keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=(0, 1, 2), keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-4) * scale.reshape(1, 1, 1, -1) + bias.reshape(1, 1, 1, -1)


def _bn_args(dtype):
    x = uniform((2, 2, 2, 10), 1).astype(dtype)
    ones, zeros = np.ones(10, dtype), np.zeros(10, dtype)
    return x, ones, zeros, zeros, zeros


@pytest.mark.parametrize("dtype", [f32, f16])
def test_batch_norm_forward_and_gradient(dtype) -> None:
    """NNC's "compare batch norm with cudnn", "compare batch norm gradient with cudnn" and their
    "in half precision" cases (here with float16 statistics; NNC's float32 ones are the
    test below): y, the batch statistics, and the gradients of x, scale and bias."""
    args = _bn_args(dtype)
    g = uniform((2, 2, 2, 10), 2, -1, 1)
    want_y, want_g = vjp64(_bn_oracle, args[:3], g)
    y, new_mean, _, mean, inv_std = outs = BN(*args)
    x64 = args[0].astype(f64)
    tol = 1e-5 if dtype == f32 else HALF
    assert_close(y, want_y, rtol=tol, atol=tol)
    assert_close(mean, x64.mean((0, 1, 2)), rtol=tol, atol=tol)
    assert_close(inv_std, 1 / np.sqrt(x64.var((0, 1, 2)) + 1e-4), rtol=tol, atol=tol * 10)
    assert_close(new_mean, 0.1 * x64.mean((0, 1, 2)), rtol=tol, atol=tol)
    grads = run_backward(BN, (g.astype(dtype), None, None, None, None), args, outs)
    tol = 1e-4 if dtype == f32 else 5e-3
    _check_grads(grads[:3], want_g, ("x", "scale", "bias"), rtol=tol, atol=tol)


def test_batch_norm_half_input_with_float_statistics() -> None:
    """NNC's "compare batch norm with cudnn in half precision" as the C test runs it: x and y
    float16; scale, bias, running mean / var and saved statistics float32 (cuDNN's
    layout), computed in float32."""
    x = uniform((2, 2, 2, 10), 1).astype(f16)
    ones, zeros = np.ones(10, f32), np.zeros(10, f32)
    args = (x, ones, zeros, zeros, zeros)
    y, *stats = outs = BN(*args)
    assert y.dtype == f16 and all(s.dtype == f32 for s in stats)
    g = uniform((2, 2, 2, 10), 2, -1, 1).astype(f16)
    want, want_g = vjp64(_bn_oracle, (x, ones, zeros), g)
    assert_close(y, want, rtol=HALF, atol=HALF)
    gx, g_scale, g_bias, *_ = run_backward(BN, (g, None, None, None, None), args, outs)
    assert gx.dtype == f16 and g_scale.dtype == g_bias.dtype == f32
    assert_close((gx, g_scale, g_bias), want_g, rtol=5e-3, atol=5e-3)


# -- layer norm and RMS norm: axes (1, 2, 3), epsilon 1e-4, NNC's [1, 2, 2, 10] scale -----

AXES = (1, 2, 3)


def _layer_norm_oracle(x, scale=None, bias=None):
    mu = jnp.mean(x, axis=AXES, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=AXES, keepdims=True)
    y = (x - mu) / jnp.sqrt(var + 1e-4)
    return y if scale is None else y * scale + bias


def _rms_norm_oracle(x, scale):
    return x / jnp.sqrt(jnp.mean(jnp.square(x), axis=AXES, keepdims=True) + 1e-4) * scale


@pytest.mark.parametrize("affine", [True, False], ids=["scale-bias", "plain"])
@pytest.mark.parametrize("magnitude", [1.0, 100.0], ids=["forward", "gradient"])
def test_layer_norm(affine, magnitude) -> None:
    """NNC's "compare layer norm with cudnn" (x in [0, 1)) and "compare layer norm gradient with
    cudnn" / "... only gradient" (x in [0, 100)), each also "without scale / bias":
    y, the saved statistics and the gradients of x, scale and bias."""
    x = uniform((2, 2, 2, 10), 1, 0, magnitude)
    params = (uniform((1, 2, 2, 10), 2), uniform((1, 2, 2, 10), 3)) if affine else ()
    g = uniform((2, 2, 2, 10), 4, -1, 1)
    cmd = ops.layer_norm(axes=AXES, epsilon=1e-4)
    y, mean, inv_std = outs = cmd(x, *params)
    want_y, want_g = vjp64(_layer_norm_oracle, (x, *params), g)
    assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    x64 = x.astype(f64)
    assert_close(mean, x64.mean(AXES, keepdims=True), rtol=1e-5, atol=1e-5)
    assert_close(inv_std, 1 / np.sqrt(x64.var(AXES, keepdims=True) + 1e-4), rtol=1e-5)
    grads = run_backward(cmd, (g, None, None), (x, *params), outs)
    _check_grads(grads, want_g, ("x", "scale", "bias"))


def test_rms_norm() -> None:
    """NNC's "compare rmsnorm with cudnn", "compare rmsnorm gradient with cudnn" and "... only
    gradient": y, the saved inverse RMS, and the gradients of x (in [0, 100)) and scale."""
    cmd = ops.rms_norm(axes=AXES, epsilon=1e-4)
    scale, g = uniform((1, 2, 2, 10), 2), uniform((2, 2, 2, 10), 4, -1, 1)
    for x in (uniform((2, 2, 2, 10), 1), uniform((2, 2, 2, 10), 1, 0, 100)):
        y, inv = outs = cmd(x, scale)
        want_y, want_g = vjp64(_rms_norm_oracle, (x, scale), g)
        assert_close(y, want_y, rtol=1e-5, atol=1e-5)
        x64 = x.astype(f64)
        assert_close(inv, 1 / np.sqrt(np.mean(x64**2, AXES, keepdims=True) + 1e-4), rtol=1e-5)
        grads = run_backward(cmd, (g, None), (x, scale), outs)
        _check_grads(grads, want_g, ("x", "scale"))


# -- group norm: x [2, 16, 2, 10], 4 groups on axis 1, epsilon 1e-5 ------------------------


@functools.cache
def _group_norm_oracle(reduce_hw: bool):
    axes = (2, 3, 4) if reduce_hw else (2,)

    def f(x, scale=None, bias=None):
        xs = jnp.reshape(x, (2, 4, 4, 2, 10))  # [batch, group, member, h, w]
        mu = jnp.mean(xs, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(xs - mu), axis=axes, keepdims=True)
        y = jnp.reshape((xs - mu) / jnp.sqrt(var + 1e-5), x.shape)
        return y if scale is None else y * scale + bias

    return f


@pytest.mark.parametrize("affine", [True, False], ids=["scale-bias", "plain"])
@pytest.mark.parametrize("reduce_hw", [False, True], ids=["group-only", "reduce-hw"])
def test_group_norm(reduce_hw, affine) -> None:
    """NNC's "compare group norm with cudnn", "... gradient ...", "... only gradient ...", "compare
    group norm and reduce HW with cudnn", "... gradient and reduce HW ...", each also
    "without scale / bias": NNC's GROUP_NORM(1, 4, 1e-5) reduces only the group's own
    channels (fnnc's ``reduce_axes=()``, statistics [2, 4, 2, 10], per-element scale
    [1, 16, 2, 10]); with axes 2, 3 listed it also reduces H and W (statistics
    [2, 4, 1, 1], per-channel scale [1, 16, 1, 1])."""
    cmd = ops.group_norm(groups=4, axis=1, epsilon=1e-5, reduce_axes=(2, 3) if reduce_hw else ())
    pshape = (1, 16, 1, 1) if reduce_hw else (1, 16, 2, 10)
    params = (uniform(pshape, 2), uniform(pshape, 3)) if affine else ()
    g = uniform((2, 16, 2, 10), 4, -1, 1)
    oracle = _group_norm_oracle(reduce_hw)
    for magnitude in (1.0, 100.0):  # the forward cases' x, then the gradient cases'
        x = uniform((2, 16, 2, 10), 1, 0, magnitude)
        y, mean, inv_std = outs = cmd(x, *params)
        assert mean.shape == inv_std.shape == ((2, 4, 1, 1) if reduce_hw else (2, 4, 2, 10))
        want_y, want_g = vjp64(oracle, (x, *params), g)
        assert_close(y, want_y, rtol=1e-5, atol=1e-5)
        grads = run_backward(cmd, (g, None, None), (x, *params), outs)
        _check_grads(grads, want_g, ("x", "scale", "bias"))


def _only_gradient_case(name: str):
    """(command, inputs, oracle) of the "only gradient" cases, x in [0, 100)."""
    if name == "group_norm":
        x, p = uniform((2, 16, 2, 10), 1, 0, 100), (1, 16, 2, 10)
        cmd = ops.group_norm(groups=4, axis=1, epsilon=1e-5, reduce_axes=())
        return cmd, (x, uniform(p, 2), uniform(p, 3)), _group_norm_oracle(False)
    x, p = uniform((2, 2, 2, 10), 1, 0, 100), (1, 2, 2, 10)
    if name == "rms_norm":
        return ops.rms_norm(axes=AXES, epsilon=1e-4), (x, uniform(p, 2)), _rms_norm_oracle
    cmd = ops.layer_norm(axes=AXES, epsilon=1e-4)
    return cmd, (x, uniform(p, 2), uniform(p, 3)), _layer_norm_oracle


@pytest.mark.parametrize("name", ["layer_norm", "group_norm", "rms_norm"])
def test_only_gradient_through_the_backward_pass(name) -> None:
    """NNC's "compare layer norm only gradient with cudnn", "compare group norm only gradient with
    cudnn" and "compare rmsnorm only gradient with cudnn" as NNC runs them: a symbolic graph
    differentiated with respect to x alone (fnnc's ``backward`` pass), compiled."""
    cmd, args, oracle = _only_gradient_case(name)
    b = GraphBuilder()
    syms = [b.input(a.shape, name=f"in{i}") for i, a in enumerate(args)]
    y = b.exec(cmd, *syms)[0]
    dy = b.input(args[0].shape, name="dy")
    graph, _ = backward(b.build([y]), y, [syms[0]], df=dy)
    g = uniform(args[0].shape, 4, -1, 1)
    got_y, got_dx = compile(graph)(*args, g)
    want_y, (want_dx, *_) = vjp64(oracle, args, g)
    assert_close(got_y, want_y, rtol=1e-5, atol=1e-5)
    assert_close(got_dx, want_dx, rtol=1e-4, atol=1e-5 * np.abs(want_dx).max())


# -- the Pallas kernels (interpret mode) on NNC's norm and cross-entropy configurations -----


def _pallas_case(name: str):
    """(kernel module, command, inputs, output gradients, oracle (value, input gradients))."""
    rng = np.random.default_rng(0)
    axes = (1, 2, 3)
    x = rng.uniform(0, 100, (2, 2, 2, 10))  # the gradient cases' x in [0, 100)
    scale, bias = rng.uniform(0, 1, (2, 1, 2, 2, 10))  # NNC's [1, 2, 2, 10] parameters
    g = rng.uniform(-1, 1, x.shape)
    xc = x - x.mean(axes, keepdims=True)
    if name == "layer_norm":
        inv = 1 / np.sqrt((xc**2).mean(axes, keepdims=True) + 1e-4)
        dxhat = g * scale  # the closed form of layer norm's input gradient
        dx = inv * (dxhat - dxhat.mean(axes, keepdims=True))
        dx -= inv * xc * inv * (dxhat * xc * inv).mean(axes, keepdims=True)
        want = (xc * inv * scale + bias, (dx, (g * xc * inv).sum(0, keepdims=True), g.sum(0)[None]))
        return ln_kernel, ops.layer_norm(axes=axes, epsilon=1e-4), (x, scale, bias), g, want
    if name == "rms_norm":
        inv = 1 / np.sqrt((x**2).mean(axes, keepdims=True) + 1e-4)
        dxhat = g * scale
        dx = inv * dxhat - x * inv**3 * (dxhat * x).mean(axes, keepdims=True)
        want = (x * inv * scale, (dx, (g * x * inv).sum(0, keepdims=True)))
        return rms_kernel, ops.rms_norm(axes=axes, epsilon=1e-4), (x, scale), g, want
    logits, labels = rng.uniform(0, 1, (10, 100)), (np.arange(10) + 1) * 9.0
    t = np.full(logits.shape, 0.1)
    t[np.arange(10), labels.astype(int)] = 0.9
    lse = np.log(np.exp(logits).sum(1, keepdims=True))
    g = np.arange(10)[:, None] * 0.1
    want = (lse - (t * logits).sum(1, keepdims=True), (g * (np.exp(logits - lse) - t),))
    cmd = ops.softmax_crossentropy(trim0=0.1, trim1=0.9)
    return sce_kernel, cmd, (logits, labels), g, want


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("layer_norm", f32),
        ("rms_norm", f32),
        ("softmax_crossentropy", f32),
        ("softmax_crossentropy", f16),
    ],
)
def test_pallas_kernel_on_nnc_configuration(name, dtype) -> None:
    """The Pallas kernel, forced, on "compare layer norm gradient with cudnn", "compare
    rmsnorm gradient with cudnn" (axes 1, 2, 3, [1, 2, 2, 10] parameters, x in [0, 100))
    and "compare softmax cross entropy backward with label smoothing" (float labels, trims
    0.1 / 0.9; also "... in half precision ..."): the first output and the backward."""
    module, cmd, args, g, (want_y, want_grads) = _pallas_case(name)
    args = tuple(a.astype(dtype) for a in args)
    with config.override(backend_per_command={cmd.name: "pallas"}):
        outs = jax.jit(lambda *a: cmd(*a))(*args)
    n_out = len(outs)
    grads = (g.astype(dtype),) + (None,) * (n_out - 1)
    diff = (0,) if name == "softmax_crossentropy" else tuple(range(len(args)))
    got = jax.jit(lambda c, i, o: module.backward(c, i, o, diff, **cmd.kwargs))(grads, args, outs)
    tol = 1e-4 if dtype == f32 else 1e-2
    assert_close(outs[0], want_y, rtol=tol, atol=tol, what="forward")
    for i, want in zip(diff, want_grads):
        assert_close(got[i], want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()), what=str(i))
