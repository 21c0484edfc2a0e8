"""Per-parameter minimizers and the optimizer-state store that never silently resets.

NNC applies a minimizer per parameter, and so does a cnnp model here: the update is
one Optax transformation made of one transformation per trainable parameter
(:func:`per_parameter`). The state of each parameter is kept in :class:`StateStore`
under the *structure* of the state it belongs to (tree and leaf shapes), so:

* switching minimizers keeps every parameter's state whose structure still matches
  (Adam -> Adam with another rate keeps the moments);
* switching to a minimizer of another structure (a no-op, SGD) sets Adam's state
  aside, and switching back finds it again: NNC's "evaluate; new batch size; set Adam;
  evaluate with input gradients; set a no-op; repeat" keeps Adam's moments;
* recompiling for a new batch size or for input gradients never touches the store.

A consequence of per-parameter updates: a transformation that couples parameters
(``optax.clip_by_global_norm``) sees one parameter at a time in a cnnp model. Use the
graph-level :func:`fnnc.graph.minimize` for such global transformations.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from fnnc.ops.optimizer import state_structure as structure


def per_parameter(
    transforms: Sequence[optax.GradientTransformation],
) -> optax.GradientTransformation:
    """One Optax transformation applying ``transforms[i]`` to parameter ``i`` of a list."""
    transforms = tuple(transforms)

    def init(params: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(t.init(p) for t, p in zip(transforms, params))

    def update(grads: Sequence[Any], state: Sequence[Any], params: Sequence[Any] | None = None):
        params = params if params is not None else [None] * len(transforms)
        pairs = [t.update(g, s, p) for t, g, s, p in zip(transforms, grads, state, params)]
        return [u for u, _ in pairs], tuple(s for _, s in pairs)

    return optax.GradientTransformation(init, update)


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


class StateStore:
    """Optimizer state per parameter id and state structure."""

    def __init__(self) -> None:
        self._states: dict[str, dict[str, Any]] = {}

    def get(self, pid: str, transform: optax.GradientTransformation, value: Any) -> Any:
        """The state of ``pid`` for ``transform``: kept if one of this structure exists."""
        key = structure(transform, jax.ShapeDtypeStruct(value.shape, value.dtype))
        slot = self._states.setdefault(pid, {})
        if key not in slot:
            slot[key] = transform.init(value)
        return slot[key]

    def put(
        self, pid: str, transform: optax.GradientTransformation, value: Any, state: Any
    ) -> None:
        key = structure(transform, jax.ShapeDtypeStruct(value.shape, value.dtype))
        self._states.setdefault(pid, {})[key] = state

    def reset(self, pids: Sequence[str] | None = None) -> None:
        for pid in list(self._states) if pids is None else pids:
            self._states.pop(pid, None)

    def all_states(self, pid: str) -> dict[str, Any]:
        """Every stored state of ``pid`` by structure (for checkpoints and tests)."""
        return dict(self._states.get(pid, {}))
