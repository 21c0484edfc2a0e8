"""Derivatives of a kernel's derivative: the kernels' ``custom_vjp`` made
differentiable again by the reference.

A Pallas kernel is a ``jax.custom_vjp`` whose forward and backward are ``pallas_call``
s, which JAX cannot differentiate: ``jax.grad`` of ``jax.grad``, ``jax.hessian`` and a
Hessian-vector product (``jax.jvp`` of ``jax.grad``) differentiate the forward and the
backward the first ``jax.grad`` ran. :func:`defvjp` wires the kernels so that they run
as before for the value and the first-order gradient, and whatever differentiates them
once more gets the derivative of the ``"xla"`` reference instead: the forward kernel is
a ``custom_jvp`` whose tangent is the reference's, and the backward kernel a
``custom_jvp`` whose tangent is that of ``jax.vjp`` of the reference (the same values
as the kernel's backward, so the derivative of the reference's backward is the one
wanted).

Forward mode on the kernel itself (``jax.jvp`` of an eager call) stays impossible:
JAX applies no forward mode to a ``custom_vjp`` (dispatch names the command and backend
in that error, see :mod:`fnnc.core.dispatch`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def defvjp(f: Any, fwd: Callable[..., Any], bwd: Callable[..., Any], reference: Callable[..., Any]):
    """``f.defvjp(fwd, bwd)``, differentiable again through ``reference``.

    ``f`` is a ``jax.custom_vjp``; ``fwd`` and ``bwd`` are its rules as JAX takes them
    (``fwd(*args) -> (outs, residuals)``, ``bwd(*nondiff, residuals, cts)``);
    ``reference(*args)`` computes ``f``'s outputs in plain JAX (the same structure and
    values), for the derivatives of ``fwd`` and ``bwd``.
    """
    nondiff = tuple(f.nondiff_argnums)

    def call(fn: Callable[..., Any], static: tuple, primals: tuple) -> Any:
        s, p = iter(static), iter(primals)
        return fn(
            *(next(s) if i in nondiff else next(p) for i in range(len(static) + len(primals)))
        )

    def pullback(static: tuple, primals: tuple, cts: Any) -> tuple:
        return jax.vjp(lambda *xs: call(reference, static, xs), *primals)[1](cts)

    @functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
    def run_fwd(static: tuple, primals: tuple) -> Any:
        return call(fwd, static, primals)

    @run_fwd.defjvp
    def _fwd_jvp(static, xs, ts):
        outs, res = call(fwd, static, xs[0])
        _, t_outs = jax.jvp(lambda *p: call(reference, static, p), xs[0], ts[0])
        return (outs, res), (_like(t_outs, outs), jax.tree.map(_zero_tangent, res))

    @functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
    def run_bwd(static: tuple, primals: tuple, res: Any, cts: Any) -> Any:
        return bwd(*static, res, cts)

    @run_bwd.defjvp
    def _bwd_jvp(static, xs, ts):
        (primals, res, cts), (t_primals, _, t_cts) = xs, ts
        grads = bwd(*static, res, cts)
        # residuals are functions of the primals: their tangents are in t_primals' already
        _, t = jax.jvp(lambda p, c: pullback(static, p, c), (primals, cts), (t_primals, t_cts))
        return grads, tuple(None if g is None else _like(u, g) for g, u in zip(grads, t))

    def split(args: Sequence[Any]) -> tuple[tuple, tuple]:
        static = tuple(a for i, a in enumerate(args) if i in nondiff)
        return static, tuple(a for i, a in enumerate(args) if i not in nondiff)

    def fwd_rule(*args: Any) -> Any:
        static, primals = split(args)
        outs, res = run_fwd(static, primals)
        return outs, (primals, res)

    def bwd_rule(*args: Any) -> Any:
        static, ((primals, res), cts) = args[: len(nondiff)], args[len(nondiff) :]
        return run_bwd(tuple(static), primals, res, cts)

    f.defvjp(fwd_rule, bwd_rule)


def _like(tangent: Any, value: Any) -> Any:
    """``tangent`` in ``value``'s float dtype (a reference may compute in another)."""
    return jax.tree.map(lambda t, v: t.astype(v.dtype) if _is_float(v) else t, tangent, value)


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _zero_tangent(x: Any) -> Any:
    if _is_float(x):
        return jnp.zeros(jnp.shape(x), jnp.result_type(x))
    return np.zeros(jnp.shape(x), jax.dtypes.float0)
