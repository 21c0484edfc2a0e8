"""Checks of what a cnnp model is fed, made on the host before anything runs.

Mistakes that would otherwise surface deep inside a compiled program (or not at all)
are caught here and named in the user's terms:

* inputs whose sizes do not fit the parameters the model was compiled with name the
  input (``input 0 (x) is float32[64, 21], compiled for float32[64, 20]``), not a
  weight id;
* a named loss without targets says so; a training step on a batch of 0 rows is
  refused (its loss is NaN and it would update the weights and running statistics);
* class labels out of range (7 or -1 with 3 classes), or not whole numbers (1.7), for
  ``softmax_crossentropy`` / ``categorical_crossentropy``, and binary targets outside
  ``[0, 1]``, name the value, its position and the number of classes;
* NaN or infinity in ``train``'s in-memory data warns (a :class:`RuntimeWarning`)
  naming the input or target and the first sample; a NaN loss names the batch's
  non-finite values when the data had them.

Labels are checked only when they are NumPy arrays (what ``train`` feeds and what users
usually pass to ``fit``): a JAX array on a device is not read back, so no check adds a
device sync to a step. ``train`` checks its whole in-memory dataset once per call (and
its steps then skip the check); ``fit`` checks each NumPy batch (a min and a max over
the labels: about 10 us for 32 labels).

>>> import numpy as np, optax
>>> from fnnc.models import Dense, Input, Model
>>> x = Input(name="x")
>>> model = Model(x, Dense(3, name="fc")(x))
>>> model.compile(np.zeros((4, 2), np.float32), loss="softmax_crossentropy",
...               minimizer=optax.sgd(0.1))
>>> model.fit(np.zeros((4, 2), np.float32), np.array([0, 1, 7, 2]))
Traceback (most recent call last):
...
fnnc.errors.ModelError: fit: target 0 holds the label 7 at sample 2; ...
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fnnc.core.dtypes import is_floating, is_inexact
from fnnc.errors import DTypeError, ModelError
from fnnc.models.build_context import is_int
from fnnc.ops.loss import batch_label

CLASSIFICATION = ("softmax_crossentropy", "categorical_crossentropy")
BINARY = ("binary_crossentropy", "sigmoid_binary_crossentropy")

# Per engine: the shape of the first model output, by input specs (one build each).
_SCORES: weakref.WeakKeyDictionary[Any, dict[Any, tuple[int, ...]]] = weakref.WeakKeyDictionary()
# Engines inside a ``train`` call whose whole in-memory dataset was checked.
_TRUSTED: weakref.WeakSet[Any] = weakref.WeakSet()


def _ty(spec: Any) -> str:
    return f"{np.dtype(spec.dtype).name}{list(spec.shape)}"


def input_label(model: Any, index: int) -> str:
    """``input 0 (x)`` for a named ``Input(name="x")``, else ``input 0``."""
    inputs = getattr(model, "inputs", ())
    name = getattr(inputs[index], "name", "") if index < len(inputs) else ""
    return f"input {index} ({name})" if name else f"input {index}"


# -- inputs against compiled parameters ---------------------------------------------
def parameters(engine: Any, built: dict[str, Any], specs: Sequence[Any]) -> None:
    """Raises :class:`ModelError` when a build from ``specs`` asks a parameter the model
    already has in another shape: the inputs' sizes differ from the compiled ones."""
    for pid, info in built.items():
        known = engine.infos.get(pid)
        if known is None or known.shape == info.shape:
            continue
        compiled = engine.input_specs
        differ = [
            i
            for i, (got, want) in enumerate(zip(specs, compiled))
            if tuple(got.shape[1:]) != tuple(want.shape[1:])
        ] or list(range(len(specs)))
        parts = [
            f"{input_label(engine.model, i)} is {_ty(specs[i])}"
            + (f", compiled for {_ty(compiled[i])}" if i < len(compiled) else "")
            for i in differ
        ]
        raise ModelError(
            f"model {engine.model.describe()}: {'; '.join(parts)}. Layer {info.layer} has "
            f"parameter {pid} of shape {list(known.shape)}, which these inputs would need as "
            f"{list(info.shape)}. Sizes that parameters depend on cannot change after "
            "compile: pass inputs with the compiled sizes, or build a new model for new ones"
        )


# -- targets and labels -------------------------------------------------------------
def targets(
    engine: Any, specs: tuple[Any, ...], values: Sequence[Any], where: str, force: bool = False
) -> None:
    """Checks the targets of a training step: present when the loss needs them, and
    class labels in range for a classification loss (NumPy targets only; ``force``: also
    while :func:`trust_labels` holds, as ``train`` does for the batch it reads ahead)."""
    loss = engine.loss
    if loss is None or isinstance(loss, str):  # a loss function may take scalar targets
        listed_numbers(values, where, "targets")
    if not isinstance(loss, str):
        return
    if not values:
        raise ModelError(
            f"{where}: loss={loss!r} compares the model's first output with targets, but "
            "no targets were given; call model.fit(inputs, targets) (train takes "
            "(inputs, targets) pairs)"
        )
    float_targets(loss, values[0], where)
    if (
        (loss in CLASSIFICATION or loss in BINARY)
        and isinstance(values[0], np.ndarray)
        and (force or engine not in _TRUSTED)
    ):
        scores = scores_shape(engine, specs)
        rows = np.shape(values[0])[:1]
        if scores and rows and rows[0] * jax.process_count() == scores[0] != rows[0]:
            scores = (*rows, *scores[1:])  # this process's slice of a global batch
        labels(loss, scores, values[0], where)


def listed_numbers(values: Sequence[Any], where: str, what: str) -> None:
    """Refuses a list of plain numbers where a list of arrays is read (``what``:
    ``"inputs"`` or ``"targets"``): such a list holds one array per input or target,
    so ``[0, 1, 2]`` would be three targets of one number each, not three labels."""
    if len(values) < 2 or any(np.ndim(v) != 0 for v in values):
        return
    shown = ", ".join(_show(np.asarray(v)) for v in values[:3]) + (
        ", ..." if len(values) > 3 else ""
    )
    raise ModelError(
        f"{where}: {what} is a list of {len(values)} numbers [{shown}], but a list holds one "
        f"array per {what[:-1]} ({len(values)} {what} of one number each here); pass the "
        f"numbers as one array with a row per sample: np.asarray(the_list)"
    )


def nonempty_batch(engine: Any, inputs: Sequence[Any], targets_: Sequence[Any], where: str) -> None:
    """Refuses a batch with 0 rows (an input or target whose first axis is 0) for a step
    that updates state (``fit``, a training-mode ``evaluate``), before anything runs: its
    loss would be NaN (a mean over no samples) and the step would still update the
    weights, the optimizer state and BatchNorm's running statistics (with NaN)."""
    for kind, arrays in (("input", inputs), ("target", targets_)):
        for i, a in enumerate(arrays):
            shape = tuple(np.shape(a))
            if not shape or shape[0] != 0:
                continue
            what = input_label(engine.model, i) if kind == "input" else f"target {i}"
            raise ModelError(
                f"model {engine.model.describe()} {where}: the batch is empty: {what} is "
                f"{_dtype_name(a)}{list(shape)}, 0 rows. A training step on no samples "
                "has a NaN loss and NaN batch statistics and would write them into the "
                "weights, optimizer state and running statistics; skip empty batches "
                "(a slice past the end of the data is one). evaluate(..., is_test=True) "
                "takes 0 rows"
            )


def _dtype_name(a: Any) -> str:
    return np.dtype(a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype).name


def trust_labels(engine: Any, trusted: bool) -> None:
    """While ``trusted``, :func:`targets` skips the label check of ``engine``'s steps
    (``train`` checked its whole dataset with :func:`train_data`, or checks each batch
    as it reads it, while the step before runs)."""
    if trusted:
        _TRUSTED.add(engine)
    else:
        _TRUSTED.discard(engine)


def scores_shape(engine: Any, specs: tuple[Any, ...]) -> tuple[int, ...]:
    """The shape of the model's first output for inputs of ``specs`` (built once)."""
    shapes = _SCORES.setdefault(engine, {})
    if specs not in shapes:
        shapes[specs] = tuple(engine._build(False, specs).outputs[0].shape)
    return shapes[specs]


def labels(
    loss: str, scores: tuple[int, ...], target: np.ndarray, where: str, sample: str = "sample"
) -> None:
    """Raises :class:`ModelError` for a label that ``loss`` cannot take against
    ``scores`` (the first output's shape): a class index outside ``[0, C)`` or not a
    whole number, or a binary target outside ``[0, 1]``. Positions are by sample."""
    target = np.asarray(target)
    float_targets(loss, target, where)
    if loss not in CLASSIFICATION and loss not in BINARY:
        return  # a regression loss (mse, smooth_l1) takes any numbers: its rule names shapes
    floating = is_floating(target.dtype)
    if not (floating or target.dtype.kind in "iu") or target.size == 0 or not scores:
        return  # the loss's shape rule names dtypes it cannot take
    if loss in BINARY:
        if target.min() < 0 or target.max() > 1:  # NaN compares false: a NaN passes
            bad = np.flatnonzero((target < 0) | (target > 1))[0]
            _fail(where, target, bad, sample, f"{loss!r} needs targets in [0, 1]")
        return
    if floating and target.shape == scores:
        return  # per-class targets (one-hot or soft), not class indices
    classes = scores[-1]
    lead = tuple(scores[:-1])
    if target.shape not in (lead, (*lead, 1)) and not batch_label(scores, target.shape):
        return  # the loss's shape rule explains what fits
    need = (
        f"{loss!r} needs class indices in [0, {classes}) for the model's {classes} output "
        f"classes (its first output is shaped {list(scores)})"
    )
    if target.min() < 0 or target.max() >= classes:
        bad = np.flatnonzero((target < 0) | (target >= classes))[0]
        _fail(
            where, target, bad, sample,
            f"{need}. Labels counted from 1 need y - 1; or give the last layer as many "
            "units as there are classes",
        )  # fmt: skip
    if floating:
        whole = np.isfinite(target) & (target == np.floor(target))
        if not whole.all():
            bad = np.flatnonzero(~whole)[0]
            _fail(
                where, target, bad, sample,
                f"{need}: a class index is a whole number (cast labels with "
                f".astype(np.int32)), or pass per-class float targets shaped {list(scores)}",
            )  # fmt: skip


def float_targets(loss: str, target: Any, where: str) -> None:
    """Integer or boolean NumPy targets (Keras takes 0/1 ints) for a loss that compares
    the output with float targets (all but the class-index losses): a DTypeError saying
    to cast them, where the command's rule spoke of datatype_conversion."""
    kind = getattr(getattr(target, "dtype", None), "kind", "")
    if loss not in CLASSIFICATION and isinstance(target, np.ndarray) and kind in "biu" and kind:
        raise DTypeError(
            f"{where}: loss {loss!r} of target 0 {target.dtype.name}{list(target.shape)}: "
            "expected a floating-point target (one per output entry; 0/1 or probabilities "
            "for a binary loss); pass y.astype(np.float32)"
        )


def _fail(where: str, target: np.ndarray, flat: int, sample: str, need: str) -> None:
    raise ModelError(
        f"{where}: target 0 holds the label {_show(target.reshape(-1)[flat])} at "
        f"{_position(target.shape, flat, sample)}; {need}"
    )


def _show(value: Any) -> str:
    """A value as its dtype prints it (``1.7``, not ``1.7000000476837158``)."""
    item = value.item()
    return f"{item:.7g}" if isinstance(item, float) else repr(item)


def _position(shape: tuple[int, ...], flat: int, sample: str) -> str:
    """``sample 12`` (one value per sample) or ``sample 12, at [12, 3]``."""
    at = [int(i) for i in np.unravel_index(flat, shape)]
    if len(shape) == 1 or int(np.prod(shape[1:])) == 1:
        return f"{sample} {at[0]}"
    return f"{sample} {at[0]}, at {at}"


# -- train's data -------------------------------------------------------------------
def train_data(model: Any, inputs: Sequence[Any], targets_: Sequence[Any], batch: int) -> None:
    """Checks ``train``'s in-memory dataset once: non-finite values warn, class labels
    out of range raise (with their sample index in the dataset)."""
    for kind, arrays in (("input", inputs), ("target", targets_)):
        for i, a in enumerate(arrays):
            found = nonfinite(a)
            if found is None:
                continue
            what = input_label(model, i) if kind == "input" else f"target {i}"
            warnings.warn(
                f"train: {what} holds {found}; every batch with such a value makes the loss "
                "and then the weights NaN. Clean the data (drop those samples, or "
                "np.nan_to_num) or mask them in your own loss",
                RuntimeWarning,
                stacklevel=4,
            )
    engine = model.engine
    loss = engine.loss
    if not (loss in CLASSIFICATION or loss in BINARY) or not targets_:
        return
    specs = tuple(
        jax.ShapeDtypeStruct((batch, *np.shape(x)[1:]), jax.dtypes.canonicalize_dtype(x.dtype))
        for x in inputs
    )
    scores = scores_shape(engine, engine._check_inputs(specs))
    labels(loss, (len(targets_[0]), *scores[1:]), targets_[0], "train", "sample")


def nonfinite(a: Any) -> str | None:
    """``"3 NaN and 0 infinite values (the first at sample 17, at [17, 2]: nan)"`` for
    a NumPy float array that has any, else ``None``."""
    if not isinstance(a, np.ndarray) or not is_inexact(a.dtype) or a.size == 0:
        return None
    finite = np.isfinite(a)
    if finite.all():
        return None
    nan = int(np.isnan(a).sum())
    flat = int(np.flatnonzero(~finite)[0])
    value = _show(a.reshape(-1)[flat])
    return (
        f"{nan} NaN and {a.size - int(finite.sum()) - nan} infinite value(s) (the first at "
        f"{_position(a.shape, flat, 'sample')}: {value})"
    )


def batch_note(inputs: Sequence[Any], targets_: Sequence[Any]) -> str:
    """What in one batch is not finite (empty if nothing, or not NumPy)."""
    notes = []
    for kind, arrays in (("input", inputs), ("target", targets_)):
        for i, a in enumerate(arrays):
            found = nonfinite(a) if isinstance(a, np.ndarray) else None
            if found is not None:
                notes.append(f"{kind} {i} of this batch holds {found}")
    return " The data is the cause: " + "; ".join(notes) + "." if notes else ""


_NUMERIC = (jnp.number, jnp.bool_, jax.dtypes.extended)  # extended: random keys


def seed(model: Any, value: Any) -> int:
    """``compile``'s ``seed`` as an int, or a :class:`ModelError` naming the model."""
    if is_int(value):
        return int(value)
    raise ModelError(
        f"{model.name or 'model'}.compile: seed must be an int (it seeds the parameters' "
        f"initialisation and dropout), got {type(value).__name__} {value!r}"
    )


def numeric_inputs(model: Any, values: list[Any]) -> list[Any]:
    """``values`` if each is a numeric array or spec; else a ModelError naming the input."""
    for i, value in enumerate(values):
        try:
            dtype = value.dtype if hasattr(value, "shape") else np.asarray(value).dtype
            ok = any(jax.dtypes.issubdtype(dtype, kind) for kind in _NUMERIC)
        except (AttributeError, TypeError, ValueError):  # a ragged list, an odd object
            dtype, ok = type(value).__name__, False
        if not ok:
            raise ModelError(
                f"model {model.describe()}: compile: {input_label(model, i)} is "
                f"{value!r:.40} ({dtype}); expected a numeric array or a "
                "jax.ShapeDtypeStruct (samples first) per model input; pass "
                "np.asarray(x, np.float32)"
            )
    return values


def declared_input(model: Any, index: int, io: Any, x: Any, where: str = "") -> None:
    """Input ``index`` of ``model`` (its ``Input(shape=, dtype=)`` declaration ``io``) against
    the symbol ``x`` a build gives it; a ModelError naming the input when they differ."""
    shape_ok = io.shape is None or (
        len(io.shape) == len(x.shape)
        and all(d is None or d == n for d, n in zip(io.shape, x.shape))
    )
    dtype = None if io.dtype is None else jax.dtypes.canonicalize_dtype(io.dtype)
    if shape_ok and (dtype is None or dtype == np.dtype(x.dtype)):
        return
    shape = "any shape" if io.shape is None else f"shape {list(io.shape)}"
    raise ModelError(
        f"{where}model {model.describe()}: {input_label(model, index)} is declared "
        f"Input({shape}, dtype {'any' if dtype is None else dtype.name}) and is given "
        f"{_ty(x)}; pass inputs that fit (None in a shape is any size), or change the "
        "Input declaration"
    )


def too_few_axes(layer: Any, args: Sequence[Any], error: Exception, where: str = "") -> ModelError:
    """The :class:`ModelError` for a layer whose ``build`` indexed an axis its input lacks
    (``x.shape[-1]`` of a scalar): names the layer and the inputs' types."""
    given = ", ".join(_ty(a) for a in args) or "none"
    return ModelError(
        f"{where}layer {layer.describe()}: building it on input(s) {given} raised "
        f"{type(error).__name__}: {error}; an input likely has fewer axes than the layer reads: "
        "layers take the samples first and the features last ([N, features], [N, H, W, C]); "
        "give inputs of that rank, e.g. x.reshape(-1, 1) for one feature per sample"
    )


def output_count(layer: Any, num_inputs: int, given: int, where: str = "") -> None:
    """What ``layer.build`` returned (``given`` outputs) against ``layer.num_outputs``: the
    model wires that many values from each call, so a missing one (or an extra one taken
    silently) is a ModelError naming the layer."""
    expected = layer.num_outputs(num_inputs)
    if given != expected:
        raise ModelError(
            f"{where}layer {layer.describe()}: build returned {given} output(s), but "
            f"num_outputs({num_inputs}) says {expected}; make build return a tuple of "
            f"{expected} symbol(s) (one symbol alone for 1), or change num_outputs"
        )


def minimizer_ids(params: Any) -> list[str] | None:
    """``params`` of ``set_minimizer`` as a list of ids: one id alone stands for ``[it]``."""
    if params is None or isinstance(params, str):
        return params if params is None else [params]
    if not isinstance(params, Sequence) or not all(isinstance(p, str) for p in params):
        raise ModelError(
            f"set_minimizer: params={params!r:.60} ({type(params).__name__}); expected a "
            "parameter id or a list of ids, e.g. params=['t-fc-0-0'] (see model.parameters()); "
            "for a layer's or sub-model's parameters (NNC's ccv_cnnp_model_parameters(layer, "
            "ALL_PARAMETERS, ALL_PARAMETERS)) pass model.parameter_ids(layer)"
        )
    return list(params)


def parameter_value(pid: str, info: Any, value: Any) -> Any:
    """``value`` for parameter ``pid`` if it is numbers (an array, a scalar, nested lists);
    a :class:`ModelError` naming the id and what was given otherwise."""
    given, dtype = value, getattr(value, "dtype", None)
    if dtype is None:
        try:
            value = np.asarray(value)
        except (TypeError, ValueError):  # ragged lists
            dtype = np.dtype(object)
        else:
            dtype = value.dtype
    if np.dtype(dtype).kind in "OUSMm":  # objects, strings, dates: not numbers
        raise ModelError(
            f"set_parameters: {pid} (layer {info.layer}) is {info.dtype}{list(info.shape)}; "
            f"the value given is {given!r:.40} ({type(given).__name__} of {np.dtype(dtype)}), "
            "not numbers; give an array of that shape"
        )
    return value
