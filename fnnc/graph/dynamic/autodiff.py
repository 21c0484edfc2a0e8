"""Gradients of a dynamic graph, as compiled programs cached by structure.

``backward(f, wrt)``:

1. picks the recorded nodes on a gradient path from ``wrt`` to ``f``
   (:func:`~fnnc.graph.dynamic.record.between`), the minimal sub-graph;
2. extracts them as a canonical graph (symbols renumbered, names dropped), which is
   the cache key together with the positions of ``f`` and ``wrt``;
3. on a miss only: runs fnnc's ``backward`` pass on it, adds the accumulation into
   gradients that already hold a value (``ewsum``) and, for :func:`.steps.minimize`, one
   ``optax_update`` node; then runs ``simplify`` as ``Model.fit`` does (fused losses
   and kernels), removes the forward nodes (their values are recorded) and compiles
   the rest (:mod:`.simplified`);
4. runs the program on the recorded activations.

The next training step records the same computation on new arrays, extracts an equal
graph and runs the program compiled for the first step.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from fnnc import ops
from fnnc.core.dtypes import is_inexact
from fnnc.core.ir import Graph
from fnnc.errors import DTypeError, GraphError, ShapeError
from fnnc.graph.builder import GraphBuilder
from fnnc.graph.compile import compile
from fnnc.graph.passes.backward import backward as backward_pass
from fnnc.ops.optimizer import optax_update_command

from . import higher, lazy, optim, stale
from .extract import PROGRAMS, extract
from .record import Read, Version, between
from .simplified import simplify_trim, tag_forward
from .variable import require_variables

if TYPE_CHECKING:
    from .graph import DynamicGraph
    from .variable import Slot, Variable


def _listed(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _check_f(dg: DynamicGraph, fs: list[Variable], what: str) -> list[Read]:
    require_variables(fs, what, "f")
    reads = [dg._read(f, what, i) for i, f in enumerate(fs)]
    for f, (v, _) in zip(fs, reads):
        if not v.grad and not is_inexact(v.dtype):
            raise DTypeError(
                f"{what}: f {f.label} is {v.dtype.name}, which has no gradient: integer "
                "(and boolean) values are not differentiable, dg.variable(...) of integers "
                "and what is computed from them included; differentiate a floating-point "
                "f with respect to floating-point variables"
            )
        if not v.grad:
            raise GraphError(
                f"{what}: f {f.label} is a constant: it depends on no trainable variable "
                "(made with dg.constant, under no_grad, or detached), so it has no gradient"
            )
    return reads


def _check_wrt(dg: DynamicGraph, ws: list[Variable], what: str) -> list[Read]:
    require_variables(ws, what, "wrt")
    reads = [dg._read(w, what, i) for i, w in enumerate(ws)]
    for w, (v, _) in zip(ws, reads):
        if not is_inexact(v.dtype):  # named here: the graph pass knows only symbol ids
            raise DTypeError(
                f"{what}: wrt {w.label} is {v.dtype.name}, which has no gradient; "
                "differentiate with respect to floating-point variables"
            )
        if not w.requires_grad:
            raise GraphError(
                f"{what}: wrt {w.label} is a constant (made with dg.constant, computed from "
                "constants or under no_grad, or detached); gradients are taken with respect "
                "to dg.variable(...) values and what is computed from them"
            )
    return reads


def _seeds(
    dg: DynamicGraph, df: Any, fs: list[Variable], f_reads: list[Read], recorded: bool = False
) -> list[Any]:
    """The seed gradients' values, one per ``f`` (none for ``df=None`` and one-element
    ``f``: the program seeds those itself). ``df=None`` with an ``f`` of several
    elements seeds ones of each ``f``'s shape and dtype, as NNC's
    ``ccv_nnc_dynamic_graph_backward`` (its ``CMD_SET_FORWARD(1)``) does: the gradient
    of the sum of ``f``'s elements. With ``recorded`` (``create_graph``) a seed that is
    a variable comes as its read, so the recorded gradient depends on it and a second
    backward reaches it."""
    if df is None:
        shapes = [view.shape if view is not None else v.shape for v, view in f_reads]
        if all(math.prod(shape) == 1 for shape in shapes):
            return []
        return [jax.numpy.ones(s, v.dtype) for s, (v, _) in zip(shapes, f_reads)]
    dfs = _listed(df)
    if len(dfs) != len(fs):
        raise GraphError(f"backward: {len(fs)} f but {len(dfs)} df; pass one seed per f")
    out = []
    for i, (f, (v, _), d) in enumerate(zip(fs, f_reads, dfs)):
        if recorded and hasattr(d, "_slot"):
            seed, shape, dtype = dg._read(d, "backward: df", i), d.shape, d.dtype
        else:
            d = dg.value_of(d) if hasattr(d, "_slot") else _seed_array(d, f, v.dtype)
            seed, shape, dtype = d, d.shape, d.dtype
        if tuple(shape) != tuple(f.shape):
            raise ShapeError(f"backward: df for f {f.label} is {list(shape)}, f is {list(f.shape)}")
        if dtype != v.dtype:  # a variable seed: an array is converted above
            raise DTypeError(
                f"backward: df for f {f.label} is a variable of {np.dtype(dtype).name}, f is "
                f"{v.dtype.name}; convert the seed to f's dtype (datatype_conversion)"
            )
        out.append(seed)
    return out


def _seed_array(d: Any, f: Variable, dtype: np.dtype) -> Any:
    """A ``df`` seed that is no variable, as an array of ``f``'s dtype."""
    try:
        return jax.numpy.asarray(d, dtype)
    except (TypeError, ValueError) as e:
        raise DTypeError(
            f"backward: df for f {f.label} is {type(d).__name__} {d!r:.40}, not an array of "
            f"numbers ({e}); pass a variable or an array of f's shape {list(f.shape)}"
        ) from None


def _check_into(ws: list[Variable], targets: list[Any]) -> None:
    """Each ``into`` target is a variable of its ``wrt``'s shape and dtype (they were
    checked only as the compiled program's inputs, an error naming neither)."""
    if len(targets) != len(ws):
        raise GraphError(f"backward: {len(ws)} wrt but {len(targets)} into; pass one per wrt")
    given = [(i, t) for i, t in enumerate(targets) if t is not None]
    require_variables([t for _, t in given], "backward", "into")
    for i, t in given:
        w = ws[i]
        if tuple(t.shape) != tuple(w.shape) or t.dtype != w.dtype:
            error = ShapeError if tuple(t.shape) != tuple(w.shape) else DTypeError
            raise error(
                f"backward: into {i} {t.label} is {t.dtype.name}{list(t.shape)}, but the "
                f"gradient of wrt {w.label} is {w.dtype.name}{list(w.shape)}; accumulate "
                "into a variable of the wrt's shape and dtype"
            )


def _gradient_graph(
    forward: Graph,
    f: tuple[int, ...],
    wrt: tuple[int, ...],
    seeded: bool,
    acc: tuple[bool, ...],
    optimizer: Any = None,
    passes: tuple[Any, ...] = (),
) -> tuple[Graph, tuple[int, ...]]:
    """``forward``'s gradients (+ accumulation, + an Optax update), see the module doc.

    ``passes`` (lazy mode's ``DynamicGraph(passes=)``) run on the forward first, as the
    flush that computed its values ran them: the gradient is the rewritten forward's.

    Returns the graph and the forward symbols it reads, its first inputs; then come
    the seeds, the gradients accumulated into, and the optimizer state.
    """
    n_forward = len(forward.symbols)
    if passes:
        forward, f, wrt = _rewritten(forward, f, wrt, passes)
        n_forward = 0  # the forward symbols carry their tags (simplify_trim) already
    b = GraphBuilder.from_graph(forward)

    def extra(sid: int) -> Any:
        spec = forward.spec(sid)
        s = b.tensor(spec.shape, spec.dtype)
        b.add_input(s)
        return s

    seeds = [extra(s) for s in f] if seeded else None
    accs = [extra(w) for w, a in zip(wrt, acc) if a]
    base = b.build([])
    sym = base.symbols
    full, grads = backward_pass(base, [sym[s] for s in f], [sym[s] for s in wrt], df=seeds)
    b = GraphBuilder.from_graph(full)
    it = iter(accs)
    outs = [b.exec(ops.ewsum(), g, next(it)) if a else g for g, a in zip(grads, acc)]
    added = [s.id for s in (seeds or [])] + [s.id for s in accs]
    if optimizer is not None:
        params = [sym[w] for w in wrt]
        cmd = optax_update_command(optimizer, [p.spec for p in params])
        state = [b.tensor(shape, dtype) for shape, dtype in cmd.param("state_specs")]
        for s in state:
            b.add_input(s)
        added += [s.id for s in state]
        updated = b.exec(cmd, *outs, *state, *params, name="optimizer")
        outs = list(updated) if isinstance(updated, tuple) else [updated]
    return simplify_trim(b.build(outs), n_forward, added)


def _rewritten(
    forward: Graph, f: tuple[int, ...], wrt: tuple[int, ...], passes: tuple[Any, ...]
) -> tuple[Graph, tuple[int, ...], tuple[int, ...]]:
    """``forward`` after ``passes``, its symbols tagged with their recorded ids first
    (passes renumber symbols but keep names), and ``f``, ``wrt`` in it: they are its
    outputs, which passes keep by position."""
    tagged = dataclasses.replace(tag_forward(forward), outputs=(*f, *wrt))
    new = lazy.passes_on(passes, tagged)
    return new, new.outputs[: len(f)], new.outputs[len(f) :]


def _run_gradients(
    dg: DynamicGraph,
    fs: list[Variable],
    ws: list[Variable],
    df: Any,
    what: str,
    optimizer: Any = None,
    into: list[Variable | None] | None = None,
    create_graph: bool = False,
) -> tuple[list[Any], list[Slot]]:
    """Runs the cached gradient (or minimize) program; returns its outputs and ``ws``' slots.

    In lazy mode the pending forward runs in the same program (:func:`lazy.run_with`).
    With ``create_graph`` the program is recorded instead (:mod:`.higher`) and the
    outputs are versions.
    """
    f_reads = _check_f(dg, fs, what)
    w_reads = _check_wrt(dg, ws, what)
    seeds = _seeds(dg, df, fs, f_reads, recorded=create_graph)
    slots = [dg._slot(w, what) for w in ws]
    stale.check(dg, fs, f_reads, ws, slots, what)
    old = [dg.grads.get((s, w._view)) for s, w in zip(slots, ws)]
    if create_graph:
        old = [None] * len(ws)
    elif into is not None:
        old = [g if g is not None else o for g, o in zip(into, old)]
    with dg._record.hold():
        nodes = between(dg._record.node_list(), [v for v, _ in w_reads], [v for v, _ in f_reads])
        ex = extract(nodes, [*f_reads, *w_reads])
        f_ids, w_ids = ex.reads[: len(fs)], ex.reads[len(fs) :]
        acc = tuple(g is not None for g in old)
        params: list[Any] = []
        opt_key = None
        if optimizer is not None:
            params = [dg.value_of(w) for w in ws]  # lazy: runs what is pending
            optim.check(optimizer, what)
            specs = optim.specs_of(params)
            opt_key = optim.keys(optimizer, specs)[0]
        key = (what, ex.key, f_ids, w_ids, bool(seeds), acc, opt_key)
        step, hyper = (
            (None, []) if optimizer is None else optim.stepper(optimizer, optim.specs_of(params))
        )
        (graph, roots), fresh = PROGRAMS.get(
            (*key, dg.passes),
            lambda: _gradient_graph(ex.graph, f_ids, w_ids, bool(seeds), acc, step, dg.passes),
        )
        args: list[Any] = [ex.versions[r] for r in roots] + seeds
        args += [dg.value_of(g) for g in old if g is not None]
        n_state = 0
        if optimizer is not None:
            state = optim.state(dg, optimizer, slots, params, what)
            n_state = len(state)
            args += [*state, *hyper]
        if create_graph:
            return higher.record(dg, graph, args), slots
        if dg.lazy:
            out = lazy.run_with(dg, graph, args)
        else:
            dg.num_compiled += fresh
            values = [a.value if isinstance(a, Version) else a for a in args]
            _check_live(values, what)
            donate: tuple[int, ...] = ()
            if optimizer is not None:  # the step's parameters and state: updated in place
                wrt = {v.id for v, view in w_reads if view is None}
                owned = {
                    i: a
                    for i, a in enumerate(args[: len(roots)])
                    if isinstance(a, Version) and a.id in wrt
                }
                state = range(len(args) - len(hyper) - n_state, len(args) - len(hyper))
                donate = _donated(dg, values, owned, state)
            out = compile(graph, donate=donate)(*values)
    return list(out) if isinstance(out, tuple) else [out], slots


def _check_live(values: Sequence[Any], what: str) -> None:
    """A value a step updated in place (donated) read again: a clear error."""
    for x in values:
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and x.is_deleted():
            raise GraphError(
                f"{what}: a value this computation reads was updated in place by an "
                "earlier minimize/apply_gradients (its buffer now holds the new "
                "parameters, as NNC's in-place update does); compute it again from the "
                "variables' current values"
            )


def _donated(
    dg: DynamicGraph, values: Sequence[Any], owned: dict[int, Version], extra: Iterable[int]
) -> tuple[int, ...]:
    """Positions of a step's inputs it may reuse for its outputs: each parameter's
    version in ``owned`` (position -> version) that only its variable holds, and the
    ``extra`` positions (optimizer state, which only the graph keeps); never a buffer
    passed twice, nor one another version of the record holds too (``dg.constant(w)``,
    ``dg.variable(w)``, ``dg.set(w2, w)`` and a detached copy share ``w``'s array).

    A picked parameter's version is spent: its memo entry goes, so the same command
    on the same inputs computes again instead of returning the donated array.
    """
    uses = collections.Counter(id(x) for x in values)
    picked = [i for i, v in owned.items() if v.pins == 1 and uses[id(values[i])] == 1]
    if picked:
        held = _holders(dg, {id(values[i]) for i in picked})
        picked = [i for i in picked if held[id(values[i])] == 1]
        for i in picked:
            owned[i].unmemo()
    picked += [i for i in extra if uses[id(values[i])] == 1]
    return tuple(picked)


def _holders(dg: DynamicGraph, arrays: set[int]) -> collections.Counter[int]:
    """How many versions of ``dg``'s record hold each array of ``arrays`` (by ``id``), as
    their value or a view's: one pass over the record per step, never per command."""
    held: collections.Counter[int] = collections.Counter()
    for v in dg._record.versions.values():
        if id(v.value) in arrays:
            held[id(v.value)] += 1
        if v.views:
            for x in v.views.values():
                if id(x) in arrays:
                    held[id(x)] += 1
    return held


def backward(
    dg: DynamicGraph, f: Any, wrt: Any, df: Any, into: Any, create_graph: bool = False
) -> list[Variable]:
    """:meth:`DynamicGraph.backward`: runs the gradient program, then accumulates each
    gradient into ``into``'s variable, the one :meth:`~DynamicGraph.grad` holds, or a
    new constant. With ``create_graph``, records it and returns the recorded
    gradients (:mod:`.higher`)."""
    fs, ws = _listed(f), _listed(wrt)
    if create_graph:
        if into is not None:
            raise GraphError(
                "backward: create_graph=True returns new recorded gradients and accumulates "
                "into nothing; drop into= (add the results to your variables yourself)"
            )
        outs, _ = _run_gradients(dg, fs, ws, df, "backward", create_graph=True)
        return higher.variables(outs, ws, dg)
    targets = [None] * len(ws) if into is None else _listed(into)
    _check_into(ws, targets)
    outs, slots = _run_gradients(dg, fs, ws, df, "backward", into=targets)
    result = []
    for w, slot, g, target in zip(ws, slots, outs, targets):
        key = (slot, w._view)
        held = target if target is not None else dg.grads.get(key)
        if target is not None:
            dg.set(target, g)
            dg.grads[key] = target
        elif held is None:
            held = dg.grads[key] = dg.constant(g, name=f"grad({w.name})" if w.name else "")
        else:
            dg.set(held, g)
        result.append(held)
    return result
