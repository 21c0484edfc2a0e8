"""The ``optax_update`` command: one step of any Optax transformation, as a node.

Inputs, in order: the gradients of the ``n`` parameters, the optimizer-state leaves,
the ``n`` parameters. Outputs: the ``n`` updated parameters, then the new state leaves.
The transformation and the state's tree structure are hyper-parameters, so the state
lives in the graph as plain tensors and a training step compiles to a pure function.

One node updates every parameter, because an Optax transformation may couple them
(``clip_by_global_norm``, LAMB's trust ratios); per-parameter nodes would be wrong for
those. Its backward is derived (``jax.vjp``), so meta-learning through an update works.
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fnnc.core.command import Command, Spec, defcommand, make_command
from fnnc.core.keys import is_key, key_bits
from fnnc.errors import CommandError
from fnnc.ops.primitive import Opaque


def _update_shape(*specs: Spec, optimizer, state_tree, state_specs, n_params) -> tuple[Spec, ...]:
    n_state = len(state_specs)
    if len(specs) != 2 * n_params + n_state:
        raise CommandError(
            f"optax_update: expected {n_params} gradients, {n_state} state leaves and "
            f"{n_params} parameters ({2 * n_params + n_state} inputs), got {len(specs)}"
        )
    params = specs[n_params + n_state :]
    for i, (g, p) in enumerate(zip(specs[:n_params], params)):
        if tuple(g.shape) != tuple(p.shape):
            raise CommandError(
                f"optax_update: gradient {i} is {list(g.shape)} but parameter {i} is "
                f"{list(p.shape)}"
            )
    state = tuple(Spec(tuple(s), np.dtype(d)) for s, d in state_specs)
    return tuple(Spec(tuple(p.shape), p.dtype) for p in params) + state


def _display(cmd: Command) -> str:
    return f"optax_update[n_params={cmd.param('n_params')}]"


@defcommand(family="optimizer", shape=_update_shape, min_inputs=0, display=_display)
def optax_update(*inputs, optimizer, state_tree, state_specs, n_params):
    """``params', state' = apply_updates(params, optimizer.update(grads, state, params))``.

    An update may be wider than its parameter (fnnc's NNC minimizers give float32 updates
    of 16-bit parameters): ``apply_updates`` adds in float32 and rounds once to the
    parameter's dtype, as the parameters' specs say."""
    n_state = len(state_specs)
    grads = list(inputs[:n_params])
    state = jax.tree.unflatten(state_tree.value, list(inputs[n_params : n_params + n_state]))
    params = list(inputs[n_params + n_state :])
    try:
        updates, new_state = optimizer.value.update(grads, state, params)
    except TypeError as e:
        if "branches must have equal output types" in str(e):
            raise CommandError(_branch_types(e, params)) from e
        if "keyword-only argument" not in str(e):
            raise
        raise CommandError(
            f"optax_update: this Optax transformation's update needs extra arguments "
            f"({e}); a training step calls update(grads, state, params) only, so "
            "line-search optimizers such as optax.lbfgs (value=, grad=, value_fn=) do "
            "not fit it: use a transformation that needs no extra arguments, e.g. "
            "optax.adam(1e-3)"
        ) from None
    new_params = optax.apply_updates(params, updates)
    new_params = [p.astype(old.dtype) for p, old in zip(new_params, params)]
    return tuple(new_params) + tuple(jax.tree.leaves(new_state))


def _branch_types(error: TypeError, params: list[Any]) -> str:
    """The message for a wrapper whose ``lax.cond`` branches give updates of different
    dtypes (``optax.apply_if_finite`` around an NNC minimizer of 16-bit parameters)."""
    low = sorted({str(p.dtype) for p in params if np.dtype(p.dtype).itemsize == 2})
    first = str(error).splitlines()[0]
    return (
        f"optax_update: a lax.cond in this Optax transformation gives updates of "
        f"different dtypes in its branches ({first}). fnnc's NNC minimizers give float32 "
        f"updates of 16-bit parameters (here {', '.join(low) or 'none'}), so that the new "
        "parameter is rounded once, while a wrapper's skip branch (optax.apply_if_finite, "
        "optax.conditionally_transform) gives the gradients' dtype: chain "
        "fnnc.models.minimizers.float32_gradients() before the wrapper, so both branches "
        "are float32"
    )


def update_like(update: Any, like: Any) -> Any:
    """``update`` in the dtype of ``like`` (its parameter, else its gradient), except a
    float32 update of a half or bfloat16 ``like``, which is kept: ``optax.apply_updates``
    adds it in float32 and rounds the sum once to the parameter's dtype, as NNC's
    kernels round ``a - delta`` (fnnc's NNC minimizers give such updates; casting one to
    16 bits first rounds twice, 18% of bfloat16 elements off at ``sgd(0.01)``)."""
    low = jnp.issubdtype(like.dtype, jnp.floating) and np.dtype(like.dtype).itemsize == 2
    if low and np.dtype(update.dtype) == np.float32:  # (bfloat16's NumPy kind is 'V')
        return update
    return update.astype(like.dtype)


def optax_update_command(optimizer: Any, param_specs: list[Spec]) -> Command:
    """The update command for ``optimizer`` over parameters of ``param_specs``."""
    if not isinstance(optimizer, optax.GradientTransformation):
        raise CommandError(
            f"minimize: optimizer must be an optax.GradientTransformation, got "
            f"{type(optimizer).__name__}; e.g. optax.adam(1e-3)"
        )
    state = jax.eval_shape(optimizer.init, [Spec(s.shape, s.dtype) for s in param_specs])
    leaves, tree = jax.tree.flatten(state)
    keys = [
        jax.tree_util.keystr(path)
        for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
        if is_key(x)
    ]
    if keys:  # the callers pass keys_as_bits(optimizer); one whose init the probe
        # could not run keeps its typed key here, which no program, store or file carries
        raise CommandError(
            f"minimize: this Optax transformation keeps a PRNG key in its state (at "
            f"{', '.join(keys)}), and fnnc could not probe its init to keep the key's "
            "bits instead; pass fnnc.ops.optimizer.keys_as_bits(transformation), or add "
            "the noise in the loss"
        )
    return make_command(
        "optax_update",
        {
            "optimizer": Opaque(optimizer),
            "state_tree": Opaque(tree),
            "state_specs": tuple((tuple(x.shape), np.dtype(x.dtype)) for x in leaves),
            "n_params": len(param_specs),
        },
    )


def _has_keys(transform: Any, params: Any = None) -> bool:
    """Whether ``transform``'s state holds a typed PRNG key, probed on ``params`` (the
    parameters it will update, arrays or specs) when given, else on a list and on a dict
    of one parameter (a transformation that takes neither is not wrapped). A stand-in
    tree can make an init that expects other parameters misbehave (a model's partitioned
    minimizer zips its parameter ids with the probe), so callers that know the
    parameters pass them."""
    spec = jax.ShapeDtypeStruct((2,), np.float32)
    probes = ([spec], {"p": spec}) if params is None else (params,)
    for probe in probes:
        try:
            state = jax.eval_shape(transform.init, probe)
        except Exception:  # an init that needs more than the probe: judged later
            continue
        return any(is_key(x) for x in jax.tree.leaves(state))
    return False


_MULTI_STEPS: weakref.WeakKeyDictionary[Any, optax.GradientTransformation] = (
    weakref.WeakKeyDictionary()
)


def as_transformation(optimizer: Any) -> Any:
    """An ``optax.MultiSteps`` object as its ``GradientTransformation`` (one per object,
    as ``Model`` takes it); anything else as it is.

    >>> import optax
    >>> ms = optax.MultiSteps(optax.sgd(0.1), 2)
    >>> as_transformation(ms) is as_transformation(ms)
    True
    """
    if not isinstance(optimizer, optax.MultiSteps):
        return optimizer
    held = _MULTI_STEPS.get(optimizer)
    if held is None:
        held = _MULTI_STEPS[optimizer] = optimizer.gradient_transformation()
    return held


def keys_as_bits(transform: Any, params: Any = None) -> Any:
    """``transform`` with every typed PRNG key in its state kept as its key data.

    ``params``: the parameters ``transform`` will update (arrays or
    ``jax.ShapeDtypeStruct`` leaves, the tree its ``init`` takes), to probe its state
    with; without it a one-parameter list and dict stand in.

    ``optax.noisy_sgd`` and ``optax.add_noise`` keep a ``jax.random.key`` in their
    state. fnnc's programs, stores and checkpoints carry arrays of numbers, so the
    returned transformation keeps the key's bits (``jax.random.key_data``, uint32)
    in its state and wraps them back (``wrap_key_data`` with the key's own
    implementation) around the inner update: the noise is the same, step by step, as
    the plain Optax loop's. A transformation whose state holds no key comes back as
    it is.

    >>> import optax, numpy as np
    >>> tx = keys_as_bits(optax.noisy_sgd(0.1, key=0))
    >>> state = tx.init([np.zeros(3, np.float32)])
    >>> [str(x.dtype) for x in jax.tree.leaves(state)]
    ['int32', 'uint32']
    """
    if not isinstance(transform, optax.GradientTransformation):
        return transform
    held = _WRAPPED.get(id(transform))
    if held is not None and held[0] is transform:
        return held[1]
    wrapped = _wrap(transform) if _has_keys(transform, params) else transform
    if len(_WRAPPED) >= 256:
        _WRAPPED.clear()
    _WRAPPED[id(transform)] = (transform, wrapped)  # one wrapper per object: programs
    return wrapped  # and states keyed by the object see the same one at every step


_WRAPPED: dict[int, tuple[Any, Any]] = {}


def _wrap(transform: optax.GradientTransformation) -> optax.GradientTransformation:

    def impls(params: Any) -> list[Any]:  # per state leaf: the key's implementation
        found: list[Any] = []

        def probe(p: Any) -> int:
            leaves = jax.tree.leaves(transform.init(p))
            found.extend(jax.random.key_impl(x) if is_key(x) else None for x in leaves)
            return 0

        jax.eval_shape(probe, params)
        return found

    def init(params: Any) -> Any:
        return jax.tree.map(key_bits, transform.init(params))

    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        leaves, tree = jax.tree.flatten(state)
        kinds = impls(updates)
        keyed = [
            x if i is None else jax.random.wrap_key_data(x, impl=i) for x, i in zip(leaves, kinds)
        ]
        new, inner = transform.update(updates, tree.unflatten(keyed), params, **extra)
        return new, jax.tree.map(key_bits, inner)

    return optax.GradientTransformation(init, update)


def state_structure(transform: Any, param: Any) -> str:
    """A key for the structure of an Optax ``transform``'s state of ``param`` (specs).

    Two transformations with equal keys keep interchangeable state: the model engine
    and the dynamic graph carry state over by this key, never by object identity.
    """
    shapes = jax.eval_shape(transform.init, param)
    leaves, tree = jax.tree.flatten(shapes)
    return f"{tree}|{[(tuple(x.shape), str(x.dtype)) for x in leaves]}"
