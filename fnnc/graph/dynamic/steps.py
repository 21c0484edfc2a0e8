"""Optimizer steps of a dynamic graph: ``apply_gradients`` and ``minimize``.

``apply_gradients`` runs one update program, cached per (optimizer structure, parameter
specs, donated positions), on the variables' values, their accumulated gradients and
the optimizer state :mod:`.optim` keeps per variable; the parameters each only their
variable holds, and the state, are updated in place (donated, as NNC's update is).
``minimize`` is :mod:`.autodiff`'s gradient program with the update appended: one
compiled program per step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fnnc.errors import GraphError
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.compile import compile
from fnnc.ops.optimizer import as_transformation, keys_as_bits, optax_update_command

from . import optim, versions
from .autodiff import _check_wrt, _donated, _listed, _run_gradients
from .extract import PROGRAMS
from .variable import require_variables

if TYPE_CHECKING:
    from .graph import DynamicGraph
    from .variable import Slot, Variable


def _params(dg: DynamicGraph, variables: Any, what: str) -> tuple[list[Variable], list[Slot]]:
    ws = _listed(variables)
    require_variables(ws, what, "variable")
    for w in ws:
        if w.is_alias:
            raise GraphError(f"{what}: {w.label} is an alias; update the variable it views instead")
    _check_wrt(dg, ws, what)
    return ws, [dg._slot(w, what) for w in ws]


def _update_program(optimizer: Any, specs: tuple[Any, ...], donate: tuple[int, ...]) -> Any:
    b = GraphBuilder()
    params = [b.input(shape, dtype) for shape, dtype in specs]
    grads = [b.input(shape, dtype) for shape, dtype in specs]
    cmd = optax_update_command(optimizer, [p.spec for p in params])
    state = [b.input(shape, dtype) for shape, dtype in cmd.param("state_specs")]
    outs = b.exec(cmd, *grads, *state, *params, name="optimizer")
    return compile(b.build(list(outs) if isinstance(outs, tuple) else [outs]), donate=donate)


def _store(
    dg: DynamicGraph,
    optimizer: Any,
    ws: list[Variable],
    slots: list[Slot],
    out: Any,
    n_hyper: int,
) -> None:
    out = list(out) if isinstance(out, tuple) else [out]
    state = out[len(ws) : len(out) - n_hyper]  # the hyper-parameters: passed through
    optim.store(dg, optimizer, slots, out[: len(ws)], state)
    for w, value in zip(ws, out[: len(ws)]):
        versions.set_value(dg, w, value)  # the caller syncs models once
        dg.grads.pop((dg._slot(w, "update"), None), None)


def apply_gradients(dg: DynamicGraph, optimizer: Any, variables: Any) -> None:
    """:meth:`DynamicGraph.apply_gradients`: one cached update program per (optimizer,
    specs), on the variables' values, gradients and optimizer state."""
    optimizer = as_transformation(optimizer)  # optax.MultiSteps, as Model takes it
    optim.check(optimizer, "apply_gradients")  # first: not 'no gradient' for a typo
    if dg.lazy:
        dg.flush()
    optimizer = keys_as_bits(optimizer)  # a PRNG key in the state rides as its bits
    ws, slots = _params(dg, variables, "apply_gradients")
    grads = []
    for w in ws:
        g = dg.grad(w)
        if g is None:
            raise GraphError(
                f"apply_gradients: variable {w.label} has no gradient; call "
                f"dg.backward(f, [{w.name or 'var'}]) first"
            )
        grads.append(dg.value_of(g))
    params = [dg.value_of(w) for w in ws]
    state = optim.state(dg, optimizer, slots, params, "apply_gradients")
    specs = optim.specs_of(params)
    step, hyper = optim.stepper(optimizer, specs)
    values = [*params, *grads, *state, *hyper]
    # the parameters (each only its variable holds) and the state are updated in place
    owned = {i: w._slot.version for i, w in enumerate(ws) if w._view is None}
    donate = _donated(dg, values, owned, range(2 * len(ws), 2 * len(ws) + len(state)))
    program, fresh = PROGRAMS.get(
        ("apply", optim.keys(optimizer, specs)[0], specs, donate),
        lambda: _update_program(step, specs, donate),
    )
    dg.num_compiled += fresh
    _store(dg, optimizer, ws, slots, program(*values), len(hyper))


def minimize(dg: DynamicGraph, optimizer: Any, f: Any, variables: Any) -> None:
    """:meth:`DynamicGraph.minimize`: the gradient program with the update appended."""
    optimizer = as_transformation(optimizer)
    optim.check(optimizer, "minimize")
    optimizer = keys_as_bits(optimizer)
    ws, slots = _params(dg, variables, "minimize")
    out, _ = _run_gradients(dg, _listed(f), ws, None, "minimize", optimizer)
    _store(dg, optimizer, ws, slots, tuple(out), optim.n_hyper(optimizer))
