"""How :meth:`DynamicGraph.exec` runs a command: plans, cached, and the recorded run.

A :class:`Plan` is what running a command needs without asking anything again: the
jitted forward of the backend :func:`select_backend` picked, and the outputs' specs,
checked once by the command's shape rule. A graph's :class:`Plans` caches them twice
over:

* per command *value* (:meth:`Plans.get`): commands equal by value share plans, so
  ``ops.scalar_mul(a=2.0)`` made afresh at every call plans once;
* by ``(id(cmd), *spec ids)`` (``Plans.fast``): the one dict lookup of ``exec``'s fast
  path. The entry holds the command, which keeps its ``id`` from being reused.

Both key on :func:`fnnc.core.dispatch.state` (backends, autotune table, settings): a
plan made before a backend was registered is made again. With the numerics check on
(``config.override(numerics=True)``), a plan's forward is wrapped by
:func:`fnnc.graph.numerics.checked`, and the first ``exec`` whose output holds a NaN or
an infinity raises :class:`~fnnc.errors.NumericsError` naming it and its inputs' statistics.

:func:`run` is the rest of every command: call the forward (unless lazy), make the
output versions, and append a node to the :class:`~.record.Record` when a gradient
can flow through it (or in lazy mode, where it runs later); :func:`run_reads` plans
first, for the general path. Both are plain functions of the graph: a module function
costs what a method call costs, and ``exec`` pays it once per command.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from fnnc import config
from fnnc.core.command import output_specs
from fnnc.core.dispatch import compiled_forward, select_backend
from fnnc.core.dispatch import state as dispatch_state
from fnnc.core.dtypes import is_inexact
from fnnc.core.evaluate import read_view
from fnnc.core.ir import AliasSymbol
from fnnc.errors import FnncError, GraphError
from fnnc.graph.numerics import NotFinite, checked, exec_error
from fnnc.graph.passes._subgraphs import is_pure
from fnnc.ops import Command

from .record import Node, Read, Version, View, spec_id

if TYPE_CHECKING:
    from .graph import DynamicGraph

Spec = jax.ShapeDtypeStruct


class PerCommand:
    """Per command value: its plans by input spec ids, and its memo table.

    Attributes:
        differentiable: whether gradients flow through the command (else its
            outputs are constants).
        plans: plans by the inputs' spec ids.
        memo: results by (grad, inputs) when the command may be memoised (pure, and
            the graph memoises), else ``None``.
    """

    __slots__ = ("differentiable", "memo", "plans")

    def __init__(self, cmd: Command, memo: bool):
        attrs = cmd.definition.attributes
        self.differentiable = attrs.differentiable
        self.plans: dict[tuple[int, ...], Plan] = {}
        # pure through and through: a call, loop or branch holding an effect (a debug
        # callback in an evaluated graph) or a random draw runs again at every exec
        self.memo: dict[Any, tuple[Version, ...]] | None = {} if memo and is_pure(cmd) else None


class Plan:
    """How one command runs on inputs of given specs.

    Attributes:
        per: the command's :class:`PerCommand`.
        cfg: the dispatch state the plan was made under.
        fn: the jitted forward; it returns an array or a tuple of arrays.
        outs: per output ``(shape, dtype, spec id, floating)``.
        pending: ``(None, ...)``, one per output: lazy mode's values.
    """

    __slots__ = ("cfg", "fn", "outs", "pending", "per")

    def __init__(self, per: PerCommand, cfg: Any, fn: Any, outs: Any):
        self.per = per
        self.cfg = cfg
        self.fn = fn
        self.outs = tuple(
            (tuple(o.shape), np.dtype(o.dtype), spec_id(tuple(o.shape), np.dtype(o.dtype)),
             is_inexact(o.dtype))
            for o in outs
        )  # fmt: skip
        self.pending = (None,) * len(self.outs)


class Plans:
    """The plans of one dynamic graph (see the module doc).

    Attributes:
        fast: ``(command, plan)`` by ``(id(command), *input spec ids)``.
    """

    __slots__ = ("_commands", "_memo", "fast")

    def __init__(self, memo: bool) -> None:
        self._memo = memo
        self._commands: dict[Command, PerCommand] = {}
        self.fast: dict[tuple[int, ...], tuple[Command, Plan]] = {}

    def get(self, cmd: Command, reads: list[Read], name: str) -> Plan:
        """The plan for ``cmd`` on ``reads`` (made and checked on first use)."""
        if not isinstance(cmd, Command):
            raise GraphError(
                f"exec{' ' + repr(name) if name else ''}: expected a Command (e.g. "
                f"fnnc.ops.relu()), got {type(cmd).__name__}; call the factory to build one"
            )
        specs = [(v.shape, v.dtype) if w is None else (w.shape, v.dtype) for v, w in reads]
        sids = tuple([spec_id(*s) for s in specs])
        per = self._commands.get(cmd)
        if per is None:
            per = self._commands[cmd] = PerCommand(cmd, self._memo)
        plan = per.plans.get(sids)
        cfg = dispatch_state()
        if plan is None or plan.cfg != cfg:
            jspecs = [Spec(shape, dtype) for shape, dtype in specs]
            try:
                outs = output_specs(cmd, jspecs)
            except FnncError as e:
                listing = ", ".join(
                    f"{name_of(v)}:{np.dtype(d).name}{list(s)}"
                    for (v, _), (s, d) in zip(reads, specs)
                )
                raise type(e)(f"{where(cmd, name)}: {e}\n  inputs: {listing or '(none)'}") from None
            fn = compiled_forward(cmd, select_backend(cmd, jspecs))
            if config.get().numerics:  # planned anew when it changes (dispatch state)
                fn = checked(fn)
            plan = per.plans[sids] = Plan(per, cfg, fn, outs)
        if len(self.fast) > 4096:  # commands made on the fly (``x * 2.0``) come and go
            self.fast.clear()
        self.fast[(id(cmd), *sids)] = (cmd, plan)  # holding cmd keeps its id unique
        return plan


def run_reads(dg: DynamicGraph, cmd: Command, reads: list[Read], name: str) -> tuple[Version, ...]:
    """Runs ``cmd`` on versions (or views of them) and records it; its new versions."""
    plan = dg._plans.get(cmd, reads, name)
    args = None
    if not dg.lazy:
        args = [v.value if w is None else dg._view_value(v, w) for v, w in reads]
    return run(dg, cmd, plan, reads, args, name)


def run(
    dg: DynamicGraph, cmd: Command, plan: Plan, reads: list[Read], args: Any, name: str
) -> tuple[Version, ...]:
    """Runs a planned command on ``args``, the values of ``reads`` (unused in lazy
    mode), and records it; its new versions, or the memoised ones."""
    per = plan.per
    grad = False
    if dg._grad_enabled and per.differentiable:
        for v, _ in reads:
            if v.source:
                grad = True
                break
    memo = per.memo
    if memo is not None:
        key = (grad, *reads)
        hit = memo.get(key)
        if hit is not None and not any(o.cut for o in hit):
            return hit
    record = dg._record
    lazy = dg.lazy
    if lazy:
        values: Any = plan.pending
    else:
        try:  # free unless raised (Python 3.11); only a numerics-checked forward raises
            values = plan.fn(*args)
        except NotFinite as e:
            names = [name_of(v) for v, _ in reads]
            raise exec_error(where(cmd, name), cmd, names, e) from None
        if type(values) is not tuple:
            values = (values,)
    ids, table = record.ids, record.versions
    # No zip(): on Python 3.11 calling it costs as much as the rest of this loop.
    outs: tuple[Version, ...] = ()
    for shape, dtype, sid, floating in plan.outs:
        out = Version(next(ids), shape, dtype, sid, values[len(outs)], grad and floating)
        table[out.id] = out
        outs += (out,)
    if grad or lazy:  # the node keeps ``reads``, a list made for this call only
        node = Node(next(ids), cmd, reads, outs, name, lazy)
        record.nodes[node.id] = node  # recorded: its inputs gain a reader
        for v, _ in reads:
            v.readers += 1
        for out in outs:
            out.node = node
        if grad:  # a gradient node: what it reads and writes has a symbol (num_tensors)
            for v, _ in reads:
                v.linked = True
            for out in outs:
                out.linked = True
    if memo is not None:
        memo[key] = outs
        entry = (memo, key)
        for out in outs:
            out.memo = entry
    return outs


def where(cmd: Command, name: str) -> str:
    """How messages name one ``exec``: ``exec ewsum ('loss')``."""
    return f"exec {cmd}" + (f" ({name!r})" if name else "")


def name_of(v: Version) -> str:
    """How messages name a version: its name, or ``%id``."""
    return repr(v.name) if v.name else f"%{v.id}"


@functools.lru_cache(maxsize=1024)
def reader(view: View, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """A jitted function reading ``view`` out of a root of ``shape`` and ``dtype``."""
    sym = AliasSymbol(1, 0, view.shape, dtype, view.base, view.stride)
    return jax.jit(lambda root: read_view(root, sym))
