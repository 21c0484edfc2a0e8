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
  from the view of that structure kept most recently (the first in model order among
  views kept by one step), so a layer frozen for some steps (``is_trainable=False``, a
  no-op minimizer) and trained again takes the step count of the parameters that went
  on training: no parameter's count (Adam's bias correction) goes backwards, and the
  returning layer's moments are those it had when frozen.
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
from fnnc.models.stacks import Blocks, acts_elementwise, cached_per_block, per_block
from fnnc.ops.optimizer import update_like


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
        blocks: per partition, its stacked parameters (:class:`~fnnc.models.Repeat`)
            with their per-block ids: its transformation sees each as its blocks
            (:func:`~fnnc.models.stacks.per_block`), unless it acts elementwise
            (then none: a stack updated whole is updated as its blocks).
    """

    key: Hashable
    groups: tuple[Hyper, ...]
    parts: tuple[tuple[str, ...], ...]
    pids: tuple[str, ...]
    blocks: tuple[Blocks, ...] = ()

    @staticmethod
    def of(
        pids: Sequence[str],
        transforms: Sequence[optax.GradientTransformation],
        blocks: Mapping[str, tuple[str, ...]] | None = None,
        specs: Mapping[str, Any] | None = None,
    ) -> Minimizers:
        """The :class:`Minimizers` of parameters ``pids`` with minimizers ``transforms``
        (one per parameter; the same object for every parameter of a partition), given
        the per-block ids of the stacked ones (``blocks``) and every parameter's shape
        and dtype (``specs``, needed with ``blocks``)."""
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
        views = tuple(
            _views(g.template, part, blocks or {}, specs or {}) for g, part in zip(groups, parts)
        )
        key = (tuple(g.key for g in groups), index, views)
        return Minimizers(key, tuple(groups), tuple(map(tuple, parts)), tuple(pids), views)

    def templates(self) -> tuple[optax.GradientTransformation, ...]:
        """Each partition's minimizer as set, seeing stacked parameters as their blocks:
        what inits the partition's state (the same object each time, for caches)."""
        return tuple(cached_per_block(g.template, b) for g, b in zip(self.groups, self.blocks))

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
        groups, parts, pids, blocks = self.groups, self.parts, self.pids, self.blocks
        sizes = [len(g.values) for g in groups]

        def init(params: Sequence[Any]) -> tuple[Any, tuple[Any, ...]]:
            inner = partitioned(self.templates(), parts).init(dict(zip(pids, params)))
            return inner, tuple(self.hyper_leaves())

        def update(grads: Sequence[Any], state: Any, params: Any = None) -> Any:
            inner, hyper = state
            built, at = [], 0
            for g, n, b in zip(groups, sizes, blocks):
                built.append(per_block(g.rebuild(hyper[at : at + n]) if n else g.template, b))
                at += n
            tree = None if params is None else dict(zip(pids, params))
            updates, new = partitioned(built, parts).update(dict(zip(pids, grads)), inner, tree)
            new = jax.tree.map(lambda a, b: a.astype(b.dtype), new, inner)
            like = params if params is not None else grads  # float32 for 16-bit kept
            return [update_like(updates[p], x) for p, x in zip(pids, like)], (new, hyper)

        return optax.GradientTransformation(init, update)

    @staticmethod
    def inner(state: Any) -> Any:
        """The partition states of a :meth:`transform` state."""
        return state[0]


def _views(
    template: optax.GradientTransformation,
    part: Sequence[str],
    blocks: Mapping[str, tuple[str, ...]],
    specs: Mapping[str, Any],
) -> Blocks:
    """The stacked parameters of partition ``part`` that its minimizer must see as
    their blocks: all of them, unless it acts elementwise."""
    stacked = tuple((p, blocks[p]) for p in part if p in blocks)
    if not stacked:
        return ()
    shapes = tuple((p, specs[p].shape, specs[p].dtype) for p in part)  # hashable already
    return () if acts_elementwise(template, shapes) else stacked


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
