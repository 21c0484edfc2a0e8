"""The checks a class metric makes of what it is given (:mod:`fnnc.models.metrics`):
that the model has the output it measures and a target for it, that the targets pair
with the outputs as class labels (one index per sample, or per-class targets shaped as
the output), and that each label is a whole class index in range. Each refusal is a
:class:`~fnnc.errors.ModelError` naming the metric, the shapes or the label and where it
is, where NumPy would raise a bare broadcasting or indexing error after ``train``'s
epoch had already trained."""

from __future__ import annotations

from typing import Any

import numpy as np

from fnnc.core.dtypes import is_floating
from fnnc.errors import ModelError
from fnnc.models import checks


def output_and_target(metric: Any, outputs: list[Any], targets: list[Any]) -> tuple[Any, Any]:
    """Output ``metric.output`` and its target as arrays; a :class:`ModelError` where the
    model has no such output or no target was given for it."""
    k = metric.output
    if not (0 <= k < len(outputs) and k < len(targets)):
        raise ModelError(
            f"metric {metric.name}: output={k}, but the model has {len(outputs)} output(s) "
            f"and {len(targets)} target(s) were given; measure an output in "
            f"[0, {min(len(outputs), len(targets))}) (output=i measures output i against "
            "target i)"
        )
    return np.asarray(outputs[k]), np.asarray(targets[k])


def class_labels(metric: Any, out: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``labels`` as class labels, one per row of ``out``'s classes (the argmax of
    per-class targets shaped as ``out``); a :class:`ModelError` naming both shapes where
    they do not pair up, or the labels are no numbers (NumPy would raise a bare
    broadcasting or indexing error, after train's epoch had trained)."""
    if out.ndim == 0:
        raise ModelError(
            f"metric {metric.name}: output {metric.output} is a scalar ({out.dtype}[]), "
            "not scores over classes; a class metric takes outputs shaped [N, classes]"
        )
    if not (labels.dtype.kind in "biu" or is_floating(labels.dtype)):
        raise ModelError(
            f"metric {metric.name}: target {metric.output} holds {labels.dtype} values; class "
            "labels are integer class indices, or one-hot / soft float targets"
        )
    if labels.shape == out.shape:
        return np.argmax(labels, axis=-1)
    rows = out.shape[:-1]
    if labels.size != int(np.prod(rows, dtype=np.int64)):
        raise ModelError(
            f"metric {metric.name}: output {metric.output} is {list(out.shape)} "
            f"({out.shape[-1]} classes) but its target is {list(labels.shape)}; expected "
            f"one class index per sample ({list(rows)} or {[*rows, 1]}) or per-class "
            f"targets shaped {list(out.shape)}"
        )
    return labels


def class_indices(metric: Any, labels: np.ndarray, classes: int) -> tuple[Any, Any]:
    """The flat class indices of ``labels`` (int64; a NaN label's is 0) and where they are
    known (not NaN). A label outside ``[0, classes)`` is a :class:`ModelError`: NumPy
    would raise an IndexError for it, or take ``-1`` as the last class."""
    labels = np.atleast_1d(labels)
    flat = labels.reshape(-1)
    known = ~np.isnan(flat) if is_floating(flat.dtype) else np.ones(flat.size, bool)
    bad = np.flatnonzero(known & ((flat < 0) | (flat >= classes)))
    if not bad.size and is_floating(flat.dtype):  # 1.5 is no class; astype would make it 1
        bad = np.flatnonzero(known & (flat != np.floor(flat)))
        if bad.size:
            raise ModelError(
                f"metric {metric.name}: target {metric.output} holds the label "
                f"{checks._show(flat[bad[0]])} at "
                f"{checks._position(labels.shape, int(bad[0]), 'sample')}; a class index is "
                "a whole number (cast labels with .astype(np.int32)), or pass per-class float "
                f"targets shaped as output {metric.output}"
            )
    if bad.size:
        place = checks._position(labels.shape, int(bad[0]), "sample")
        raise ModelError(
            f"metric {metric.name}: target {metric.output} holds the label "
            f"{checks._show(flat[bad[0]])} at {place}, but output {metric.output} has {classes} "
            f"classes: labels are class indices in [0, {classes}) (-1 is no class, not the "
            "last one). Labels counted from 1 need y - 1; or give the last layer as many "
            "units as there are classes"
        )
    return np.where(known, flat, 0).astype(np.int64), known
