"""train: epochs of fused steps over in-memory data, with a progress bar and history.

Batches are drawn from a fresh permutation every epoch; a final partial batch is
dropped in training (every sample is still seen over epochs, and the step compiles
once), but evaluation covers every sample.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from fnnc.models.layer import ModelError


def _as_lists(data: Any, where: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    try:
        inputs, targets = data
    except (TypeError, ValueError):
        raise ModelError(f"{where}: expected (inputs, targets), e.g. (x_train, y_train)") from None
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    targets = list(targets) if isinstance(targets, (list, tuple)) else [targets]
    sizes = {len(a) for a in (*inputs, *targets)}
    if len(sizes) != 1:
        raise ModelError(
            f"{where}: inputs and targets disagree on the number of samples: {sorted(sizes)}"
        )
    return [np.asarray(a) for a in inputs], [np.asarray(a) for a in targets]


def predict(
    model: Any, inputs: Sequence[np.ndarray] | np.ndarray, *, batch_size: int = 256
) -> np.ndarray:
    """The model's first output over all samples, in batches (test mode)."""
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    n = len(inputs[0])
    outs = []
    for start in range(0, n, batch_size):
        out = model.evaluate([x[start : start + batch_size] for x in inputs], is_test=True)
        outs.append(np.asarray(out[0] if isinstance(out, list) else out))
    return np.concatenate(outs)


def accuracy(model: Any, data: Any, *, batch_size: int = 256) -> float:
    """Top-1 accuracy of the first output against integer labels."""
    inputs, targets = _as_lists(data, "accuracy")
    logits = predict(model, inputs, batch_size=batch_size)
    return float(np.mean(np.argmax(logits, axis=-1) == targets[0].reshape(-1)))


def train(
    model: Any,
    data: Any,
    *,
    epochs: int = 1,
    batch_size: int = 32,
    validation: Any = None,
    seed: int = 0,
    progress: bool | None = None,
) -> dict[str, list[float]]:
    """Trains ``model`` (compiled with a loss and a minimizer) on ``data = (inputs, targets)``.

    Args:
        model: a compiled :class:`~fnnc.models.Model`.
        data: ``(inputs, targets)``, arrays or lists of arrays with samples first.
        epochs: passes over the data.
        batch_size: samples per step.
        validation: optional ``(inputs, targets)``; its accuracy is recorded per epoch.
        seed: the shuffling seed.
        progress: show a tqdm bar; default only when stderr is a terminal.

    Returns:
        ``{"loss": [mean loss per epoch], "val_accuracy": [...]}`` (the latter with
        ``validation``).
    """
    inputs, targets = _as_lists(data, "train")
    n = len(inputs[0])
    if n < batch_size:
        raise ModelError(f"train: {n} samples are fewer than batch_size={batch_size}")
    show = sys.stderr.isatty() if progress is None else progress
    rng = np.random.default_rng(seed)
    history: dict[str, list[float]] = {"loss": []}
    if validation is not None:
        history["val_accuracy"] = []
    steps = n // batch_size
    bar = None
    if show:
        from tqdm import tqdm

        bar = tqdm(total=epochs * steps, unit="step", dynamic_ncols=True)
    for epoch in range(epochs):
        order = rng.permutation(n)
        losses = []
        for step in range(steps):
            idx = order[step * batch_size : (step + 1) * batch_size]
            loss = model.fit([x[idx] for x in inputs], [t[idx] for t in targets])
            losses.append(loss)
            if bar is not None:
                bar.update(1)
        history["loss"].append(float(np.mean([float(v) for v in losses])))
        if validation is not None:
            history["val_accuracy"].append(accuracy(model, validation))
        if bar is not None:
            post = {"epoch": epoch + 1, "loss": f"{history['loss'][-1]:.4f}"}
            if validation is not None:
                post["val_acc"] = f"{history['val_accuracy'][-1]:.4f}"
            bar.set_postfix(post)
    if bar is not None:
        bar.close()
    return history
