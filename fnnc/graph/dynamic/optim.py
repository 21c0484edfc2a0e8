"""Optimizer state and programs of a dynamic graph, keyed by structure, not identity.

A training loop may build its Optax transformation afresh at every step
(``dg.minimize(optax.adam(1e-3), loss, params)``): each call makes new closures, so
keying by the object would start Adam from zero every step and compile a program per
step. Instead:

* **state** is kept per variable and state structure (:func:`state`): the
  transformation runs on a dict of the parameters, its state is cut into what each
  variable sees (:mod:`.state_views`, as a cnnp model keeps it per parameter id), and a
  step over any set or order of variables assembles its state from those views. A fresh
  ``optax.adam()`` finds the moments the previous one left; switching to a
  transformation of another structure sets them aside (switching back finds them
  again). A transformation that takes its parameters only as a list (``optax.masked``
  with a list mask) keeps one state per ordered variable list. A mask (or labels) is
  matched against that list, so it is a list in the variables' order or a callable;
  a dict keyed by variable name is a :class:`GraphError`;
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

from fnnc.core.keys import key_bits
from fnnc.errors import GraphError
from fnnc.graph.dynamic.state_views import rekey, view
from fnnc.ops.optimizer import state_structure, update_like

if TYPE_CHECKING:
    from .graph import DynamicGraph
    from .variable import Slot

_KEYS: dict[tuple[int, Any], tuple[Any, Hashable, str, tuple[int, int]]] = {}


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
    if isinstance(value, jax.Array):
        value = key_bits(value)  # a typed PRNG key: by its bits
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
    made = (split(optimizer).key, _structure(optimizer, params))
    tokens = (
        _TOKENS.setdefault(made[0], len(_TOKENS)),
        _SPEC_TOKENS.setdefault((made[0], specs), len(_SPEC_TOKENS)),
    )
    _KEYS[(id(optimizer), specs)] = (optimizer, *made, tokens)
    return made


def _structure(optimizer: Any, params: list[Any]) -> str:
    """:func:`state_structure` over the list of parameters; a per-parameter pytree in
    the transformation (a mask, labels) shaped otherwise gets a :class:`GraphError`."""
    try:
        return state_structure(optimizer, params)
    except (ValueError, TypeError) as e:
        specs = ", ".join(f"{p.dtype.name}{list(p.shape)}" for p in params)
        raise GraphError(
            f"minimize/apply_gradients: the optimizer cannot init on the {len(params)} "
            f"variables it is given ({specs}): {str(e).splitlines()[0]}. The dynamic "
            "graph hands the optimizer its variables as a list, in the order passed to "
            "minimize/apply_gradients, so a mask or other per-parameter pytree (optax."
            "masked, adamw(mask=...), multi_transform's labels) must be a list in that "
            "order, e.g. mask=[True, False], or a callable that maps over the parameters, "
            "e.g. mask=lambda ps: jax.tree.map(lambda p: p.ndim > 1, ps); a dict keyed "
            "by variable name does not match"
        ) from e


def token(optimizer: Any, specs: tuple[Any, ...], *, with_specs: bool = True) -> int:
    """A small int for ``(program key, specs)`` (or the program key alone): the program
    key is a deep tuple whose hash a training step should not pay several times over."""
    got = _KEYS.get((id(optimizer), specs))
    if got is None or got[0] is not optimizer:
        keys(optimizer, specs)
        got = _KEYS[(id(optimizer), specs)]
    return got[3][1 if with_specs else 0]


_TOKENS: dict[Hashable, int] = {}
_SPEC_TOKENS: dict[tuple[Hashable, tuple[Any, ...]], int] = {}


def specs_of(params: Sequence[Any]) -> tuple[Any, ...]:
    """The ``(shape, dtype)`` pairs of ``params`` (arrays or specs)."""
    return tuple((tuple(p.shape), np.dtype(p.dtype)) for p in params)


def per_variable(optimizer: Any, specs: tuple[Any, ...]) -> bool:
    """Whether ``optimizer``'s state over parameters of ``specs`` is kept per variable:
    it takes the parameters as a dict (keyed by position in its programs, by variable
    in the store). One that needs them as a list (``optax.masked`` with a list mask)
    keeps one state per ordered variable list instead. Cached per program key."""
    key = token(optimizer, specs)
    got = _PER_VARIABLE.get(key)
    if got is None:
        params = dict(zip(_positions(len(specs)), (jax.ShapeDtypeStruct(*s) for s in specs)))
        try:
            jax.eval_shape(lambda p: optimizer.update(p, optimizer.init(p), p), params)
            got = len(specs) > 0
        except Exception:  # a list-shaped mask, extra update arguments: judged elsewhere
            got = False
        if len(_PER_VARIABLE) > 256:
            _PER_VARIABLE.clear()
        _PER_VARIABLE[key] = got
    return got


_PER_VARIABLE: dict[int, bool] = {}


def _positions(n: int) -> tuple[str, ...]:
    return tuple(str(i) for i in range(n))


def _names(slots: Sequence[Slot]) -> list[str]:
    return [f"#{s.id}" for s in slots]


def state(
    dg: DynamicGraph, optimizer: Any, slots: Sequence[Slot], params: list[Any], what: str
) -> list[Any]:
    """The state leaves of ``optimizer`` for the variables of ``slots``, in the order its
    programs take them.

    Per variable (:func:`per_variable`): assembled from each variable's kept view of a
    state of this structure (Adam's moments follow the variable into any set or order;
    a shared step count comes from the view kept most recently, so no count goes
    backwards), the rest from a fresh ``init``; injected hyper-parameters always from
    the object stepping now.
    Otherwise: the kept state of this structure and variable list, else a fresh one.
    """
    check(optimizer, what)
    specs = specs_of(params)
    named = per_variable(optimizer, specs)
    if named and len(set(slots)) == len(slots):
        prog = token(optimizer, specs, with_specs=False)  # one kind of state, any variables
        hk = (prog, tuple(slots))
        hot = dg.opt_hot.get(hk)
        if (
            hot is not None
            and (hot[2] is optimizer or not _state_tree(optimizer, specs)[1])
            and all(dg.opt_latest.get((s, prog)) == hk for s in slots)
        ):  # the same list stepped last (its injected rates, if any, by this object)
            return hot[0]
        flush(dg, prog, slots)
        names = _names(slots)
        tree = dg.opt_store.assemble(optimizer, dict(zip(names, params)))
        return jax.tree.leaves(rekey(tree, dict(zip(names, _positions(len(names))))))
    _, struct = keys(optimizer, specs)
    key = (struct, tuple(slots))
    leaves = dg.opt_states.get(key)
    # the programs run a per-variable transformation on a dict of positions (stepper):
    # so does its init here, where a variable listed twice keeps the state per list
    given = dict(zip(_positions(len(params)), params)) if named else list(params)
    if leaves is None:
        leaves = dg.opt_states[key] = jax.tree.leaves(optimizer.init(given))
        dg._opt_owner[key] = optimizer
        return leaves
    if dg._opt_owner.get(key) is not optimizer:
        dg._opt_owner[key] = optimizer
        fresh = jax.tree_util.tree_flatten_with_path(optimizer.init(given))[0]
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
    """Keeps ``leaves``, the state after a step (see :func:`state`)."""
    specs = specs_of(params)
    if per_variable(optimizer, specs) and len(set(slots)) == len(slots):
        # kept whole, as the program gave it; cut into per-variable views only when
        # another list or order needs them (flush): a training loop pays nothing
        prog = token(optimizer, specs, with_specs=False)
        entry = (list(leaves), _state_tree(optimizer, specs)[0], optimizer)
        hk = (prog, tuple(slots))
        dg.opt_hot[hk] = entry
        moved = False
        for slot in slots:
            moved |= dg.opt_latest.get((slot, prog)) != hk
            dg.opt_latest[(slot, prog)] = hk
        if moved:  # some variable's newest state left another whole state
            _prune(dg)
        return
    _, struct = keys(optimizer, specs)
    dg.opt_states[(struct, tuple(slots))] = leaves


def _state_tree(optimizer: Any, specs: tuple[Any, ...]) -> tuple[Any, bool]:
    """The tree of ``optimizer``'s state over a dict of positions of ``specs``, and
    whether it holds injected hyper-parameters; cached per program key (one structure
    of transformation, one tree)."""
    key = token(optimizer, specs)
    got = _TREES.get(key)
    if got is None:
        params = dict(zip(_positions(len(specs)), (jax.ShapeDtypeStruct(*s) for s in specs)))
        shapes = jax.eval_shape(optimizer.init, params)
        paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(shapes)[0]]
        got = (jax.tree.structure(shapes), any(_injected(p) for p in paths))
        if len(_TREES) > 256:
            _TREES.clear()
        _TREES[key] = got
    return got


_TREES: dict[int, tuple[Any, bool]] = {}


def flush(dg: DynamicGraph, prog: int | None = None, slots: Sequence[Slot] = ()) -> None:
    """Cuts the whole states kept by :func:`store` into per-variable views in
    ``dg.opt_store``: those holding the newest state of a variable of ``slots`` for
    structure ``prog`` (every one with ``prog=None``)."""
    wanted = {
        hk
        for (slot, p), hk in dg.opt_latest.items()
        if prog is None or (p == prog and slot in slots)
    }
    for hk in wanted:
        leaves, tree, _ = dg.opt_hot[hk]
        names = _names(hk[1])
        full = rekey(tree.unflatten(leaves), dict(zip(_positions(len(names)), names)))
        members = frozenset(names)
        for slot, name in zip(hk[1], names):
            if dg.opt_latest.get((slot, hk[0])) == hk:
                dg.opt_store.put(name, view(full, name, members), members)
                del dg.opt_latest[(slot, hk[0])]
    _prune(dg)


def states_of(dg: DynamicGraph, slot: Slot) -> dict[str, Any]:
    """Every optimizer state kept for the variable of ``slot``, as it sees it (its
    view), by state structure."""
    flush(dg)
    return dg.opt_store.all_states(_names([slot])[0])


def _prune(dg: DynamicGraph) -> None:
    """Drops whole states that hold no variable's newest state."""
    live = set(dg.opt_latest.values())
    for hk in [k for k in dg.opt_hot if k not in live]:
        del dg.opt_hot[hk]


def forget(dg: DynamicGraph, dead: set[Slot]) -> None:
    """Drops the optimizer state of variables that are gone."""
    dg.opt_latest = {k: v for k, v in dg.opt_latest.items() if k[0] not in dead}
    _prune(dg)
    dg.opt_states = {k: s for k, s in dg.opt_states.items() if not dead.intersection(k[1])}
    dg._opt_owner = {k: o for k, o in dg._opt_owner.items() if k in dg.opt_states}
    dg.opt_store.reset(_names(list(dead)))


def _injected(path: Sequence[Any]) -> bool:
    return any(getattr(k, "name", None) == "hyperparams" for k in path)


def stepper(
    optimizer: Any, specs: tuple[Any, ...]
) -> tuple[optax.GradientTransformation, list[Any]]:
    """``(transformation, hyper-parameter leaves)``: ``optimizer`` as a program over
    parameters of ``specs`` runs it (on a dict of positions when its state is kept per
    variable, :func:`per_variable`; the program still takes and gives lists).

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
    hyper = [jnp.float32(v) for v in h.values]
    step = _with_hyper(h) if h.values else optimizer
    if per_variable(optimizer, specs):
        step = _on_positions(step, len(specs))
    return step, hyper


def n_hyper(optimizer: Any) -> int:
    """How many hyper-parameter leaves :func:`stepper` adds after the state."""
    from fnnc.graph.dynamic.minimizer_key import split

    return len(split(optimizer).values)


def _with_hyper(h: Any) -> optax.GradientTransformation:
    """The transformation of :func:`stepper` whose state carries ``h``'s numbers."""

    def init(params: Any) -> Any:
        return h.template.init(params), tuple(jnp.float32(v) for v in h.values)

    def update(grads: Any, state: Any, params: Any = None) -> Any:
        inner, hyper = state
        updates, new = h.rebuild(hyper).update(grads, inner, params)
        # the rebuilt rates are weakly typed (minimizer_key.weak); the casts only guard
        # a transformation that promotes on its own: keep the state's and grads' types,
        # but a float32 update of a 16-bit parameter as it is (update_like: NNC's rules
        # give one, so that apply_updates rounds once)
        new = jax.tree.map(lambda a, b: a.astype(b.dtype), new, inner)
        like = grads if params is None else params
        return jax.tree.map(update_like, updates, like), (new, hyper)

    return optax.GradientTransformation(init, update)


def _on_positions(tx: optax.GradientTransformation, n: int) -> optax.GradientTransformation:
    """``tx`` over a list of ``n`` parameters, run on the dict ``{"0": p0, ...}`` (its
    state is then a dict state, cut per variable by :mod:`.state_views`)."""
    names = _positions(n)

    def named(values: Any) -> Any:
        return None if values is None else dict(zip(names, values))

    def init(params: Any) -> Any:
        return tx.init(named(params))

    def update(grads: Any, state: Any, params: Any = None) -> Any:
        updates, new = tx.update(named(grads), state, named(params))
        return [updates[k] for k in names], new

    return optax.GradientTransformation(init, update)
