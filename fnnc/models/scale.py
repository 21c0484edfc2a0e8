"""Model methods for scale: data parallelism over devices (and processes) and mixed
precision; :class:`fnnc.models.Model` mixes them in. See :mod:`fnnc.models.parallel`,
:mod:`fnnc.models.precision` and :mod:`fnnc.models.loss_scale`."""

from __future__ import annotations

from typing import Any

from fnnc.errors import ModelError
from fnnc.models import loss_scale
from fnnc.models.loss_scale import ScaleState
from fnnc.models.parallel import MODES, PIPELINE, Parallel, mesh_of


class ScaleMixin:
    """``set_data_parallel`` and the ``mesh=`` / ``precision=`` options of ``compile``."""

    _pending_parallel: Parallel | None = None
    _engine: Any

    def set_data_parallel(self, n: int = 0, *, parameter_sharding: str = "replicated") -> None:
        """Trains and evaluates on ``n`` devices (NNC's ``ccv_cnnp_model_set_data_parallel``;
        ``0``: every device, with ``jax.distributed`` every process's): a one-axis mesh
        ``"data"``, the batch split over it, parameters ``"replicated"`` or ``"fsdp"``
        (each device holds a slice). Call before or after ``compile``.

        >>> import numpy as np, optax
        >>> from fnnc.models import Dense, Input, Model
        >>> x = Input()
        >>> model = Model(x, Dense(2, name="fc")(x))
        >>> model.set_data_parallel(1, parameter_sharding="fsdp")
        >>> model.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1))
        >>> model.engine.parallel.size
        1
        """
        where = f"set_data_parallel({n!r})"
        self._set_layout(Parallel.of(mesh_of(n), parameter_sharding, where=where))

    def _set_layout(self, parallel: Parallel | None) -> None:
        self._pending_parallel = parallel
        if self._engine is not None:
            self._engine._sync_live()
            self._engine.parallel = parallel
            self._engine.place_parameters()

    @property
    def loss_scale(self) -> ScaleState | None:
        """The dynamic loss scale of float16 training and the finite steps in a row
        (``ScaleState(scale=32768.0, good_steps=0)``), or ``None`` without loss
        scaling; see :mod:`fnnc.models.loss_scale`. Reading it waits for the last step."""
        return None if self._engine is None else loss_scale.visible(self._engine)

    def _scale_options(
        self, mesh: Any, parameter_sharding: Any, precision: Any, scaling: Any = None
    ) -> None:
        """Applies ``compile``'s ``mesh=``, ``parameter_sharding=``, ``precision=`` and
        ``loss_scale=``."""
        if precision is not None or scaling is not None:
            from fnnc.models.precision import Precision

            engine = self._engine
            old = engine.precision
            engine.precision = Precision.of(precision if precision is not None else old, scaling)
            if getattr(old, "loss_scale", None) != getattr(engine.precision, "loss_scale", None):
                engine.loss_scale_state = None  # a new policy starts from its initial scale
        if mesh is not None:
            self._pending_parallel = Parallel.of(mesh, parameter_sharding or "replicated")
        elif parameter_sharding is not None:
            rules = not (isinstance(parameter_sharding, str) and parameter_sharding in MODES)
            if rules and self._pending_parallel is None and parameter_sharding != PIPELINE:
                raise ModelError(
                    f"compile: parameter_sharding={parameter_sharding!r:.80} gives sharding "
                    "rules, which split parameters over a mesh's 'model' axis, but no mesh= "
                    "was given (nor an earlier one); pass compile(mesh=jax.make_mesh((2, 2), "
                    "('data', 'model')), parameter_sharding=...)"
                )
            current = self._pending_parallel or Parallel.of(mesh_of(0), "replicated")
            self._pending_parallel = Parallel.of(current.mesh, parameter_sharding)
        if self._engine is not None:
            self._engine.parallel = self._pending_parallel
