"""Dispatch: which backend runs a command (NNC's ``CPU_REF`` / ``GPU_CUDNN`` ...), in one place.

Backend choice depends on the backends registered per command, the autotune table, and
the selection rule. Eager calls, ``compile`` and the dynamic graph all choose through
:func:`select_backend`, and every cache of a choice keys on :func:`state` (a generation
bumped by each registration and table write, plus the configuration in force), so no
cache can disagree with the registry.

The pieces live in modules of their own, and this module re-exports every name of them:

- :mod:`fnnc.core.backends`: :class:`Backend`, :func:`register_backend`,
  :func:`backends_of` (gradient backends synthesized from forwards' ``backward``), the
  autotune table :data:`TABLE` and :func:`state`;
- :mod:`fnnc.core.selection`: :func:`select_backend` (the rule: forced, tuned, measured,
  by priority, else the reference), :func:`why_not`, :func:`use_measured_defaults`;
- :mod:`fnnc.core.compiled`: :func:`compiled_forward` (jitted, cached, checked against
  the shape rule), :func:`matmul_precision_scope`, :func:`reference_only`.

What stays here is the eager call: :func:`run_eager` checks its inputs
(:func:`checked_inputs`), selects a backend and runs the compiled forward.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.backends import _BACKENDS as _BACKENDS
from fnnc.core.backends import REFERENCE as REFERENCE
from fnnc.core.backends import TABLE as TABLE
from fnnc.core.backends import AutotuneTable as AutotuneTable
from fnnc.core.backends import Backend as Backend
from fnnc.core.backends import _bump as _bump
from fnnc.core.backends import backends_of as backends_of
from fnnc.core.backends import register_backend as register_backend
from fnnc.core.backends import state as state
from fnnc.core.backends import table_key as table_key
from fnnc.core.backends import unregister_backend as unregister_backend
from fnnc.core.command import Command, Spec, lookup, output_specs
from fnnc.core.compiled import _compiled as _compiled
from fnnc.core.compiled import compiled_forward as compiled_forward
from fnnc.core.compiled import forward_mode_error as forward_mode_error
from fnnc.core.compiled import forward_of as forward_of
from fnnc.core.compiled import matmul_precision_scope as matmul_precision_scope
from fnnc.core.compiled import reference_only as reference_only
from fnnc.core.compiled import references_only as references_only
from fnnc.core.keys import key_bits
from fnnc.core.platforms import PLATFORMS as PLATFORMS
from fnnc.core.selection import platform_scope as platform_scope
from fnnc.core.selection import select_backend as select_backend
from fnnc.core.selection import selection_precision as selection_precision
from fnnc.core.selection import use_measured_defaults as use_measured_defaults
from fnnc.core.selection import why_not as why_not
from fnnc.errors import CommandError, DTypeError


def as_arrays(values: Sequence[Any], where: str) -> tuple[Any, ...]:
    """``values`` with lists and Python numbers made the arrays NumPy makes of them; a
    :class:`DTypeError` naming ``where`` for what makes none. ``None`` (an optional
    input left out) stays ``None``."""
    out = []
    for i, a in enumerate(values):
        if a is not None and not (hasattr(a, "shape") and hasattr(a, "dtype")):
            try:
                a = jax.numpy.asarray(a)
            except TypeError:
                raise DTypeError(
                    f"{where}: input {i} is a {type(a).__name__}, expected an array"
                ) from None
        out.append(a)
    return tuple(out)


def as_specs(arrays: Sequence[Any], where: str) -> tuple[Spec | None, ...]:
    """The specs of ``arrays`` (:func:`as_arrays` of them); ``None`` stays ``None``."""
    return tuple(
        None if a is None else Spec(tuple(a.shape), a.dtype) for a in as_arrays(arrays, where)
    )


def _left_out(cmd: Command, arrays: Sequence[Any]) -> tuple[Any, ...]:
    """``arrays`` without trailing ``None``s; a :class:`CommandError` for a ``None`` in
    the place of a required input (only inputs whose default is ``None`` may be left out).
    """
    if not any(a is None for a in arrays):
        return tuple(arrays)
    opdef = lookup(cmd.name)
    optional = range(opdef.num_required, opdef.num_required + opdef.num_optional)
    for i, a in enumerate(arrays):
        if a is None and i not in optional:
            raise CommandError(
                f"{cmd}: input {i} is None, but it is required "
                f"(signature {opdef.name}{inspect.signature(opdef.forward)}); only optional "
                "inputs (those with a default of None) may be passed as None"
            )
    arrays = tuple(arrays)
    while arrays and arrays[-1] is None:
        arrays = arrays[:-1]
    return arrays


_PLAIN = np.dtype(np.float32)


def checked_inputs(
    cmd: Command, arrays: Sequence[Any]
) -> tuple[tuple[Any, ...], tuple[Spec | None, ...], tuple[Spec, ...]]:
    """``(arrays, their specs, the output specs)`` of a call of ``cmd`` on ``arrays``,
    checked as an eager call checks them: trailing ``None`` s dropped (a ``None`` in a
    required place is a :class:`CommandError`), typed PRNG keys as their ``uint32``
    data, lists and numbers as arrays, and the shape rule run (a
    :class:`~fnnc.errors.ShapeError`, :class:`DTypeError` or :class:`CommandError` for
    inputs the command does not take)."""
    arrays = _left_out(cmd, arrays)
    if any(not isinstance(getattr(a, "dtype", _PLAIN), np.dtype) for a in arrays):
        arrays = tuple(map(key_bits, arrays))  # a typed PRNG key: its uint32 data
    arrays = as_arrays(arrays, str(cmd))  # a list runs as the array NumPy makes of it
    specs = as_specs(arrays, str(cmd))
    return arrays, specs, output_specs(cmd, specs)


def run_eager(cmd: Command, arrays: Sequence[Any]) -> Any:
    """Runs ``cmd`` on concrete arrays: checked by the shape rule, then compiled once.

    ``None`` leaves out an optional input: ``sdpa(q, k, v, None)`` is ``sdpa(q, k, v)``
    (trailing ``None``s are dropped), and ``sdpa(q, k, v, None, w)`` gives the command
    ``mask=None``. Such a call, with an input left out before a given one, runs the
    reference backend: other backends take their inputs by position.
    """
    arrays, specs, outs = checked_inputs(cmd, arrays)
    gap = any(s is None for s in specs)
    backend = REFERENCE if gap else select_backend(cmd, specs)
    try:
        result = compiled_forward(cmd, backend)(*arrays)
    except TypeError as e:  # jax.jvp of a kernel (a custom_vjp): say which, and the way out
        error = forward_mode_error(e, [(str(cmd), cmd.name, backend)])
        if error is None:
            raise
        raise error from None
    if len(outs) == 1 and isinstance(result, tuple):
        return result[0]
    return result
