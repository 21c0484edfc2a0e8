"""Audit of issue 2 (foundation), the commands (``fnnc/ops``).

Checked here, as the issue states them:
- the command definition: shape rule, reference forward, backward in NNC's convention
  (``backward(grads, inputs, outputs, **params)``, tensors outside ``backward_uses``
  passed as bare specs), ``backward_uses``, attributes; a registry; frozen, hashable
  commands from factories;
- the backend mechanism: ``"xla"`` always, other backends chosen by platform, support
  predicate and the autotune table, reported per node by ``Program.backends``;
- every family of the issue, forward against an independent oracle (NumPy closed forms
  or loops): data movement, BLAS, elementwise, activations (mish included), convolution
  (+ transpose as the adjoint, groups, dilation, NHWC), pools, the four norms,
  reductions, losses (softmax cross-entropy returns loss and softmax), scaled
  dot-product attention (causal, mask), LSTM, dropout / random with explicit keys,
  embedding / index_select;
- backwards of some commands against ``jax.vjp`` of an independent JAX formula.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fnnc import ops
from fnnc.core.dispatch import table_key
from fnnc.graph import GraphBuilder, compile, interpret
from tests.helpers import assert_close, rand, randint

F32 = np.float32
KEY = np.asarray(jax.random.key_data(jax.random.key(0)))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# -- the command definition and the registry -----------------------------------------------


FAMILIES = {
    "data movement": ["transpose", "reshape", "concat", "slice", "pad", "format_transform"],
    "blas": ["gemm", "add", "mul", "scalar_mul"],
    "elementwise": ["ewsum", "ewprod", "ewdiv", "ewexp", "ewlog", "ewsqrt", "max", "min"],
    "activations": ["relu", "sigmoid", "tanh", "gelu", "swish", "mish", "softmax"],
    "convolution": ["convolution", "convolution_transpose"],
    "pools": ["max_pool", "avg_pool"],
    "norms": ["batch_norm", "layer_norm", "group_norm", "rms_norm"],
    "reductions": ["reduce_sum", "reduce_mean", "reduce_max", "argmax"],
    "losses": ["softmax_crossentropy", "categorical_crossentropy", "binary_crossentropy"],
    "attention": ["scaled_dot_product_attention"],
    "lstm": ["lstm"],
    "random": ["dropout", "random_uniform", "random_normal"],
    "embedding": ["embedding", "index_select"],
}


def test_registry_holds_every_family_with_a_full_definition() -> None:
    """Every command the issue's families name is in ops.registry(), with a shape rule,
    a reference forward, a backward, backward_uses and attributes."""
    reg = ops.registry()
    for family, names in FAMILIES.items():
        for name in names:
            assert name in reg, (family, name)
            opdef = reg[name]
            assert opdef is ops.lookup(name)
            assert callable(opdef.shape) and callable(opdef.forward) and callable(opdef.backward)
            assert isinstance(opdef.backward_uses, ops.Uses)
            assert isinstance(opdef.attributes, ops.Attributes)
            assert "xla" in ops.backends_of(name), name
    assert reg["dropout"].attributes.random and reg["random_uniform"].attributes.random


def test_commands_are_frozen_hashable_values() -> None:
    """A factory call gives a Command equal to (and hashing like) another of the same
    hyper-parameters; its shape rule needs no arrays."""
    a, b = ops.gemm(transpose_b=True), ops.gemm(transpose_b=True)
    assert isinstance(a, ops.Command) and a == b and hash(a) == hash(b)
    assert a != ops.gemm() and a.param("transpose_b") is True
    with pytest.raises(AttributeError):
        a.name = "relu"  # type: ignore[misc]
    (spec,) = a.shape(jax.ShapeDtypeStruct((2, 3), F32), jax.ShapeDtypeStruct((5, 3), F32))
    assert spec.shape == (2, 5) and spec.dtype == F32


def test_backward_gets_unused_tensors_as_specs() -> None:
    """NNC's convention: backward(grads, inputs, outputs) with every tensor outside
    backward_uses given only as its ShapeDtypeStruct still computes the gradient (here
    softmax's, which reads its output only: y * (g - sum(g * y)))."""
    cmd = ops.softmax()
    uses = cmd.definition.backward_uses
    assert uses.inputs == () and uses.outputs == (0,)
    x, g = rand((3, 5)), rand((3, 5), seed=1)
    y = np.asarray(cmd(x))
    (dx,) = cmd.definition.backward(
        (g,), (jax.ShapeDtypeStruct(x.shape, x.dtype),), (y,), **cmd.kwargs
    )
    want = y * (g - (g * y).sum(-1, keepdims=True))
    assert_close(dx, want, 1e-5, 1e-6)


# -- backends ----------------------------------------------------------------------------


def test_backend_chosen_by_platform_support_and_autotune_table() -> None:
    """A registered backend runs where its platform and support predicate allow and the
    reference "xla" elsewhere; an autotune table entry picks a backend for one shape;
    Program.backends reports the choice per node."""
    spec2 = [jax.ShapeDtypeStruct((2, 3), F32)]
    spec4 = [jax.ShapeDtypeStruct((4, 3), F32)]

    def only_two_rows(cmd, specs):
        return None if specs[0].shape[0] == 2 else "only 2 rows"

    def twice(x):
        return 2 * jnp.maximum(x, 0)  # distinguishable from relu

    fast = ops.Backend("audit_fast", twice, ("cpu",), supports=only_two_rows, priority=5)
    gpu_only = ops.Backend("audit_gpu", twice, ("gpu",), priority=9, interpret_platforms=())
    tuned = ops.Backend("audit_tuned", twice, ("cpu",), priority=0)
    ops.register_backend("relu", fast)
    ops.register_backend("relu", gpu_only)
    ops.register_backend("relu", tuned)
    try:
        assert ops.select_backend(ops.relu(), spec2, "cpu") == "audit_fast"
        assert ops.select_backend(ops.relu(), spec4, "cpu") == "xla"
        assert ops.select_backend(ops.relu(), spec4, "gpu") == "audit_gpu"
        b = GraphBuilder()
        x = b.input((2, 3), name="x")
        graph = b.build([b.exec(ops.relu(), x, name="act")])
        program = compile(graph)
        here = {"cpu": "audit_fast", "gpu": "audit_gpu"}.get(jax.default_backend(), "xla")
        assert [row[2] for row in program.backends] == [here]
        xs = rand((2, 3))
        assert_close(program(xs), 2 * np.maximum(xs, 0), 0, 0)
        key = table_key(ops.relu(), spec4, "cpu")
        ops.autotune.TABLE[key] = "audit_tuned"
        try:
            assert ops.select_backend(ops.relu(), spec4, "cpu") == "audit_tuned"
        finally:
            del ops.autotune.TABLE[key]
        assert ops.select_backend(ops.relu(), spec4, "cpu") == "xla"
    finally:
        for name in ("audit_fast", "audit_gpu", "audit_tuned"):
            ops.unregister_backend("relu", name)
    assert ops.select_backend(ops.relu(), spec2, "cpu") == "xla"


# -- data movement, BLAS, elementwise, activations ---------------------------------------------


def test_data_movement_commands_match_numpy() -> None:
    """transpose, reshape, concat, slice, pad and NHWC -> NCHW format_transform."""
    x = rand((2, 3, 4))
    y = rand((2, 1, 4), seed=1)
    img = rand((2, 4, 5, 3), seed=2)
    checks = [
        (ops.transpose(perm=(2, 0, 1))(x), x.transpose(2, 0, 1)),
        (ops.reshape(shape=(6, 4))(x), x.reshape(6, 4)),
        (ops.concat(axis=1)(x, y), np.concatenate([x, y], axis=1)),
        (ops.slice(start=(0, 1, 1), limit=(2, 3, 4))(x), x[:, 1:3, 1:4]),
        (ops.pad(pads=((0, 0), (1, 2), (0, 1)))(x), np.pad(x, ((0, 0), (1, 2), (0, 1)))),
        (ops.format_transform(src="NHWC", dst="NCHW")(img), img.transpose(0, 3, 1, 2)),
    ]
    for got, want in checks:
        assert_close(got, want, 0, 0)


def test_gemm_with_transposes_and_bias_matches_numpy() -> None:
    """gemm(transpose_a, transpose_b) with a bias is a.T @ b.T + bias."""
    a, b, bias = rand((3, 2)), rand((4, 3), seed=1), rand((4,), seed=2)
    got = ops.gemm(transpose_a=True, transpose_b=True)(a, b, bias)
    assert_close(got, a.T @ b.T + bias, 1e-5, 1e-6)
    assert_close(ops.gemm()(a.T, b.T), a.T @ b.T, 1e-5, 1e-6)


def test_elementwise_family_matches_numpy() -> None:
    """ewsum (variadic), ewprod, ewdiv, ewexp, ewlog, ewsqrt, max, min."""
    a, b, c = rand((2, 3), lo=0.5, hi=2), rand((2, 3), seed=1, lo=0.5, hi=2), rand((2, 3), seed=2)
    checks = [
        (ops.ewsum()(a, b, c), a + b + c),
        (ops.ewprod()(a, b), a * b),
        (ops.ewdiv()(a, b), a / b),
        (ops.ewexp()(c), np.exp(c)),
        (ops.ewlog()(a), np.log(a)),
        (ops.ewsqrt()(a), np.sqrt(a)),
        (ops.max()(a, c), np.maximum(a, c)),
        (ops.min()(a, c), np.minimum(a, c)),
    ]
    for got, want in checks:
        assert_close(got, want, 1e-6, 1e-6)


def test_activations_including_mish_match_closed_forms() -> None:
    """relu, sigmoid, tanh, gelu (exact and tanh form), swish, softplus, mish
    (x * tanh(softplus(x))), leaky_relu, softmax and log_softmax."""
    from math import erf

    x = rand((4, 5), lo=-4, hi=4)
    sp = np.log1p(np.exp(x))
    sm = np.exp(x - x.max(-1, keepdims=True))
    sm /= sm.sum(-1, keepdims=True)
    gelu_exact = 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))
    gelu_tanh = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    checks = [
        (ops.relu()(x), np.maximum(x, 0)),
        (ops.sigmoid()(x), _sigmoid(x)),
        (ops.tanh()(x), np.tanh(x)),
        (ops.gelu()(x), gelu_exact),
        (ops.gelu(approximate=True)(x), gelu_tanh),
        (ops.swish()(x), x * _sigmoid(x)),
        (ops.softplus()(x), sp),
        (ops.mish()(x), x * np.tanh(sp)),
        (ops.leaky_relu(negative_slope=0.1)(x), np.where(x > 0, x, 0.1 * x)),
        (ops.softmax()(x), sm),
        (ops.log_softmax()(x), np.log(sm)),
    ]
    for i, (got, want) in enumerate(checks):
        assert_close(got, want, 1e-5, 1e-5, what=str(i))


# -- convolution ---------------------------------------------------------------------------


def _np_conv(x, w, stride, pad, dil, groups):
    """NHWC convolution by loops; w is [O, kh, kw, C / groups] (NNC's layout)."""
    n, h, wd, _ = x.shape
    o, kh, kw, cg = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    ekh, ekw = (kh - 1) * dil + 1, (kw - 1) * dil + 1
    oh, ow = (h + 2 * pad - ekh) // stride + 1, (wd + 2 * pad - ekw) // stride + 1
    out = np.zeros((n, oh, ow, o))
    per = o // groups
    for oc, i, j in itertools.product(range(o), range(oh), range(ow)):
        g = oc // per
        patch = xp[:, i * stride : i * stride + ekh : dil, j * stride : j * stride + ekw : dil]
        out[:, i, j, oc] = (patch[..., g * cg : (g + 1) * cg] * w[oc]).sum(axis=(1, 2, 3))
    return out


@pytest.mark.parametrize(
    ("stride", "pad", "dil", "groups"),
    [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 2), (1, 1, 1, 4)],
    ids=["plain", "strided_grouped", "dilated_grouped", "depthwise"],
)
def test_convolution_nhwc_groups_dilation_match_loops(stride, pad, dil, groups) -> None:
    """convolution on NHWC input with strides, padding, dilation and groups equals a
    direct loop; with a bias, the bias is added per output channel."""
    x = rand((2, 7, 6, 4))
    w = rand((4, 3, 3, 4 // groups), seed=1)
    bias = rand((4,), seed=2)
    cmd = ops.convolution(strides=stride, padding=pad, dilation=dil, groups=groups)
    want = _np_conv(x, w, stride, pad, dil, groups)
    assert_close(cmd(x, w), want, 1e-5, 1e-5)
    assert_close(cmd(x, w, bias), want + bias, 1e-5, 1e-5)


def test_convolution_transpose_is_the_adjoint() -> None:
    """<conv(x, w), y> == <x, conv_transpose(y, w)> for the same strides, padding,
    dilation and groups: the transposed convolution is the convolution's adjoint."""
    x = rand((1, 7, 7, 4))
    w = rand((6, 3, 3, 2), seed=1)  # 6 outputs, 4 inputs in 2 groups
    kw = dict(strides=2, padding=1, groups=2)
    y_shape = ops.convolution(**kw)(x, w).shape
    y = rand(y_shape, seed=2)
    xt = ops.convolution_transpose(**kw)(y, w)
    assert xt.shape == x.shape
    lhs = float(np.sum(np.asarray(ops.convolution(**kw)(x, w), np.float64) * y))
    rhs = float(np.sum(x.astype(np.float64) * np.asarray(xt, np.float64)))
    assert abs(lhs - rhs) < 1e-4 * max(1.0, abs(lhs))


def test_convolution_backward_equals_vjp_of_lax_conv() -> None:
    """The grouped, dilated convolution's backward equals jax.vjp of
    lax.conv_general_dilated (NHWC, weight [O, kh, kw, I/groups] as OHWI)."""
    x, w = rand((1, 6, 6, 4)), rand((4, 3, 3, 2), seed=1)
    cmd = ops.convolution(padding=1, dilation=2, groups=2)
    out = cmd(x, w)
    g = rand(out.shape, seed=3)
    dx, dw = cmd.definition.backward((g,), (x, w), (out,), **cmd.kwargs)[:2]

    def ref(x, w):
        return lax.conv_general_dilated(
            x, w, (1, 1), ((1, 1), (1, 1)), rhs_dilation=(2, 2),
            dimension_numbers=("NHWC", "OHWI", "NHWC"), feature_group_count=2,
            precision=lax.Precision.HIGHEST,
        )  # fmt: skip

    want_out, vjp = jax.vjp(ref, x, w)
    assert_close(out, want_out, 1e-5, 1e-5)
    assert_close([dx, dw], list(vjp(g)), 1e-4, 1e-4)


# -- pools, norms, reductions ------------------------------------------------------------------


def test_pools_match_numpy_windows() -> None:
    """max_pool (3x3, stride 2, padding 1: padding never wins) and avg_pool (2x2)."""
    x = rand((2, 5, 5, 3))
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    want_max = np.stack(
        [
            np.stack(
                [xp[:, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3].max(axis=(1, 2)) for j in range(3)], 1
            )
            for i in range(3)
        ],
        1,
    )
    assert_close(ops.max_pool(window=(3, 3), strides=(2, 2), padding=1)(x), want_max, 0, 0)
    x4 = x[:, :4, :4]
    want_avg = x4.reshape(2, 2, 2, 2, 2, 3).mean(axis=(2, 4))
    assert_close(ops.avg_pool(window=(2, 2), strides=(2, 2))(x4), want_avg, 1e-6, 1e-6)


def _normalise(x, axes, eps):
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + eps), mu, var


def test_batch_norm_training_and_test_match_numpy() -> None:
    """batch_norm over N, H, W: y from the batch's biased statistics; running mean and
    variance move by momentum (new = momentum * old + (1 - momentum) * batch); with
    is_test the running statistics normalise."""
    x = rand((4, 3, 3, 2), lo=-2, hi=3).astype(np.float64)
    scale, bias = rand((2,), seed=1), rand((2,), seed=2)
    mean, var = rand((2,), seed=3), rand((2,), seed=4, lo=0.5, hi=2)
    xn, mu, bvar = _normalise(x, (0, 1, 2), 1e-5)
    y, new_mean, new_var, *_ = ops.batch_norm(momentum=0.9)(x.astype(F32), scale, bias, mean, var)
    assert_close(y, xn * scale + bias, 1e-5, 1e-5)
    assert_close(new_mean, 0.9 * mean + 0.1 * mu.reshape(-1), 1e-5, 1e-6)
    assert_close(new_var, 0.9 * var + 0.1 * bvar.reshape(-1), 1e-5, 1e-6)
    yt = ops.batch_norm(is_test=True)(x.astype(F32), scale, bias, mean, var)[0]
    assert_close(yt, (x - mean) / np.sqrt(var + 1e-5) * scale + bias, 1e-5, 1e-5)


def test_layer_group_and_rms_norm_match_numpy() -> None:
    """layer_norm over the last axis, group_norm (2 groups of an NHWC input, statistics
    per sample over H, W and the group's channels: reduce_axes=None) and rms_norm."""
    x = rand((2, 3, 3, 4), lo=-2, hi=2).astype(np.float64)
    scale, bias = rand((4,), seed=1), rand((4,), seed=2)
    ln = _normalise(x, (-1,), 1e-5)[0] * scale + bias
    assert_close(ops.layer_norm()(x.astype(F32), scale, bias)[0], ln, 1e-5, 1e-5)
    xs = x.reshape(2, 3, 3, 2, 2)
    gn = _normalise(xs, (1, 2, 4), 1e-5)[0].reshape(x.shape) * scale + bias
    assert_close(
        ops.group_norm(groups=2, reduce_axes=None)(x.astype(F32), scale, bias)[0], gn, 1e-5, 1e-5
    )
    rms = x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * scale
    assert_close(ops.rms_norm()(x.astype(F32), scale)[0], rms, 1e-5, 1e-5)


def test_reductions_keep_reduced_axes_as_one() -> None:
    """reduce_sum / reduce_mean / reduce_max / argmax over axes equal NumPy's with the
    reduced axes kept as size 1 (NNC's layout)."""
    x = rand((2, 3, 4))
    assert_close(ops.reduce_sum(axes=(0, 2))(x), x.sum(axis=(0, 2), keepdims=True), 1e-6, 1e-6)
    assert_close(ops.reduce_mean(axes=(1,))(x), x.mean(axis=1, keepdims=True), 1e-6, 1e-6)
    assert_close(ops.reduce_max(axes=(2,))(x), x.max(axis=2, keepdims=True), 0, 0)
    assert_close(ops.argmax(axis=1)(x), x.argmax(axis=1)[:, None], 0, 0)


# -- losses ------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels", ["index", "one_hot"])
def test_softmax_crossentropy_returns_loss_and_softmax(labels: str) -> None:
    """softmax_crossentropy(logits, labels) returns (loss, softmax) like NNC: loss is
    -log softmax at the label (one per row), softmax the row softmax; its backward for
    the logits is softmax - one_hot."""
    x = rand((3, 5), lo=-3, hi=3)
    idx = np.array([1, 4, 0], np.int32)
    onehot = np.eye(5, dtype=F32)[idx]
    lab = idx if labels == "index" else onehot
    cmd = ops.softmax_crossentropy()
    out = cmd(x, lab)
    assert isinstance(out, tuple) and len(out) == 2
    loss, sm = out
    e = np.exp(x - x.max(-1, keepdims=True))
    want_sm = e / e.sum(-1, keepdims=True)
    want_loss = -np.log(want_sm[np.arange(3), idx])
    assert_close(sm, want_sm, 1e-5, 1e-6)
    assert_close(np.asarray(loss).reshape(-1), want_loss, 1e-5, 1e-5)
    g = np.ones(np.shape(loss), F32)
    dx = cmd.definition.backward((g, None), (x, lab), out, **cmd.kwargs)[0]
    assert_close(dx, want_sm - onehot, 1e-5, 1e-6)


def test_softmax_crossentropy_in_a_graph_has_two_outputs() -> None:
    """In a graph the node has two output symbols (loss, softmax); interpret and compile
    return both."""
    b = GraphBuilder()
    x = b.input((2, 3), name="logits")
    lab = b.input((2,), np.int32, name="labels")
    loss, sm = b.exec(ops.softmax_crossentropy(), x, lab, name="ce")
    graph = b.build([loss, sm])
    xs, ls = rand((2, 3)), np.array([2, 0], np.int32)
    e = np.exp(xs)
    want_sm = e / e.sum(-1, keepdims=True)
    for got in (interpret(graph, xs, ls), compile(graph)(xs, ls)):
        assert_close(np.asarray(got[0]).reshape(-1), -np.log(want_sm[[0, 1], ls]), 1e-5, 1e-5)
        assert_close(got[1], want_sm, 1e-5, 1e-6)


def test_other_losses_match_closed_forms() -> None:
    """categorical_crossentropy of probabilities, binary_crossentropy, sigmoid binary
    cross-entropy (loss and sigmoid) and mse, one loss per row."""
    p = rand((3, 4), lo=0.05, hi=0.95)
    t = (rand((3, 4), seed=1) > 0).astype(F32)
    idx = np.array([0, 3, 1], np.int32)
    cce = ops.categorical_crossentropy()(p, idx)
    assert_close(np.asarray(cce).reshape(-1), -np.log(p[np.arange(3), idx]), 1e-5, 1e-5)
    bce = -(t * np.log(p) + (1 - t) * np.log(1 - p))
    assert_close(np.asarray(ops.binary_crossentropy()(p, t)).reshape(-1), bce.sum(-1), 1e-5, 1e-5)
    x = rand((3, 4), seed=2, lo=-3, hi=3)
    loss, sig = ops.sigmoid_binary_crossentropy()(x, t)
    s = _sigmoid(x)
    want = -(t * np.log(s) + (1 - t) * np.log(1 - s)).sum(-1)
    assert_close(np.asarray(loss).reshape(-1), want, 1e-5, 1e-5)
    assert_close(sig, s, 1e-5, 1e-6)
    assert_close(np.asarray(ops.mse()(x, p)).reshape(-1), ((x - p) ** 2).mean(-1), 1e-5, 1e-5)


# -- attention, LSTM ------------------------------------------------------------------------


def _np_attention(q, k, v, add=None, keep=None):
    """softmax(q k^T / sqrt(D) + add) v, per head, layout [B, S, H, D]."""
    logits = np.einsum("bshd,bthd->bhst", q, k) / np.sqrt(q.shape[-1])
    if add is not None:
        logits = logits + add
    if keep is not None:
        logits = np.where(keep, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhst,bthd->bshd", p, v)


def test_attention_plain_causal_and_masked() -> None:
    """scaled_dot_product_attention on [B, S, H, D]: plain, causal (query i sees keys
    j <= i), with a bool mask (True attends) and with an additive float mask."""
    q, k, v = rand((2, 4, 2, 8)), rand((2, 4, 2, 8), seed=1), rand((2, 4, 2, 8), seed=2)
    sdpa = ops.scaled_dot_product_attention
    assert_close(sdpa()(q, k, v), _np_attention(q, k, v), 1e-5, 1e-5)
    causal = np.tril(np.ones((4, 4), bool))
    assert_close(sdpa(is_causal=True)(q, k, v), _np_attention(q, k, v, keep=causal), 1e-5, 1e-5)
    keep = rand((2, 1, 4, 4), seed=3) > -0.6
    keep[..., 0] = True  # every query attends at least one key
    assert_close(sdpa()(q, k, v, keep), _np_attention(q, k, v, keep=keep), 1e-5, 1e-5)
    add = rand((1, 1, 4, 4), seed=4)
    assert_close(sdpa()(q, k, v, add), _np_attention(q, k, v, add=add), 1e-5, 1e-5)


def test_causal_attention_backward_equals_vjp() -> None:
    """The causal attention backward equals jax.vjp of a plain JAX formula."""
    q, k, v = rand((1, 3, 2, 4)), rand((1, 3, 2, 4), seed=1), rand((1, 3, 2, 4), seed=2)
    cmd = ops.scaled_dot_product_attention(is_causal=True)
    out = cmd(q, k, v)
    g = rand(out.shape, seed=3)

    def ref(q, k, v):
        logits = jnp.einsum("bshd,bthd->bhst", q, k) / 2.0
        logits = jnp.where(jnp.tril(jnp.ones((3, 3), bool)), logits, -jnp.inf)
        return jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(logits, -1), v)

    _, vjp = jax.vjp(ref, q, k, v)
    outs = out if isinstance(out, tuple) else (out,)
    grads = (g,) + (None,) * (len(outs) - 1)
    run = jax.jit(lambda *a: cmd.definition.backward(grads, a, outs, **cmd.kwargs)[:3])
    got = run(q, k, v)
    assert_close(list(got), list(vjp(g)), 1e-5, 1e-5)


def test_lstm_matches_a_numpy_lstm() -> None:
    """One-layer LSTM, batch-first, gates in cuDNN order (i, f, g, o), weights w_ih
    [4H, I], w_hh [4H, H], bias [4H]: outputs y [B, T, H] and the final h, c."""
    bsz, steps, inp, hid = 2, 3, 3, 4
    x = rand((bsz, steps, inp))
    h0, c0 = rand((bsz, hid), seed=1), rand((bsz, hid), seed=2)
    w_ih, w_hh = rand((4 * hid, inp), seed=3), rand((4 * hid, hid), seed=4)
    bias = rand((4 * hid,), seed=5)
    y, hn, cn = ops.lstm()(x, h0, c0, w_ih, w_hh, bias)
    h, c, ys = h0.astype(np.float64), c0.astype(np.float64), []
    for t in range(steps):
        z = x[:, t] @ w_ih.T + h @ w_hh.T + bias
        i, f, gg, o = np.split(z, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(gg)
        h = _sigmoid(o) * np.tanh(c)
        ys.append(h)
    assert_close(y, np.stack(ys, 1), 1e-5, 1e-5)
    assert_close(hn, h, 1e-5, 1e-5)
    assert_close(cn, c, 1e-5, 1e-5)


# -- random, embedding ------------------------------------------------------------------------


def test_dropout_with_explicit_keys() -> None:
    """dropout(x, key) -> (y, mask): the same key gives the same mask, another key
    another; y = x * mask / (1 - p); about p of the entries are dropped; entirety drops
    all or nothing."""
    x = rand((40, 50), lo=0.5, hi=1.5)
    key2 = np.asarray(jax.random.key_data(jax.random.key(1)))
    y, mask = ops.dropout(p=0.3)(x, KEY)
    y_again, mask_again = ops.dropout(p=0.3)(x, KEY)
    _, mask_other = ops.dropout(p=0.3)(x, key2)
    mask = np.asarray(mask)
    assert set(np.unique(mask)) <= {0.0, 1.0}
    np.testing.assert_array_equal(mask, np.asarray(mask_again))
    np.testing.assert_array_equal(np.asarray(y), np.asarray(y_again))
    assert not np.array_equal(mask, np.asarray(mask_other))
    assert_close(y, x * mask / 0.7, 1e-6, 1e-6)
    assert abs((1 - mask.mean()) - 0.3) < 0.05
    whole = np.asarray(ops.dropout(p=0.5, entirety=True)(x, KEY)[1])
    assert np.all(whole == whole.flat[0])


def test_random_commands_depend_only_on_their_key() -> None:
    """random_uniform / random_normal: equal keys give equal draws, other keys others;
    uniform lies in [low, high); both take the explicit uint32[2] key in a graph too."""
    key2 = np.asarray(jax.random.key_data(jax.random.key(7)))
    uni = ops.random_uniform(shape=(500,), low=-2.0, high=3.0)
    a, b, c = np.asarray(uni(KEY)), np.asarray(uni(KEY)), np.asarray(uni(key2))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.min() >= -2.0 and a.max() < 3.0 and abs(a.mean() - 0.5) < 0.3
    normal = np.asarray(ops.random_normal(shape=(2000,), mean=1.0, std=2.0)(KEY))
    assert abs(normal.mean() - 1.0) < 0.2 and abs(normal.std() - 2.0) < 0.2
    bld = GraphBuilder()
    k = bld.input((2,), np.uint32, name="key")
    graph = bld.build([bld.exec(uni, k)])
    np.testing.assert_array_equal(np.asarray(interpret(graph, KEY)), a)
    np.testing.assert_array_equal(np.asarray(compile(graph)(key2)), c)


def test_embedding_and_index_select_gather_rows() -> None:
    """embedding(table, idx) == table[idx]; index_select(x, idx, axis) == take; the
    embedding backward scatter-adds into the table rows (repeated ids add up)."""
    table = rand((6, 3))
    idx = np.array([4, 0, 4, 5], np.int32)
    emb = ops.embedding()
    out = emb(table, idx)
    assert_close(out, table[idx], 0, 0)
    x = rand((2, 5, 3), seed=1)
    sel = randint((3,), 5, seed=2)
    assert_close(ops.index_select(axis=1)(x, sel), np.take(x, sel, axis=1), 0, 0)
    g = rand((4, 3), seed=3)
    dtable = emb.definition.backward((g,), (table, idx), (out,), **emb.kwargs)[0]
    want = np.zeros_like(table)
    np.add.at(want, idx, g)
    assert_close(dtable, want, 1e-6, 1e-6)


# -- backwards against jax.vjp of independent formulas ----------------------------------------


def _bn_ref(x, s, b, mean, var):
    mu = x.mean(axis=(0, 1, 2), keepdims=True)
    var = ((x - mu) ** 2).mean(axis=(0, 1, 2), keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * s.reshape(1, 1, 1, -1) + b.reshape(1, 1, 1, -1)


def _gn_ref(x, s, b):
    xs = x.reshape(2, 3, 3, 2, 2)
    mu = xs.mean(axis=(1, 2, 4), keepdims=True)
    var = ((xs - mu) ** 2).mean(axis=(1, 2, 4), keepdims=True)
    y = ((xs - mu) * lax.rsqrt(var + 1e-5)).reshape(x.shape)
    return y * s.reshape(1, 1, 1, -1) + b.reshape(1, 1, 1, -1)


def _avg_pool_ref(x):
    win = ((0, 0), (1, 1), (1, 1), (0, 0))
    total = lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), win)
    count = lax.reduce_window(jnp.ones_like(x), 0.0, lax.add, (1, 3, 3, 1), (1, 1, 1, 1), win)
    return total / count


def _conv_ref(x, w):
    return lax.conv_general_dilated(
        x, w, (2, 2), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "OHWI", "NHWC"),
        precision=lax.Precision.HIGHEST,
    )  # fmt: skip


def _conv_t_ref(y, w):
    """The transposed convolution as the adjoint of _conv_ref (x is [1, 5, 5, 3])."""
    _, pullback = jax.vjp(lambda x: _conv_ref(x, w), jnp.zeros((1, 5, 5, 3), F32))
    return pullback(y)[0]


def _sdpa_ref(q, k, v, mask):
    logits = jnp.einsum("bshd,bthd->bhst", q, k) / jnp.sqrt(4.0) + mask
    return jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(logits, -1), v)


def _erf_gelu(x):
    return 0.5 * x * (1 + lax.erf(x / np.sqrt(2.0).astype(F32)))


# (command, inputs, independent formula of output 0, how many leading inputs it differentiates)
BACKWARDS = {
    "mish": (
        ops.mish(),
        (rand((3, 4), lo=-3, hi=3),),
        lambda x: x * jnp.tanh(jnp.logaddexp(x, 0.0)),
        1,
    ),
    "layer_norm": (
        ops.layer_norm(),
        (rand((3, 5)), rand((5,), seed=1), rand((5,), seed=2)),
        lambda x, s, b: (
            (x - x.mean(-1, keepdims=True))
            * lax.rsqrt(((x - x.mean(-1, keepdims=True)) ** 2).mean(-1, keepdims=True) + 1e-5)
            * s[None, :]
            + b[None, :]
        ),
        3,
    ),
    "batch_norm": (
        ops.batch_norm(),
        (
            rand((2, 3, 3, 2)),
            rand((2,), seed=1),
            rand((2,), seed=2),
            np.zeros(2, F32),
            np.ones(2, F32),
        ),
        _bn_ref,
        3,
    ),
    "group_norm": (
        ops.group_norm(groups=2, reduce_axes=None),
        (rand((2, 3, 3, 4)), rand((4,), seed=1), rand((4,), seed=2)),
        _gn_ref,
        3,
    ),
    "rms_norm": (
        ops.rms_norm(),
        (rand((3, 5)), rand((5,), seed=1)),
        lambda x, s: x * lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * s[None, :],
        2,
    ),
    "max_pool": (
        ops.max_pool(window=(2, 2)),
        (rand((1, 4, 4, 2)),),
        lambda x: x.reshape(1, 2, 2, 2, 2, 2).max(axis=(2, 4)),
        1,
    ),
    "avg_pool_padded": (
        ops.avg_pool(window=(3, 3), strides=(1, 1), padding=1),
        (rand((1, 4, 4, 2)),),
        _avg_pool_ref,
        1,
    ),
    "gemm_bias": (
        ops.gemm(transpose_b=True),
        (rand((2, 3)), rand((4, 3), seed=1), rand((4,), seed=2)),
        lambda a, b, c: a @ b.T + c[None, :],
        3,
    ),
    "convolution_transpose": (
        ops.convolution_transpose(strides=2, padding=1),
        (rand((1, 3, 3, 4)), rand((4, 3, 3, 3), seed=1)),
        _conv_t_ref,
        2,
    ),
    "sdpa_float_mask": (
        ops.scaled_dot_product_attention(),
        (
            rand((1, 3, 2, 4)),
            rand((1, 3, 2, 4), seed=1),
            rand((1, 3, 2, 4), seed=2),
            rand((1, 1, 3, 3), seed=3),
        ),
        _sdpa_ref,
        3,
    ),
    "sigmoid_bce": (
        ops.sigmoid_binary_crossentropy(),
        (rand((3, 4), lo=-3, hi=3), (rand((3, 4), seed=1) > 0).astype(F32)),
        lambda x, t: jnp.sum(
            -(t * jnp.log(jax.nn.sigmoid(x)) + (1 - t) * jnp.log(1 - jax.nn.sigmoid(x))),
            -1,
            keepdims=True,
        ),
        1,
    ),
    "gelu": (ops.gelu(), (rand((3, 4), lo=-3, hi=3),), _erf_gelu, 1),
    "log_softmax": (
        ops.log_softmax(),
        (rand((3, 4), lo=-3, hi=3),),
        lambda x: x - jnp.log(jnp.sum(jnp.exp(x), -1, keepdims=True)),
        1,
    ),
    "reduce_norm2": (
        ops.reduce_norm2(axes=(1,)),
        (rand((3, 4)),),
        lambda x: jnp.sqrt(jnp.sum(x * x, axis=1, keepdims=True)),
        1,
    ),
    "index_select": (
        ops.index_select(axis=1),
        (rand((2, 5)), np.array([4, 1, 4], np.int32)),
        lambda x, idx: x[:, idx],
        1,
    ),
}


@pytest.mark.parametrize("name", list(BACKWARDS))
def test_backward_equals_vjp_of_an_independent_formula(name: str) -> None:
    """The command's output 0 equals the formula and its backward, called in NNC's
    convention with every tensor outside backward_uses passed as a bare spec, equals
    jax.vjp of the formula for the differentiable inputs."""
    cmd, inputs, formula, n_diff = BACKWARDS[name]
    opdef = cmd.definition
    outs = cmd(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    rest = inputs[n_diff:]
    want_out, pullback = jax.vjp(lambda *d: formula(*d, *rest), *inputs[:n_diff])
    assert_close(outs[0], want_out, 1e-5, 1e-5, what="forward")
    g = rand(np.shape(outs[0]), seed=11)
    uses = opdef.backward_uses
    used_in = [i for i in range(len(inputs)) if uses.input_used(i)]
    used_out = [i for i in range(len(outs)) if i in uses.outputs]

    def run(g, ins, os):
        """backward with the unused tensors as bare specs (jitted: the arrays are traced)."""
        specs_in = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in inputs]
        specs_out = [jax.ShapeDtypeStruct(np.shape(o), o.dtype) for o in outs]
        for i, a in zip(used_in, ins):
            specs_in[i] = a
        for i, o in zip(used_out, os):
            specs_out[i] = o
        grads = (g,) + (None,) * (len(outs) - 1)
        return opdef.backward(grads, tuple(specs_in), tuple(specs_out), **cmd.kwargs)[:n_diff]

    got = jax.jit(run)(g, [inputs[i] for i in used_in], [outs[i] for i in used_out])
    assert_close(list(got), list(pullback(g)), 1e-4, 1e-5, what="backward")
