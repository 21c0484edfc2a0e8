"""The history of a training run as a picture: :func:`plot_history` (matplotlib).

One panel per metric, the training value and its ``val_`` counterpart together
(``loss`` with ``val_loss``, ``accuracy`` with ``val_accuracy``), against the epoch.
It draws on a ``matplotlib.figure.Figure`` of its own, not through ``pyplot``: no
window opens and no global figure state changes, so it runs on servers and in
callbacks. matplotlib is an optional extra: ``pip install "fnnc[plot]"``.
"""

from __future__ import annotations

import os
from typing import Any

from fnnc.core.files import atomic_write
from fnnc.errors import ModelError


def panels(history: dict[str, list[float]]) -> dict[str, list[str]]:
    """Panel title -> the history keys drawn in it (``loss``: ``loss``, ``val_loss``).

    >>> panels({"epoch": [1], "loss": [1.0], "val_loss": [2.0], "val_accuracy": [0.5]})
    {'loss': ['loss', 'val_loss'], 'accuracy': ['val_accuracy']}
    """
    found: dict[str, list[str]] = {}
    for key in history:
        if key == "epoch":
            continue
        found.setdefault(key.removeprefix("val_"), []).append(key)
    return found


def plot_history(
    history: dict[str, list[float]], path: str | os.PathLike[str] | None = None, *,
    title: str = "",
) -> Any:  # fmt: skip
    """Draws ``history`` (what ``Model.train`` returns) and saves it to ``path`` (a PNG
    unless its suffix says another format matplotlib writes).

    Args:
        history: ``{"epoch": [...], "loss": [...], "val_loss": [...], ...}``.
        path: where to save; ``None`` only returns the figure.
        title: the figure's title.

    Returns:
        the ``matplotlib.figure.Figure``.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ModelError(
            "plot_history needs the optional package 'matplotlib', which is not installed; "
            'pip install "fnnc[plot]"'
        ) from None
    groups = panels(history)
    if not groups:
        raise ModelError(
            f"plot_history: the history has no metrics to draw (keys {sorted(history)}); "
            "pass what Model.train returned"
        )
    epochs = list(history.get("epoch") or range(1, len(next(iter(history.values()))) + 1))
    fig = Figure(figsize=(4.0 * len(groups), 3.2), layout="constrained")
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, (name, keys) in zip(axes, groups.items()):
        for key in keys:
            values = history[key]
            if len(values) != len(epochs):
                raise ModelError(
                    f"plot_history: {key!r} has {len(values)} values for {len(epochs)} "
                    "epochs; every metric needs one value per epoch"
                )
            ax.plot(epochs, values, marker="o", label=key)
        ax.set_xlabel("epoch")
        ax.set_title(name)
        ax.legend()
    if title:
        fig.suptitle(title)
    if path is not None:
        _save(fig, os.fspath(path))
    return fig


def _save(fig: Any, path: str) -> None:
    """Saves ``fig`` to ``path`` atomically (a viewer refreshing it, or a run killed while
    it is written, never sees half a file), in the format its suffix names; a path
    without one gets matplotlib's default format and suffix, as ``savefig`` gives it."""
    import matplotlib

    suffix = os.path.splitext(path)[1]
    fmt = suffix[1:].lower() if suffix else matplotlib.rcParams["savefig.format"]
    target = path if suffix else f"{path}.{fmt}"
    atomic_write(target, lambda temporary: fig.savefig(temporary, dpi=100, format=fmt))
