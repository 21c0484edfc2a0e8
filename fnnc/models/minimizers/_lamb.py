"""NNC's LAMB_FORWARD: Adam's direction plus decay, scaled per tensor by a trust ratio.

Rule (``lib/nnc/cmd/lamb/ccv_nnc_lamb_cpu_ref.c``, ``t`` the 1-based step), per
parameter tensor::

    grad = scale * g
    m'   = beta1 * m + (1 - beta1) * grad
    v'   = beta2 * v + (1 - beta2) * grad * grad
    u    = (m' / (1 - beta1 ** t)) / (sqrt(v' / (1 - beta2 ** t)) + epsilon) + decay * a
    trust = |a| / |u| if |a| > 0 and |u| > 0 else 1        (L2 norms over the tensor)
    b    = a - rate * trust * u
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fnnc.models.minimizers import _common as c


class LAMBState(NamedTuple):
    """State of :func:`lamb`: steps taken (NNC's ``step - 1``) and NNC's saved
    auxiliaries, momentum then velocity, in each parameter's dtype."""

    count: jax.Array
    momentum: optax.Updates
    velocity: optax.Updates


def lamb(
    rate: c.Rate,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    decay: float = 0.0,
    epsilon: float = 1e-6,
    scale: float = 1.0,
) -> optax.GradientTransformation:
    """NNC's LAMB (``CMD_LAMB_FORWARD``) as an Optax transformation.

    Each parameter tensor gets its own trust ratio ``|a| / |u|`` (1 where either norm
    is 0). ``decay`` is added to the Adam direction, not to the gradient, so it does
    not enter the moments. The default ``epsilon=1e-6`` is s4nnc's. With ``scale=1``
    this is ``optax.lamb(rate, beta1, beta2, epsilon, weight_decay=decay)``.

    Args:
        rate: learning rate, or an Optax schedule of the step count.
        beta1: first-moment decay, in ``[0, 1)``.
        beta2: second-moment decay, in ``[0, 1)``.
        decay: weight decay added to the direction, ``>= 0``.
        epsilon: added to the square root of the velocity, ``>= 0``.
        scale: factor on the gradient, ``> 0``.

    Returns:
        An ``optax.GradientTransformation``; ``update`` always needs ``params``.

    Raises:
        CommandError: a hyper-parameter is out of range, naming it.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from fnnc.models.minimizers import lamb
        >>> opt = lamb(0.1, epsilon=0.0)
        >>> params = jnp.array([3.0, 4.0])  # norm 5
        >>> updates, _ = opt.update(jnp.array([1.0, -1.0]), opt.init(params), params)
        >>> optax.apply_updates(params, updates)  # u = sign(g), trust = 5 / sqrt(2)
        Array([2.6464467, 4.3535533], dtype=float32)
    """
    rate = c.check_rate("lamb", rate)
    beta1 = c.check_range("lamb", "beta1", beta1, 0.0, 1.0, high_open=True)
    beta2 = c.check_range("lamb", "beta2", beta2, 0.0, 1.0, high_open=True)
    decay = c.check_range("lamb", "decay", decay, 0.0)
    epsilon = c.check_range("lamb", "epsilon", epsilon, 0.0)
    scale = c.check_range("lamb", "scale", scale, 0.0, low_open=True)

    def init_fn(params: optax.Params) -> LAMBState:
        return LAMBState(
            count=jnp.zeros([], jnp.int32),
            momentum=c.zeros_like(params),
            velocity=c.zeros_like(params),
        )

    def rule(g, a, m, v, lr, c1, c2):
        ct = c.compute_type("lamb", g, a)
        w = a.astype(ct)
        grad = scale * g.astype(ct)
        new_m = beta1 * m.astype(ct) + (1.0 - beta1) * grad
        new_v = beta2 * v.astype(ct) + (1.0 - beta2) * grad * grad
        u = (new_m * c1.astype(ct)) / (jnp.sqrt(new_v * c2.astype(ct)) + epsilon) + w * decay
        w_norm = jnp.sqrt(jnp.sum(w * w))
        u_norm = jnp.sqrt(jnp.sum(u * u))
        trust = jnp.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, 1.0)
        delta = (lr.astype(ct) * trust) * u
        return c.to_update(delta), new_m.astype(m.dtype), new_v.astype(v.dtype)

    def update_fn(grads, state, params=None):
        c.require_params("lamb", params, "the trust ratio is |params| / |update|")
        c.check_leaves("lamb", grads, params, momentum=state.momentum, velocity=state.velocity)
        g_leaves, treedef = jax.tree.flatten(grads)
        lr = c.rate_at(rate, state.count)
        c1 = 1.0 / c.bias_correction(beta1, state.count)
        c2 = 1.0 / c.bias_correction(beta2, state.count)
        updates, momentum, velocity = c.map_leaves(
            lambda g, a, m, v: rule(g, a, m, v, lr, c1, c2),
            treedef,
            g_leaves,
            treedef.flatten_up_to(params),
            treedef.flatten_up_to(state.momentum),
            treedef.flatten_up_to(state.velocity),
            outputs=3,
        )
        new_state = LAMBState(
            count=optax.safe_int32_increment(state.count),
            momentum=momentum,
            velocity=velocity,
        )
        return updates, new_state

    return optax.GradientTransformation(init_fn, update_fn)
