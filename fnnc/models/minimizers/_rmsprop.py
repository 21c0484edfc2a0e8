"""NNC's RMSPROP_FORWARD, plus an opt-in centered variant NNC does not have.

Rule (``lib/nnc/cmd/rmsprop/ccv_nnc_rmsprop_cpu_ref.c``, per element)::

    grad = scale * g + decay * a
    v'   = alpha * v + (1 - alpha) * grad * grad
    m'   = momentum * m + grad / (sqrt(v') + epsilon)
    b    = a - rate * m'

``centered=True`` (fnnc's extension, PyTorch's and Optax's centered RMSProp) also
keeps ``ga' = alpha * ga + (1 - alpha) * grad`` and divides by
``sqrt(v' - ga'^2) + epsilon``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fnnc.models.minimizers import _common as c


class RMSPropState(NamedTuple):
    """State of :func:`rmsprop`: steps taken, NNC's saved auxiliaries (momentum, then
    the squared-gradient average ``velocity``) in each parameter's dtype, and the
    gradient average when ``centered`` (else None)."""

    count: jax.Array
    momentum: optax.Updates
    velocity: optax.Updates
    grad_average: optax.Updates | None


def rmsprop(
    rate: c.Rate,
    *,
    decay: float = 0.0,
    alpha: float = 0.99,
    momentum: float = 0.0,
    epsilon: float = 1e-8,
    centered: bool = False,
    scale: float = 1.0,
) -> optax.GradientTransformation:
    """NNC's RMSProp (``CMD_RMSPROP_FORWARD``) as an Optax transformation.

    ``decay`` is L2 regularization added to the scaled gradient first; ``epsilon``
    sits outside the square root; the momentum buffer accumulates the normalized
    gradient (PyTorch's form). ``centered`` is not in NNC: it is off by default, and
    with it off the rule is NNC's exactly.

    With ``decay=0``, ``scale=1`` and a fixed ``rate`` this is ``optax.rmsprop(rate,
    decay=alpha, eps=epsilon, eps_in_sqrt=False, centered=centered, momentum=momentum)``.
    With a schedule and ``momentum > 0`` they differ: NNC's buffer holds normalized
    gradients and each step multiplies it by that step's rate (as NNC run with a new
    rate per step), where Optax's holds steps already multiplied by their rates.

    Args:
        rate: learning rate, or an Optax schedule of the step count.
        decay: L2 weight decay, ``>= 0``.
        alpha: smoothing of the squared-gradient average, in ``[0, 1]``.
        momentum: momentum on the normalized gradient, in ``[0, 1)``.
        epsilon: added to the square root, ``>= 0``.
        centered: divide by the estimated standard deviation (fnnc's extension).
        scale: factor on the gradient, ``> 0``.

    Returns:
        An ``optax.GradientTransformation``; ``update`` needs ``params`` when
        ``decay != 0``.

    Raises:
        CommandError: a hyper-parameter is out of range, naming it.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from fnnc.models.minimizers import rmsprop
        >>> opt = rmsprop(0.01, alpha=0.75, epsilon=0.0)
        >>> params = jnp.array([1.0, -2.0])
        >>> updates, _ = opt.update(jnp.array([3.0, -0.5]), opt.init(params), params)
        >>> optax.apply_updates(params, updates)  # g / sqrt(0.25 g^2) = 2 sign(g)
        Array([ 0.98, -1.98], dtype=float32)
    """
    rate = c.check_rate("rmsprop", rate)
    decay = c.check_range("rmsprop", "decay", decay, 0.0)
    alpha = c.check_range("rmsprop", "alpha", alpha, 0.0, 1.0)
    momentum = c.check_range("rmsprop", "momentum", momentum, 0.0, 1.0, high_open=True)
    epsilon = c.check_range("rmsprop", "epsilon", epsilon, 0.0)
    scale = c.check_range("rmsprop", "scale", scale, 0.0, low_open=True)
    centered = bool(centered)

    def init_fn(params: optax.Params) -> RMSPropState:
        return RMSPropState(
            count=jnp.zeros([], jnp.int32),
            momentum=c.zeros_like(params),
            velocity=c.zeros_like(params),
            grad_average=c.zeros_like(params) if centered else None,
        )

    def rule(g, a, m, v, ga, lr):
        ct = c.compute_type("rmsprop", g, a)
        grad = scale * g.astype(ct)
        if c.nonzero(decay):
            grad = grad + decay * a.astype(ct)
        new_v = alpha * v.astype(ct) + (1.0 - alpha) * grad * grad
        if centered:
            new_ga = alpha * ga.astype(ct) + (1.0 - alpha) * grad
            # v' >= ga'^2 in exact arithmetic; the max only stops rounding making a nan.
            denom = jnp.sqrt(jnp.maximum(new_v - new_ga * new_ga, 0.0)) + epsilon
            new_ga = new_ga.astype(ga.dtype)
        else:
            denom = jnp.sqrt(new_v) + epsilon
            new_ga = None
        new_m = momentum * m.astype(ct) + grad / denom
        delta = lr.astype(ct) * new_m
        return c.to_update(delta), new_m.astype(m.dtype), new_v.astype(v.dtype), new_ga

    def update_fn(grads, state, params=None):
        if c.nonzero(decay):
            c.require_params("rmsprop", params, f"decay={c.shown(decay)} multiplies them")
        c.check_leaves(
            "rmsprop",
            grads,
            params,
            momentum=state.momentum,
            velocity=state.velocity,
            grad_average=state.grad_average,
        )
        g_leaves, treedef = jax.tree.flatten(grads)
        lr = c.rate_at(rate, state.count)
        ga_leaves = (
            treedef.flatten_up_to(state.grad_average) if centered else [None] * len(g_leaves)
        )
        updates, momentum, velocity, grad_average = c.map_leaves(
            lambda g, a, m, v, ga: rule(g, a, m, v, ga, lr),
            treedef,
            g_leaves,
            c.leaves_like(treedef, params),
            treedef.flatten_up_to(state.momentum),
            treedef.flatten_up_to(state.velocity),
            ga_leaves,
            outputs=4,
        )
        new_state = RMSPropState(
            count=optax.safe_int32_increment(state.count),
            momentum=momentum,
            velocity=velocity,
            grad_average=grad_average if centered else None,
        )
        return updates, new_state

    return optax.GradientTransformation(init_fn, update_fn)
