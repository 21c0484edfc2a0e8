"""Minimizers keyed by structure: hyper-parameters are program inputs, not constants.

``set_minimizer(optax.adam(1e-3))`` then ``set_minimizer(optax.adam(1e-4))`` makes two
objects that differ only in a number. The engine keys its ``fit`` and
``apply_gradients`` programs by what a minimizer *does* with its numbers taken out,
and feeds the numbers to the program, so the second call compiles nothing and the
next step uses the new rate.

How a minimizer is split (:func:`split`): its ``init`` and ``update`` closures are
walked as :func:`fnnc.graph.dynamic.optim.behaviour` walks them (functions by code,
defaults and closure cells, ``functools.partial``, tuples, lists, dicts). Every float
met on the way (Python floats, NumPy float scalars, 0-d float arrays) is a
hyper-parameter candidate. A candidate becomes a float32 input only if

* the update still traces with it traced: a float that decides Python control flow
  (``if decay:``) stays a constant;
* its first arithmetic is with the data, not with other numbers alone: optax computes
  ``1 - b2`` in Python's double precision and rounds once, which a float32 input would
  not reproduce (Adam's numbers would move by ~1e-5), so ``b1``, ``b2`` stay constants
  while the rate, ``eps`` and schedule values are inputs (:func:`.rounded_first.rounded_first`,
  read off the update's jaxpr; no XLA compile).

Constants are part of the key by value; the key is ``behaviour`` of the transformation
with every input float replaced by a numbered placeholder. The probe runs once per
structure and set of constants (later objects of that kind reuse its answer).

In a program, the hyper-parameters ride as float32 scalar leaves at the end of the
optimizer state (:class:`fnnc.models.optim.Minimizers`), as ``optax.inject_hyperparams``
carries them: the program passes them through unchanged. The partition states kept by
:class:`fnnc.models.optim.StateStore` never hold them, so checkpoints and
``optimizer_state`` are the plain Optax states.

Numerics: inside the update the inputs are weakly typed float32 scalars, as the Python
floats they replace are (:func:`weak`), so a bfloat16 or float16 parameter's update is
computed in its own dtype, as Optax alone computes it, and code that mixes a
hyper-parameter with the data (``optax.clip_by_global_norm``'s
``jnp.where(norm < max_norm, g, g * (max_norm / norm))``) sees the dtypes it was written
for.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import types
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc.errors import ModelError
from fnnc.graph.dynamic.optim import behaviour
from fnnc.graph.dynamic.rounded_first import rounded_first

try:  # JAX has no public way to make a traced value weakly typed
    from jax._src.lax.lax import _convert_element_type
except ImportError:  # pragma: no cover - a JAX that moved it: strong float32 inputs
    _convert_element_type = None

_DEPTH = 12  # as deep as behaviour() looks
_CACHE: dict[int, tuple[Any, Hyper]] = {}
_MASKS: dict[Hashable, list[tuple[bool, ...]]] = {}  # structure -> masks probed
_PROBED: set[tuple[Hashable, tuple[bool, ...], tuple[float, ...]]] = set()


@dataclasses.dataclass(frozen=True, eq=False)
class _Hole:
    """The placeholder of hyper-parameter ``index`` in a key."""

    index: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Hole) and other.index == self.index

    def __hash__(self) -> int:
        return hash(("hyper", self.index))


def weak(value: Any) -> Any:
    """``value`` (a float32 scalar, traced or not) weakly typed, as a Python float is:
    with a float16 array it gives float16, where a plain float32 scalar promotes the
    array to float32 (``lax.select`` then refuses the mix).

    >>> import jax.numpy as jnp
    >>> (weak(jnp.float32(0.5)) * jnp.ones(2, jnp.float16)).dtype
    dtype('float16')
    """
    if _convert_element_type is None:
        return value
    return _convert_element_type(value, weak_type=True)


def _rebuilt(template: Any, mask: Sequence[bool], values: Sequence[Any]) -> Any:
    """``template`` with ``values`` in the places ``mask`` marks, weakly typed as the
    floats they replace (:func:`weak`)."""
    return _substitute(template, mask, [weak(v) for v in values])


def _is_float(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (float, np.floating)):
        return True
    return (
        isinstance(value, (np.ndarray, jax.Array))
        and value.shape == ()
        and jnp.issubdtype(value.dtype, jnp.floating)
    )


def _walk(value: Any, put: Callable[[Any], Any], depth: int = 0, *, fill: bool = False) -> Any:
    """``value`` with every float ``f`` reachable through closures replaced by
    ``put(f)`` (in a fixed order); the same object where nothing changed. ``fill``
    also puts :data:`_EMPTY` in empty closure cells (for keys: ``behaviour`` reads
    every cell)."""
    if depth > _DEPTH:
        return value
    if _is_float(value):
        return put(value)

    def walk(v: Any) -> Any:
        return _walk(v, put, depth + 1, fill=fill)

    if isinstance(value, types.FunctionType):
        return _walk_function(value, walk, fill)
    if isinstance(value, types.MethodType) and hasattr(value.__self__, "__dict__"):
        # a transformation object's bound method (optax.MultiSteps): its attributes
        # are its closure; a copy of the object carries the substituted numbers
        attrs = walk(vars(value.__self__))
        if attrs is vars(value.__self__):
            return value
        obj = copy.copy(value.__self__)
        vars(obj).update(attrs)
        return types.MethodType(value.__func__, obj)
    if isinstance(value, functools.partial):
        func, args, kw = walk((value.func, value.args, value.keywords))
        if func is value.func and args is value.args and kw is value.keywords:
            return value
        return functools.partial(func, *args, **kw)
    if isinstance(value, (tuple, list)):
        items = [walk(v) for v in value]
        if all(a is b for a, b in zip(items, value)):
            return value
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        new = {k: walk(v) for k, v in value.items()}
        return value if all(new[k] is v for k, v in value.items()) else new
    return value


_EMPTY = ("empty cell",)


def _walk_function(fn: types.FunctionType, walk: Callable[[Any], Any], fill: bool) -> Any:
    cells: list[Any] = []
    changed = False
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a name the function's maker never bound
            cells.append(types.CellType(_EMPTY) if fill else cell)
            changed |= fill
            continue
        new = walk(value)
        cells.append(cell if new is value else types.CellType(new))
        changed |= new is not value
    defaults = walk(fn.__defaults__) if fn.__defaults__ else fn.__defaults__
    kwdefaults = walk(fn.__kwdefaults__) if fn.__kwdefaults__ else fn.__kwdefaults__
    if not changed and defaults is fn.__defaults__ and kwdefaults is fn.__kwdefaults__:
        return fn
    new_fn = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, defaults, tuple(cells))
    new_fn.__kwdefaults__ = kwdefaults
    new_fn.__qualname__ = fn.__qualname__
    new_fn.__dict__.update(fn.__dict__)
    return new_fn


def _floats(transform: Any) -> list[Any]:
    found: list[Any] = []

    def put(v: Any) -> Any:
        found.append(v)
        return v

    _walk(transform, put)
    return found


def _substitute(
    transform: Any, mask: Sequence[bool], values: Sequence[Any], *, fill: bool = False
) -> Any:
    """``transform`` with float ``i`` replaced by the next of ``values`` where ``mask[i]``."""
    count = iter(range(len(mask)))
    given = iter(values)

    def put(v: Any) -> Any:
        i = next(count, None)
        if i is None:
            raise ModelError(
                f"minimizer {transform!r:.80}: its closures now hold more numbers than "
                f"when it was first seen ({len(mask)}); a transformation that rewrites "
                "its own closure after its first update cannot be keyed by structure: "
                "pass hyper-parameters through optax.inject_hyperparams"
            )
        return next(given) if mask[i] else v

    return _walk(transform, put, fill=fill)


@dataclasses.dataclass(frozen=True, eq=False)
class Hyper:
    """One minimizer split into structure and numbers.

    Attributes:
        key: hashable; equal keys mean equal programs (floats fed as inputs).
        values: the input hyper-parameters, in walk order.
        template: the minimizer itself.
        mask: per float met in the walk, whether it is an input (``values``).
    """

    key: Hashable
    values: tuple[float, ...]
    template: Any
    mask: tuple[bool, ...]

    def rebuild(self, values: Sequence[Any]) -> optax.GradientTransformation:
        """The template with ``values`` (e.g. traced float32 scalars) as its
        hyper-parameters, weakly typed as the floats they replace (:func:`weak`)."""
        return _rebuilt(self.template, self.mask, values)


def split(transform: optax.GradientTransformation) -> Hyper:
    """The :class:`Hyper` of ``transform`` (cached per object, which the cache keeps
    alive so its id stays its own).

    >>> import optax
    >>> a, b = split(optax.adam(1e-3)), split(optax.adam(1e-4))
    >>> a.key == b.key, a.values[-1], b.values[-1]   # scale_by_learning_rate: -lr
    (True, -0.001, -0.0001)
    >>> split(optax.adam(1e-3, b1=0.5)).key == a.key   # 1 - b1 is rounded once: a constant
    False
    """
    got = _CACHE.get(id(transform))
    if got is not None and got[0] is transform:
        return got[1]
    if len(_CACHE) > 256:
        _CACHE.clear()
    _settle(transform)
    floats = _floats(transform)
    mask = _known_mask(transform, floats)
    holes = [_Hole(i) for i in range(sum(mask))]
    key = _key(_substitute(transform, mask, holes, fill=True))
    values = tuple(float(v) for v, m in zip(floats, mask) if m)
    made = Hyper(key, values, transform, tuple(mask))
    _CACHE[id(transform)] = (transform, made)
    return made


def _settle(transform: Any) -> None:
    """Runs ``transform`` once abstractly, so closures that rewrite themselves on the
    first call reach their steady state before the walk counts their floats (Optax's
    ``cosine_decay_schedule`` turns its int ``decay_steps`` into a float then)."""
    spec = jax.ShapeDtypeStruct((2,), jnp.float32)
    with contextlib.suppress(Exception):  # one we cannot probe keeps its numbers
        jax.eval_shape(transform.update, spec, jax.eval_shape(transform.init, spec), spec)


def _key(holed: Any) -> Hashable:
    return (type(holed), behaviour(_plain(holed.init)), behaviour(_plain(holed.update)))


def _plain(fn: Any) -> Any:
    """A bound method as its function and its object's attributes (which ``behaviour``
    reads by value), so equal objects give equal keys; anything else as it is."""
    if isinstance(fn, types.MethodType) and hasattr(fn.__self__, "__dict__"):
        return (fn.__func__, type(fn.__self__), vars(fn.__self__))
    return fn


def _known_mask(transform: Any, floats: Sequence[Any]) -> list[bool]:
    """:func:`_tunable`, probed once per structure: a transformation whose code and
    constants (the floats a mask keeps) match one probed before gets its mask."""
    holes = [_Hole(i) for i in range(len(floats))]
    shape = _key(_substitute(transform, [True] * len(floats), holes, fill=True))
    for mask in _MASKS.get(shape, ()):
        if len(mask) != len(floats):  # ``behaviour`` bounds depth: shapes may collide
            continue
        kept = tuple(float(v) for v, m in zip(floats, mask) if not m)
        if (shape, mask, kept) in _PROBED:
            return list(mask)
    mask = _tunable(transform, floats)
    if len(_PROBED) > 1024:
        _PROBED.clear()
        _MASKS.clear()
    _MASKS.setdefault(shape, []).append(tuple(mask))
    _PROBED.add((shape, tuple(mask), tuple(float(v) for v, m in zip(floats, mask) if not m)))
    return mask


def _tunable(transform: Any, floats: Sequence[Any]) -> list[bool]:
    """Which ``floats`` of ``transform`` can be float32 inputs: those whose update
    traces with them traced (found one at a time if not all do) and that
    :func:`.rounded_first.rounded_first` does not reject."""
    n = len(floats)
    if not n:
        return []
    grad = param = jax.ShapeDtypeStruct((2,), jnp.float32)
    try:
        state = jax.eval_shape(transform.init, param)
        want = jax.eval_shape(transform.update, grad, state, param)
    except Exception:  # a transformation we cannot probe keeps its numbers
        return [False] * n

    def trace(mask: list[bool]) -> Any:
        def run(hs: Any, g: Any, s: Any, p: Any) -> Any:
            return _rebuilt(transform, mask, hs).update(g, s, p)

        hs = [jax.ShapeDtypeStruct((), jnp.float32)] * sum(mask)
        try:
            traced = jax.make_jaxpr(run, return_shape=True)(hs, grad, state, param)
        except Exception:  # e.g. the float decides Python control flow (`if decay:`)
            return None
        same = jax.tree.structure(traced[1]) == jax.tree.structure(want)
        return traced[0] if same else None

    mask = [True] * n
    if trace(mask) is None:
        mask = [False] * n
        for i in range(n):
            mask[i] = True
            mask[i] = trace(mask) is not None
    jaxpr = trace(mask)
    if jaxpr is None:
        return [False] * n
    rejected = rounded_first(jaxpr.jaxpr, sum(mask))
    at = [i for i, m in enumerate(mask) if m]
    for k in rejected:
        mask[at[k]] = False
    return mask
