"""Mixed precision for cnnp models: ``Model.compile(..., precision="bfloat16")``.

The engine runs :func:`fnnc.graph.passes.precision.cast_precision` on the forward and
loss graph of its ``fit`` and ``evaluate`` programs, before ``minimize`` adds the
backward and the optimizer: parameters, optimizer state, gradients and the loss stay
float32 (``parameters()`` returns float32), matmuls and convolutions run in the low
type (a ``Repeat``'s blocks too, inside their loop), softmax, losses, reductions and
normalisations in float32. The loss, named or a function of ``jnp`` code, computes in
float32 whatever its commands: the model's outputs are converted up to it. With
float16 the ``fit`` program also scales the loss dynamically
(:mod:`fnnc.models.loss_scale`).

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input()
>>> model = Model(x, Dense(2, name="fc")(x))
>>> model.compile(np.zeros((4, 3), np.float32), loss="mse", minimizer=optax.sgd(0.1),
...               precision="bfloat16")
>>> loss = model.fit(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32))
>>> str(loss.dtype), str(model.parameters()["t-fc-0-0"].dtype)
('float32', 'float32')
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fnnc.core.ir import Graph
from fnnc.errors import ModelError
from fnnc.graph.passes.precision import KEEP_FLOAT32, LOW, cast_precision
from fnnc.models import loss_scale as scaling


@dataclasses.dataclass(frozen=True)
class Precision:
    """The compute type ``dtype`` (``"bfloat16"``, ``"float16"``), the command
    names kept in float32 and the dynamic ``loss_scale`` policy of ``fit`` (a
    :class:`fnnc.models.loss_scale.LossScale`, or ``None``)."""

    dtype: str
    keep_float32: frozenset[str] = KEEP_FLOAT32
    loss_scale: scaling.LossScale | None = None

    @staticmethod
    def of(value: Any, loss_scale: Any = None) -> Precision | None:
        """A :class:`Precision` from a name (``"float32"``: none) and ``compile``'s
        ``loss_scale=`` (see :func:`fnnc.models.loss_scale.policy`), checking both."""
        if isinstance(value, Precision):
            if loss_scale is None:
                return value
            return dataclasses.replace(value, loss_scale=scaling.policy(loss_scale, value.dtype))
        name = _name(value)
        if name not in (None, "float32", *LOW):
            raise ModelError(
                f"compile: precision={value!r}; expected 'float32', 'bfloat16' or 'float16' "
                "(or those dtypes, e.g. jnp.bfloat16)"
            )
        dtype = None if name in (None, "float32") else name
        policy = scaling.policy(loss_scale, dtype)
        return None if dtype is None else Precision(dtype, loss_scale=policy)

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.dtype, tuple(sorted(self.keep_float32)), self.loss_scale)

    def __call__(self, graph: Graph, float32_from: int | None = None) -> Graph:
        """``graph`` cast; its nodes from position ``float32_from`` on (the loss the
        training step appends to the model) compute in float32."""
        wide = () if float32_from is None else range(float32_from, len(graph.nodes))
        return cast_precision(graph, self.dtype, keep_float32=self.keep_float32, float32_nodes=wide)


def _name(value: Any) -> str | None:
    """``value``'s dtype name (``jnp.bfloat16``, ``np.dtype("float16")``: the same as
    their names; ``np.dtype("float16")`` had been taken and ``np.float16`` refused), or
    ``value`` itself where it names no dtype (the error then shows it)."""
    if value is None or isinstance(value, str):
        return value
    try:
        return np.dtype(value).name
    except (TypeError, ValueError):
        return value
