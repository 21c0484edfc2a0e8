"""Keyword arguments a Keras or PyTorch user brings to the model's methods, answered.

``Model.fit`` is NNC's one fused step on one batch and ``Model.evaluate`` its forward
pass; the whole-dataset loops Keras calls ``fit(x, y, epochs=...)`` and
``evaluate(x, y)`` are :meth:`~fnnc.models.Model.train` and
:meth:`~fnnc.models.Model.score`. A keyword one of them does not take is a
:class:`~fnnc.models.ModelError` saying which method or argument does the job, where
Python's own ``TypeError`` named only the keyword.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fnnc.models.layer import ModelError

_TRAIN = (
    "Keras's fit(x, y, epochs=..., batch_size=...) is train((x, y), epochs=..., batch_size=...)"
)
_SCORE = "Keras's evaluate(x, y, batch_size=...) is score(x, y, batch_size=...)"
_WHAT = {
    "fit": "fit(inputs, targets) is NNC's one training step on one batch; " + _TRAIN,
    "evaluate": (
        "evaluate(inputs) is NNC's forward pass on one batch (is_test=, requires_grad=); "
        + _SCORE
        + ", predict(x, batch_size=...) the outputs over many batches"
    ),
    "predict": "predict takes inputs and batch_size=",
    "score": "score takes data, labels, metrics=, batch_size=, inputs=, targets=",
    "train": (
        "train takes data, epochs=, batch_size=, validation=, metrics=, callbacks=, "
        "resume=, seed=, stop_on_nan=, inputs=, targets=, progress=, verbose="
    ),
}
_INSTEAD = {
    "validation_data": "validation=",
    "validation_split": "validation= with the held-out rows",
    "initial_epoch": "resume= (a checkpoint path or Checkpoints; the model counts its epochs)",
    "shuffle": "train shuffles every epoch from seed= (a dataframe or Grain dataset as data "
    "keeps its own order)",
    "steps_per_epoch": "a dataframe or Grain dataset of that many batches as data",
    "class_weight": "a loss function that weights the classes (compile(loss=fn))",
    "sample_weight": "a loss function of a weight column (compile(loss=fn))",
    "x": "the first argument",
    "y": "targets (fit) or labels (score)",
    "verbose": "progress= and verbose= of train",
    "epochs": "train(..., epochs=)",
    "callbacks": "train(..., callbacks=)",
}


def refuse_unknown(
    method: str, model: Any, unknown: Mapping[str, Any], extra: Sequence[Any] = ()
) -> None:
    """A :class:`ModelError` for the keywords ``unknown`` (and the positional arguments
    ``extra`` past the method's own: Keras's ``evaluate(x, y)``, ``fit(x, y, 32, 10)``)
    given to ``method`` of ``model``, naming what fnnc takes instead; nothing (and no
    work: ``fit`` calls it every step) when both are empty."""
    if not extra and not unknown:
        return
    where = model.describe()
    if extra:
        raise ModelError(
            f"{method} of model {where}: {len(extra)} positional argument(s) more than it "
            f"takes; {_WHAT[method]}"
        )
    if not unknown:
        return
    given = ", ".join(f"{k}={v!r:.30}" for k, v in unknown.items())
    hints = [f"{k}: {_INSTEAD[k]}" for k in unknown if k in _INSTEAD]
    tail = f" ({'; '.join(hints)})" if hints else ""
    raise ModelError(
        f"{method} of model {where}: unknown keyword argument(s) {given}; {_WHAT[method]}{tail}"
    )
