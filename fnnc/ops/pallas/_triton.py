"""Which primitives the Pallas Triton lowering implements, and fnnc's rules for some it lacks.

The Pallas backend compiles on one platform, ``gpu``, through Triton (see
:mod:`fnnc.ops.pallas`), so whether a generated kernel can run is a question about
Triton's rule table, whichever machine asks: ``select_backend(cmd, specs, "gpu")``
answers the same on a CPU host as on the GPU. The table is read from the installed JAX
(:func:`lowered`), never copied: primitives change between JAX versions (0.11 added
``one_minus_square``, the ``1 - tanh²`` of ``tanh``'s derivative, which JAX's Triton
lowering implements), and a copied list declined every GELU chain there.

Primitives that fnnc's elementwise commands emit but the table lacks get a rule here
(:data:`RULES`): a function of lowerable primitives, substituted for the equation when
a kernel body is traced (:func:`lowerable`). ``erf`` (exact GELU, ``ewerf``) uses the
rational approximation XLA itself expands float32 ``erf`` into, so a kernel matches the
reference to rounding. A body whose primitives are neither lowered nor ruled (``erfc``
today) is declined by ``supports`` with their names, and XLA runs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend as jex
import jax.numpy as jnp


@functools.cache
def lowered() -> frozenset[str]:
    """Names of the primitives the installed JAX's Pallas Triton lowering implements.

    Empty when this JAX has no Triton lowering (it is deprecated upstream): every
    generated kernel is then declined, with the primitives named, rather than failing.
    """
    try:
        from jax._src.pallas.triton import lowering
    except ImportError:
        return frozenset()
    return frozenset(p.name for p in lowering.triton_lowering_rules)


# XLA's float32 erf expansion (xla/codegen/emitters/transforms/expand_float_ops.cc):
# x * P(x²) / Q(x²) on [-c, c], c = erfinv(1 - 2^-23), past which erf rounds to ±1.
_ERF_P = (
    0.00022905065861350646,
    0.0034082910107109506,
    0.050955695062380861,
    0.18520832239976145,
    1.128379143519084,
)
_ERF_Q = (
    -1.1791602954361697e-7,
    0.000023547966471313185,
    0.0010179625278914885,
    0.014070470171167667,
    0.11098505178285362,
    0.49746925110067538,
    1.0,
)
_ERF_CLAMP = 3.7439211627767994


def _horner(coefficients: Sequence[float], x: Any) -> Any:
    acc = jnp.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        acc = acc * x + c
    return acc


def _erf(x: Any, **params: Any) -> Any:
    x = jnp.clip(x, -_ERF_CLAMP, _ERF_CLAMP)
    x2 = x * x
    return x * _horner(_ERF_P, x2) / _horner(_ERF_Q, x2)


def _one_minus_square(x: Any, **params: Any) -> Any:
    # (1 - x)(1 + x), not 1 - x*x: no cancellation near |x| = 1 (JAX's own Triton rule).
    return (1 - x) * (1 + x)


RULES: dict[str, Callable[..., Any]] = {
    "erf": _erf,
    "one_minus_square": _one_minus_square,
}
"""Primitive name -> the same function of lowerable primitives (params as keywords)."""

_INLINED = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr"}
_INLINED |= {"custom_jvp_call": "call_jaxpr"}
"""Call-like primitives whose body is evaluated in place when a rule applies inside it
(only forwards run in a kernel: derivatives are taken before :func:`lowerable`)."""


def _ruled(name: str) -> bool:
    return name in RULES and name not in lowered()


def _needs_rules(jaxpr: Any) -> bool:
    for eqn in jaxpr.eqns:
        if _ruled(eqn.primitive.name):
            return True
        if any(_needs_rules(sub) for sub in jex.core.jaxprs_in_params(eqn.params)):
            return True
    return False


def _evaluate(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list[Any]:
    """``jaxpr`` on ``args``, ruled primitives replaced (``eval_jaxpr`` with :data:`RULES`)."""
    env: dict[Any, Any] = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, jex.core.Literal) else env[v]
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        sub = eqn.params.get(_INLINED.get(name, ""))
        if _ruled(name):
            outs = [RULES[name](*ins, **eqn.params)]
        elif sub is not None and _needs_rules(getattr(sub, "jaxpr", sub)):
            outs = _evaluate(getattr(sub, "jaxpr", sub), getattr(sub, "consts", ()), ins)
        else:
            outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def lowerable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with every ruled primitive it binds replaced by its :data:`RULES` entry.

    ``fn`` is traced on the arguments' shapes first; when nothing in it needs a rule it
    runs as it is, so bodies Triton lowers directly are untouched.
    """

    @functools.wraps(fn)
    def run(*args: Any) -> Any:
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        if not _needs_rules(closed.jaxpr):
            return fn(*args)
        outs = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(shapes), outs)

    return run


def primitives(jaxpr: Any) -> set[str]:
    """Names of the primitives ``jaxpr`` binds, nested jaxprs included."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for sub in jex.core.jaxprs_in_params(eqn.params):
            names |= primitives(sub)
    return names


def missing(fn: Callable[..., Any], *specs: Any) -> list[str]:
    """Primitives of ``lowerable(fn)`` on ``specs`` that Triton cannot lower, sorted."""
    return sorted(primitives(jax.make_jaxpr(lowerable(fn))(*specs).jaxpr) - lowered())
