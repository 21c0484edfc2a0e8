"""First values of a model's parameters: every initializer of one build in one program.

Run eagerly, an initializer costs an XLA compile per primitive per parameter shape
(``jax.random.uniform`` is a handful of them): a 12-layer MLP spent 3.7 of its 4.1 s of
``compile`` there. :func:`initialize` traces all of a build's initializers into one
``jax.jit`` instead, splitting the key as the eager loop did (``key, sub =
split(key)`` per parameter, in order), so the values are the same, and compiles it
at XLA's lowest optimization level, since it runs once.

Two kinds of initializer stay eager, each run on its own as before:

- one that returns a value it holds (a Flax module's weights, a given array): traced,
  that value would become a constant of the program, compiled into it, so an
  initializer whose trace holds more than :data:`CONSTANT_BYTES` of constants runs
  eagerly;
- one that needs concrete values (NumPy on the key, Python control flow on an array),
  which cannot be traced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.extend.core
import numpy as np

from fnnc.errors import ModelError

CONSTANT_BYTES = 1 << 16
"""Initializers whose trace holds more constant bytes than this run eagerly."""

FAST_COMPILE = {"xla_backend_optimization_level": 0}
"""XLA options of the one-off initialization program: compile fast, run once."""

_UNTRACEABLE = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
)


def initialize(key: Any, infos: Sequence[Any]) -> tuple[Any, list[Any]]:
    """``(key', values)``: the first value of each parameter of ``infos``
    (:class:`~fnnc.models.layer.ParamInfo`, in order), each from its own key split off
    ``key``, and the key left after the splits."""
    subs, traced = [], []
    for info in infos:
        key, sub = jax.random.split(key)
        subs.append(sub)
        traced.append(_trace(info, sub))
    values: list[Any] = [None] * len(infos)
    together = [k for k, closed in enumerate(traced) if closed is not None]
    if together:
        keys = [subs[k] for k in together]
        for k, value in zip(together, _program([traced[k] for k in together], keys)(keys)):
            values[k] = value
    for k, closed in enumerate(traced):
        if closed is None:
            values[k] = _call(infos[k], subs[k])
    return key, values


_PROGRAMS: dict[tuple, Any] = {}
"""Compiled initialization programs by what they compute (:func:`_program`)."""

PROGRAMS_KEPT = 64
"""How many of them are kept; the oldest go first."""


def _program(closed: Sequence[Any], keys: list[Any]) -> Any:
    """One compiled program running the traced initializers ``closed`` on ``keys``.

    Kept by what it computes (each trace's text and its constants' bytes): a model
    built again with the same shapes, as tests and sweeps do, reuses it, where eager
    initializers reused their per-primitive compiles (a 3-layer MLP's ``compile`` took
    150 ms with a program compiled per build against 2 ms)."""
    signature = tuple((str(c.jaxpr), _digest(c.consts)) for c in closed)
    program = _PROGRAMS.pop(signature, None)
    if program is None:
        parts = [jax.extend.core.jaxpr_as_fun(c) for c in closed]
        program = _compiled(jax.jit(lambda ks: [f(k)[0] for f, k in zip(parts, ks)]), keys)
    _PROGRAMS[signature] = program  # most recently used last
    while len(_PROGRAMS) > PROGRAMS_KEPT:
        del _PROGRAMS[next(iter(_PROGRAMS))]
    return program


def _digest(consts: Sequence[Any]) -> tuple:
    return tuple((np.asarray(c).dtype.str, np.shape(c), np.asarray(c).tobytes()) for c in consts)


def _compiled(run: Any, keys: list[Any]) -> Any:
    """``run`` compiled for ``keys`` by XLA's fastest pipeline: it runs once, so its
    compile is all its cost (24 uniform initializers: 1.3 s against 3.2 s at the default
    optimization level, and 6.5 s run eagerly)."""
    lowered = run.lower(keys)
    try:
        return lowered.compile(compiler_options=FAST_COMPILE)
    except Exception:  # a backend without the option compiles as usual
        return lowered.compile()


def _call(info: Any, key: Any) -> Any:
    try:
        value = info.init(key, info.shape, info.dtype)
    except _UNTRACEABLE:
        raise
    except Exception as e:  # the user's function: say which parameter it was making
        raise ModelError(
            f"{_where(info)} raised {type(e).__name__}: {e}; an initializer is called as "
            "init(key, shape, dtype) and returns an array of that shape"
        ) from e
    return _declared(info, value)


def _where(info: Any) -> str:
    name = getattr(info.init, "__name__", type(info.init).__name__)
    return f"parameter {info.id} {list(info.shape)} of layer {info.layer}: its init {name}"


def _declared(info: Any, value: Any) -> Any:
    """``value``, what ``info``'s initializer returned, as the parameter's first value:
    an array of its shape, converted to its dtype (a float32 draw for a bfloat16
    parameter, NumPy's float64); else a ModelError naming the parameter. Unchecked, a
    wrong shape or type failed later, at the first step, as an input of a program."""
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        value = np.asarray(value) if value is not None else None
    dtype = getattr(value, "dtype", None)
    real = dtype is not None and (
        dtype == np.bool_ or jax.numpy.issubdtype(dtype, jax.numpy.number)
    )
    if real and jax.numpy.issubdtype(dtype, jax.numpy.complexfloating):
        real = jax.numpy.issubdtype(info.dtype, jax.numpy.complexfloating)
    if not real or tuple(value.shape) != tuple(info.shape):
        got = "None" if value is None else f"{np.dtype(dtype).name}{list(value.shape)}"
        raise ModelError(
            f"{_where(info)} returned {got}; an initializer is called as init(key, shape, "
            f"dtype) and returns an array of numbers of that shape, {list(info.shape)}"
        )
    return value if dtype == info.dtype else jax.numpy.asarray(value, info.dtype)


def _trace(info: Any, key: Any) -> Any:
    """``info``'s initializer traced (a ``ClosedJaxpr``), or ``None`` where it must run
    eagerly: it does not trace, or holds many constant bytes (module doc). An error
    raised inside it is a ModelError naming the parameter's id and layer."""
    try:
        closed = jax.make_jaxpr(lambda k: _call(info, k))(key)
    except _UNTRACEABLE:
        return None
    held = sum(np.asarray(c).nbytes for c in closed.consts if hasattr(c, "shape"))
    return closed if held <= CONSTANT_BYTES else None
