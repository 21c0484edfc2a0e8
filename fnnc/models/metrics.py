"""Metrics of a model on a labelled set: :meth:`Model.score <fnnc.models.Model.score>`
and ``Model.train(validation=...)`` measure with the same objects.

NNC's ``evaluate`` is a forward pass (``model.evaluate(x)`` gives outputs, as in
NNC's ``ccv_cnnp_model_evaluate``), so the Keras habit ``model.evaluate(x, y)`` is
called :meth:`~fnnc.models.Model.score` here, after scikit-learn's ``score(X, y)``:
it returns ``{"loss": ..., "accuracy": ...}``, the numbers ``train`` logs as
``val_loss`` and ``val_accuracy`` when given the same set.

A metric sees the model's test-mode outputs and the targets of the *whole* set (one
array per output / target, batches concatenated), so a set gives the same number in
whatever batches it is read. A metric is a :class:`Metric` (:class:`Accuracy`,
:class:`BinaryAccuracy`, :class:`TopK`, :class:`MeanLoss`), a name (``"accuracy"``,
``"top_5_accuracy"``, ``"loss"``) or your own callable ``fn(outputs, targets) -> float``
of the first output and target.

>>> import numpy as np
>>> from fnnc.models.metrics import Accuracy, TopK
>>> logits = np.array([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2]], np.float32)
>>> Accuracy()(None, [logits], [np.array([1, 2])]), TopK(2)(None, [logits], [np.array([1, 1])])
(0.5, 1.0)
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.dtypes import is_floating
from fnnc.errors import DTypeError, ModelError, ShapeError
from fnnc.models import checks, metric_checks
from fnnc.models.build_context import is_int
from fnnc.models.layer import real_scalar

CLASSIFICATION = checks.CLASSIFICATION


class Metric:
    """A number measured on a whole labelled set.

    Subclasses set :attr:`name` (the key in ``score``'s result; ``val_<name>`` in the
    history of ``train``) and implement :meth:`__call__`.
    """

    name: str = "metric"

    def __call__(self, model: Any, outputs: list[np.ndarray], targets: list[np.ndarray]) -> float:
        """The metric of ``outputs`` (each model output over the set) against
        ``targets`` (each target over the set)."""
        raise NotImplementedError(f"{type(self).__name__} must implement __call__")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class TopK(Metric):
    """The fraction of samples whose label is among the ``k`` largest outputs of output
    ``output``; labels are integers, or one-hot / soft targets (their argmax). A label
    outside ``[0, C)`` for ``C`` output classes is a :class:`~fnnc.errors.ModelError`
    (``-1`` is not the last class); a NaN label is a miss.

    Args:
        k: how many of the largest outputs count.
        output: which model output (and target) to measure.
        name: the result's key (default ``accuracy`` for ``k=1``, else
            ``top_<k>_accuracy``).
    """

    def __init__(self, k: int, *, output: int = 0, name: str | None = None):
        if not is_int(k) or k < 1:
            raise ModelError(f"TopK: k must be a positive int, got {k!r}")
        if not is_int(output) or output < 0:
            raise ModelError(f"TopK: output must be an output index >= 0, got {output!r}")
        self.k, self.output = int(k), int(output)
        self.name = name or ("accuracy" if k == 1 else f"top_{k}_accuracy")

    def __call__(self, model: Any, outputs: list[np.ndarray], targets: list[np.ndarray]) -> float:
        out, labels = metric_checks.output_and_target(self, outputs, targets)
        labels = metric_checks.class_labels(self, out, labels)
        if self.k > out.shape[-1]:
            raise ModelError(
                f"metric {self.name}: k={self.k} but output {self.output} has only "
                f"{out.shape[-1]} classes; pick k <= {out.shape[-1]}"
            )
        if out.shape[-1] == 1:
            raise ModelError(
                f"metric {self.name}: output {self.output} has one unit, a binary output; "
                "ranks mean nothing there: measure it with 'accuracy' (BinaryAccuracy)"
            )
        flat = out.reshape(-1, out.shape[-1])
        index, known = metric_checks.class_indices(self, labels, out.shape[-1])
        # a label ties into the top k if fewer than k outputs are strictly larger; a NaN
        # output ranks above everything (as argmax takes it), and a NaN label is a miss
        picked = np.take_along_axis(flat, index[:, None], axis=1)
        larger = np.sum((flat > picked) | np.isnan(flat), axis=1)
        return float(np.mean((larger < self.k) & ~np.isnan(picked[:, 0]) & known))


class BinaryAccuracy(Metric):
    """The fraction of entries of output ``output`` that fall on the side of
    ``threshold`` their targets do (targets above 0.5 are positive): what
    ``"accuracy"`` measures for a model with one output unit, or with a binary loss
    (for multi-label ``[N, C]`` targets, the mean over all ``N * C`` entries).

    Args:
        threshold: the output value that separates the classes; ``None`` takes it from
            the model's loss: 0 for ``sigmoid_binary_crossentropy`` (logits), 0.5 for
            ``binary_crossentropy`` (probabilities).
        output: which model output (and target) to measure.
        name: the result's key.

    >>> import numpy as np
    >>> BinaryAccuracy(0.0)(None, [np.array([[2.0], [-1.0], [0.5]])], [np.array([1, 1, 0])])
    0.3333333333333333
    """

    def __init__(self, threshold: float | None = None, *, output: int = 0, name: str = "accuracy"):
        if not is_int(output) or output < 0:
            raise ModelError(f"BinaryAccuracy: output must be an output index >= 0, got {output!r}")
        if real_scalar(threshold):  # a 0-d NumPy or JAX number
            threshold = float(threshold)
        number = isinstance(threshold, numbers.Real) and not isinstance(threshold, bool)
        if threshold is not None and (not number or math.isnan(threshold)):
            # '0.5' failed NumPy's comparison only when measured, after train's epoch
            raise ModelError(
                f"BinaryAccuracy: threshold={threshold!r} ({type(threshold).__name__}); "
                "expected a number (0.0 for logits, 0.5 for probabilities) or None (from "
                "the model's loss)"
            )
        self.threshold, self.output, self.name = threshold, int(output), name

    def __call__(self, model: Any, outputs: list[np.ndarray], targets: list[np.ndarray]) -> float:
        out, labels = metric_checks.output_and_target(self, outputs, targets)
        threshold = self.threshold
        if threshold is None:
            loss = _named_loss(model)
            if loss not in BINARY_THRESHOLDS:
                given = getattr(getattr(model, "engine", None), "loss", None)
                raise ModelError(
                    f"metric {self.name}: output {self.output} has one unit (binary), and "
                    f"the loss {given!r:.60} does not say whether it is a logit or a "
                    "probability; pass fnnc.models.metrics.BinaryAccuracy(threshold=0.0 "
                    "for logits, 0.5 for probabilities)"
                )
            threshold = BINARY_THRESHOLDS[loss]
        if labels.size != out.size:
            raise ModelError(
                f"metric {self.name}: output {self.output} is {list(out.shape)} but its "
                f"targets are {list(labels.shape)}; a binary output takes one 0/1 target "
                "per entry"
            )
        said = out.reshape(-1) > threshold
        return float(np.mean(said == (labels.reshape(-1) > 0.5)))


# what a one-unit output is, by the loss it trains with: a logit or a probability
BINARY_THRESHOLDS = {"sigmoid_binary_crossentropy": 0.0, "binary_crossentropy": 0.5}


def _named_loss(model: Any) -> Any:
    """The model's loss if a name, else ``None``: a loss function may be unhashable (a
    dataclass instance), and looking it up in :data:`BINARY_THRESHOLDS` raised TypeError."""
    loss = getattr(getattr(model, "engine", None), "loss", None)
    return loss if isinstance(loss, str) else None


class Accuracy(TopK):
    """Top-1 accuracy: the argmax of output ``output`` against integer labels, or
    one-hot / soft (mixup) targets of the output's shape, whose argmax is the label.

    An output of one unit, or any output of a model trained with a binary loss
    (``sigmoid_binary_crossentropy``, ``binary_crossentropy``: independent yes / no
    units, e.g. multi-label ``[N, C]`` targets), is binary: it is measured as
    :class:`BinaryAccuracy`, entry by entry, with the threshold its loss implies (as
    Keras's ``binary_accuracy``), not by argmax."""

    def __init__(self, *, output: int = 0, name: str = "accuracy"):
        super().__init__(1, output=output, name=name)

    def __call__(self, model: Any, outputs: list[np.ndarray], targets: list[np.ndarray]) -> float:
        out, labels = metric_checks.output_and_target(self, outputs, targets)
        loss = _named_loss(model)
        # one unit (argmax would always be 0) or independent units (argmax picks one)
        if (out.ndim >= 1 and out.shape[-1] == 1) or loss in BINARY_THRESHOLDS:
            binary = BinaryAccuracy(output=self.output, name=self.name)
            return binary(model, outputs, targets)
        labels = metric_checks.class_labels(self, out, labels)
        index, known = metric_checks.class_indices(self, labels, out.shape[-1])
        # argmax, not top-1 by rank: ties go to the first class, as predictions do
        return float(np.mean((np.argmax(out, axis=-1).reshape(-1) == index) & known))


class MeanLoss(Metric):
    """The compiled loss of the model over the set (the mean over samples); with no
    loss, the mean of the first output.

    It is computed on the model's outputs, so a probability loss behind a sigmoid or
    softmax is not fused with it as in ``fit``: a saturated correct output (a sigmoid
    of 1.0, a softmax 0 off the label) costs 0 as in ``fit``, but a label whose
    probability rounded to 0 costs ``inf`` where ``fit``'s fused loss stays finite. A
    loss function gets the whole set's outputs and targets as JAX arrays, as ``fit``
    gives it a batch's (NumPy arrays have no ``.at[]``)."""

    name = "loss"

    def __init__(self, where: str = "train validation"):
        self.where = where  # begins the error of targets the loss cannot take

    def __call__(self, model: Any, outputs: list[np.ndarray], targets: list[np.ndarray]) -> float:
        from fnnc.models import losses

        loss = model.engine.loss
        if loss is None:
            return _mean(outputs[0])
        if isinstance(loss, str):
            if not targets:  # as fit refuses it, rather than an IndexError after the epoch
                raise ModelError(
                    f"{self.where}: loss={loss!r} compares the model's first output with "
                    "targets, but the set has none; pass (inputs, targets)"
                )
            if isinstance(targets[0], np.ndarray):
                checks.labels(loss, np.shape(outputs[0]), targets[0], self.where)
            try:
                out = losses._COMMANDS[loss]()(outputs[0], _as_fit_takes(targets[0]))
            except (ShapeError, DTypeError) as e:  # named for the set, as fit names its node
                raise type(e)(
                    f"{self.where}: loss {loss!r} of output 0 {_typed(outputs[0])} against "
                    f"target 0 {_typed(targets[0])}: {e}"
                ) from None
            return _mean(out[0] if isinstance(out, tuple) else out)
        # as JAX arrays, as fit traces it: a NumPy array has no .at[] (nor JAX's other ways)
        outs = [_as_jax(o) for o in outputs]
        ts = [_as_jax(_as_fit_takes(t)) for t in targets]
        return float(losses.call_loss(loss, outs, ts))


def _mean(values: Any) -> float:
    """The mean of ``values`` summed in float64: NumPy sums a bfloat16 array in bfloat16,
    whose 8-bit mantissa stops counting near 256 (the mean of 4096 ones is 0.125)."""
    return float(np.mean(np.asarray(values), dtype=np.float64))


def _as_jax(value: Any) -> Any:
    """A NumPy array of numbers as a JAX array (what a loss function gets in ``fit``);
    anything else (strings a function may ignore) as it is."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not (np.dtype(dtype).kind in "biufc" or is_floating(dtype)):
        return value
    return jax.numpy.asarray(value)


def _typed(value: Any) -> str:
    return f"{np.dtype(value.dtype).name}{list(np.shape(value))}"


def _as_fit_takes(target: Any) -> Any:
    """``target`` in the dtype ``fit`` compiles it as: JAX's canonical one (float64
    NumPy targets are float32 unless ``jax_enable_x64`` is on), so a set ``fit``
    trains on also scores, rather than failing a loss's same-dtype rule."""
    if not isinstance(target, np.ndarray):
        return target
    return target.astype(jax.dtypes.canonicalize_dtype(target.dtype), copy=False)


class Function(Metric):
    """Your own metric: ``fn(outputs, targets) -> float`` of the first output and
    target over the set, under the key ``name`` (``targets`` is ``None`` for a set
    without targets, as a ``loss=None`` model is given)."""

    def __init__(self, name: str, fn: Callable[[Any, Any], Any]):
        self.name, self.fn = name, fn

    def __call__(self, model: Any, outputs: list[np.ndarray], targets: list[np.ndarray]) -> float:
        return _number(self.name, self.fn(outputs[0], targets[0] if targets else None))


_TOP_K = re.compile(r"top_?(\d+)(_accuracy)?$")


def get(metric: str | Metric | Callable[..., Any], where: str = "metrics") -> Metric:
    """The :class:`Metric` a name, metric or callable stands for."""
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, str):
        if metric in ("accuracy", "acc"):
            return Accuracy()
        if metric == "loss":
            return MeanLoss()
        found = _TOP_K.match(metric)
        if found:
            return TopK(int(found.group(1)), name=metric)
        raise ModelError(
            f"{where}: unknown metric {metric!r}; names are 'accuracy', 'loss' and "
            "'top_<k>_accuracy'; pass {'name': fn(outputs, targets)} or a "
            "fnnc.models.metrics.Metric for your own"
        )
    if callable(metric):
        name = getattr(metric, "__name__", "")
        if not name or name == "<lambda>":
            raise ModelError(f"{where}: a callable metric needs a name; pass it as {{'name': fn}}")
        return Function(name, metric)
    raise ModelError(
        f"{where}: a metric is a name, a fnnc.models.metrics.Metric or a callable "
        f"fn(outputs, targets), got {type(metric).__name__}"
    )


def resolve(model: Any, metrics: Any, where: str = "metrics") -> dict[str, Metric]:
    """The metrics measured on a set: the mean loss first, then top-1 accuracy for a
    classification loss (unless ``metrics`` is a list, which says exactly which), then
    ``metrics`` (names, :class:`Metric` objects, callables, or ``{"name": fn}``; none
    named ``loss``, but a :class:`MeanLoss`, or ``epoch``: a :class:`ModelError`)."""
    found: dict[str, Metric] = {"loss": MeanLoss()}
    listed = metrics is not None and not isinstance(metrics, Mapping)
    if model.engine.loss in CLASSIFICATION and not listed:
        found["accuracy"] = Accuracy()
    if metrics is None:
        return found
    if isinstance(metrics, (str, Metric, Mapping)) or not isinstance(metrics, Sequence):
        metrics = [metrics]
    for metric in metrics:  # a list may mix names, Metrics, callables and {"name": fn}
        if isinstance(metric, Mapping):
            for name, fn in metric.items():
                _add(
                    found, name, fn if isinstance(fn, Metric) else _function(name, fn, where), where
                )
            continue
        m = get(metric, where)
        _add(found, m.name, m, where)
    return found


def _function(name: Any, fn: Any, where: str) -> Function:
    """``{name: fn}`` as a :class:`Function` metric; a name that is no string, or an
    ``fn`` that is not callable, is a :class:`ModelError` now, not after train's epoch."""
    if not callable(fn):
        raise ModelError(
            f"{where}: metric {name!r} is {type(fn).__name__} ({fn!r:.40}), not a function; "
            f"pass {{{name!r}: fn}} with fn(outputs, targets) -> float, or a "
            "fnnc.models.metrics.Metric"
        )
    return Function(name, fn)


def _add(found: dict[str, Metric], name: str, metric: Metric, where: str) -> None:
    """Adds ``metric`` under ``name``, refusing the names the model's own numbers use:
    ``loss`` (the model's loss, ``val_loss`` in train, which EarlyStopping and the
    checkpoints read) for anything but :class:`MeanLoss`, and ``epoch`` (train's
    history numbers the epochs under it), and a name that is no non-empty string."""
    if not isinstance(name, str) or not name:
        raise ModelError(
            f"{where}: a metric's name is a non-empty string (the key of the results and "
            f"the history), got {name!r} ({type(name).__name__}); pass {{'my_metric': fn}}"
        )
    if (name == "loss" and not isinstance(metric, MeanLoss)) or name == "epoch":
        whose = "the model's loss (val_loss in train)" if name == "loss" else "the epoch number"
        raise ModelError(
            f"{where}: a metric named {name!r} ({metric!r}) would replace {whose}; the "
            f"names 'loss' and 'epoch' are the model's own: name yours otherwise, e.g. "
            f"{{'my_{name}': fn}}"
        )
    found[name] = metric


def measure(
    model: Any, outputs: list[np.ndarray], targets: list[np.ndarray], metrics: dict[str, Metric]
) -> dict[str, float]:
    """Each metric of ``metrics`` on the gathered ``outputs`` and ``targets``."""
    return {name: _number(name, m(model, outputs, targets)) for name, m in metrics.items()}


def _number(name: str, value: Any) -> float:
    """A metric's ``value`` as a float; a :class:`ModelError` naming the metric for
    anything but one real number (an array, a string)."""
    try:
        array = np.asarray(value)
    except Exception:  # an object NumPy cannot take
        array = np.asarray(None)
    if array.ndim != 0 or not (array.dtype.kind in "biu" or is_floating(array.dtype)):
        shape = f" of shape {list(array.shape)}" if array.ndim else ""
        raise ModelError(
            f"metric {name!r} returned {type(value).__name__}{shape} ({value!r:.60}); a metric "
            "returns one real number for the whole set, e.g. float(np.mean(...))"
        )
    return float(array)


def score(
    model: Any,
    data: Any,
    labels: Any = None,
    *,
    metrics: Any = None,
    batch_size: int = 256,
    inputs: Any = None,
    targets: Any = None,
) -> dict[str, float]:
    """Loss and metrics of ``model`` on a labelled set (see ``Model.score``)."""
    from fnnc.models.sample_sets import check_batch_size
    from fnnc.models.validation import outputs_and_targets, validation_batches

    batch_size = check_batch_size(batch_size, "score")
    if labels is not None:
        data = (data, labels)
    found = resolve(model, metrics, "score")
    if isinstance(found.get("loss"), MeanLoss):
        found["loss"] = MeanLoss("score")  # its label errors say score, not train
    read = validation_batches(
        data, batch_size=batch_size, inputs=inputs, targets=targets, where="score"
    )
    outs, ts = outputs_and_targets(model, read, "score")
    return measure(model, outs, ts, found)
