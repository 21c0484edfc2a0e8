"""Reverse mode for a loop whose trip count is data: the carries of every trip on a tape.

``lax.while_loop`` has no reverse mode: its trip count is known only when it has run,
so JAX cannot size the storage the backward needs. NNC's answer is a tape: while the
loop runs forward, each trip's carried values are written down; the backward then
walks the tape from the last trip to the first, running the body's backward on each
stored trip. :func:`taped_while` is that, as one ``jax.custom_vjp``:

* forward: a ``lax.while_loop`` that also writes the carry each trip starts from into
  slot ``n`` of a buffer of ``capacity`` slots (one leading axis per carried array);
* backward: a ``lax.fori_loop`` from the last trip taken down to the first (its bounds
  are the actual trip count, so the cost follows the trips, not the capacity), each step
  pulling the carry's gradient back through ``jax.vjp`` of one body run and summing the
  gradient of the loop-invariant inputs.

**Why a fixed capacity.** XLA sizes every buffer at compile time. A tape that doubles
while the loop runs would need a shape that depends on data inside one compiled
program, which XLA cannot express; a doubling scheme would have to allocate the cap up
front anyway. So the tape is a buffer of ``capacity`` trips, allocated once.

**When the loop runs more trips than that.** The forward values stay exact (the loop
keeps running; only the writes stop mattering), but the gradient cannot be formed.
Then

1. the gradients of that call are NaN (poison), so no wrong number is ever returned
   silently, whatever transformation or runtime runs the program; and
2. unless ``on_overflow="nan"``, the backward raises a
   :class:`~fnnc.errors.CommandError` that names the loop, the trips it ran, the
   capacity and the capacity to rebuild it with. It is raised from a host callback
   that runs only on overflow (it sits in a ``lax.cond``), so a normal backward never
   touches the host. The callback is a ``jax.pure_callback`` whose (zero) result is
   added to the gradients, which keeps it alive: an effectful ``jax.debug.callback``
   would do the same but takes jit's slow dispatch path on every call (~0.2 ms per call
   on CPU, measured). What is left is a constant per call, not per trip (on a busy
   2-core CPU, ~0.07 ms for a whole gradient program). A compiled ``Program`` that holds
   a taped backward waits for its outputs (the one synchronisation this costs) and
   raises the error as a ``CommandError`` naming the node (``interpret`` wraps it in a
   ``GraphError`` naming the node); under a caller's own ``jax.jit`` the error reaches
   the caller as the runtime's error carrying that message. ``checkify`` was not used
   because it needs every caller, compiled programs included, to functionalise its
   errors; a flag output would change the command's outputs; a switch read from
   :mod:`fnnc.config` would be baked into cached compiled code (those caches do not key
   on ``checks``).

The backward uses ``lax.fori_loop`` with data-dependent bounds, which lowers to a
``while_loop`` and so has no reverse mode itself: gradients of gradients through a
taped loop are not available (use ``max_iterations`` for those).

>>> import jax, jax.numpy as jnp
>>> grow = lambda w, c: (c[0] + 1, c[1] * w)
>>> below = lambda w, c: c[1] < 10.0
>>> def f(w):  # x = 1; x *= w while x < 10, as a function of w
...     return taped_while(below, grow, w, (jnp.int32(0), 1.0), capacity=8)[1]
>>> float(f(3.0)), float(jax.grad(f)(3.0))  # 3 trips: x = w**3, dx/dw = 3 w**2
(27.0, 27.0)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fnnc.core.dtypes import at_least_float32
from fnnc.errors import CommandError

Carry = Any
Consts = Any


def taped_while(
    cond_fn: Callable[[Consts, Carry], Any],
    body_fn: Callable[[Consts, Carry], Carry],
    consts: Consts,
    init: Carry,
    *,
    capacity: int,
    label: str = "while_loop",
    on_overflow: str = "raise",
) -> Carry:
    """``lax.while_loop`` over ``init`` with reverse mode through a tape of ``capacity`` trips.

    Args:
        cond_fn: ``cond_fn(consts, carry) -> bool scalar``; the loop runs while true.
        body_fn: ``body_fn(consts, carry) -> carry`` (same structure, shapes, dtypes).
        consts: loop-invariant values (any pytree); gradients reach their float leaves.
        init: the initial carry (any pytree); gradients reach its float leaves.
        capacity: how many trips the tape holds, >= 1. More trips than that make the
            gradient NaN and, by default, raise (see ``on_overflow`` and the module doc).
        label: how errors name the loop.
        on_overflow: ``"raise"`` (NaN gradients and an error) or ``"nan"`` (NaN
            gradients only, e.g. for a training step that skips non-finite updates).

    Returns:
        The final carry, as ``lax.while_loop(lambda c: cond_fn(consts, c),
        lambda c: body_fn(consts, c), init)`` returns it.
    """
    if not isinstance(capacity, (int, np.integer)) or isinstance(capacity, bool) or capacity < 1:
        raise CommandError(
            f"{label}: the tape capacity must be an int >= 1 (trips the backward can "
            f"replay), got {capacity!r}"
        )
    if on_overflow not in ("raise", "nan"):
        raise CommandError(f'{label}: on_overflow must be "raise" or "nan", got {on_overflow!r}')
    strong = lambda x: _strong(x, _dtype(x))
    run = _taped(cond_fn, body_fn, int(capacity), label, on_overflow == "raise")
    return run(jax.tree.map(strong, consts), jax.tree.map(strong, init))


def _taped(cond_fn, body_fn, capacity: int, label: str, raises: bool):
    """The ``custom_vjp`` for one loop; ``cond_fn``/``body_fn`` close over no tracers."""

    @jax.custom_vjp
    def run(consts, init):
        return lax.while_loop(
            functools.partial(cond_fn, consts), functools.partial(body_fn, consts), init
        )

    def fwd(consts, init):
        tape = jax.tree.map(lambda x: jnp.zeros((capacity, *jnp.shape(x)), _dtype(x)), init)

        def test(state):
            return cond_fn(consts, state[1])

        def step(state):
            n, carry, tape = state
            # Past the capacity the index clamps onto the last slot: those gradients are
            # poisoned anyway, and the forward values stay exact.
            tape = jax.tree.map(
                lambda t, x: lax.dynamic_update_index_in_dim(t, x, n, 0), tape, carry
            )
            return n + 1, body_fn(consts, carry), tape

        n, final, tape = lax.while_loop(test, step, (jnp.int32(0), init, tape))
        return final, (consts, tape, n)

    def bwd(res, g_final):
        consts, tape, n = res
        g_consts, g_init = _replay(body_fn, consts, tape, n, g_final, capacity)
        over = n > capacity
        alarm = jnp.float32(0)
        if raises:
            check = functools.partial(_overflow, capacity=capacity, label=label)
            spec = jax.ShapeDtypeStruct((), jnp.float32)
            call = lambda: jax.pure_callback(check, spec, n, vmap_method="broadcast_all")
            alarm = lax.cond(over, call, lambda: jnp.float32(0))
        return _poison(g_consts, over, alarm), _poison(g_init, over, alarm)

    run.defvjp(fwd, bwd)
    return run


def _replay(body_fn, consts, tape, n, g_final, capacity):
    """Walks the tape from trip ``n - 1`` down to 0, pulling gradients back per trip."""
    c_leaves, c_def = jax.tree.flatten(consts)
    t_leaves, t_def = jax.tree.flatten(tape)
    c_float = [_is_float(x) for x in c_leaves]
    x_float = [_is_float(t) for t in t_leaves]
    c_floats = [c for c, f in zip(c_leaves, c_float) if f]

    def trip(cf, xf, others):
        cs = jax.tree.unflatten(c_def, _merge(c_float, cf, c_leaves))
        carry = jax.tree.unflatten(t_def, _merge(x_float, xf, others))
        out = jax.tree.leaves(body_fn(cs, carry))
        return [o for o, f in zip(out, x_float) if f]

    def back(i, acc):
        g_x, g_c = acc
        row = [lax.dynamic_index_in_dim(t, n - 1 - i, 0, keepdims=False) for t in t_leaves]
        xf = [r for r, f in zip(row, x_float) if f]
        _, pull = jax.vjp(lambda cf, xf: trip(cf, xf, row), c_floats, xf)
        d_c, d_x = pull(g_x)
        return _like(d_x, g_x), [a + b.astype(a.dtype) for a, b in zip(g_c, d_c)]

    g_leaves = jax.tree.leaves(g_final)
    g_x0 = [_strong(g, t.dtype) for g, t, f in zip(g_leaves, t_leaves, x_float) if f]
    # The invariants' gradients are summed over the trips in float32 at least (16-bit
    # terms rounded once, as scan sums them) and given back in their own types.
    g_c0 = [jnp.zeros(c.shape, at_least_float32(c.dtype)) for c in c_floats]
    g_x, g_c = lax.fori_loop(0, jnp.minimum(n, capacity), back, (g_x0, g_c0))
    g_c = _like(g_c, c_floats)
    c_zero = [_float0(c.shape) for c in c_leaves]
    x_zero = [_float0(t.shape[1:]) for t in t_leaves]
    return (
        jax.tree.unflatten(c_def, _merge(c_float, g_c, c_zero)),
        jax.tree.unflatten(t_def, _merge(x_float, g_x, x_zero)),
    )


def _merge(is_float, floats, others):
    """Per leaf: the next of ``floats`` where ``is_float``, else the leaf of ``others``."""
    it = iter(floats)
    return [next(it) if f else o for f, o in zip(is_float, others)]


def _float0(shape) -> np.ndarray:
    return np.zeros(shape, jax.dtypes.float0)


def _strong(x, dtype):
    """``x`` as a strongly typed ``dtype`` array (loop carries must match exactly)."""
    return lax.convert_element_type(x, dtype)


def _like(values, ref):
    return [_strong(v, r.dtype) for v, r in zip(values, ref)]


def _poison(grads, over, alarm):
    """NaN gradients when the tape overflowed, plus the check's zero; float0 passes."""

    def one(g):
        if g.dtype == jax.dtypes.float0:
            return g
        return jnp.where(over, jnp.asarray(jnp.nan, g.dtype), g) + alarm.astype(g.dtype)

    return jax.tree.map(one, grads)


def _overflow(n, *, capacity: int, label: str) -> np.ndarray:
    """Host side of the check: raises when any (batched) call ran past the tape."""
    trips = int(np.max(np.asarray(n)))
    if trips <= capacity:
        return np.zeros(np.shape(n), np.float32)
    suggest = 1 << (trips - 1).bit_length()
    raise CommandError(
        f"{label}: the loop ran {trips} iterations, but its tape holds {capacity} "
        f"(tape={capacity}), so its gradient cannot be computed (this call's gradients are "
        f"NaN). Rebuild the loop with tape={suggest} or more: an upper bound on the "
        "iterations it takes (the tape stores one copy of the carried tensors per iteration)"
    )


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(_dtype(x), jnp.inexact)


def _dtype(x: Any) -> Any:
    return jnp.result_type(x)


def checks_on_host(cmd: Any) -> bool:
    """Whether ``cmd`` is the backward of a taped ``while_loop``: its overflow check
    raises from a host callback, which a compiled program reports when its outputs are
    read (:class:`fnnc.graph.Program` waits for them, to raise a ``CommandError``)."""
    if cmd.name != "gradient":
        return False
    of = cmd.param("of")
    return of.name == "while_loop" and of.param("tape") is not None


def host_error(error: Exception) -> CommandError | None:
    """The tape's ``CommandError`` carried by a runtime error of XLA, else ``None``."""
    text = str(error)
    start = text.find("CommandError: ")
    if start < 0 or "but its tape holds" not in text:
        return None
    return CommandError(text[start + len("CommandError: ") :].strip().splitlines()[0])


def forward_mode_error(cmd: Any, error: Exception) -> CommandError | None:
    """What to tell a caller whose forward-mode derivative (``jax.jvp``, ``jax.jacfwd``,
    ``jax.hessian``) met taped ``while_loop`` ``cmd``: JAX's "can't apply forward-mode
    autodiff (jvp) to a custom_vjp function" names neither the loop nor the way out."""
    if cmd.name != "while_loop" or cmd.param("tape") is None:
        return None
    if "forward-mode autodiff (jvp) to a custom_vjp" not in str(error):
        return None
    return CommandError(
        f"{cmd}: a loop with a tape has reverse-mode gradients only (jax.grad, fnnc's "
        "backward pass); forward mode (jax.jvp, jax.jacfwd) and second order "
        "(jax.hessian) need the loop built with max_iterations=N (a static bound on its "
        "trips) instead of tape"
    )


class _QuietOverflow(logging.Filter):
    """Drops JAX's ``ERROR:jax._src.callback`` log of the overflow check's own error:
    fnnc raises it to the caller (``interpret``, a ``Program``), with the node named."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, CommandError) and "but its tape holds" in str(error))


logging.getLogger("jax._src.callback").addFilter(_QuietOverflow())


def forget_failed_tokens() -> int:
    """Drops the runtime tokens that still carry a failed host callback; how many.

    On a GPU, JAX keeps each device's last runtime token of a program with host
    callbacks, to wait for at ``jax.effects_barrier()`` and at exit. Once the overflow
    check has raised and the error is reported, that token still holds it: a later
    ``jax.effects_barrier()`` raised it again, and every process printed it at exit
    ("Exception ignored in atexit callback", seen in the H100 suite). On CPU the error
    comes from the call itself and no token is kept. A token's error is only ever
    re-raised, never acted on, so dropping the failed ones loses nothing; healthy ones
    stay. JAX keeps them in ``jax._src.dispatch.runtime_tokens`` (no public API); where
    that is absent this does nothing."""
    from jax._src import dispatch as jax_dispatch

    held = getattr(getattr(jax_dispatch, "runtime_tokens", None), "output_runtime_tokens", None)
    if not isinstance(held, dict):
        return 0
    dropped = 0
    for device, token in list(held.items()):
        try:
            token.block_until_ready()
        except Exception:  # the error this check raised, or one like it: reported already
            del held[device]
            dropped += 1
    return dropped
