"""BLAS family: gemm, add, mul, scalar_mul (NNC's GEMM, ADD, MUL, SCALAR_MUL).

``gemm(a, b, bias?)`` multiplies the last two axes, batching over leading axes
(broadcast). NNC's dense layer is ``gemm(transpose_b=True)`` with weight ``[out, in]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.command import NOTHING, Spec, Uses, defcommand
from fnnc.core.dtypes import at_least_float32, is_floating
from fnnc.errors import DTypeError
from fnnc.ops._rules import (
    broadcast,
    broadcast_shape,
    fail,
    require_number,
    require_same_dtype,
    same_shape,
    show,
    to_shape,
    unbroadcast,
    whole_number,
)

_A = {False: "mk", True: "km"}  # a's matrix axes, by transpose_a
_B = {False: "kn", True: "nk"}  # b's matrix axes, by transpose_b
_BATCH = "abcdefghijlopqrstuvwxyz"  # einsum letters of batch axes (m, k, n are taken)


def _contract(shape: Sequence[int], axes: str, *operands: tuple[Any, str]) -> Any:
    """The product of two ``[*batch, r, c]`` operands (matrix axes named by ``axes``
    letters ``m``, ``k``, ``n``) as ``shape``: ``[*batch, *axes]``, where a batch axis
    of size 1 in ``shape`` that an operand has at another size is summed.

    Batch axes broadcast without ever being materialised: one einsum, so one
    ``dot_general``, where an axis only one operand has is a free axis and an axis the
    result lacks is contracted. The dense layer ``[B, S, in] x [out, in]`` is then one
    matrix product of ``B*S`` rows, and its weight gradient one contraction over
    ``B*S``. Broadcasting the weight to ``[B, out, in]`` (as this command did) made
    XLA:CPU copy the weight per batch row and sum ``B`` weight gradients (3x slower
    LM steps at batch 16).
    """
    shapes = [tuple(shape)] + [tuple(t.shape) for t, _ in operands]
    rank = max(map(len, shapes)) - 2
    batch = [1] * rank
    for each in shapes:
        for i, n in enumerate(each[:-2]):
            j = rank - (len(each) - 2) + i
            batch[j] = max(batch[j], n)
    names, squeezed = [], []
    for t, matrix in operands:
        lead = rank - (t.ndim - 2)
        drop = [i for i, n in enumerate(t.shape[:-2]) if n == 1 and batch[lead + i] != 1]
        letters = [_BATCH[lead + i] for i in range(t.ndim - 2) if i not in drop]
        squeezed.append(lax.squeeze(t, drop) if drop else t)
        names.append("".join(letters) + matrix)
    lead = rank - (len(shape) - 2)
    kept = "".join(
        _BATCH[lead + i] for i, n in enumerate(shape[:-2]) if n != 1 or batch[lead + i] == 1
    )
    y = jnp.einsum(f"{names[0]},{names[1]}->{kept}{axes}", *squeezed)
    return jnp.reshape(y, tuple(shape))


def _as_matrix(name: str, x: Spec, transpose: bool) -> tuple[int, ...]:
    """``x``'s shape as NNC's matrix view: a rank-1 ``[k]`` is the row ``[1, k]``.

    NNC cannot transpose a vector (``ccv_nnc_tensor_get_matrix_params`` asserts), so
    neither can fnnc: a column is an explicit ``[k, 1]``.
    """
    if x.ndim == 0:
        fail(f"gemm: {name} {show(x)} is a scalar; gemm needs a vector or a matrix")
    if x.ndim == 1 and transpose:
        fail(
            f"gemm: transpose_{name} on the vector {name} {show(x)}: a rank-1 operand is the "
            f"row [1, {x.shape[0]}] and has no transpose (as in NNC); reshape it to "
            f"[{x.shape[0]}, 1] (a column) and drop transpose_{name}"
        )
    return tuple(x.shape) if x.ndim >= 2 else (1, *x.shape)


def _gemm_layout(a: Spec, b: Spec, bias: Spec | None, transpose_a: bool, transpose_b: bool):
    """(a's matrix shape, b's matrix shape, the product's matrix shape, the output shape).

    NNC's rule (``_ccv_nnc_gemm_tensor_auto_forw``): a vector ``a`` gives a vector when
    neither operand has batch axes (``[k] x [k, n] -> [n]``); otherwise the row axis
    stays (``[k] x [B, k, n] -> [B, 1, n]``).
    """
    am, bm = _as_matrix("a", a, transpose_a), _as_matrix("b", b, transpose_b)
    m, ka = (am[-1], am[-2]) if transpose_a else (am[-2], am[-1])
    kb, n = (bm[-1], bm[-2]) if transpose_b else (bm[-2], bm[-1])
    if ka != kb:
        fail(
            f"gemm: contraction sizes differ: a {show(a)} gives k={ka} "
            f"(transpose_a={transpose_a}), b {show(b)} gives k={kb} (transpose_b={transpose_b}); "
            "for a dense layer with weight [out, in] use gemm(transpose_b=True)"
        )
    batch = broadcast_shape("gemm", am[:-2], bm[:-2])
    full = (*batch, m, n)
    if bias is not None and broadcast_shape("gemm (bias)", full, bias.shape) != full:
        fail(
            f"gemm: bias {show(bias)} must broadcast to the product {list(full)} "
            f"(e.g. [{n}], one value per output column)"
        )
    out = (n,) if a.ndim == 1 and max(a.ndim, b.ndim) <= 2 else full
    return am, bm, full, out


def _gemm_shape(a: Spec, b: Spec, bias: Spec | None = None, *, transpose_a, transpose_b):
    dtype = require_same_dtype("gemm", *(s for s in (a, b, bias) if s is not None))
    return Spec(_gemm_layout(a, b, bias, transpose_a, transpose_b)[3], dtype)


@defcommand(family="blas", shape=_gemm_shape, uses=Uses(inputs=(0, 1)))
def gemm(a, b, bias=None, *, transpose_a=False, transpose_b=False):
    """Matrix product of the last two axes, plus an optional bias: ``a @ b + bias``.

    ``transpose_a`` / ``transpose_b`` transpose the last two axes of ``a`` / ``b``
    first; leading axes are batch axes and broadcast. As in NNC, a rank-1 operand is a
    row vector ``[1, k]`` (it cannot be transposed), and a vector ``a`` times a matrix
    gives a vector: ``[1, 2] x [[7, 8, 9], [10, 11, 12]] = [27, 30, 33]``, and the dense
    layer ``gemm(transpose_b=True)`` maps an input ``[in]`` to ``[out]``. The bias
    broadcasts against the product ``[..., m, n]`` (``[n]``: one value per column).
    """
    am, bm, full, out = _gemm_layout(a, b, bias, transpose_a, transpose_b)
    x, w = jnp.reshape(a, am), jnp.reshape(b, bm)
    y = _contract(full, "mn", (x, _A[transpose_a]), (w, _B[transpose_b]))
    if bias is not None:
        y = y + to_shape(bias, y.shape)
    return jnp.reshape(y, out)


@gemm.backward
def _gemm_backward(grads, inputs, outputs, *, transpose_a, transpose_b):
    (g,), (a, b, *bias) = grads, inputs
    am, bm, full, _ = _gemm_layout(a, b, bias[0] if bias else None, transpose_a, transpose_b)
    g = jnp.reshape(g, full)
    x, w = jnp.reshape(a, am), jnp.reshape(b, bm)
    ga = _contract(am, _A[transpose_a], (g, "mn"), (w, _B[transpose_b]))
    gb = _contract(bm, _B[transpose_b], (x, _A[transpose_a]), (g, "mn"))
    result = (jnp.reshape(ga, a.shape), jnp.reshape(gb, b.shape))
    return result + tuple(unbroadcast(g, c.shape) for c in bias)


def _whole_scalars(name: str, base: Any) -> Any:
    """Shape rule ``base`` that also refuses a fractional scalar (``p``, ``q``, ``a``) on
    an integer or bool input: computed in the input's type it would be truncated first
    (``scalar_mul(a=0.5)`` of ``[1, 2, 3]`` gave zeros), and NNC's commands take floats."""

    def rule(*specs: Spec, **params: Any) -> Spec:
        out = base(*specs, **params)
        if not jnp.issubdtype(out.dtype, jnp.inexact):
            bad = {k: v for k, v in params.items() if k in ("p", "q", "a") and not whole_number(v)}
            if bad:
                given = ", ".join(f"{k}={v!r}" for k, v in bad.items())
                raise DTypeError(
                    f"{name}: {given} on {show(specs[0])} would be truncated to "
                    f"{np.dtype(out.dtype).name}; give whole-number scalars, or convert the "
                    "inputs to a float type first (datatype_conversion)"
                )
        require_number(name, specs[0])
        return out

    return rule


@defcommand(
    family="blas",
    shape=_whole_scalars("add", broadcast("add")),
    uses=NOTHING,
    elementwise=True,
    commutative=lambda cmd: cmd.param("p") == cmd.param("q"),  # p*a + q*b
)
def add(a, b, *, p=1.0, q=1.0):
    """``p * a + q * b`` (broadcasting), NNC's ADD with its two scalars; 16-bit floats
    are scaled and summed in float32 and rounded once, as NNC does. On integer inputs
    the scalars are whole numbers (a fractional one raises :class:`DTypeError`)."""
    shape = broadcast_shape("add", a.shape, b.shape)
    a, b = to_shape(a, shape), to_shape(b, shape)
    if q == -1.0 and p == 1.0:
        return lax.sub(a, b)
    if p == 1.0 and q == 1.0:
        return lax.add(a, b)
    wide = _wide(a.dtype)  # 16-bit: in float32, rounded once (NNC's)
    return lax.add(_times(a.astype(wide), p), _times(b.astype(wide), q)).astype(a.dtype)


def _scalar(value, like):
    return lax.full(like.shape, value, like.dtype)


def _wide(dtype):
    """The type a scalar product is computed in: float32 for 16- and 8-bit floats, whose
    own rounding of the scalar (0.99 is 0.9883 in bfloat16) would move every result (JAX
    has no promotion path from the float8 types, so it is not asked)."""
    return at_least_float32(dtype) if is_floating(dtype) else dtype


def _times(x, value):
    """``value * x`` computed as :func:`_wide` says, in ``x``'s type."""
    if value == 1.0:
        return x
    wide = x.astype(_wide(x.dtype))
    return lax.mul(wide, _scalar(value, wide)).astype(x.dtype)


@add.backward
def _add_backward(grads, inputs, outputs, *, p, q):
    (g,), (a, b) = grads, inputs
    return unbroadcast(_times(g, p), a.shape), unbroadcast(_times(g, q), b.shape)


@defcommand(
    family="blas",
    shape=_whole_scalars("mul", broadcast("mul")),
    uses=Uses(inputs=(0, 1)),
    elementwise=True,
    commutative=True,
)
def mul(a, b, *, p=1.0):
    """``p * a * b`` (broadcasting), NNC's MUL (on integer inputs ``p`` is a whole
    number: a fractional one raises :class:`DTypeError`)."""
    shape = broadcast_shape("mul", a.shape, b.shape)
    a, b = to_shape(a, shape), to_shape(b, shape)
    if p == 1.0:
        return lax.mul(a, b)
    wide = _wide(a.dtype)
    return _times(lax.mul(a.astype(wide), b.astype(wide)), p).astype(a.dtype)


@mul.backward
def _mul_backward(grads, inputs, outputs, *, p):
    (g,), (a, b) = grads, inputs
    gp = _times(g, p)
    return unbroadcast(gp * to_shape(b, g.shape), a.shape), unbroadcast(
        gp * to_shape(a, g.shape), b.shape
    )


@defcommand(
    family="blas", shape=_whole_scalars("scalar_mul", same_shape), uses=NOTHING, elementwise=True
)
def scalar_mul(x, *, a=1.0):
    """``a * x`` for a Python scalar ``a``, NNC's SCALAR_MUL (16-bit floats: computed in
    float32 and rounded once, as NNC does; integer inputs take a whole-number ``a``, a
    fractional one raises :class:`DTypeError`)."""
    return _times(x, a)


@scalar_mul.backward
def _scalar_mul_backward(grads, inputs, outputs, *, a):
    return (_times(grads[0], a),)
