"""NNC's "no minimizer" and its gradient accumulation over several backward calls.

In cnnp (``lib/nnc/ccv_cnnp_model.c``), each ``ccv_cnnp_model_backward`` after the
first adds its gradients to the previous ones with ``CMD_EWSUM_FORWARD`` (a plain sum,
no averaging), and ``ccv_cnnp_model_apply_gradients`` runs the minimizer once on that
sum and resets the count. :func:`with_gradient_accumulation` is that protocol as an
Optax wrapper. It sums; to average, divide through the minimizer's ``scale`` by what
the sum counts:

* a cnnp model's ``fit`` (and ``train``): its loss is already the batch mean, so
  ``scale=1 / k`` makes ``k`` accumulated batches one step on the ``k`` times larger
  batch (``sgd(rate, scale=1 / k)``; ``1 / (batch_size * k)`` would divide the rate
  by the batch size too);
* gradients summed per sample: NNC's own cnnp, whose loss is per sample (``[N, 1]``)
  and whose backward seeds each sample with one, as :meth:`Model.backward
  <fnnc.models.Model.backward>` of per-sample outputs without ``ingrads`` and a
  dynamic graph's ``backward`` of a summed loss do: ``scale=1 / (batch_size * k)``.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc.errors import CommandError
from fnnc.models.minimizers._common import check_leaves

_INT32_MAX = 2**31 - 1


def float32_gradients() -> optax.GradientTransformation:
    """Gradients of a half or bfloat16 type as float32, the rest as they are: chain it
    before ``optax.apply_if_finite`` or ``optax.conditionally_transform`` around an NNC
    minimizer of 16-bit parameters.

    NNC's minimizers give float32 updates for 16-bit parameters (so each new parameter
    is rounded once, as NNC's kernels round it), while those wrappers' skip branch gives
    the gradients' type, and ``lax.cond`` needs both branches of one type. The numbers
    do not change: NNC's kernels read a 16-bit gradient into float32 anyway.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from fnnc.models import minimizers
        >>> opt = optax.chain(
        ...     minimizers.float32_gradients(),
        ...     optax.apply_if_finite(minimizers.adam(1e-3), max_consecutive_errors=3),
        ... )
        >>> params = {"w": jnp.ones(2, jnp.bfloat16)}
        >>> updates, _ = opt.update({"w": jnp.ones(2, jnp.bfloat16)}, opt.init(params), params)
        >>> updates["w"].dtype
        dtype('float32')
    """

    def cast(g: Any) -> Any:
        if jnp.issubdtype(g.dtype, jnp.floating) and np.dtype(g.dtype).itemsize == 2:
            return g.astype(jnp.float32)
        return g

    return optax.stateless(lambda updates, params=None: jax.tree.map(cast, updates))


def noop() -> optax.GradientTransformation:
    """NNC's ``CMD_NOOP`` as a minimizer: parameters stay as they are.

    The update is zeros and the state empty, like ``optax.set_to_zero()``; cnnp uses
    it for parameters that are to be left alone.

    Example:
        >>> import jax.numpy as jnp
        >>> from fnnc.models.minimizers import noop
        >>> opt = noop()
        >>> updates, state = opt.update(jnp.array([1.0, 2.0]), opt.init(None))
        >>> updates
        Array([0., 0.], dtype=float32)
    """

    def init_fn(params: optax.Params) -> optax.EmptyState:
        del params
        return optax.EmptyState()

    def update_fn(grads, state, params=None):
        del params
        return jax.tree.map(jnp.zeros_like, grads), state

    return optax.GradientTransformation(init_fn, update_fn)


class AccumulationState(NamedTuple):
    """State of :func:`with_gradient_accumulation`: backward calls since the last apply,
    their gradients' sum (in each parameter's dtype, as NNC's gradient tensors), and
    the wrapped minimizer's state."""

    mini_step: jax.Array
    gradients: optax.Updates
    inner: Any


def with_gradient_accumulation(
    opt: optax.GradientTransformation, k: int
) -> optax.GradientTransformation:
    """Applies ``opt`` once every ``k`` updates, to the sum of the last ``k`` gradients.

    Each call adds ``grads`` to a running sum; the first ``k - 1`` calls return zero
    updates and leave ``opt``'s state untouched, the ``k``-th runs ``opt`` on the sum
    (so a step counter inside ``opt`` advances once per ``k`` calls, as NNC's ``step``
    does in ``bin/nnc/iwslt.c``) and clears it. This is ``optax.MultiSteps(opt, k,
    use_grad_mean=False)`` except that the sum is kept in the parameters' dtype and
    ``opt`` runs only on the ``k``-th call (under ``lax.cond``), not on every call.

    Args:
        opt: the minimizer to run on the summed gradients.
        k: backward calls per apply, an integer ``>= 1`` (an int32).

    Returns:
        An ``optax.GradientTransformation``.

    Raises:
        CommandError: ``k`` is not an integer in ``[1, 2**31 - 1]``.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from fnnc.models.minimizers import sgd, with_gradient_accumulation
        >>> opt = with_gradient_accumulation(sgd(0.5), 2)
        >>> params = jnp.array([1.0])
        >>> state = opt.init(params)
        >>> for g in (0.25, 0.75):
        ...     updates, state = opt.update(jnp.array([g]), state, params)
        ...     print(updates)
        [0.]
        [-0.5]
    """
    try:
        if isinstance(k, (bool, np.bool_)):
            raise TypeError
        k = operator.index(k)
    except TypeError:
        raise CommandError(
            f"with_gradient_accumulation: k must be an integer, got {type(k).__name__} {k!r}"
        ) from None
    if not 1 <= k <= _INT32_MAX:  # the state counts backward calls in an int32
        raise CommandError(
            f"with_gradient_accumulation: k must be >= 1 and <= {_INT32_MAX}, got {k}"
        )

    def init_fn(params: optax.Params) -> AccumulationState:
        return AccumulationState(
            mini_step=jnp.zeros([], jnp.int32),
            gradients=jax.tree.map(jnp.zeros_like, params),
            inner=opt.init(params),
        )

    def update_fn(grads, state, params=None):
        check_leaves("with_gradient_accumulation", grads, params, gradient_sum=state.gradients)
        total = jax.tree.map(lambda s, g: s + g.astype(s.dtype), state.gradients, grads)
        summed = jax.tree.map(lambda t, g: t.astype(g.dtype), total, grads)
        shapes, _ = jax.eval_shape(opt.update, summed, state.inner, params)

        def apply(operands):
            summed, inner, params = operands
            updates, new_inner = opt.update(summed, inner, params)
            new_inner = jax.tree.map(lambda n, o: n.astype(o.dtype), new_inner, inner)
            cleared = jax.tree.map(jnp.zeros_like, state.gradients)
            return updates, AccumulationState(jnp.zeros([], jnp.int32), cleared, new_inner)

        def hold(operands):
            _, inner, _ = operands
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
            return zeros, AccumulationState(state.mini_step + 1, total, inner)

        last = state.mini_step >= k - 1
        return jax.lax.cond(last, apply, hold, (summed, state.inner, params))

    return optax.GradientTransformation(init_fn, update_fn)
