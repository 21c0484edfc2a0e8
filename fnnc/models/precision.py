"""Mixed precision for cnnp models: ``Model.compile(..., precision="bfloat16")``.

The engine runs :func:`fnnc.graph.passes.precision.cast_precision` on the forward and
loss graph of its ``fit`` and ``evaluate`` programs, before ``minimize`` adds the
backward and the optimizer: parameters, optimizer state, gradients and the loss stay
float32 (``parameters()`` returns float32), matmuls and convolutions run in the low
type, softmax, losses, reductions and normalisations in float32.

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

from fnnc.core.ir import Graph
from fnnc.errors import ModelError
from fnnc.graph.passes.precision import KEEP_FLOAT32, LOW, cast_precision


@dataclasses.dataclass(frozen=True)
class Precision:
    """The compute type ``dtype`` (``"bfloat16"``, ``"float16"``) and the command
    names kept in float32."""

    dtype: str
    keep_float32: frozenset[str] = KEEP_FLOAT32

    @staticmethod
    def of(value: Any) -> Precision | None:
        """A :class:`Precision` from a name (``"float32"``: none), checking it."""
        if isinstance(value, Precision) or value is None:
            return value
        if value == "float32":
            return None
        if value not in LOW:
            raise ModelError(
                f"compile: precision={value!r}; expected 'float32', 'bfloat16' or 'float16'"
            )
        return Precision(value)

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.dtype, tuple(sorted(self.keep_float32)))

    def __call__(self, graph: Graph) -> Graph:
        return cast_precision(graph, self.dtype, keep_float32=self.keep_float32)
