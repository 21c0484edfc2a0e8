"""Dynamic loss scaling of cnnp models: float16 training as NNC does it.

``Model.compile(..., precision="float16")`` turns it on with the default policy
(:class:`LossScale`: scale ``2**15``, doubled after 2000 finite steps in a row, halved
and the step skipped on Inf/NaN gradients); ``loss_scale=LossScale(...)`` picks
another policy, ``loss_scale=False`` turns it off. The ``fit`` program is built by
:func:`fnnc.graph.passes.loss_scale.minimize_scaled`, so the scaling, the check and
the skip run inside the one jitted step; the engine only carries the state
(:class:`ScaleState`: the scale, float32, and the finite steps in a row) from one step
to the next, as it carries the optimizer state. It is visible as ``model.loss_scale``
and saved and restored by :class:`fnnc.io.Checkpoints` (in the metadata).

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> from fnnc.models.loss_scale import LossScale
>>> x = Input()
>>> model = Model(x, Dense(2, name="fc")(x))
>>> model.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1),
...               precision="float16", loss_scale=LossScale(growth_interval=2))
>>> for _ in range(2):
...     loss = model.fit(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32))
>>> model.loss_scale
ScaleState(scale=65536.0, good_steps=0)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from fnnc.errors import CheckpointError, ModelError
from fnnc.graph.passes.loss_scale import LossScale as LossScale
from fnnc.graph.passes.loss_scale import ScaleState as ScaleState

KEY = "loss_scale"


def policy(loss_scale: Any, dtype: str | None) -> LossScale | None:
    """The policy for ``compile``'s ``loss_scale=`` under compute type ``dtype``
    (``None``: float32): ``None`` is the default policy for float16 and none otherwise,
    ``True`` the default policy, ``False`` none, a :class:`LossScale` itself."""
    if loss_scale is None:
        return LossScale() if dtype == "float16" else None
    if loss_scale is False:
        return None
    if loss_scale is True:
        loss_scale = LossScale()
    if not isinstance(loss_scale, LossScale):
        raise ModelError(
            f"compile: loss_scale={loss_scale!r}; expected None (dynamic for float16), "
            "True, False or fnnc.models.loss_scale.LossScale(initial=..., growth_interval=...)"
        )
    if dtype is None:
        raise ModelError(
            "compile: loss_scale= needs a low compute type; pass precision='float16' "
            "(or 'bfloat16') with it, or drop loss_scale"
        )
    return loss_scale


def current(engine: Any, n_scale: int) -> tuple[Any, ...]:
    """The scale-state arrays a fit program with ``n_scale`` of them takes (``()``)."""
    if not n_scale:
        return ()
    if engine.loss_scale_state is None:
        engine.loss_scale_state = engine.precision.loss_scale.init()
    return tuple(engine.loss_scale_state)


def keep(engine: Any, new: tuple[Any, ...]) -> None:
    """Keeps the scale state a fit program returned (nothing without scaling)."""
    if new:
        engine.loss_scale_state = ScaleState(*new)


def visible(engine: Any) -> ScaleState | None:
    """The scale state as Python numbers (``None`` without loss scaling); reading it
    waits for the last step."""
    scaling = getattr(engine.precision, "loss_scale", None)
    if scaling is None:
        return None
    state = engine.loss_scale_state or scaling.init()
    return ScaleState(float(_host(state.scale)), int(_host(state.good_steps)))


def to_json(engine: Any) -> dict[str, Any]:
    """``{"loss_scale": [scale, good_steps]}`` for a checkpoint (``{}`` without it)."""
    state = visible(engine)
    return {} if state is None else {KEY: [state.scale, state.good_steps]}


def saved_state(engine: Any, saved: dict[str, Any], where: str) -> ScaleState | None:
    """The scale state of a checkpoint's ``saved`` progress, checked before anything of
    the model changes; ``None`` where it holds none or the model has no loss scaling
    (float16 runs may be continued in float32).

    Raises:
        CheckpointError: the entry is not ``[scale, good_steps]``: a finite scale > 0
            and a count in ``[0, 2**31)``.
    """
    if KEY not in saved or getattr(engine.precision, "loss_scale", None) is None:
        return None
    value = saved[KEY]
    try:
        scale, good = value
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        if not numbers or not isinstance(good, int) or not 0 <= good < 2**31:
            raise ValueError
        with np.errstate(over="ignore"):
            state = ScaleState(np.float32(scale), np.int32(good))
        if not (np.isfinite(state.scale) and state.scale > 0):
            raise ValueError
    except (TypeError, ValueError):
        raise CheckpointError(
            f"checkpoint: {where}: {KEY} is {value!r:.80}; expected [scale, good_steps] "
            "(a finite scale > 0 and a count in [0, 2**31)), as a float16 run saves it; "
            "restore another step, or only the parameters: "
            "model.set_parameters(Checkpoints(path).restore(step).state)"
        ) from None
    return state


def put(engine: Any, state: ScaleState | None) -> None:
    """Makes ``state`` (from :func:`saved_state`) the model's; ``None`` (the run saved
    none: a float32 one) is the policy's initial state, as in a fresh model."""
    engine.loss_scale_state = None if state is None else jax.tree.map(jax.numpy.asarray, state)


def _host(value: Any) -> Any:
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return np.asarray(value.addressable_data(0))  # replicated: any copy is the value
    return np.asarray(value)
