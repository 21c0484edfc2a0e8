"""Optimizer state and programs of a dynamic graph, keyed by structure, not identity.

A training loop may build its Optax transformation afresh at every step
(``dg.minimize(optax.adam(1e-3), loss, params)``): each call makes new closures, so
keying by the object would start Adam from zero every step and compile a program per
step. Instead:

* **state** is kept per (state structure, variable set), the structure being
  :func:`fnnc.models.optim.structure` of the whole parameter list (state tree and leaf
  specs), the key a cnnp model's engine uses per parameter. A fresh ``optax.adam()``
  finds the moments the previous one left; switching to a transformation of another
  structure sets them aside (switching back finds them again);
* **programs** are cached by the transformation's structure with its hyper-parameters
  taken out (:func:`fnnc.graph.dynamic.minimizer_key.split`, built on
  :func:`behaviour`: code and what the closures hold, recursively). Two
  transformations made by the same factory share one program; ``optax.adam(1e-3)``
  and ``optax.adam(1e-4)`` too, since the rate is a program input (:func:`stepper`).

Hyper-parameters as inputs: a plain transformation's rates ride as float32 leaves after
its state (:func:`stepper`), which the programs pass through and :func:`store` never
keeps, so each step uses the numbers of the object stepping now. With
``optax.inject_hyperparams(optax.adam)(learning_rate=lr)`` the rate is already a leaf
of the state; when another object of that kind steps a kept state, its
hyper-parameters replace the state's (:func:`state`), so the new rate takes effect.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc.errors import GraphError
from fnnc.ops.optimizer import state_structure

if TYPE_CHECKING:
    from .graph import DynamicGraph
    from .variable import Slot

_KEYS: dict[tuple[int, Any], tuple[Any, Hashable, str]] = {}


def check(optimizer: Any, what: str) -> None:
    """Raises the :class:`GraphError` for an ``optimizer`` that is not an Optax one."""
    if not isinstance(optimizer, optax.GradientTransformation):
        raise GraphError(
            f"{what}: optimizer must be an optax.GradientTransformation, got "
            f"{type(optimizer).__name__}; e.g. optax.adam(1e-3)"
        )


def _cell(cell: Any, depth: int) -> Any:
    """A closure cell's behaviour; an empty cell (a name bound later, as in
    ``optax.exponential_decay``) is its own marker."""
    try:
        contents = cell.cell_contents
    except ValueError:
        return ("empty cell",)
    return behaviour(contents, depth)


def behaviour(value: Any, depth: int = 0) -> Hashable:
    """A hashable fingerprint of what ``value`` does: functions by code, defaults and
    closure (recursively), containers by contents, numbers and strings by value,
    small arrays by bytes, anything else by identity."""
    if depth > 12:
        return ("id", id(value))
    if isinstance(value, types.FunctionType):
        cells = tuple(_cell(c, depth + 1) for c in value.__closure__ or ())
        defaults = behaviour(value.__defaults__ or (), depth + 1)
        return ("fn", value.__code__, defaults, cells)
    if isinstance(value, functools.partial):
        return ("partial", behaviour((value.func, value.args, value.keywords), depth + 1))
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None), np.dtype, type)):
        return (type(value).__name__, value)
    if isinstance(value, dict):
        return ("dict", tuple((k, behaviour(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(behaviour(v, depth + 1) for v in value))
    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        value = jax.random.key_data(value)  # a typed PRNG key: by its bits
    if isinstance(value, (np.ndarray, np.generic, jax.Array)) and np.size(value) <= 64:
        arr = np.asarray(value)
        return ("array", arr.shape, arr.dtype.str, arr.tobytes())
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return ("obj", type(value), value)


def keys(optimizer: Any, specs: tuple[Any, ...]) -> tuple[Hashable, str]:
    """``(program key, state structure)`` of ``optimizer`` over parameters of ``specs``
    (``(shape, dtype)`` pairs); cached per object (the cache holds it, so its id stays
    its own)."""
    got = _KEYS.get((id(optimizer), specs))
    if got is not None and got[0] is optimizer:
        return got[1], got[2]
    if len(_KEYS) > 256:
        _KEYS.clear()
    from fnnc.graph.dynamic.minimizer_key import split  # it builds on behaviour()

    params = [jax.ShapeDtypeStruct(s, d) for s, d in specs]
    made = (split(optimizer).key, state_structure(optimizer, params))  # type: ignore[arg-type]
    _KEYS[(id(optimizer), specs)] = (optimizer, *made)
    return made


def specs_of(params: Sequence[Any]) -> tuple[Any, ...]:
    """The ``(shape, dtype)`` pairs of ``params`` (arrays or specs)."""
    return tuple((tuple(p.shape), np.dtype(p.dtype)) for p in params)


def state(
    dg: DynamicGraph, optimizer: Any, slots: Sequence[Slot], params: list[Any], what: str
) -> list[Any]:
    """The state leaves of ``optimizer`` for the variables of ``slots``: the kept ones
    of its structure, else a fresh ``init``. An injected hyper-parameter (a
    ``hyperparams`` leaf) follows the object stepping now."""
    check(optimizer, what)
    _, struct = keys(optimizer, specs_of(params))
    key = (struct, tuple(slots))
    leaves = dg.opt_states.get(key)
    if leaves is None:
        leaves = dg.opt_states[key] = jax.tree.leaves(optimizer.init(list(params)))
        dg._opt_owner[key] = optimizer
        return leaves
    if dg._opt_owner.get(key) is not optimizer:
        dg._opt_owner[key] = optimizer
        fresh = jax.tree_util.tree_flatten_with_path(optimizer.init(list(params)))[0]
        injected = [i for i, (path, _) in enumerate(fresh) if _injected(path)]
        if injected:
            leaves = list(leaves)
            for i in injected:
                leaves[i] = fresh[i][1]
            dg.opt_states[key] = leaves
    return leaves


def store(
    dg: DynamicGraph, optimizer: Any, slots: Sequence[Slot], params: list[Any], leaves: list[Any]
) -> None:
    """Keeps ``leaves``, the state after a step, under ``optimizer``'s structure."""
    _, struct = keys(optimizer, specs_of(params))
    dg.opt_states[(struct, tuple(slots))] = leaves


def _injected(path: Sequence[Any]) -> bool:
    return any(getattr(k, "name", None) == "hyperparams" for k in path)


def stepper(optimizer: Any) -> tuple[optax.GradientTransformation, list[Any]]:
    """``(transformation, hyper-parameter leaves)``: ``optimizer`` as a program runs it.

    Its floats that are hyper-parameters (:func:`~fnnc.graph.dynamic.minimizer_key.split`:
    learning rates, ``eps``, schedule values) come out of its closures and ride as
    float32 leaves after its state: the transformation's state is ``(optimizer's state,
    hyper-parameters)``, its update rebuilds the optimizer from the hyper-parameters it
    is given and passes them on. A program built for one object therefore steps any
    object of the same structure (the program key) with that object's numbers. Without
    such floats it is ``optimizer`` itself and no leaves.
    """
    from fnnc.graph.dynamic.minimizer_key import split

    h = split(optimizer)
    if not h.values:
        return optimizer, []

    def init(params: Any) -> Any:
        return h.template.init(params), tuple(jnp.float32(v) for v in h.values)

    def update(grads: Any, state: Any, params: Any = None) -> Any:
        inner, hyper = state
        updates, new = h.rebuild(hyper).update(grads, inner, params)
        # a traced float32 rate is not weakly typed: keep the state's and grads' types
        new = jax.tree.map(lambda a, b: a.astype(b.dtype), new, inner)
        return jax.tree.map(lambda u, g: u.astype(g.dtype), updates, grads), (new, hyper)

    return optax.GradientTransformation(init, update), [jnp.float32(v) for v in h.values]
