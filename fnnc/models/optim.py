"""A cnnp model's minimizer: one Optax transformation over the parameter dict.

A model trains its trainable parameters as one pytree, ``{parameter id: array}``, and
its minimizer is one Optax transformation over that dict, as Optax users apply one:
``optax.clip_by_global_norm`` clips by the norm of every gradient together,
``optax.MultiSteps`` and ``optax.inject_hyperparams`` wrap the whole update.

NNC's per-parameter ``set_minimizer(opt, params=[...])`` partitions the dict the
``optax.multi_transform`` way (:func:`partitioned`): the parameters set with one
transformation object form one partition, the rest keep the model's minimizer, and each
transformation updates the sub-dict of its partition as a whole (a clip in one
partition sees that partition's norm). Per-element rules (SGD, Adam, NNC's
:mod:`~fnnc.models.minimizers`) give on a dict what they give per parameter, so NNC's
per-parameter semantics hold. :class:`Minimizers` is that transformation for a
program, with the numbers of each partition's minimizer as program inputs
(:mod:`fnnc.graph.dynamic.minimizer_key`), so a new learning rate compiles nothing.

State views: the state of a partition, seen from one parameter (:func:`view`), is that
state with every dict keyed by parameter ids (Adam's ``mu``) cut down to the
parameter's entry; the leaves of the partition as a whole (a step count, MultiSteps'
counters, injected hyper-parameters) are in every parameter's view. :class:`StateStore`
keeps views per parameter id and view structure (tree and leaf shapes), so:

* switching minimizers keeps every parameter's state whose structure still matches
  (Adam -> Adam with another rate keeps the moments); switching to another structure
  (a no-op, SGD) sets the state aside and switching back finds it: NNC's "evaluate;
  new batch size; set Adam; evaluate with input gradients; set a no-op; repeat" keeps
  Adam's moments;
* repartitioning keeps each parameter's own leaves; a partition's shared leaves come
  from its first parameter (in model order) that holds a view of that structure, so
  ``set_minimizer(opt, params=..., reset=True)`` restarts those parameters' own leaves
  and, in a partition of their own, its step count too;
* hyper-parameters injected with ``optax.inject_hyperparams`` follow the
  transformation as set (a new rate takes effect; DynamicGraph does the same);
* recompiling for a new batch size or for input gradients never touches the store.

Checkpoints write each parameter's view under its id (:mod:`fnnc.models.checkpoint_state`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fnnc.errors import ModelError
from fnnc.graph.dynamic.minimizer_key import Hyper, split
from fnnc.graph.dynamic.state_views import (  # noqa: F401 (the engine's names for them)
    SHARED,
    StateStore,
    disagreements,
    owners,
    structure,
    view,
    views_like,
)


def partitioned(
    transforms: Sequence[optax.GradientTransformation], parts: Sequence[Sequence[str]]
) -> optax.GradientTransformation:
    """One transformation over a dict of parameters: ``transforms[i]`` updates the
    sub-dict of the ids ``parts[i]``, its whole partition at once.

    This is ``optax.multi_transform`` with the labels given as partitions, except that
    each transformation gets its sub-dict itself (``multi_transform`` passes the whole
    dict with ``optax.MaskedNode`` placeholders, which have no leaves: the same
    numbers), so a partition's state is that transformation's plain state. The state is
    the tuple of the partitions' states.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> tx = partitioned([optax.clip_by_global_norm(1.0), optax.sgd(1.0)], [["a", "b"], ["c"]])
        >>> g = {"a": jnp.array([3.0]), "b": jnp.array([4.0]), "c": jnp.array([10.0])}
        >>> updates, _ = tx.update(g, tx.init(g))
        >>> [float(updates[k][0]) for k in "abc"]  # a and b clipped together, c not clipped
        [0.6000000238418579, 0.800000011920929, -10.0]
    """
    transforms, parts = tuple(transforms), tuple(tuple(p) for p in parts)

    def init(params: Mapping[str, Any]) -> tuple[Any, ...]:
        states = []
        for t, ids in zip(transforms, parts):
            try:
                states.append(t.init({p: params[p] for p in ids}))
            except (TypeError, ValueError, KeyError) as e:
                raise ModelError(
                    f"minimizer {t!r:.60}: its init failed on the parameters {list(ids)} "
                    f"({type(e).__name__}: {str(e)[:300]}); a model's minimizer updates "
                    "the dict {parameter id: array} of its partition, so masks and labels "
                    "must be trees of that dict (keyed by these ids) or callables of it"
                ) from e
        return tuple(states)

    def update(grads: Mapping[str, Any], state: Sequence[Any], params: Any = None) -> Any:
        updates: dict[str, Any] = {}
        new = []
        for t, ids, s in zip(transforms, parts, state):
            sub = None if params is None else {p: params[p] for p in ids}
            u, s = t.update({p: grads[p] for p in ids}, s, sub)
            updates.update(u)
            new.append(s)
        return {p: updates[p] for p in grads}, tuple(new)

    return optax.GradientTransformation(init, update)


@dataclasses.dataclass(frozen=True, eq=False)
class Minimizers:
    """The minimizer of a program's parameters: their partitions, one per
    transformation object (:func:`fnnc.models.optim.partitioned`).

    Attributes:
        key: the program key: the partitions' structures and each parameter's partition.
        groups: one :class:`Hyper` per partition, in order of first appearance.
        parts: the parameter ids of each partition, in the program's order.
        pids: every parameter id, in the program's order.
    """

    key: Hashable
    groups: tuple[Hyper, ...]
    parts: tuple[tuple[str, ...], ...]
    pids: tuple[str, ...]

    @staticmethod
    def of(pids: Sequence[str], transforms: Sequence[optax.GradientTransformation]) -> Minimizers:
        """The :class:`Minimizers` of parameters ``pids`` with minimizers ``transforms``
        (one per parameter; the same object for every parameter of a partition)."""
        groups: list[Hyper] = []
        parts: list[list[str]] = []
        where: dict[int, int] = {}
        for pid, t in zip(pids, transforms):
            at = where.setdefault(id(t), len(groups))
            if at == len(groups):
                groups.append(split(t))
                parts.append([])
            parts[at].append(pid)
        index = tuple(where[id(t)] for t in transforms)
        key = (tuple(g.key for g in groups), index)
        return Minimizers(key, tuple(groups), tuple(map(tuple, parts)), tuple(pids))

    @property
    def n_hyper(self) -> int:
        """The number of hyper-parameter leaves (the last leaves of the state)."""
        return sum(len(g.values) for g in self.groups)

    def hyper_leaves(self) -> list[Any]:
        """The hyper-parameters as fresh float32 scalars (the program may donate them)."""
        return [jnp.array(v, jnp.float32) for g in self.groups for v in g.values]

    def transform(self) -> optax.GradientTransformation:
        """One Optax transformation over the parameter list (in ``pids`` order, as the
        ``optax_update`` command passes it) whose state is ``(partition states,
        hyper-parameters)``; ``update`` rebuilds each partition's minimizer from the
        hyper-parameters in its state, applies it to its partition's dict and passes
        the hyper-parameters on."""
        groups, parts, pids = self.groups, self.parts, self.pids
        sizes = [len(g.values) for g in groups]

        def init(params: Sequence[Any]) -> tuple[Any, tuple[Any, ...]]:
            inner = partitioned([g.template for g in groups], parts).init(dict(zip(pids, params)))
            return inner, tuple(self.hyper_leaves())

        def update(grads: Sequence[Any], state: Any, params: Any = None) -> Any:
            inner, hyper = state
            built, at = [], 0
            for g, n in zip(groups, sizes):
                built.append(g.rebuild(hyper[at : at + n]) if n else g.template)
                at += n
            tree = None if params is None else dict(zip(pids, params))
            updates, new = partitioned(built, parts).update(dict(zip(pids, grads)), inner, tree)
            new = jax.tree.map(lambda a, b: a.astype(b.dtype), new, inner)
            like = params if params is not None else grads
            return [updates[p].astype(x.dtype) for p, x in zip(pids, like)], (new, hyper)

        return optax.GradientTransformation(init, update)

    @staticmethod
    def inner(state: Any) -> Any:
        """The partition states of a :meth:`transform` state."""
        return state[0]


@functools.lru_cache(maxsize=1024)
def is_noop(transform: optax.GradientTransformation) -> bool:
    """Whether ``transform`` never changes a parameter (NNC's no-op minimizer): then the
    parameter is frozen and gets no gradient at all. Probed once per transformation."""
    probe = [jnp.ones((2,), jnp.float32)]
    try:
        state = transform.init(probe)
        if jax.tree.leaves(state):  # it keeps state (e.g. gradient accumulation): it acts
            return False
        updates, _ = transform.update(probe, state, probe)
    except Exception:  # a transformation that needs more than this probe is not a no-op
        return False
    return all(bool(jnp.all(u == 0)) for u in jax.tree.leaves(updates))
