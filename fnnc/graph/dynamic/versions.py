"""What changes a variable's version: writes (whole or through an alias), ``set``,
``detach`` and ``free``; :class:`DynamicGraph`'s methods of those names call these.

A write never changes a version: writing a variable points its slot at a new one, and
writing through an alias records ``write_view(old, value)``, whose result is the new
version of the whole slot. Readers of the old version keep it (SSA), which is what
lets ``backward`` differentiate through a variable that was written since.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from fnnc import ops
from fnnc.core.dtypes import is_inexact
from fnnc.core.ir import unit_axes_apart
from fnnc.errors import DTypeError, GraphError, ShapeError
from fnnc.ops import Command
from fnnc.ops._rules import integer_cast
from fnnc.ops.call import write_view

from . import stale
from .execute import run_reads, where
from .record import Read, Version
from .variable import Variable

if TYPE_CHECKING:
    from .graph import DynamicGraph
    from .variable import Slot

_COPY = ops.data_transfer()


def exec_into(
    dg: DynamicGraph,
    cmd: Command,
    run: Callable[[], tuple[Version, ...]],
    targets: Sequence[Variable],
    name: str,
) -> Any:
    """``exec`` with ``outputs=``: checks ``targets``, runs ``cmd`` (``run``) and writes
    its outputs into them."""
    at = where(cmd, name)
    if not isinstance(targets, (list, tuple)):  # a variable was iterated row by row
        raise GraphError(
            f"{at}: outputs is a list of variables, one per output of the command, got "
            f"{type(targets).__name__}; pass outputs=[y] for one"
        )
    targets = list(targets)
    slots = [dg._slot(t, at) for t in targets]
    outs = run()
    if len(outs) != len(targets):
        raise GraphError(f"{at}: the command has {len(outs)} outputs, {len(targets)} were given")
    for target, slot, out in zip(targets, slots, outs):
        _assign(dg, target, slot, (out, None), at)
    return targets[0] if len(targets) == 1 else tuple(targets)


def output_list(
    dg: DynamicGraph, targets: Any, at: str, count: int | None = None
) -> list[Variable]:
    """``evaluate``'s ``outputs``, checked before the model runs: a list of live
    variables of ``dg`` (a variable alone would be iterated row by row), ``count`` of
    them where the model's output count is known."""
    if not isinstance(targets, (list, tuple)):
        raise GraphError(
            f"{at}: outputs is a list of variables, one per output of the model, got "
            f"{type(targets).__name__}; pass outputs=[y] for one"
        )
    if count is not None and len(targets) != count:
        raise GraphError(f"{at}: the model has {count} outputs, {len(targets)} were given")
    for t in targets:
        dg._slot(t, at)
    return list(targets)


def write_outputs(dg: DynamicGraph, outs: Any, targets: list[Variable], at: str) -> Any:
    """``evaluate(outputs=...)``: each of ``outs`` (variables, a pytree of them for a
    traced graph) written into its target, as ``exec_into`` writes a command's outputs."""
    leaves = jax.tree.leaves(outs, is_leaf=lambda v: isinstance(v, Variable))
    if len(leaves) != len(targets):
        raise GraphError(f"{at}: the model has {len(leaves)} outputs, {len(targets)} were given")
    slots = [dg._slot(t, at) for t in targets]
    for target, slot, out in zip(targets, slots, leaves):
        _assign(dg, target, slot, (out._slot.version, None), at)
    return targets[0] if len(targets) == 1 else tuple(targets)


def write(dg: DynamicGraph, target: Variable, value: Any) -> None:
    """:meth:`DynamicGraph.write`: ``target``'s slot gets a new version holding ``value``."""
    slot = dg._slot(target, "write")
    if isinstance(value, Variable):
        read = dg._read(value, "write", 0)
    else:
        arr = _numbers(value, slot.version.dtype, f"write into {target.label}")
        while arr.ndim > len(target.shape) and arr.shape[0] == 1:
            arr = arr[0]  # NumPy's y[0] = np.ones((1, 3)): leading size-1 axes dropped
        try:
            arr = np.broadcast_to(arr, target.shape)
        except ValueError:
            raise ShapeError(
                f"write into {target.label}: the value is {list(arr.shape)}, which does not "
                f"broadcast to the variable's shape {list(target.shape)}; write a number or "
                f"an array of shape {list(target.shape)} (or one that broadcasts to it)"
            ) from None
        read = (dg._leaf(np.array(arr), grad=False), None)
    _assign(dg, target, slot, read, f"write into {target.label}")


def _numbers(value: Any, dtype: np.dtype, at: str) -> np.ndarray:
    """``value`` as an array of ``dtype``, or a :class:`DTypeError` naming ``at`` for a
    value that holds no numbers (``np.asarray(None, float32)`` is NaN, not an error)."""
    try:
        given = (arr := np.asarray(value)).dtype
    except (TypeError, ValueError):  # ragged lists
        given = np.dtype(object)
    if given.kind in "biu":  # an integer the variable's type does not hold: error
        return integer_cast(arr, dtype, at)
    if is_inexact(given):
        return arr.astype(dtype)
    raise DTypeError(
        f"{at}: got {value!r:.40} ({type(value).__name__}), which is not an array of "
        f"numbers; write a Variable, a number, or a NumPy or JAX array of "
        f"{np.dtype(dtype).name} (or a list of numbers)"
    )


def _assign(dg: DynamicGraph, target: Variable, slot: Slot, read: Read, where: str) -> None:
    old = slot.version
    shape, dtype = target.shape, old.dtype
    v, view = read
    got = view.shape if view is not None else v.shape
    if v.dtype == dtype and unit_axes_apart(got, shape):
        # NumPy's y[0] = z for z of shape [1]: the same values with size-1 axes
        # dropped or added are written as the target's shape
        (v,) = _internal(run_reads(dg, ops.reshape(shape=tuple(shape)), [read], ""))
        read, view, got = (v, None), None, tuple(shape)
    if got != shape or v.dtype != dtype:
        error = ShapeError if got != shape else DTypeError
        raise error(
            f"{where}: writes {np.dtype(v.dtype).name}{list(got)} into variable "
            f"{target.label}, which is {np.dtype(dtype).name}{list(shape)}"
        )
    if target._view is not None:
        w = target._view
        cmd = write_view(shape=w.shape, base=w.base, stride=w.stride)
        (new,) = _internal(run_reads(dg, cmd, [(old, None), read], ""))
    elif view is not None:
        (new,) = _internal(run_reads(dg, _COPY, [read], ""))
    else:
        new = v
    if not slot.trainable and new.grad:
        new = _constant(dg, new)
    elif slot.trainable and not new.grad and (target._view is None or old.grad):
        # a value made from constants alone (ops.set, ...) written into a trainable
        # variable: it stays a variable, now a leaf holding that value, as ``set`` makes
        # it (NNC: the variable keeps taking gradients); so does a differentiable one
        # written through an alias under no_grad (``w[0] = 0`` made w a constant)
        value = new.value
        if value is None:  # pinned while flushed: unpinned pending work is dead
            new.pins += 1
            try:
                dg.flush()
                value = new.value
            finally:
                dg._record.unpin(new)
        new = dg._leaf(value, grad=True, name=slot.name)
    new.name = new.name or slot.name
    repin(dg, slot, new)


def _constant(dg: DynamicGraph, v: Version) -> Version:
    """``v``'s value as a constant, for a constant's slot: however it is written
    (``dg.write``, ``c[:] = z``, ``exec(outputs=[c])``), a constant stays one and no
    gradient flows through it (NNC asserts a recorded exec never writes a constant).
    ``v`` itself is cut when nothing else sees it; a version a variable holds or a
    recorded node reads keeps its gradient, and the constant gets a copy."""
    if v.pins == 0 and v.readers == 0:
        v.detach()
        return v
    with dg.no_grad():
        (copy,) = _internal(run_reads(dg, _COPY, [(v, None)], ""))
    return copy


def _internal(outs: tuple[Version, ...]) -> tuple[Version, ...]:
    """``outs``, whose producer (a write through an alias, a copy of a view, a reshape
    to the target's shape) is marked as the dynamic graph's own node: NNC records such
    a write as part of the user's exec, so :attr:`DynamicGraph.num_nodes` leaves it out."""
    for out in outs:
        if out.node is not None:
            out.node.internal = True
    return outs


def set_value(dg: DynamicGraph, var: Variable, value: Any) -> None:
    """:meth:`DynamicGraph.set`: ``var``'s slot gets a new leaf version (a write, for an
    alias)."""
    slot = dg._slot(var, "set")
    if var.is_alias:
        return write(dg, var, value)
    leaf = dg._leaf(value, grad=slot.trainable, name=slot.name, where="set: variable")
    old = slot.version
    if leaf.spec != old.spec:
        said = (
            f"set: variable {var.label} is {old.dtype.name}{list(old.shape)}, the value is "
            f"{leaf.dtype.name}{list(leaf.shape)}"
        )
        if tuple(leaf.shape) != tuple(old.shape):
            raise ShapeError(said)
        raise DTypeError(f"{said}; convert it first, e.g. .astype(np.{old.dtype.name})")
    repin(dg, slot, leaf)


def repin(dg: DynamicGraph, slot: Slot, version: Version) -> None:
    """Points ``slot`` at ``version``; the version it held loses a holder."""
    old = slot.version
    slot.version = version
    version.pins += 1
    dg._record.unpin(old)
    stale.supersede(dg._record, slot, old)


def free(dg: DynamicGraph, var: Variable) -> None:
    """:meth:`DynamicGraph.free`: ``var`` lets go of its slot; the record is pruned.

    Freeing a gradient that :meth:`~DynamicGraph.backward` returned drops it from the
    accumulator (NNC: freeing the gradient tensor resets accumulation): the next
    ``backward`` starts a new gradient.
    """
    slot = dg._slot(var, "free")
    dg.grads = {k: g for k, g in dg.grads.items() if g is not var}
    var._slot = None
    dg.release(slot)
    dg.collect()


def detach(dg: DynamicGraph, var: Variable, collect: bool = True) -> None:
    """:meth:`DynamicGraph.detach`: cuts ``var``'s version (or a copy of it, when
    memoisation shares it) and makes its slot a constant one; then prunes the record
    (``collect``)."""
    slot = dg._slot(var, "detach")
    if var.is_alias:  # it would detach the whole variable (NNC asserts: no alias)
        raise GraphError(
            f"detach: {var.label} is an alias (a view of another variable); detaching it "
            "would detach the whole variable it views. Detach that variable, or use a "
            "constant copy of the view: dg.constant(view)"
        )
    v = slot.version
    if v.pins > 1:  # shared by memoisation: detach a copy
        repin(dg, slot, dg._leaf(v.value if v.value is not None else var.value, False))
    else:
        v.detach()
    slot.trainable = False
    if collect:
        dg.collect()
