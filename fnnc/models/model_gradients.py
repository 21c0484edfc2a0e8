"""The accumulated parameter gradients between ``backward`` and ``apply_gradients``.

NNC lets a program look at and change the gradients that ``ccv_cnnp_model_backward``
accumulated before ``ccv_cnnp_model_apply_gradients`` uses them: clip them by their
global norm (``ccv_cnnp_model_parameters_clip_grad_norm``, PyTorch's
``clip_grad_norm_``), ask whether any is NaN (``ccv_cnnp_model_parameter_gradients_isnan``)
and read them (``ccv_cnnp_model_parameter_gradients_map``). :class:`GradientsMixin` gives
a :class:`~fnnc.models.Model` the three as :meth:`~GradientsMixin.clip_grad_norm`,
:meth:`~GradientsMixin.gradients_isnan` and :meth:`~GradientsMixin.gradients`, and
drops them unapplied with :meth:`~GradientsMixin.zero_grad`.

In a training loop written with ``fit`` or ``train`` the same clipping belongs in the
minimizer (``optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))``), which
runs inside the compiled step; these methods are for the step-by-step API.

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input()
>>> model = Model(x, Dense(1, name="fc")(x))
>>> model.compile(np.zeros((2, 3), np.float32), minimizer=optax.sgd(0.1))
>>> _ = model.evaluate(100 * np.ones((2, 3), np.float32), requires_grad=True)
>>> _ = model.backward()
>>> total = model.clip_grad_norm(0.5)   # the norm before clipping
>>> after = float(np.sqrt(sum(float((g**2).sum()) for g in model.gradients().values())))
>>> total > 0.5, round(after, 4)
(True, 0.5)
>>> model.apply_gradients()
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from fnnc.core.dtypes import at_least_float32
from fnnc.models.layer import ModelError, ModelIO, real_in


class GradientsMixin:
    """Reading, clipping and checking the accumulated gradients (see module doc)."""

    def gradients(self, params: Any = None) -> dict[str, jax.Array]:
        """The parameter gradients accumulated by :meth:`backward` since the last
        :meth:`apply_gradients`, ``{id: array}`` in model order (empty before any
        ``backward``). ``params``: every parameter (``None``), an id, a list of ids, or
        a layer or sub-model of this model (its :meth:`parameter_ids`), as NNC's
        ``ccv_cnnp_model_parameters(...)`` argument of the gradient functions. The arrays
        are the ones ``apply_gradients`` will use (JAX arrays, as placed on the mesh
        when data parallel). An id without an accumulated gradient (frozen, or not
        reached by the loss) is left out."""
        grads = self.engine.grads  # type: ignore[attr-defined]
        return {pid: grads[pid] for pid in self._gradient_ids(params, "gradients")}

    def clip_grad_norm(self, max_norm: float, norm_type: float = 2, params: Any = None) -> float:
        """Scales the accumulated gradients of ``params`` (all by default; see
        :meth:`gradients`) so that their global ``norm_type``-norm (taken over all of
        them together, in float32 at least) is at most ``max_norm``: each is multiplied by
        ``min(max_norm / norm, 1)``, as NNC's ``ccv_cnnp_model_parameters_clip_grad_norm``
        (which takes ``norm_type`` 2 only; here any ``p >= 1`` or ``math.inf``, as
        PyTorch's ``clip_grad_norm_``). Returns the norm before clipping. Call it between
        :meth:`backward` and :meth:`apply_gradients`. A NaN norm leaves the gradients
        NaN (see :meth:`gradients_isnan`)."""
        max_norm = real_in(
            self, "max_norm", max_norm, 0.0, math.inf, open_low=True,  # type: ignore[arg-type]
            hint="the largest global norm the gradients keep",
        )  # fmt: skip
        p = real_in(
            self, "norm_type", norm_type, 1.0, math.inf,  # type: ignore[arg-type]
            hint="p of the p-norm: 2 (NNC's only one, the default) or math.inf",
        )  # fmt: skip
        pids = self._gradient_ids(params, "clip_grad_norm")
        grads = self.engine.grads  # type: ignore[attr-defined]
        if not pids:
            return 0.0
        clipped, norm = _clip(p)([grads[pid] for pid in pids], jnp.float32(max_norm))
        grads.update(zip(pids, clipped))
        return float(norm)

    def gradients_isnan(self, params: Any = None) -> bool:
        """Whether any accumulated gradient of ``params`` (all by default; see
        :meth:`gradients`) holds a NaN, as NNC's
        ``ccv_cnnp_model_parameter_gradients_isnan``: when it is ``True``, drop them with
        :meth:`zero_grad` instead of :meth:`apply_gradients` (a loss-scaled step).
        Infinities are not NaN."""
        grads = self.engine.grads  # type: ignore[attr-defined]
        pids = self._gradient_ids(params, "gradients_isnan")
        return bool(pids) and bool(_any_nan([grads[pid] for pid in pids]))

    def zero_grad(self) -> None:
        """Drops the accumulated gradients without applying them (PyTorch's
        ``optimizer.zero_grad()``, :meth:`fnnc.graph.DynamicGraph.zero_grad`): the next
        :meth:`backward` starts from zero. :meth:`apply_gradients` clears them too."""
        self.engine.grads.clear()  # type: ignore[attr-defined]

    def parameters_clip_grad_norm(self, params: Any, norm_type: float, max_norm: float) -> float:
        """NNC's ``ccv_cnnp_model_parameters_clip_grad_norm(model, parameters, norm_type,
        max_norm)`` in its argument order: :meth:`clip_grad_norm` ``(max_norm,
        norm_type, params)``."""
        return self.clip_grad_norm(max_norm, norm_type, params)

    def parameter_gradients_isnan(self, params: Any = None) -> bool:
        """NNC's ``ccv_cnnp_model_parameter_gradients_isnan(model, parameters)``:
        :meth:`gradients_isnan`."""
        return self.gradients_isnan(params)

    def _gradient_ids(self, params: Any, where: str) -> list[str]:
        """The ids ``params`` names that have an accumulated gradient, in model order."""
        engine = self.engine  # type: ignore[attr-defined]
        if params is None:
            wanted = list(engine.infos)
        elif isinstance(params, str):
            wanted = [params]
        elif isinstance(params, Sequence) and all(isinstance(p, str) for p in params):
            wanted = list(params)
        elif hasattr(params, "describe") or isinstance(params, ModelIO):
            # a layer or sub-model, NNC's parameters(layer); parameter_ids explains a ModelIO
            wanted = self.parameter_ids(params)  # type: ignore[attr-defined]
        else:
            raise ModelError(
                f"{where}: params={params!r:.60} ({type(params).__name__}); expected None "
                "(every parameter), a parameter id, a list of ids, or a layer of the model"
            )
        unknown = [p for p in wanted if p not in engine.infos]
        if unknown:
            ids = list(engine.infos)
            shown = f"{ids[:6]}{'...' if len(ids) > 6 else ''}"
            raise ModelError(
                f"{where}: {unknown[0]!r} is not a parameter of {self.describe()}; "  # type: ignore[attr-defined]
                f"its parameters are {shown} (model.parameter_ids())"
            )
        chosen = set(wanted)
        return [pid for pid in engine.infos if pid in chosen and pid in engine.grads]


@functools.lru_cache(maxsize=8)
def _clip(p: float) -> Any:
    """A jitted ``(grads, max_norm) -> (clipped grads, norm)`` for the ``p``-norm,
    taken in float32 at least (float64 gradients in float64)."""

    def clip(grads: list[Any], max_norm: Any) -> tuple[list[Any], Any]:
        wide = [g.astype(at_least_float32(g.dtype)) for g in grads]
        if math.isinf(p):
            norm = jnp.max(jnp.stack([jnp.max(jnp.abs(g), initial=0.0) for g in wide]))
        else:
            total = sum(jnp.sum(jnp.abs(g) ** p) for g in wide)
            norm = total ** (1.0 / p)
        # NNC: clamp(max_norm / norm, max 1); a zero norm gives inf, clamped to 1
        scale = jnp.minimum(max_norm / norm, 1.0)
        return [(w * scale).astype(g.dtype) for w, g in zip(wide, grads)], norm

    return jax.jit(clip)


@jax.jit
def _any_nan(grads: list[Any]) -> Any:
    return jnp.any(jnp.stack([jnp.any(jnp.isnan(g)) for g in grads]))
