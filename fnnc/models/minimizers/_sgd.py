"""NNC's SGD_FORWARD: momentum, Nesterov, dampening and L2 decay, in NNC's order.

Rule (``lib/nnc/cmd/sgd/ccv_nnc_sgd_cpu_ref.c``, per element, ``a`` the parameter,
``g`` the gradient, ``m`` the momentum)::

    # nesterov == 0
    m' = momentum * m + (1 - dampening) * (scale * g + decay * a)
    b  = a - rate * m'
    # nesterov == 1 (NNC asserts dampening == 0)
    grad = scale * g
    m'   = momentum * m + grad + decay * a
    b    = a - rate * (grad + momentum * m')
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fnnc.errors import CommandError
from fnnc.models.minimizers import _common as c


class SGDState(NamedTuple):
    """State of :func:`sgd`: steps taken and NNC's one saved auxiliary, the momentum
    (in each parameter's dtype, kept even when ``momentum == 0`` as NNC does)."""

    count: jax.Array
    momentum: optax.Updates


def sgd(
    rate: c.Rate,
    *,
    momentum: float = 0.0,
    nesterov: bool = False,
    dampening: float = 0.0,
    decay: float = 0.0,
    scale: float = 1.0,
) -> optax.GradientTransformation:
    """NNC's SGD (``CMD_SGD_FORWARD``) as an Optax transformation.

    ``scale`` multiplies the gradient before anything else (NNC's cnnp passes
    ``1 / batch_size`` there, as it sums per-sample losses; a model's ``fit`` already
    takes the batch mean: keep ``1``, or ``1 / k`` under
    :func:`~fnnc.models.minimizers.with_gradient_accumulation`); ``decay`` is L2 weight
    decay added to the scaled gradient inside the momentum. Unlike PyTorch, dampening
    applies from the first step, and with ``nesterov=True`` the decay term enters only
    through the momentum (``b = a - rate * (scale * g + momentum * m')``).

    With ``dampening=0``, ``decay=0`` and ``scale=1`` this is ``optax.sgd(rate,
    momentum=momentum or None, nesterov=nesterov)``.

    Args:
        rate: learning rate, or an Optax schedule of the step count.
        momentum: momentum factor, in ``[0, 1)``.
        nesterov: Nesterov accelerated gradient (needs ``dampening == 0``).
        dampening: multiplies the new gradient by ``1 - dampening``, in ``[0, 1]``.
        decay: L2 weight decay, ``>= 0``.
        scale: factor on the gradient, ``> 0``.

    Returns:
        An ``optax.GradientTransformation``; ``update`` needs ``params`` when
        ``decay != 0``. Its updates of half and bfloat16 parameters are float32, so that
        ``optax.apply_updates`` rounds the new parameter once, as NNC does.

    Raises:
        CommandError: a hyper-parameter is out of range, naming it.

    Warns:
        UserWarning: ``nesterov=True`` with ``momentum=0`` and ``decay != 0``, where
            NNC's rule drops the decay.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from fnnc.models.minimizers import sgd
        >>> opt = sgd(0.1, momentum=0.9)
        >>> params = jnp.array([1.0, -2.0])
        >>> state = opt.init(params)
        >>> for _ in range(2):
        ...     updates, state = opt.update(jnp.array([0.5, 0.25]), state, params)
        ...     params = optax.apply_updates(params, updates)
        >>> params  # 0.1 * (0.5 + 0.95) = 0.145 off the first
        Array([ 0.855 , -2.0725], dtype=float32)
    """
    rate = c.check_rate("sgd", rate)
    momentum = c.check_range("sgd", "momentum", momentum, 0.0, 1.0, high_open=True)
    dampening = c.check_range("sgd", "dampening", dampening, 0.0, 1.0)
    decay = c.check_range("sgd", "decay", decay, 0.0)
    scale = c.check_range("sgd", "scale", scale, 0.0, low_open=True)
    nesterov = bool(nesterov)
    if nesterov and c.nonzero(dampening) and not c.traced(dampening):
        raise CommandError(
            f"sgd: nesterov=True needs dampening == 0 (NNC asserts it), got "
            f"dampening={dampening}; drop dampening or set nesterov=False"
        )

    if nesterov and not c.nonzero(momentum) and c.nonzero(decay) and not c.traced(decay):
        warnings.warn(
            f"sgd: nesterov=True with momentum=0 ignores decay={decay} (NNC's rule is then "
            f"b = a - rate * scale * g); set momentum > 0 or nesterov=False",
            stacklevel=2,
        )

    def init_fn(params: optax.Params) -> SGDState:
        return SGDState(count=jnp.zeros([], jnp.int32), momentum=c.zeros_like(params))

    def rule(g, a, m, lr):
        ct = c.compute_type("sgd", g, a)
        grad = scale * g.astype(ct)
        mom = momentum * m.astype(ct)
        wd = decay * a.astype(ct) if c.nonzero(decay) else 0.0
        if nesterov:
            new_m = mom + grad + wd
            delta = lr.astype(ct) * (grad + momentum * new_m)
        else:
            new_m = mom + (1.0 - dampening) * (grad + wd)
            delta = lr.astype(ct) * new_m
        return c.to_update(delta), new_m.astype(m.dtype)

    def update_fn(grads, state, params=None):
        if c.nonzero(decay):
            c.require_params("sgd", params, f"decay={c.shown(decay)} multiplies them")
        c.check_leaves("sgd", grads, params, momentum=state.momentum)
        g_leaves, treedef = jax.tree.flatten(grads)
        lr = c.rate_at(rate, state.count)
        outs = [
            rule(g, a, m, lr)
            for g, a, m in zip(
                g_leaves, c.leaves_like(treedef, params), treedef.flatten_up_to(state.momentum)
            )
        ]
        updates = treedef.unflatten([u for u, _ in outs])
        new_m = treedef.unflatten([m for _, m in outs])
        return updates, SGDState(count=optax.safe_int32_increment(state.count), momentum=new_m)

    return optax.GradientTransformation(init_fn, update_fn)
