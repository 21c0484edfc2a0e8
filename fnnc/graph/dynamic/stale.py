"""Stale values: an ``f`` computed from a variable's earlier value, differentiated anew.

A step (``minimize``, ``apply_gradients``), ``set`` or a write gives a variable a new
version; gradients are taken with respect to the version its slot holds *now*. An ``f``
recorded before (a loss computed once, outside the training loop) reads the earlier
version, and its gradient with respect to the new one is zero: Adam would keep moving on
its momentum and nothing would say why. :func:`check` makes that a
:class:`~fnnc.errors.GraphError`; a variable ``f`` never depended on keeps its zero
gradient, as ``jax.grad`` gives.

The record remembers which slots held which earlier versions (:attr:`Record.old`, by
version id): :func:`supersede` notes one when a slot moves on, while the version is
still recorded. Pruning drops the nodes such a version fed (no live variable feeds them
any more), so :func:`carry` moves the note onto the values those nodes wrote that stay
alive (the stale loss itself), which then stand for where they came from. Nothing here
runs per ``exec``: a note per slot that moves on, a pass at prune time while notes
exist, and a walk from ``f`` at ``backward`` only when a note names one of its ``wrt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fnnc.errors import GraphError

if TYPE_CHECKING:
    from .graph import DynamicGraph
    from .record import Node, Read, Record, Version
    from .variable import Slot, Variable


def supersede(record: Record, slot: Slot, old: Version) -> None:
    """``slot`` moved on from ``old``: note it while ``old`` can still be read."""
    if old.grad and old.id in record.versions:
        record.old.setdefault(old.id, []).append(slot)


def carry(
    old: dict[int, list[Any]], nodes: Sequence[Node], kept: set[int], alive: dict[int, Any]
) -> dict[int, list[Any]]:
    """The notes after a prune that keeps the nodes ``kept`` (ids) and the versions
    ``alive``: the notes of alive versions, and for each alive version a dropped node
    wrote, the slots whose earlier versions it derives from (not through a version a
    slot still holds: what comes from that is current)."""
    if not old:
        return old
    deps: dict[int, list[Any]] = dict(old)
    carried: dict[int, list[Any]] = {}
    for node in nodes:
        slots: list[Any] = []
        for v, _ in node.inputs:
            for s in deps.get(v.id, ()) if v.grad and not v.cut else ():
                if s.version is not v and s not in slots:
                    slots.append(s)
        if not slots:
            continue
        for o in node.outputs:
            if o.grad:
                had = deps.get(o.id, [])
                deps[o.id] = had + [s for s in slots if s not in had]
                if node.id not in kept and o.id in alive:
                    carried[o.id] = deps[o.id]
    return {vid: s for vid, s in (*old.items(), *carried.items()) if vid in alive}


def check(
    dg: DynamicGraph,
    fs: Sequence[Variable],
    f_reads: Sequence[Read],
    ws: Sequence[Variable],
    slots: Sequence[Slot],
    what: str,
) -> None:
    """Raises when an ``f`` reads an earlier version of a ``wrt`` variable's slot."""
    record = dg._record
    named = {s: w for s, w in zip(slots, ws)}
    old, versions = record.old, record.versions
    if not any(s in named for vid, ss in old.items() if vid in versions for s in ss):
        return
    stop = {s.version.id for s in slots}
    seen: set[int] = set()
    for f, (first, _) in zip(fs, f_reads):
        stack = [first]
        while stack:
            v = stack.pop()
            if v.id in seen:
                continue
            seen.add(v.id)
            for s in old.get(v.id, ()):
                if s in named and s.version is not v:
                    _raise(f, named[s], what)
            if v.id in stop or v.node is None:
                continue
            stack += [iv for iv, _ in v.node.inputs if iv.grad and not iv.cut]


def _raise(f: Variable, w: Variable, what: str) -> None:
    raise GraphError(
        f"{what}: f {f.label} was computed from an earlier value of variable {w.label}, "
        "which a minimize/apply_gradients step, set or write has replaced since; gradients "
        "are taken with respect to its current value only, so that earlier value's part "
        "of f would get no gradient (all of it, where f reads no current value). Compute "
        "f again from the variables after the step, e.g. record the loss inside the "
        "training loop; for a buffer written every step (buf[0] = h), dg.detach(buf) "
        "before the write cuts the old values out"
    )
