"""NNC's ``parallel`` argument of the dynamic graph: one call over several copies.

NNC's ``ccv_nnc_dynamic_graph_exec``, ``_apply_gradients`` and ``_minimize`` take a
``parallel`` count for data parallelism by hand: their variable lists hold that many
copies one after another (copy ``i`` is the ``i``-th contiguous block of each list),
each copy usually on its own device. Here:

* ``exec(..., parallel=n)`` runs the command once per copy, on that copy's inputs
  and into its outputs, and returns every copy's outputs in the same layout;
* ``apply_gradients(..., parallel=n)`` first sums each variable's accumulated
  gradient over the copies (NNC's all-reduce), gives every copy that sum, then steps
  all of them: copies that start equal stay equal;
* ``minimize(..., parallel=n)`` differentiates each copy's ``f`` with respect to that
  copy's variables alone (adding to what they hold, as ``minimize`` does), then does
  the same.

Copies stay where their variables live; a sum is formed on the first copy's device
and each copy gets it on the device of its variable. ``backward`` of several ``f`` on different
devices (NNC's ``ccv_nnc_dynamic_graph_backward`` over copies) runs one gradient program
per device, since a program runs on one.

>>> import numpy as np, optax
>>> from fnnc import ops
>>> from fnnc.graph import DynamicGraph
>>> dg = DynamicGraph()
>>> x0, x1 = dg.variable(np.float32([2.0])), dg.variable(np.float32([-1.0]))
>>> y0, y1 = dg.exec(ops.scalar_mul(a=1.1), x0, x1, parallel=2)
>>> dg.minimize(optax.sgd(-1.0), [y0, y1], [x0, x1], parallel=2)  # x += sum of grads
>>> np.round([float(x0.numpy()[0]), float(x1.numpy()[0])], 5).tolist()
[4.2, 1.2]
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax

from fnnc.errors import GraphError

from .autodiff import _listed
from .variable import Variable

if TYPE_CHECKING:
    from .graph import DynamicGraph


def copies(items: Sequence[Any], parallel: Any, what: str, role: str) -> list[list[Any]]:
    """``items`` cut into ``parallel`` contiguous copies; checks the count divides."""
    if isinstance(parallel, bool) or not isinstance(parallel, numbers.Integral) or parallel < 1:
        raise GraphError(f"{what}: parallel is the number of copies, an int >= 1; got {parallel!r}")
    if len(items) % parallel:
        raise GraphError(
            f"{what}: parallel={parallel} takes the {role} as {parallel} copies one after "
            f"another, so their number must divide by {parallel}; got {len(items)}"
        )
    parallel = int(parallel)
    per = len(items) // parallel
    return [list(items[i * per : (i + 1) * per]) for i in range(parallel)]


def exec_copies(
    dg: DynamicGraph,
    cmd: Any,
    inputs: Sequence[Any],
    outputs: Sequence[Variable] | None,
    name: str,
    parallel: int,
) -> tuple[Variable, ...]:
    """``exec(..., parallel=n)``: the command on each copy; every copy's outputs, in order."""
    ins = copies(inputs, parallel, f"exec {cmd.name}", "inputs")
    # `is not None`: a Variable's truth is its value's (one element) or an error
    outs = None if outputs is None else copies(outputs, parallel, f"exec {cmd.name}", "outputs")
    results: list[Variable] = []
    for i in range(parallel):
        got = dg.exec(
            cmd,
            *ins[i],
            outputs=None if outs is None else outs[i],
            name=f"{name}{i}" if name else "",
        )
        results.extend(got if isinstance(got, tuple) else [got])
    return tuple(results)


def _devices(dg: DynamicGraph, var: Variable) -> frozenset[Any] | None:
    """The devices ``var``'s value lives on; ``None`` while it is pending (lazy mode:
    its forward runs inside the gradient program, on one device)."""
    v = dg._slot(var, "backward").version
    return frozenset(v.value.devices()) if isinstance(v.value, jax.Array) else None


def backward_by_device(
    dg: DynamicGraph, fs: list[Any], ws: list[Any], df: Any, into: Any
) -> list[Variable] | None:
    """``backward`` of copies that live on different devices: one gradient program per
    device (a program runs on one), each ``f`` with respect to the ``wrt`` on its
    device. ``None`` where every ``f`` is on one device (the caller runs one program)."""
    where = [_devices(dg, f) for f in fs]
    if None in where or len(set(where)) <= 1:
        return None
    dfs = [None] * len(fs) if df is None else list(df)
    targets = [None] * len(ws) if into is None else list(into)
    w_where = [_devices(dg, w) for w in ws]
    stranded = [w.label for w, d in zip(ws, w_where) if d not in where]
    if stranded:
        raise GraphError(
            f"backward: {', '.join(stranded)} is on a device none of f is on; a gradient "
            "flows only within a device here (copy values across with dg.exec first)"
        )
    result: list[Any] = [None] * len(ws)
    for place in dict.fromkeys(where):
        fi = [i for i, d in enumerate(where) if d == place]
        wi = [j for j, d in enumerate(w_where) if d == place]
        if not wi:
            continue
        got = dg.backward(
            [fs[i] for i in fi],
            [ws[j] for j in wi],
            None if df is None else [dfs[i] for i in fi],
            into=None if into is None else [targets[j] for j in wi],
        )
        for j, g in zip(wi, got):
            result[j] = g
    return result


def all_reduce(dg: DynamicGraph, variables: Sequence[Variable], parallel: int, what: str) -> None:
    """Gives every copy of each variable the sum of the copies' accumulated gradients."""
    per_copy = copies(variables, parallel, what, "variables")
    for same in zip(*per_copy):
        grads = [dg.grad(v) for v in same]
        missing = [v.label for v, g in zip(same, grads) if g is None]
        if missing:
            raise GraphError(
                f"{what}: {', '.join(missing)} has no gradient to sum over the copies; call "
                "dg.backward(f, variables) first"
            )
        values = [dg.value_of(g) for g in grads]
        home = next(iter(values[0].devices()))
        total = values[0]
        for v in values[1:]:
            total = total + jax.device_put(v, home)
        for var, g in zip(same, grads):  # on the device of the variable it steps
            dg.set(g, jax.device_put(total, next(iter(dg.value_of(var).devices()))))


def minimize_copies(
    dg: DynamicGraph, optimizer: Any, f: Any, variables: Any, parallel: int
) -> None:
    """``minimize(..., parallel=n)``: each copy's gradients, summed, then one step each."""
    fs, ws = _listed(f), _listed(variables)
    f_copies = copies(fs, parallel, "minimize", "f")
    w_copies = copies(ws, parallel, "minimize", "variables")
    for f_i, w_i in zip(f_copies, w_copies):
        dg.backward(f_i, w_i)
    apply_copies(dg, optimizer, ws, parallel, "minimize")


def apply_copies(
    dg: DynamicGraph, optimizer: Any, variables: list[Variable], parallel: int, what: str
) -> None:
    """``apply_gradients(..., parallel=n)``: the summed gradients, then one update per
    copy (an update program runs on one device; each copy's state is its own)."""
    all_reduce(dg, variables, parallel, what)
    for copy in copies(variables, parallel, what, "variables"):
        dg.apply_gradients(optimizer, copy)
