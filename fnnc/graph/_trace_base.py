"""What the trace rules (:mod:`fnnc.graph.trace_rules`) share: the rule type, dtype
and parameter tests, and the rule for a primitive that is exactly one command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Spec = jax.ShapeDtypeStruct
Rule = Callable[[Any, Any, list[Any]], list[Any] | None]

# Rules that may see non-array values (PRNG keys) and pass them through unchanged.
PASS_THROUGH = frozenset({"jit"})


def _out(eqn: Any, i: int = 0) -> Any:
    return eqn.outvars[i].aval


def _kind(dtype: Any, kind: str) -> bool:
    """``real``: float or signed int; ``float``: real floating; ``number``: not bool."""
    dtype = np.dtype(dtype)
    if kind == "float":
        return jnp.issubdtype(dtype, jnp.floating)
    if kind == "real":
        return jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.signedinteger)
    if kind == "inexact":
        return jnp.issubdtype(dtype, jnp.inexact)
    if kind == "number":
        return dtype != np.bool_
    return True


def _plain(params: dict[str, Any], *keys: str) -> bool:
    """The parameters that would change the result (accuracy, sharding...) are unset."""
    return all(params.get(k) is None for k in keys)


def _default_precision(params: dict[str, Any]) -> bool:
    """A dot or convolution's ``precision`` is what JAX's default gave it (none, or the
    ambient ``jax_default_matmul_precision``): the user asked for nothing of their own,
    so the command fnnc maps it to runs at fnnc's policy (:mod:`fnnc.config`). An
    explicit precision or algorithm stays a generic node, which binds it as written."""
    precision = params.get("precision")
    if precision is None:
        return True
    ambient = jax.config.jax_default_matmul_precision
    try:
        return ambient is not None and precision == (lax.Precision(ambient),) * 2
    except ValueError:  # an algorithm preset's name: never the plain default
        return False


def _simple(cmd: str, kind: str = "any", **params: Any) -> Rule:
    """A primitive that is exactly one command on the same inputs."""

    def rule(ctx, eqn, args):
        if not (_kind(args[0].dtype, kind) and _plain(eqn.params, "accuracy")):
            return None
        if not ctx.fits(cmd, args, _out(eqn), **params):
            return None
        return [ctx.exec(cmd, *args, **params)]

    rule.__name__ = f"rule_{cmd}"
    return rule
