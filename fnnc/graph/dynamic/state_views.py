"""Optimizer state seen per parameter: views, their owners, and a store of them.

A transformation's state over several parameters (a dict ``{id: array}``) holds some
leaves per parameter (Adam's ``mu[id]``) and some for the set as a whole (a step count,
injected hyper-parameters). :func:`view` cuts the state down to what one parameter
sees; :func:`owners` names each leaf's parameter (or :data:`SHARED`);
:class:`StateStore` keeps views per parameter and view structure and assembles a
state for any set of parameters from them. A cnnp model keys views by parameter id
(:mod:`fnnc.models.optim`), a dynamic graph by variable (:mod:`.optim`), so each
variable's moments follow it into another set or order of variables.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

SHARED = ""
"""The owner of a leaf that belongs to a partition as a whole (:func:`owners`)."""


def _children(tree: Any) -> tuple[list[Any], Any] | None:
    """The children of ``tree``'s top node and its treedef, or None for a leaf."""
    children, treedef = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is not tree)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return None
    return children, treedef


def _by_parameter(node: Any, pids: Collection[str]) -> bool:
    """Whether ``node`` is a dict keyed by parameter ids (a per-parameter part of a state)."""
    return isinstance(node, dict) and bool(node) and all(k in pids for k in node)


def view(state: Any, pid: str, pids: Collection[str]) -> Any:
    """``state`` (of a partition holding ``pids``) as parameter ``pid`` sees it: every
    dict keyed by parameter ids keeps ``pid``'s entry only; the rest is kept whole.

    >>> import jax.numpy as jnp, optax
    >>> state = optax.adam(0.1).init({"a": jnp.zeros(2), "b": jnp.zeros(3)})
    >>> view(state, "b", {"a", "b"})[0].mu
    {'b': Array([0., 0., 0.], dtype=float32)}
    """
    if _by_parameter(state, pids):
        return {pid: state[pid]} if pid in state else {}
    split = _children(state)
    if split is None:
        return state
    children, treedef = split
    return treedef.unflatten([view(c, pid, pids) for c in children])


def owners(state: Any, pids: Collection[str], owner: str = SHARED) -> list[str]:
    """Per leaf of ``state`` (in ``jax.tree.leaves`` order), the parameter id it
    belongs to, or :data:`SHARED` for a leaf of the partition as a whole."""
    if _by_parameter(state, pids):
        return [o for k in sorted(state) for o in owners(state[k], pids, k)]
    split = _children(state)
    if split is None:
        return [owner]
    return [o for c in split[0] for o in owners(c, pids, owner)]


def structure(tree: Any) -> str:
    """A key for the structure of a state (view): its tree and leaf shapes and dtypes."""
    leaves, treedef = jax.tree.flatten(tree)
    return f"{treedef}|{[(tuple(np.shape(x)), str(x.dtype)) for x in leaves]}"


def _paths(tree: Any) -> list[str]:
    return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _by_path(tree: Any) -> dict[str, Any]:
    return dict(zip(_paths(tree), jax.tree.leaves(tree)))


def _injected(path: str) -> bool:
    """Whether a leaf at ``path`` is a hyper-parameter of ``optax.inject_hyperparams``."""
    return ".hyperparams[" in path


def views_like(transform: Any, specs: Mapping[str, Any]) -> dict[str, Any]:
    """Each parameter's view (of ``jax.ShapeDtypeStruct`` leaves) of ``transform``'s
    state over the parameters ``specs`` (id -> spec): the templates checkpoints restore."""
    shapes = jax.eval_shape(transform.init, dict(specs))
    return {p: view(shapes, p, specs) for p in specs}


def rekey(tree: Any, names: Mapping[str, str]) -> Any:
    """``tree`` with every dict keyed by parameter ids (keys of ``names``) keyed by
    ``names[id]`` instead: a state over ids as a state over other names."""
    if _by_parameter(tree, names):
        return {names[k]: rekey(v, names) for k, v in tree.items()}
    split = _children(tree)
    if split is None:
        return tree
    children, treedef = split
    return treedef.unflatten([rekey(c, names) for c in children])


class _Kept(NamedTuple):
    """A kept view, when it was kept (a clock), and the ids kept with it in one call,
    whose views share its shared leaves' arrays (None: unknown)."""

    value: Any
    clock: int
    members: frozenset[str] | None


class StateStore:
    """Optimizer state views per parameter id and view structure (see module doc)."""

    def __init__(self) -> None:
        self._views: dict[str, dict[str, _Kept]] = {}  # per id and structure
        self._clock = 0
        self._shapes: dict[Any, tuple[Any, Any]] = {}  # (id, specs) -> (transform, shapes)

    def _shapes_of(self, transform: Any, values: Mapping[str, Any]) -> Any:
        """``jax.eval_shape`` of ``transform.init`` over ``values``, cached per object and
        parameter specs (tracing the init of hundreds of parameters takes a while)."""
        key = (id(transform), tuple((p, np.shape(v), str(v.dtype)) for p, v in values.items()))
        got = self._shapes.get(key)
        if got is None or got[0] is not transform:
            if len(self._shapes) > 64:
                self._shapes.clear()
            got = self._shapes[key] = (transform, jax.eval_shape(transform.init, dict(values)))
        return got[1]

    def find(self, pid: str, like: Any) -> Any:
        """The kept view of ``pid`` with the structure of ``like``, or None."""
        kept = self._views.get(pid, {}).get(structure(like))
        return None if kept is None else kept.value

    def put(self, pid: str, value: Any, members: Collection[str] | None = None) -> None:
        """Keeps ``value``, a view of ``pid``, under its structure, as the newest view.

        ``members``: the ids whose views, put with this one, hold the same arrays for the
        shared leaves (None: unknown, so :meth:`assemble` copies them)."""
        self._clock += 1
        self._put(pid, value, None if members is None else frozenset(members))

    def _put(self, pid: str, value: Any, members: frozenset[str] | None) -> None:
        self._views.setdefault(pid, {})[structure(value)] = _Kept(value, self._clock, members)

    def keep(self, state: Any, pids: Sequence[str]) -> None:
        """Keeps the views of a partition's ``state`` for each of its ``pids``."""
        members = frozenset(pids)
        self._clock += 1
        for pid in pids:
            self._put(pid, view(state, pid, members), members)

    def assemble(self, transform: Any, values: Mapping[str, Any]) -> Any:
        """``transform``'s state over ``values`` (id -> parameter) from the kept views:
        each parameter's own leaves from its view; the shared ones (a step count) from
        the view kept most recently (the first in ``values`` order among those kept
        together), so a parameter that sat out some steps takes the partition's newest
        count and no count goes backwards; injected hyper-parameters and the rest from
        ``transform.init`` (run only when some leaf needs it).

        A program may donate the state it is given, so a shared leaf that a view outside
        ``values`` holds too is given as a copy: every other view stays readable."""
        shapes = self._shapes_of(transform, values)
        pids = frozenset(values)
        found = {p: self._views.get(p, {}).get(structure(view(shapes, p, pids))) for p in values}
        found = {p: k for p, k in found.items() if k is not None}
        kept = {p: _by_path(k.value) for p, k in found.items()}
        donor = max(found, key=lambda p: found[p].clock, default=None)
        holders = None if donor is None else found[donor].members
        copy = holders is None or not holders <= pids
        flat, treedef = jax.tree_util.tree_flatten_with_path(shapes)
        leaves: list[Any] = []
        for (path, _), owner in zip(flat, owners(shapes, pids)):
            name = jax.tree_util.keystr(path)
            source = kept.get(owner if owner != SHARED else donor)
            fresh = source is None or (owner == SHARED and _injected(name))
            leaf = None if fresh else source[name]
            if leaf is not None and owner == SHARED and copy:
                leaf = jax.numpy.array(leaf, copy=True)
            leaves.append(leaf)
        if any(leaf is None for leaf in leaves):
            init = jax.tree.leaves(transform.init(dict(values)))
            leaves = [new if leaf is None else leaf for leaf, new in zip(leaves, init)]
        return treedef.unflatten(leaves)

    def reset(self, pids: Sequence[str] | None = None) -> None:
        for pid in list(self._views) if pids is None else pids:
            self._views.pop(pid, None)

    def all_states(self, pid: str) -> dict[str, Any]:
        """Every kept view of ``pid`` by structure (for checkpoints and tests)."""
        return {key: kept.value for key, kept in self._views.get(pid, {}).items()}


def disagreements(views: Mapping[str, Any]) -> list[str]:
    """The shared leaves on which the ``views`` (id -> view) of one partition differ, as
    ``"<path>: <id> holds ..., <id> holds ..."`` lines (none when they agree)."""
    pids = frozenset(views)
    seen: dict[str, tuple[str, Any]] = {}
    lines = []
    for pid, v in views.items():
        paths, leaves = _paths(v), jax.tree.leaves(v)
        for name, leaf, owner in zip(paths, leaves, owners(v, pids)):
            if owner != SHARED:
                continue
            first = seen.setdefault(name, (pid, leaf))
            if first[0] != pid and not np.array_equal(np.asarray(first[1]), np.asarray(leaf)):
                lines.append(f"{name}: {first[0]} holds {_brief(first[1])}, {pid} {_brief(leaf)}")
    return lines


def _brief(x: Any) -> str:
    a = np.asarray(x)
    return str(a.tolist()) if a.size <= 4 else f"{a.dtype}{list(a.shape)}"
