"""Sets of samples held as arrays: ``(inputs, targets)`` checked and split, and a model
run over a set in batches.

:func:`split` reads what ``train``, ``score`` and validation were given as
``(inputs, targets)`` lists with one row per sample each, and refuses, saying what to
pass, data that is no such pair (a dict, a bare array, a single value, row counts that
disagree). :func:`in_batches` and :func:`evaluate_rows` run a model over a set in
batches of any number of rows (padding to the microbatches of a pipelined Repeat or to
the devices of each process, and cutting back), as ``predict``, ``score`` and
validation do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from fnnc.core.dtypes import is_floating
from fnnc.errors import ModelError
from fnnc.models import checks, processes


def as_list(value: Any) -> list[Any]:
    """A list of arrays from one array or a list/tuple of them."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def targets_list(value: Any) -> list[Any]:
    """:func:`as_list` of a batch's targets; ``None`` is none (a ``loss=None`` model)."""
    return [] if value is None else as_list(value)


def check_batch_size(batch_size: Any, where: str) -> int:
    """``batch_size`` as an int of at least 1; a :class:`ModelError` saying so otherwise."""
    is_int = isinstance(batch_size, (int, np.integer)) and not isinstance(batch_size, bool)
    if is_int and batch_size >= 1:
        return int(batch_size)
    raise ModelError(
        f"{where}: batch_size={batch_size!r} ({type(batch_size).__name__}); expected an int "
        "of at least 1, the samples per step; pass e.g. batch_size=32"
    )


def split(data: Any, where: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(inputs, targets)`` as lists of arrays with as many samples each; targets
    ``None`` are none (a model compiled with ``loss=None``)."""
    try:
        # a dict or string would unpack into its keys or letters, an array of 2 rows into them
        if isinstance(data, (Mapping, str, bytes)) or hasattr(data, "shape"):
            raise TypeError
        inputs, targets = data
    except (TypeError, ValueError):
        odd = isinstance(data, (Mapping, str)) or hasattr(data, "shape")
        got = f", got a {type(data).__name__}" if odd else ""
        raise ModelError(
            f"{where}: expected (inputs, targets), e.g. (x_train, y_train){got}; name "
            "columns with a fnnc.data.DataFrame (DataFrame.from_arrays(x=..., y=...))"
        ) from None
    listed = [(what, len(v)) for what, v in (("inputs", inputs), ("targets", targets))
              if isinstance(v, list) and len(v) > 1]  # fmt: skip
    inputs, targets = as_list(inputs), targets_list(targets)
    checks.listed_numbers(inputs, where, "inputs")
    checks.listed_numbers(targets, where, "targets")
    inputs = [np.asarray(a) for a in inputs]
    targets = [np.asarray(a) for a in targets]
    arrays = [*(("input", i, a) for i, a in enumerate(inputs)),
              *(("target", i, a) for i, a in enumerate(targets))]  # fmt: skip
    for kind, i, a in arrays:
        if a.ndim == 0:
            raise ModelError(
                f"{where}: {kind} {i} is a single value ({_shown(a)}), not an array with a row "
                f"per sample; pass one {kind} per sample, e.g. np.full(len(x), value)"
            )
    sizes = {len(a) for _, _, a in arrays}
    if len(sizes) != 1:
        rows = ", ".join(f"{kind} {i} has {len(a)}" for kind, i, a in arrays)
        hint = "".join(
            f"; {what} came as a list of {n}, and a list holds one array per "
            f"{what[:-1]}: make a nested list of numbers one array with np.asarray"
            for what, n in listed
        )
        raise ModelError(
            f"{where}: inputs and targets disagree on the number of samples: {sorted(sizes)} "
            f"({rows}); every input and target needs one row per sample{hint}"
        )
    return inputs, targets


def same_rows(inputs: Sequence[Any], where: str) -> None:
    """Refuses inputs read by rows (``predict``) that disagree on the number of rows:
    they would be batched apart, and the shorter ones' outputs would be cut or mixed."""
    rows = [len(x) for x in inputs]
    if len(set(rows)) > 1:
        shown = ", ".join(f"input {i} has {n}" for i, n in enumerate(rows))
        raise ModelError(
            f"{where}: the inputs disagree on the number of samples ({shown}); every input "
            "needs one row per sample"
        )


def _shown(a: np.ndarray) -> str:
    number = a.dtype.kind in "biu" or is_floating(a.dtype)  # bfloat16's NumPy kind is 'V'
    return repr(a.item()) if number else f"a {a.dtype} scalar"


def row_multiple(model: Any) -> int:
    """The number every batch's rows (this process's) must be a multiple of: the
    microbatch counts of the model's pipelined Repeats (their least common multiple),
    and with several processes the rows each gives to the data axis (a global batch of
    ``rows * processes`` rows must divide over it), else 1."""
    counts = {
        owner.pipeline.microbatches
        for info in model.engine.infos.values()
        for owner in info.owners
        if getattr(owner, "pipeline", None) is not None
    }
    procs = processes.spanned(model)
    if procs > 1:
        size = model.engine.parallel.size
        counts.add(size // math.gcd(size, procs))
    return math.lcm(*counts) if counts else 1


def evaluate_rows(
    model: Any, inputs: Sequence[Any], multiple: int, where: str = "predict"
) -> list[np.ndarray]:
    """``model.evaluate(inputs, is_test=True)`` as a list of arrays, for a batch of any
    number of rows: where the rows must be a multiple of ``multiple``
    (:func:`row_multiple`, found once per pass over the data: a pipelined Repeat's
    microbatches, the devices of each process), the rows are padded with copies of the
    last one and every per-row output is cut back to the rows given. With several
    processes the outputs are every process's rows, in process order
    (:mod:`fnnc.models.processes`). (Predicting and scoring take per-row outputs
    already; the padding rows only fill microbatches and are never returned.) A scalar
    output (one value per batch: a loss) is a :class:`ModelError` beginning ``where``:
    batches of it have no rows to gather."""
    rows = len(inputs[0]) if inputs else 0
    pad = -rows % multiple if rows else 0
    if pad:
        inputs = [np.concatenate([x, np.repeat(x[-1:], pad, axis=0)]) for x in inputs]
    outs = [np.asarray(o) for o in as_list(model.evaluate(list(inputs), is_test=True))]
    for i, o in enumerate(outs):
        if o.ndim == 0:  # np.concatenate of the batches' outputs would fail
            raise ModelError(
                f"{where}: output {i} of model {model.describe()} is a scalar ({o.dtype}[]), "
                "one value per batch, not a row per sample, so it cannot be gathered over "
                "the batches of a set; run model.evaluate(batch) for it, or give the model "
                "per-sample outputs ([N, ...]; a loss=None model may output its per-sample "
                "losses, which fit averages)"
            )
    procs = processes.spanned(model)
    return [processes.per_process(o, rows + pad, rows, procs) for o in outs]


def in_batches(
    fn: Callable[[list[Any]], Any], inputs: Sequence[Any], batch_size: int, procs: int = 1
) -> list[np.ndarray]:
    """``fn`` over ``inputs`` in batches, its outputs (one or a list) concatenated.
    Zero samples still run ``fn`` once, on the empty batch, so the outputs have
    ``fn``'s shapes (``(0, *output_shape)``) and dtypes. ``procs``: the processes whose
    rows ``fn`` gathers (each giving as many per batch); the outputs are then all of
    process 0's rows, then process 1's... (:func:`processes.in_process_order`)."""
    batch_size = check_batch_size(batch_size, "predict")
    for i, x in enumerate(inputs):
        if np.ndim(x) == 0:
            raise ModelError(
                f"predict: input {i} is one value of {np.asarray(x).dtype} ({x!r:.40}); "
                "expected an array with the samples first ([N, ...]); pass x[None] for "
                "one sample"
            )
    same_rows(inputs, "predict")  # before any batch runs
    n, chunks, rows = len(inputs[0]), [], []
    for start in range(0, n, batch_size) or [0]:
        batch = [x[start : start + batch_size] for x in inputs]
        chunks.append([np.asarray(o) for o in as_list(fn(batch))])
        rows.append(len(batch[0]))
    return [processes.in_process_order(parts, rows, procs) for parts in zip(*chunks)]
