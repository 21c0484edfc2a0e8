"""The dynamic graph's own IR: SSA versions, recorded nodes, and the pruning rule.

A :class:`Version` is one SSA value: a symbol of the recorded graph and, once
computed, its array. Variables point at versions; writing a variable makes a new
version, so a version never changes. A :class:`Node` is one recorded command, reading
versions (or views of them: :data:`Read`) and writing new ones. A :class:`Record`
holds both, in recording order.

**Why not** :class:`fnnc.core.ir.Graph`. ``Graph`` is frozen and hashable, numbered
densely, array-free, valid as a whole: right for passes, caching and compiling, wrong
for a graph that changes at every command. The record is the opposite on each point:

* *mutable and appended to per command*: ``exec`` adds a node and its versions in
  about a microsecond (plain ``__slots__`` objects in dicts keyed by a counter; no
  validation, no renumbering, no copy of what was recorded before);
* *carrying runtime state*: a version holds its array (``None`` while a lazy node is
  pending), a node knows whether it ran; ``Graph`` holds no arrays;
* *shrinking as variables die*: versions are freed when no variable holds them and no
  node reads them (:meth:`Record.free`, at once) and nodes off every path from a live
  trainable variable to a live variable are pruned (:meth:`Record.prune`), so the
  record stays bounded while a training loop runs forever; ids are never reused.

A ``Graph`` is made from the record only when something needs one: ``backward`` (the
gradient path from ``wrt`` to ``f``), a lazy flush (the pending work), or printing
(:meth:`DynamicGraph.graph`). :func:`~fnnc.graph.dynamic.extract.extract` renumbers the
picked nodes canonically, so the same computation recorded again extracts an equal
graph and finds its compiled program cached.

**Pruning** (NNC's bookkeeping rule). A node stays recorded while it lies on a path
from a live *source* to a live *sink*:

* a sink is the version a live variable holds (constants and detached ones too);
* a source is the version a live variable holds that can carry a gradient: it was
  made from trainable variables and is not *cut* (:meth:`DynamicGraph.detach` cuts a
  version from its readers: gradients no longer pass through it);
* paths run through versions that no variable holds any more (freed intermediates)
  and stop at cut versions.

A node not on such a path can never take part in a backward pass, so it is dropped;
the versions it wrote that are still held or read become leaves (they keep their
values). In lazy mode a node whose values were not computed yet also stays while its
outputs are needed. For ``z = 0.5 * log(x)``: two nodes; detaching ``y = log(x)``
drops ``0.5 * y`` (no source feeds it any more: ``z`` becomes a leaf) but keeps
``log(x)`` (``x`` feeds it, ``y`` is held); freeing ``x`` then drops ``log(x)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from fnnc.ops import Command

from .stale import carry


class View(NamedTuple):
    """Where a view sits in its root's flat, row-major buffer (as an alias symbol)."""

    shape: tuple[int, ...]
    base: int
    stride: tuple[int, ...]


_SPEC_IDS: dict[tuple[tuple[int, ...], np.dtype], int] = {}


def spec_id(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """A small int naming ``(shape, dtype)``: plans are found by these, since a tuple of
    ints hashes much faster than one of shapes and dtypes on the eager hot path."""
    key = (shape, dtype)
    sid = _SPEC_IDS.get(key)
    if sid is None:
        sid = _SPEC_IDS[key] = len(_SPEC_IDS)
    return sid


class Version:
    """One SSA version: shape, dtype, value (``None`` until computed), producer."""

    __slots__ = (
        "cut", "dtype", "grad", "id", "linked", "memo", "name", "node", "pins", "readers",
        "shape", "sid", "source", "value", "views",
    )  # fmt: skip

    def __init__(
        self, vid: int, shape: tuple[int, ...], dtype: np.dtype, sid: int, value: Any, grad: bool
    ):
        self.id = vid
        self.shape = shape
        self.dtype = dtype
        self.sid = sid  # spec_id(shape, dtype)
        self.value = value
        self.grad = grad  # made from trainable variables: a gradient can reach it
        self.cut = False  # detached: gradients do not pass from its readers into it
        self.source = grad  # passes gradients on to its readers: grad and not cut
        self.node: Node | None = None  # the producer while it is recorded
        self.pins = 0  # live storage slots holding this version
        self.readers = 0  # recorded nodes reading it
        self.linked = False  # once read or written by a recorded gradient node (a symbol)
        self.memo: tuple[dict, Any] | None = None  # the memo entry that returns it
        self.name = ""
        self.views: dict[View, Any] | None = None  # computed view values

    @property
    def spec(self) -> tuple[tuple[int, ...], np.dtype]:
        """``(shape, dtype)``."""
        return self.shape, self.dtype

    def detach(self) -> None:
        """Cuts this version from its readers: no gradient passes through it any more."""
        self.cut = True
        self.source = False

    def unmemo(self) -> None:
        """Drops the memo entry that returns this version (its value is gone or spent)."""
        if self.memo is not None:
            table, key = self.memo
            table.pop(key, None)
            self.memo = None

    def __repr__(self) -> str:
        return f"<version {self.id} {self.dtype.name}{list(self.shape)}>"


Read = tuple[Version, View | None]
"""A node input: a version, or a view of one."""


class Node:
    """One recorded command: ``outputs = cmd(*inputs)``; ``pending`` until it ran.

    ``inputs`` is any sequence of reads (``exec`` hands over the list it built, never
    to change it again); nothing mutates it.
    """

    __slots__ = ("cmd", "id", "inputs", "internal", "name", "outputs", "pending")

    def __init__(
        self,
        nid: int,
        cmd: Command,
        inputs: Sequence[Read],
        outputs: tuple[Version, ...],
        name: str,
        pending: bool,
    ):
        self.id = nid
        self.cmd = cmd
        self.inputs = inputs
        self.outputs = outputs
        self.name = name
        self.pending = pending
        self.internal = False  # a write through an alias: not one of the user's execs


class Record:
    """The versions and nodes a dynamic graph keeps, and the pruning that bounds them.

    Freeing is incremental where it is local: when the last holder of a version goes
    and no recorded node reads it, the version is forgotten at once, and so is its
    producer once none of its outputs is held or read (and, in turn, the versions it
    read). What needs the whole graph (a source dying: nodes no longer fed) waits for
    :meth:`prune`, which runs when enough was recorded or released.
    """

    def __init__(self) -> None:
        self.versions: dict[int, Version] = {}
        self.nodes: dict[int, Node] = {}
        self.ids = itertools.count()
        self.garbage = 0  # unpinned versions since the last prune
        self.limit = 64  # prune when nodes or garbage pass it
        self._busy = 0
        self._deferred: list[Version] = []
        self.old: dict[int, list[Any]] = {}  # slots by earlier version (see .stale)

    def version(self, shape: tuple[int, ...], dtype: np.dtype, value: Any, grad: bool) -> Version:
        """A new leaf version (no producer) holding ``value``."""
        v = Version(next(self.ids), shape, dtype, spec_id(shape, dtype), value, grad)
        self.versions[v.id] = v
        return v

    def node_list(self) -> list[Node]:
        """The recorded nodes, in recording order (an execution order)."""
        return list(self.nodes.values())

    def pinned(self) -> list[Version]:
        """The versions live variables hold."""
        return [v for v in self.versions.values() if v.pins]

    def hold(self) -> Record:
        """Defers freeing (releases from ``__del__``) while the caller walks the record:
        ``with record.hold(): ...`` (a plain context manager: it runs every step, and
        ``contextlib``'s generator-based one costs several microseconds)."""
        return self

    def __enter__(self) -> None:
        self._busy += 1

    def __exit__(self, *exc: object) -> None:
        self._busy -= 1
        if not self._busy and self._deferred:
            deferred, self._deferred = self._deferred, []
            for v in deferred:
                self.free(v)

    def unpin(self, v: Version) -> None:
        """One holder of ``v`` is gone."""
        v.pins -= 1
        self.garbage += 1
        if v.pins == 0 and v.readers == 0:  # read by a recorded node: it stays
            self.free(v)

    def free(self, first: Version) -> None:
        """Forgets ``first``, no longer held nor read, and what only it kept recorded."""
        if self._busy:
            self._deferred.append(first)
            return
        versions, nodes = self.versions, self.nodes
        stack = [first]
        while stack:
            v = stack.pop()
            if v.pins or v.readers or v.id not in versions:
                continue
            node = v.node
            if node is None:
                self._forget(v)
                continue
            outs = node.outputs
            if len(outs) > 1 and any(o.pins or o.readers for o in outs):
                continue
            del nodes[node.id]
            for o in outs:
                o.node = None
                self._forget(o)
            for iv, _ in node.inputs:
                iv.readers -= 1
                if not (iv.readers or iv.pins):
                    stack.append(iv)

    def _forget(self, v: Version) -> None:
        self.versions.pop(v.id, None)
        v.unmemo()
        v.value = v.views = None

    def keep(self, *, pending: bool) -> list[bool]:
        """Per node, whether the rule keeps it; ``pending``: also keep lazy nodes whose
        outputs are needed (see the module doc)."""
        # Plain loops rather than any(...) over generators: this runs at every sync
        # point and prune, and a generator costs about half a microsecond to start.
        nodes = self.node_list()
        feeds: set[int] = set()  # versions a live source reaches
        fed = []
        for node in nodes:
            hit = False
            for v, _ in node.inputs:
                if v.source and (v.pins or v.id in feeds):
                    hit = True
                    break
            fed.append(hit)
            if hit:
                for o in node.outputs:
                    feeds.add(o.id)
        grad_live = {v.id for v in self.pinned()}
        value_live = set(grad_live)
        keep = [False] * len(nodes)
        for i in range(len(nodes) - 1, -1, -1):
            node = nodes[i]
            by_grad = by_value = False
            if fed[i] or (pending and node.pending):
                for o in node.outputs:
                    if fed[i] and o.id in grad_live:
                        by_grad = True
                    if pending and node.pending and o.id in value_live:
                        by_value = True
            if not (by_grad or by_value):
                continue
            keep[i] = True
            for v, _ in node.inputs:
                value_live.add(v.id)
                if by_grad and v.source:
                    grad_live.add(v.id)
        return keep

    def prune(self) -> None:
        """Drops nodes off every source-to-sink path (see the module doc)."""
        with self.hold():
            nodes = self.node_list()
            kept = [node for node, k in zip(nodes, self.keep(pending=True)) if k]
            ids = {n.id for n in kept}
            self.drop([node for node in nodes if node.id not in ids])
            versions: dict[int, Version] = {v.id: v for v in self.pinned()}
            for v in self.versions.values():
                v.readers = 0
            for node in kept:
                for v, _ in node.inputs:
                    versions[v.id] = v
                    v.readers += 1
                versions.update((o.id, o) for o in node.outputs)
            self.old = carry(self.old, nodes, ids, versions)
            for v in list(self.versions.values()):
                if v.id not in versions:
                    self._forget(v)
            self.nodes = {node.id: node for node in kept}
            self.versions = dict(sorted(versions.items()))
            self.garbage = 0
            self.limit = 2 * len(kept) + 64

    def drop(self, nodes: Iterable[Node]) -> None:
        """Makes the versions ``nodes`` wrote leaves (callers remove the nodes)."""
        for node in nodes:
            for out in node.outputs:
                if out.node is node:
                    out.node = None


def between(nodes: Sequence[Node], wrt: Iterable[Version], f: Iterable[Version]) -> list[Node]:
    """The recorded nodes on a gradient path from ``wrt`` to ``f``, in order.

    A node none of whose outputs can carry a gradient (run under ``no_grad``, or a
    constant's copy: lazy mode records them too, to run them later) is on no path:
    what it wrote is a leaf of the gradient graph."""
    reach = {v.id for v in wrt}
    forward = []
    for node in nodes:
        for v, _ in node.inputs:
            if v.id in reach and not v.cut:
                carried = [o.id for o in node.outputs if o.grad]
                if carried:
                    forward.append(node)
                    reach.update(carried)
                break
    need = {v.id for v in f}
    picked = []
    for node in reversed(forward):
        for o in node.outputs:
            if o.id in need:
                picked.append(node)
                for v, _ in node.inputs:
                    if not v.cut:
                        need.add(v.id)
                break
    picked.reverse()
    return picked


def to_flush(record: Record) -> tuple[list[Node], list[Version]]:
    """The pending nodes a lazy flush runs, and the versions it must return.

    Returned are the versions held by variables and those of nodes that stay recorded
    for gradients; pending nodes needed for neither are dead and run never.
    """
    need = {v.id for v in record.pinned()}
    nodes = record.node_list()
    for node, k in zip(nodes, record.keep(pending=False)):
        if k:
            for v, _ in node.inputs:
                need.add(v.id)
            for o in node.outputs:
                need.add(o.id)
    returned = set(need)
    picked = []
    for node in reversed(nodes):
        if node.pending:
            for o in node.outputs:
                if o.id in need:
                    picked.append(node)
                    for v, _ in node.inputs:
                        need.add(v.id)
                    break
    picked.reverse()
    outs = [o for node in picked for o in node.outputs if o.id in returned]
    return picked, outs
