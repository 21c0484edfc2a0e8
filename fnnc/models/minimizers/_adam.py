"""NNC's ADAM_FORWARD and ADAMW_FORWARD, with amsgrad.

Rule (``lib/nnc/cmd/adam/ccv_nnc_adam_cpu_ref.c``; AdamW from
``ccv_nnc_adamw_cpu_ref.c``), per element with ``t`` the 1-based step::

    grad = scale * g (+ decay * a            Adam only: coupled L2)
    m'   = beta1 * m + (1 - beta1) * grad
    v'   = beta2 * v + (1 - beta2) * grad * grad
    r1   = rate / (1 - beta1 ** t);  c2 = 1 / (1 - beta2 ** t)
    vm'  = max(vm, v' * c2)                  amsgrad only: the max of *corrected* v
    b    = a (- rate * decay * a             AdamW only: decoupled)
             - (m' * r1) / (sqrt(v' * c2 or vm') + epsilon)

NNC takes ``t`` from the command (``adam.step``), which callers raise by one per
apply; here the state counts applies and uses ``t = count + 1``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fnnc.models.minimizers import _common as c


class AdamState(NamedTuple):
    """State of :func:`adam` and :func:`adamw`: steps taken (NNC's ``step - 1``) and
    NNC's saved auxiliaries in each parameter's dtype. ``velocity_max`` is the running
    max of the bias-corrected velocity when ``amsgrad``, else None."""

    count: jax.Array
    momentum: optax.Updates
    velocity: optax.Updates
    velocity_max: optax.Updates | None


def adam(
    rate: c.Rate,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    decay: float = 0.0,
    epsilon: float = 1e-8,
    amsgrad: bool = False,
    scale: float = 1.0,
) -> optax.GradientTransformation:
    """NNC's Adam (``CMD_ADAM_FORWARD``) as an Optax transformation.

    ``decay`` is L2 regularization added to the scaled gradient before both moments
    (coupled; for decoupled decay use :func:`adamw`). ``epsilon`` sits outside the
    square root. With amsgrad, NNC keeps the max of the bias-corrected velocity, as
    ``optax.amsgrad`` does (PyTorch keeps the max of the raw one).

    With ``scale=1`` this is ``optax.adam(rate, beta1, beta2, epsilon)`` (or
    ``optax.amsgrad``), chained after ``optax.add_decayed_weights(decay)``.

    Args:
        rate: learning rate, or an Optax schedule of the step count.
        beta1: first-moment decay, in ``[0, 1)``.
        beta2: second-moment decay, in ``[0, 1)``.
        decay: L2 weight decay, ``>= 0``.
        epsilon: added to the square root of the velocity, ``>= 0``.
        amsgrad: keep and divide by the running max of the corrected velocity.
        scale: factor on the gradient, ``> 0``.

    Returns:
        An ``optax.GradientTransformation``; ``update`` needs ``params`` when
        ``decay != 0``.

    Raises:
        CommandError: a hyper-parameter is out of range, naming it.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from fnnc.models.minimizers import adam
        >>> opt = adam(0.01)
        >>> params = jnp.array([1.0, -2.0])
        >>> updates, state = opt.update(jnp.array([0.5, -0.25]), opt.init(params), params)
        >>> print(optax.apply_updates(params, updates).round(6))  # the first step: ~rate
        [ 0.99 -1.99]
        >>> int(state.count)
        1
    """
    return _adam_family("adam", rate, beta1, beta2, decay, epsilon, amsgrad, scale, decoupled=False)


def adamw(
    rate: c.Rate,
    *,
    beta1: float = 0.9,
    beta2: float = 0.999,
    decay: float = 0.0,
    epsilon: float = 1e-8,
    amsgrad: bool = False,
    scale: float = 1.0,
) -> optax.GradientTransformation:
    """NNC's AdamW (``CMD_ADAMW_FORWARD``): Adam with decoupled weight decay.

    The gradient is not decayed; instead the parameter shrinks by ``rate * decay * a``
    each step (the plain rate, not bias-corrected). Everything else is :func:`adam`.
    With ``scale=1`` this is ``optax.adamw(rate, beta1, beta2, epsilon,
    weight_decay=decay)``.

    Args:
        rate: learning rate, or an Optax schedule of the step count.
        beta1: first-moment decay, in ``[0, 1)``.
        beta2: second-moment decay, in ``[0, 1)``.
        decay: decoupled weight decay, ``>= 0``.
        epsilon: added to the square root of the velocity, ``>= 0``.
        amsgrad: keep and divide by the running max of the corrected velocity.
        scale: factor on the gradient, ``> 0``.

    Returns:
        An ``optax.GradientTransformation``; ``update`` needs ``params`` when
        ``decay != 0``.

    Raises:
        CommandError: a hyper-parameter is out of range, naming it.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from fnnc.models.minimizers import adamw
        >>> opt = adamw(0.1, decay=0.5)
        >>> params = jnp.array([2.0])
        >>> updates, _ = opt.update(jnp.array([0.0]), opt.init(params), params)
        >>> optax.apply_updates(params, updates)  # 2 - 0.1 * 0.5 * 2
        Array([1.9], dtype=float32)
    """
    return _adam_family("adamw", rate, beta1, beta2, decay, epsilon, amsgrad, scale, decoupled=True)


def _adam_family(
    name, rate, beta1, beta2, decay, epsilon, amsgrad, scale, *, decoupled
) -> optax.GradientTransformation:
    rate = c.check_rate(name, rate)
    beta1 = c.check_range(name, "beta1", beta1, 0.0, 1.0, high_open=True)
    beta2 = c.check_range(name, "beta2", beta2, 0.0, 1.0, high_open=True)
    decay = c.check_range(name, "decay", decay, 0.0)
    epsilon = c.check_range(name, "epsilon", epsilon, 0.0)
    scale = c.check_range(name, "scale", scale, 0.0, low_open=True)
    amsgrad = bool(amsgrad)

    def init_fn(params: optax.Params) -> AdamState:
        return AdamState(
            count=jnp.zeros([], jnp.int32),
            momentum=c.zeros_like(params),
            velocity=c.zeros_like(params),
            velocity_max=c.zeros_like(params) if amsgrad else None,
        )

    def rule(g, a, m, v, vm, lr, r1, c2):
        ct = c.compute_type(name, g, a)
        grad = scale * g.astype(ct)
        if c.nonzero(decay) and not decoupled:
            grad = grad + decay * a.astype(ct)
        new_m = beta1 * m.astype(ct) + (1.0 - beta1) * grad
        new_v = beta2 * v.astype(ct) + (1.0 - beta2) * grad * grad
        if amsgrad:
            new_vm = jnp.maximum(vm.astype(ct), new_v * c2.astype(ct))
            denom = jnp.sqrt(new_vm) + epsilon
            new_vm = new_vm.astype(vm.dtype)
        else:
            denom = jnp.sqrt(new_v * c2.astype(ct)) + epsilon
            new_vm = None
        delta = (new_m * r1.astype(ct)) / denom
        if c.nonzero(decay) and decoupled:
            # NNC's b = (a - rate * decay * a) - delta, rounded in that order; b - a is
            # exact while b is within a factor 2 of a, and apply_updates then gives b.
            w = a.astype(ct)
            update = ((w - (lr * decay).astype(ct) * w) - delta) - w
        else:
            update = c.to_update(delta)
        return update, new_m.astype(m.dtype), new_v.astype(v.dtype), new_vm

    def update_fn(grads, state, params=None):
        if c.nonzero(decay):
            c.require_params(name, params, f"decay={c.shown(decay)} multiplies them")
        c.check_leaves(
            name,
            grads,
            params,
            momentum=state.momentum,
            velocity=state.velocity,
            velocity_max=state.velocity_max,
        )
        g_leaves, treedef = jax.tree.flatten(grads)
        lr = c.rate_at(rate, state.count)
        r1 = lr / c.bias_correction(beta1, state.count)
        c2 = 1.0 / c.bias_correction(beta2, state.count)
        vm_leaves = treedef.flatten_up_to(state.velocity_max) if amsgrad else [None] * len(g_leaves)
        updates, momentum, velocity, velocity_max = c.map_leaves(
            lambda g, a, m, v, vm: rule(g, a, m, v, vm, lr, r1, c2),
            treedef,
            g_leaves,
            c.leaves_like(treedef, params),
            treedef.flatten_up_to(state.momentum),
            treedef.flatten_up_to(state.velocity),
            vm_leaves,
            outputs=4,
        )
        new_state = AdamState(
            count=optax.safe_int32_increment(state.count),
            momentum=momentum,
            velocity=velocity,
            velocity_max=velocity_max if amsgrad else None,
        )
        return updates, new_state

    return optax.GradientTransformation(init_fn, update_fn)
