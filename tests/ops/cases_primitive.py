"""Registry-sweep cases for the generic commands that carry JAX primitives."""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

from fnnc.ops.primitive import export_command, primitive_command
from tests.helpers import rand
from tests.ops.cases import Case


def _from_jaxpr(fn, *args):
    """The generic command of the only equation of ``fn``'s jaxpr."""
    (eqn,) = jax.make_jaxpr(fn)(*args).jaxpr.eqns
    outs = [(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
    return primitive_command(eqn.primitive, eqn.params, outs, effects=bool(eqn.effects))


X = rand((3, 4))

CASES = [
    Case(primitive_command(lax.erf_p, {}, [((3, 4), np.float32)]), (X,), "primitive-erf"),
    Case(_from_jaxpr(lambda x: lax.cumsum(x, axis=1), X), (X,), "primitive-cumsum"),
    Case(
        _from_jaxpr(lambda x, y: lax.sort((x, y), dimension=0, num_keys=1), X, -X),
        (X, -X),
        "primitive-sort-two-results",
    ),
    Case(
        _from_jaxpr(lambda x: jax.debug.callback(lambda v: None, x), X),
        (X,),
        "effectful_primitive-debug-callback",
    ),
]

_ERF = primitive_command(lax.erf_p, {}, [((3, 4), np.float32)])
_SPEC = jax.ShapeDtypeStruct((3, 4), np.float32)
CASES.append(Case(export_command(_ERF, [_SPEC]), (X,), "exported-erf", numeric_float32=True))
