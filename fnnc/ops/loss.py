"""Loss family: softmax / categorical / binary / sigmoid-binary cross-entropy, mse, smooth L1.

Every loss gives one value per sample, keeping the reduced axis as size 1 (NNC's
convention). The cross-entropies reduce the last (class) axis: ``[..., C] -> [..., 1]``;
``mse`` and ``smooth_l1`` reduce every axis but the batch axis: ``[N, ...] -> [N, 1]``.
Sums over an empty axis are 0; what has no value there is refused by the shape rule
(a ``ShapeError``): ``mse``'s mean over samples of no values, and a softmax over no
classes.

Class labels (softmax and categorical cross-entropy) are either class indices shaped
``[...]`` or ``[..., 1]`` (integers, or floats rounded to the nearest class as NNC
does; ``[N]`` also fits scores ``[N, 1, ..., 1, C]``, NNC taking dimension 0 as the
batch), or per-class float targets shaped like the scores. Index labels become the
targets ``trim1`` at the label and ``trim0`` elsewhere: NNC's label smoothing
(``CMD_SOFTMAX_CROSSENTROPY_FORWARD(trim0, trim1)``); float targets ignore the trims.
A class index outside ``[0, C)`` (-1, or C) hits no class: its targets are ``trim0``
everywhere, so softmax_crossentropy's loss is ``logsumexp(x)`` (unsmoothed) and its
gradient the softmax, and categorical_crossentropy's is 0. NNC asserts there; a
compiled program cannot check data, so ``Model.fit`` checks NumPy labels on the host
(:mod:`fnnc.models.checks`) and the fused linear heads and the Pallas kernel agree.
Sources: ``lib/nnc/cmd/softmax_loss/ccv_nnc_softmax_crossentropy_cpu_ref.c``,
``lib/nnc/cmd/sigmoid_loss/ccv_nnc_sigmoid_binary_crossentropy_cpu_ref.c`` and
``lib/nnc/cmd/loss/ccv_nnc_{categorical_crossentropy,binary_crossentropy,mse,smooth_l1}_cpu_ref.c``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from fnnc.core.command import Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError, DTypeError
from fnnc.ops._loss_hints import class_axis_hint, reshape_hint
from fnnc.ops._rules import fail, require_float, require_same_dtype, show, to_shape


def _label_kind(name: str, x, label) -> str:
    """``"index"`` or ``"target"``; fails for labels that fit neither."""
    lead = tuple(x.shape[:-1])
    shape = tuple(label.shape)
    floating = jnp.issubdtype(label.dtype, jnp.floating)
    if not (floating or jnp.issubdtype(label.dtype, jnp.integer)):
        raise DTypeError(
            f"{name}: label {show(label)} must be integer class indices or float targets"
        )
    if _is_target(label, x.shape):
        return "target"
    if shape in (lead, (*lead, 1)) or batch_label(x.shape, shape):
        return "index"
    fail(
        f"{name}: label {show(label)} does not fit scores {show(x)}: expected class indices "
        f"shaped {list(lead)} or {[*lead, 1]} (or [N] for scores [N, 1, ..., 1, C], NNC's "
        f"batch-first rule), or float targets shaped {list(x.shape)}{class_axis_hint(x, shape)}"
    )


def batch_label(scores, shape) -> bool:
    """NNC's rule: dimension 0 is the batch, so ``[N]`` (or ``[N, 1]``) labels fit scores
    ``[N, 1, ..., 1, C]``, whose axes between the batch and the classes have size 1."""
    scores, shape = tuple(scores), tuple(shape)
    return (
        len(scores) > 2
        and all(n == 1 for n in scores[1:-1])
        and shape in ((scores[0],), (scores[0], 1))
    )


def _is_target(label, shape) -> bool:
    """Float labels shaped like the scores are per-class targets, others class indices."""
    return jnp.issubdtype(label.dtype, jnp.floating) and tuple(label.shape) == tuple(shape)


def class_index(label):
    """Class indices from a label: float labels round as NNC's ``(int)(label + 0.5)``, in
    float32 at least (a bfloat16 ``129 + 0.5`` rounds to 130, a float16 ``1025.5`` to 1026)."""
    if jnp.issubdtype(label.dtype, jnp.floating):
        label = label.astype(at_least_float32(label.dtype))
        return jnp.floor(label + 0.5).astype(jnp.int32)
    return label


def _targets(label, shape, dtype, trim0, trim1):
    """Per-class targets ``[..., C]`` from a label (see the module docstring)."""
    if _is_target(label, shape):
        return label.astype(dtype)
    # class numbers counted in at least int32: an iota in a uint8 label's own type wraps
    # past 255, so with 300 classes label 10 also hit class 266
    wide = jax.dtypes.canonicalize_dtype(jnp.promote_types(label.dtype, jnp.int32))
    label = class_index(label).astype(wide)
    idx = to_shape(jnp.reshape(label, (*shape[:-1], 1)), shape)
    hit = lax.broadcasted_iota(wide, shape, len(shape) - 1) == idx
    return jnp.where(hit, jnp.asarray(trim1, dtype), jnp.asarray(trim0, dtype))


def _minus_targets(p, label, trim0, trim1):
    """``p - targets``. For class indices, a scatter of ``trim0 - trim1`` at each label
    into ``p - trim0`` (labels outside ``[0, C)`` hit nothing, as in :func:`_targets`):
    the form JAX's own gradient of a gather has. The one-hot form (an iota compare in
    every consumer's fusion) made the MLP fit step 8% slower on XLA:CPU than jax.jit."""
    if _is_target(label, p.shape):
        return p - label.astype(p.dtype)
    label = class_index(label)
    c = p.shape[-1]
    rows = p.reshape(-1, c)
    lab = jnp.reshape(label, (-1,)).astype(jnp.int32)
    lab = jnp.where((lab >= 0) & (lab < c), lab, c)  # c: out of bounds, dropped
    base = rows - jnp.asarray(trim0, p.dtype) if trim0 else rows
    hit = jnp.asarray(trim0 - trim1, p.dtype)
    out = base.at[jnp.arange(rows.shape[0]), lab].add(hit, mode="drop")
    return out.reshape(p.shape)


def _class_loss_shape(name: str, outputs: int, *, softmax: bool = False):
    def rule(x, label, *, trim0, trim1):
        require_float(name, x)
        if x.ndim < 1:
            fail(f"{name}: scores {show(x)} need a class axis")
        if softmax and x.shape[-1] == 0:  # a softmax over no classes is undefined
            fail(f"{name}: scores {show(x)} have no classes; a softmax needs at least one")
        _label_kind(name, x, label)
        loss = Spec((*x.shape[:-1], 1), x.dtype)
        return (loss, Spec(x.shape, x.dtype)) if outputs == 2 else loss

    return rule


def _null_loss_gradients(inputs, outputs, **params):
    """NNC's null gradient of a two-output loss (``(loss, probabilities)``): ones for the
    loss, nothing for the probabilities (:meth:`fnnc.ops.OpDef.backward` asks it)."""
    x = inputs[0]
    return jnp.ones((*x.shape[:-1], 1), x.dtype), None


@defcommand(
    family="loss",
    shape=_class_loss_shape("softmax_crossentropy", 2, softmax=True),
    uses=Uses(inputs=(1,), outputs=(1,)),
    null_gradient=_null_loss_gradients,
)
def softmax_crossentropy(x, label, *, trim0=0.0, trim1=1.0):
    """Softmax of the logits ``x`` and the cross-entropy to the label: ``(loss [..., 1], softmax)``.

    ``loss = logsumexp(x) - sum(t * x)`` for targets ``t``; it equals
    ``sum(t * -log softmax(x))`` whenever the targets sum to 1 (one-hot labels, or
    ``trim0 = eps / C, trim1 = 1 - eps + eps / C``), and its gradient is always NNC's
    ``softmax - t``. A class whose target is 0 adds 0, so logits masked with ``-inf`` give a
    finite loss (and a zero softmax there) unless a target falls on one. The backward reads
    only the softmax and the label. A 16-bit x is computed in float32 (as the Pallas kernel
    does: over more than 65504 classes the sum of the exponentials passes float16's largest
    value) and both outputs cast back.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> loss, p = ops.softmax_crossentropy()(jnp.array([[10.0, -1.0, -5.0]]), jnp.array([2]))
    >>> loss
    Array([[15.000017]], dtype=float32)
    """
    out, x = x.dtype, x.astype(at_least_float32(x.dtype))
    m = lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
    z = x - m
    e = jnp.exp(z)
    s = jnp.sum(e, axis=-1, keepdims=True)
    t = _targets(label, x.shape, x.dtype, trim0, trim1)
    t_sum = jnp.sum(t, axis=-1, keepdims=True)
    # -sum(t * z) is exactly max - x[label] for a one-hot t, so log(s) is added last. A
    # class without target adds 0 even at a masked -inf logit (0 * -inf would be NaN).
    tz = jnp.where(t == 0, 0, t * z)
    loss = -jnp.sum(tz, axis=-1, keepdims=True) + m * (1 - t_sum) + jnp.log(s)
    return loss.astype(out), (e / s).astype(out)


def _softmax_crossentropy_grad(g_loss, g_p, label, p, *, trim0, trim1):
    gx = jnp.zeros(p.shape, p.dtype)
    if g_loss is not None:
        gx = gx + to_shape(g_loss, p.shape) * _minus_targets(p, label, trim0, trim1)
    if g_p is not None:
        gx = gx + p * (g_p - jnp.sum(g_p * p, axis=-1, keepdims=True))
    return gx


@softmax_crossentropy.backward
def _softmax_crossentropy_backward(grads, inputs, outputs, *, trim0, trim1):
    (g_loss, g_p), (_, label), (_, p) = grads, inputs, outputs
    return _softmax_crossentropy_grad(g_loss, g_p, label, p, trim0=trim0, trim1=trim1), None


@defcommand(
    family="loss", shape=_class_loss_shape("categorical_crossentropy", 1), uses=Uses(inputs=(0, 1))
)
def categorical_crossentropy(p, label, *, trim0=0.0, trim1=1.0):
    """Cross-entropy of probabilities ``p`` to the label: ``-sum(t * log p)`` as ``[..., 1]``.

    A class whose target is 0 adds 0, whatever its probability (``0 * log 0 = 0``, as
    ``xlogy``): for index labels the loss is NNC's ``-log p[label]`` even where another
    class has probability 0, and so is its gradient, ``-1 / p[label]`` at the label and
    0 elsewhere. A probability of 0 at the label is an infinite loss, as in NNC.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.categorical_crossentropy()(jnp.array([[0.0, 0.5, 0.5]]), jnp.array([1]))
    Array([[0.6931472]], dtype=float32)
    """
    t = _targets(label, p.shape, p.dtype, trim0, trim1)
    return -jnp.sum(_xlogy(t, p), axis=-1, keepdims=True)


def _xlogy(t, p):
    """``t * log(p)``, and 0 where ``t == 0`` (no NaN from ``0 * log 0``); the ``p`` under
    the log is kept off 0 there, so JAX's own derivative of this is finite too."""
    none = t == 0
    return jnp.where(none, 0, t * jnp.log(jnp.where(none, 1, p)))


def _xlog1py(t, p):
    """``t * log1p(p)``, and 0 where ``t == 0`` (as :func:`_xlogy`, for ``log(1 - p)``
    with the precision of ``log1p`` where ``p`` is tiny)."""
    none = t == 0
    return jnp.where(none, 0, t * jnp.log1p(jnp.where(none, 0, p)))


def _categorical_crossentropy_grad(g, p, label, *, trim0, trim1):
    g = to_shape(g, p.shape)
    t = _targets(label, p.shape, p.dtype, trim0, trim1)
    none = t == 0  # no weight: a zero gradient, not 0 / 0 where p is 0 too
    gp = jnp.where(none, 0, -g * t / jnp.where(none, 1, p))
    return gp, (-g * jnp.log(p) if _is_target(label, p.shape) else None)


@categorical_crossentropy.backward
def _categorical_crossentropy_backward(grads, inputs, outputs, *, trim0, trim1):
    return _categorical_crossentropy_grad(grads[0], *inputs, trim0=trim0, trim1=trim1)


def _binary_shape(name: str, outputs: int):
    def rule(x, label, *, pos_weight):
        require_float(name, x, label)
        if x.ndim < 1 or tuple(label.shape) != tuple(x.shape):
            fail(
                f"{name}: label {show(label)} must be shaped like the input {show(x)} "
                f"(one target per entry){reshape_hint(label.shape, x.shape)}"
            )
        loss = Spec((*x.shape[:-1], 1), x.dtype)
        return (loss, Spec(x.shape, x.dtype)) if outputs == 2 else loss

    return rule


@defcommand(family="loss", shape=_binary_shape("binary_crossentropy", 1), uses=Uses(inputs=(0, 1)))
def binary_crossentropy(p, label, *, pos_weight=1.0):
    """Binary cross-entropy of probabilities ``p`` summed over the last axis, ``[..., 1]``.

    ``sum((y - 1) * log(1 - p) - pos_weight * y * log(p))`` as in NNC, each product 0
    where its factor ``y - 1`` or ``y`` is (``0 * log 0 = 0``): a saturated correct
    probability (``p == y``, 0 or 1) costs 0, not NaN, and its gradient is 0.

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.binary_crossentropy()(jnp.array([[1.0, 0.0]]), jnp.array([[1.0, 0.0]]))
    Array([[0.]], dtype=float32)
    """
    y = label.astype(p.dtype)
    terms = -_xlog1py(1 - y, -p) - pos_weight * _xlogy(y, p)
    return jnp.sum(terms, axis=-1, keepdims=True)


def _binary_crossentropy_grad(g, p, label, *, pos_weight):
    g, y = to_shape(g, p.shape), label.astype(p.dtype)
    # NNC's form: one division by p (1 - p), kept off 0 (1e-12, or the type's smallest
    # normal number where 1e-12 is none), so a saturated p = 0 or 1 gets a finite (zero
    # for its own label) gradient instead of 0 / 0
    floor = max(1e-12, float(jnp.finfo(p.dtype).tiny))
    gp = g * (((1 - y) * p - pos_weight * y * (1 - p)) / jnp.maximum(p * (1 - p), floor))
    gy = g * (jnp.log1p(-p) - pos_weight * jnp.log(p))
    return gp, gy.astype(label.dtype)


@binary_crossentropy.backward
def _binary_crossentropy_backward(grads, inputs, outputs, *, pos_weight):
    return _binary_crossentropy_grad(grads[0], *inputs, pos_weight=pos_weight)


@defcommand(
    family="loss",
    shape=_binary_shape("sigmoid_binary_crossentropy", 2),
    uses=Uses(inputs=(1,), outputs=(1,)),
    null_gradient=_null_loss_gradients,
)
def sigmoid_binary_crossentropy(x, label, *, pos_weight=1.0):
    """Sigmoid of logits ``x`` and binary cross-entropy to ``label``: ``(loss [..., 1], sigmoid)``.

    ``loss = sum((1 - y) * x + (1 + (pos_weight - 1) * y) * log(1 + exp(-x)))`` over the
    last axis, as in NNC; the backward reads only the sigmoid and the label.
    """
    y = label.astype(x.dtype)
    terms = (1 - y) * x + (1 + (pos_weight - 1) * y) * jax.nn.softplus(-x)
    return jnp.sum(terms, axis=-1, keepdims=True), jax.nn.sigmoid(x)


def _sigmoid_binary_crossentropy_grad(g_loss, g_s, label, s, *, pos_weight):
    y = label.astype(s.dtype)
    gx = jnp.zeros(s.shape, s.dtype)
    if g_loss is not None:
        gx = gx + to_shape(g_loss, s.shape) * ((s - 1) * y * pos_weight + s * (1 - y))
    if g_s is not None:
        gx = gx + g_s * s * (1 - s)
    return gx


@sigmoid_binary_crossentropy.backward
def _sigmoid_binary_crossentropy_backward(grads, inputs, outputs, *, pos_weight):
    (g_loss, g_s), (_, label), (_, s) = grads, inputs, outputs
    return _sigmoid_binary_crossentropy_grad(g_loss, g_s, label, s, pos_weight=pos_weight), None


def _pair_shape(name: str, check=None):
    def rule(a, b, **params):
        require_float(name, a, b)
        require_same_dtype(name, a, b)
        if a.ndim < 1 or tuple(a.shape) != tuple(b.shape):
            fail(
                f"{name}: inputs must share one shape [batch, ...], got {show(a)} and "
                f"{show(b)}{reshape_hint(b.shape, a.shape)}"
            )
        if check is not None:
            check(**params)
        return Spec((a.shape[0], 1), a.dtype)

    return rule


def _per_sample(v):
    """Sum over every axis but the first, as ``[N, 1]``."""
    return jnp.reshape(jnp.sum(v, axis=tuple(range(1, v.ndim))), (v.shape[0], 1))


def _expand(g, shape):
    """``[N, 1]`` gradient spread over a ``[N, ...]`` input."""
    return to_shape(jnp.reshape(g, (shape[0],) + (1,) * (len(shape) - 1)), shape)


def _check_reduce(*, reduce):
    if reduce not in ("mean", "sum"):
        raise CommandError(f"mse: reduce={reduce!r}; use 'mean' or 'sum'")


_MSE_PAIR = _pair_shape("mse", _check_reduce)


def _mse_shape(a, b, *, reduce):
    out = _MSE_PAIR(a, b, reduce=reduce)
    if reduce == "mean" and math.prod(a.shape[1:]) == 0:  # 0 / 0: NaN, and so its gradient
        fail(
            f"mse: inputs {show(a)} have no values per sample to take the mean of; give "
            "samples at least one value, or reduce='sum' (0 for an empty sample)"
        )
    return out


@defcommand(family="loss", shape=_mse_shape, uses=Uses(inputs=(0, 1)))
def mse(a, b, *, reduce="mean"):
    """Squared error per sample, ``[N, ...] -> [N, 1]``: ``"mean"`` or ``"sum"`` of ``(a-b)**2``,
    summed in float32 at least (a 16-bit sum of squares overflows where its mean fits)."""
    wide = at_least_float32(a.dtype)
    d = a.astype(wide) - b.astype(wide)
    loss = _per_sample(d * d)
    return (loss / math.prod(a.shape[1:]) if reduce == "mean" else loss).astype(a.dtype)


def _mse_grad(g, a, b, *, reduce):
    scale = 2.0 / math.prod(a.shape[1:]) if reduce == "mean" else 2.0
    ga = _expand(g, a.shape) * (a - b) * jnp.asarray(scale, a.dtype)
    return ga, -ga


@mse.backward
def _mse_backward(grads, inputs, outputs, *, reduce):
    return _mse_grad(grads[0], *inputs, reduce=reduce)


def _check_beta(*, beta):
    if not beta > 0:
        raise CommandError(f"smooth_l1: beta={beta!r} must be > 0")


@defcommand(family="loss", shape=_pair_shape("smooth_l1", _check_beta), uses=Uses(inputs=(0, 1)))
def smooth_l1(a, b, *, beta=1.0):
    """Smooth L1 per sample, ``[N, ...] -> [N, 1]``, switched on the sample's L1 distance.

    NNC's form: with ``l1 = sum|a - b|`` over the sample, the loss is
    ``0.5 * sum((a - b)**2) / beta`` when ``l1 < beta`` and ``l1 - 0.5 * beta`` otherwise.
    Summed in float32 at least, as :func:`mse`: a 16-bit sum of squares overflows where
    the quadratic branch's loss fits (float16, beta 1000: 300**2 is inf, the loss 45).
    """
    wide = at_least_float32(a.dtype)
    d = a.astype(wide) - b.astype(wide)
    l1 = _per_sample(jnp.abs(d))
    loss = jnp.where(l1 < beta, _per_sample(d * d) * (0.5 / beta), l1 - 0.5 * beta)
    return loss.astype(a.dtype)


def _smooth_l1_grad(g, a, b, *, beta):
    wide = at_least_float32(a.dtype)
    d = a.astype(wide) - b.astype(wide)
    small = _expand(_per_sample(jnp.abs(d)) < beta, a.shape)  # the forward's switch
    ga = _expand(g, a.shape) * jnp.where(small, d / beta, jnp.sign(d)).astype(a.dtype)
    return ga, -ga


@smooth_l1.backward
def _smooth_l1_backward(grads, inputs, outputs, *, beta):
    return _smooth_l1_grad(grads[0], *inputs, beta=beta)
