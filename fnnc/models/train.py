"""train: the training loop's functions by their old names (see :mod:`fnnc.models.training`).

``train(model, data, ...)`` is :meth:`Model.train <fnnc.models.Model.train>`;
``predict`` gives the first output over all samples; ``accuracy`` measures it against
integer labels or one-hot / soft targets.

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> from fnnc.models.train import accuracy
>>> x = Input()
>>> model = Model(x, Dense(2, name="fc")(x))
>>> model.compile(np.zeros((4, 3), np.float32), loss="softmax_crossentropy",
...               minimizer=optax.sgd(0.1))
>>> xs = np.ones((6, 3), np.float32)
>>> 0.0 <= accuracy(model, (xs, np.eye(2)[[0, 1, 0, 1, 0, 1]])) <= 1.0
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc.models import metrics, sample_sets, training


def predict(
    model: Any, inputs: Sequence[np.ndarray] | np.ndarray, *, batch_size: int = 256
) -> np.ndarray:
    """The model's first output over all samples, in batches (test mode)."""
    return training.predict(model, inputs, batch_size=batch_size, all_outputs=True)[0]


def accuracy(model: Any, data: Any, *, batch_size: int = 256) -> float:
    """Top-1 accuracy of the first output against integer labels, one-hot or soft targets;
    for a one-unit output or a binary loss, entry by entry (``score``'s ``accuracy``:
    :class:`fnnc.models.metrics.Accuracy`, which reads the model's loss)."""
    inputs, targets = sample_sets.split(data, "accuracy")
    outputs = predict(model, inputs, batch_size=batch_size)
    return metrics.Accuracy()(model, [outputs], [targets[0]])


def train(model: Any, data: Any, **kwargs: Any) -> dict[str, list[float]]:
    """:meth:`Model.train <fnnc.models.Model.train>` as a function."""
    return model.train(data, **kwargs)
