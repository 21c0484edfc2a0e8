"""Which hyper-parameters of an optimizer update must stay Python constants.

:mod:`.minimizer_key` turns the floats of an Optax transformation into float32 program
inputs, so that a new learning rate compiles nothing. A float whose first arithmetic is
with other numbers alone (Adam's ``1 - b2``) ran in double precision and was rounded
once; as a float32 input it would round at every step and the update would move by
~1e-5. :func:`rounded_first` finds those floats on the update's jaxpr (no XLA compile),
following nested jaxprs (``pjit``, custom derivatives) and ``cond`` branches, and
rejecting any float that enters control flow it does not follow (``while``, ``scan``).
"""

from __future__ import annotations

from typing import Any

from jax.extend.core import Literal

_EXACT = frozenset(
    (
        *("convert_element_type", "broadcast_in_dim", "reshape", "squeeze", "expand_dims"),
        *("copy", "copy_p", "neg", "abs", "max", "min", "select_n"),
        *("eq", "ne", "lt", "le", "gt", "ge"),
    )
)
"""Primitives that give the same float32 result whether their operands were combined in
Python's double precision first or not."""


def rounded_first(jaxpr: Any, n: int) -> set[int]:
    """Hyper-parameters (the first ``n`` inputs of ``jaxpr``) that meet arithmetic with
    nothing but other hyper-parameters and literals before they meet the data.

    Where the original closure held Python floats, that arithmetic (``1 - b2``) ran in
    double precision and was rounded once; as float32 inputs it rounds at every step
    and the numbers change, so those hyper-parameters stay constants.
    """
    rejected: set[int] = set()
    _scan(jaxpr, {v: {i} for i, v in enumerate(jaxpr.invars[:n])}, rejected)
    return rejected


def _scan(jaxpr: Any, pure: dict[Any, set[int]], rejected: set[int]) -> None:
    """Walks ``jaxpr`` where ``pure`` maps variables computed from hyper-parameters
    alone to those hyper-parameters; adds the offending ones to ``rejected``."""
    for eqn in jaxpr.eqns:
        ins = [v for v in eqn.invars if not isinstance(v, Literal)]
        if not any(v in pure for v in ins):
            continue
        inner = next(
            (eqn.params[k] for k in ("jaxpr", "call_jaxpr", "fun_jaxpr") if k in eqn.params), None
        )
        inner = getattr(inner, "jaxpr", inner)
        if inner is not None and len(inner.invars) == len(eqn.invars):
            sub = {
                iv: pure[v]
                for iv, v in zip(inner.invars, eqn.invars)
                if not isinstance(v, Literal) and v in pure
            }
            _scan(inner, sub, rejected)
            for ov, iv in zip(eqn.outvars, inner.outvars):
                if not isinstance(iv, Literal) and iv in sub:
                    pure[ov] = sub[iv]
            continue
        if "branches" in eqn.params:  # lax.cond (optax.MultiSteps): operands after the index
            _scan_branches(eqn, pure, rejected)
            continue
        nested = inner is not None or any(map(_holds_jaxpr, eqn.params.values()))
        hypers = set().union(*(pure.get(v, set()) for v in ins))
        if all(v in pure for v in ins):  # hyper-parameters and literals only
            if eqn.primitive.name not in _EXACT or nested:
                rejected.update(hypers)
            for ov in eqn.outvars:
                pure[ov] = hypers
        elif nested:  # control flow we do not follow (while, scan)
            rejected.update(hypers)


def _holds_jaxpr(param: Any) -> bool:
    if isinstance(param, (tuple, list)):
        return any(map(_holds_jaxpr, param))
    return hasattr(param, "eqns") or hasattr(getattr(param, "jaxpr", None), "eqns")


def _scan_branches(eqn: Any, pure: dict[Any, set[int]], rejected: set[int]) -> None:
    """:func:`_scan` of each branch of a ``cond``; an output is pure if it is in some
    branch (which rejects more, never less)."""
    outs: dict[int, set[int]] = {}
    for branch in eqn.params["branches"]:
        jaxpr = getattr(branch, "jaxpr", branch)
        sub = {
            iv: pure[v]
            for iv, v in zip(jaxpr.invars, eqn.invars[1:])
            if not isinstance(v, Literal) and v in pure
        }
        _scan(jaxpr, sub, rejected)
        for i, ov in enumerate(jaxpr.outvars):
            if not isinstance(ov, Literal) and ov in sub:
                outs.setdefault(i, set()).update(sub[ov])
    for i, hypers in outs.items():
        pure[eqn.outvars[i]] = hypers
