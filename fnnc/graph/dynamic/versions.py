"""What changes a variable's version: writes (whole or through an alias), ``set``,
``detach`` and ``free``.

A write never changes a version: writing a variable points its slot at a new one, and
writing through an alias records ``write_view(old, value)``, whose result is the new
version of the whole slot. Readers of the old version keep it (SSA), which is what
lets ``backward`` differentiate through a variable that was written since.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fnnc import ops
from fnnc.errors import DTypeError, GraphError, ShapeError
from fnnc.ops import Command
from fnnc.ops.call import write_view

from .record import Read, Version
from .variable import Variable

if TYPE_CHECKING:
    from .graph import DynamicGraph
    from .variable import Slot

_COPY = ops.data_transfer()


def exec_into(
    self: DynamicGraph,
    cmd: Command,
    run: Callable[[], tuple[Version, ...]],
    targets: Sequence[Variable],
    name: str,
) -> Any:
    """``exec`` with ``outputs=``: checks ``targets``, runs ``cmd`` (``run``) and writes
    its outputs into them."""
    where = f"exec {cmd}" + (f" ({name!r})" if name else "")
    targets = list(targets)
    slots = [self._slot(t, where) for t in targets]
    outs = run()
    if len(outs) != len(targets):
        raise GraphError(f"{where}: the command has {len(outs)} outputs, {len(targets)} were given")
    for target, slot, out in zip(targets, slots, outs):
        _assign(self, target, slot, (out, None), where)
    return targets[0] if len(targets) == 1 else tuple(targets)


def write(self: DynamicGraph, target: Variable, value: Any) -> None:
    """Writes ``value`` (a variable, an array or a number) into ``target``.

    ``target`` keeps its shape; a number or array broadcasts to it. Writing an alias
    makes a new version of the variable it views (``y[0] = z`` is
    ``dg.write(y[0], z)``).
    """
    slot = self._slot(target, "write")
    if isinstance(value, Variable):
        read = self._read(value, "write", 0)
    else:
        arr = np.broadcast_to(np.asarray(value, slot.version.dtype), target.shape)
        read = (self._leaf(np.array(arr), grad=False), None)
    _assign(self, target, slot, read, f"write into {target.label}")


def _assign(self: DynamicGraph, target: Variable, slot: Slot, read: Read, where: str) -> None:
    old = slot.version
    shape, dtype = target.shape, old.dtype
    v, view = read
    got = view.shape if view is not None else v.shape
    if got != shape or v.dtype != dtype:
        error = ShapeError if got != shape else DTypeError
        raise error(
            f"{where}: writes {np.dtype(v.dtype).name}{list(got)} into variable "
            f"{target.label}, which is {np.dtype(dtype).name}{list(shape)}"
        )
    if target._view is not None:
        w = target._view
        cmd = write_view(shape=w.shape, base=w.base, stride=w.stride)
        (new,) = self._run_reads(cmd, [(old, None), read], "")
    elif view is not None:
        (new,) = self._run_reads(_COPY, [read], "")
    else:
        new = v
    if not slot.trainable and new.grad and new.pins == 0:
        new.detach()
    new.name = new.name or slot.name
    repin(self, slot, new)


def set(  # noqa: A001 - the method name NNC users know
    self: DynamicGraph, var: Variable, value: Any
) -> None:
    """Gives ``var`` a new value (a leaf version; NNC's ``ccv_nnc_tensor_variable_set``)."""
    slot = self._slot(var, "set")
    if var.is_alias:
        return self.write(var, value)
    leaf = self._leaf(value, grad=slot.trainable, name=slot.name)
    if leaf.spec != slot.version.spec:
        raise ShapeError(
            f"set: variable {var.label} is {slot.version.dtype.name}"
            f"{list(slot.version.shape)}, the value is {leaf.dtype.name}{list(leaf.shape)}"
        )
    repin(self, slot, leaf)


def repin(self: DynamicGraph, slot: Slot, version: Version) -> None:
    old = slot.version
    slot.version = version
    version.pins += 1
    self._record.unpin(old)


def free(self: DynamicGraph, var: Variable) -> None:
    """Frees ``var`` now (NNC's ``ccv_nnc_tensor_variable_free``) and prunes the record."""
    slot = self._slot(var, "free")
    var._slot = None
    self.release(slot)
    self.collect()


def detach(self: DynamicGraph, var: Variable) -> None:
    """Makes ``var`` a constant: no gradient passes through its current value any more.

    Nodes that only that value fed are pruned (NNC's ``ccv_nnc_tensor_variable_detach``).
    """
    slot = self._slot(var, "detach")
    v = slot.version
    if v.pins > 1:  # shared by memoisation: detach a copy
        repin(self, slot, self._leaf(v.value if v.value is not None else var.value, False))
    else:
        v.detach()
    slot.trainable = False
    self.collect()
