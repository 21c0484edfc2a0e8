"""Losses of cnnp models: NNC's loss commands by name, or any JAX function.

A loss turns model outputs and targets into one scalar symbol (the batch mean of NNC's
per-sample ``[N, 1]`` losses).

* ``"softmax_crossentropy"``: logits and integer labels (or one-hot / probabilities);
* ``"sigmoid_binary_crossentropy"``, ``"categorical_crossentropy"``,
  ``"binary_crossentropy"``, ``"mse"``, ``"smooth_l1"``: NNC's commands of those names;
  a named loss takes exactly one target (more is a :class:`~fnnc.errors.ModelError`,
  not silently ignored), ``loss=None`` none;
* any callable ``fn(outputs, targets) -> scalar`` written with JAX: traced into a graph
  and inlined. It is called with two **lists** of arrays, the model's outputs and the
  targets given to ``fit``/``train`` (even for one of each: ``outputs[0]``,
  ``targets[0]``), and returns one scalar, e.g.
  ``lambda outputs, targets: jnp.mean((outputs[0] - targets[0]) ** 2)``. (A metric
  function gets the first output and target as arrays.) An error the function raises
  (while ``fit`` traces it, or when ``score`` and validation call it) is a
  :class:`~fnnc.errors.ModelError` that says so, the original error as its ``__cause__``.
  Its value must be a real floating-point scalar (an integer one has no gradient). A
  loss command with parameters (label smoothing, ``pos_weight``, ``beta``) is given as
  such a function, e.g. ``lambda outputs, targets:
  jnp.mean(ops.softmax_crossentropy(trim0=0.01, trim1=0.91)(outputs[0], targets[0])[0])``;
  the command object itself is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from fnnc import ops
from fnnc.core.command import Command
from fnnc.core.dtypes import is_floating
from fnnc.core.ir import Symbol
from fnnc.graph import GraphBuilder, trace
from fnnc.graph.inline import inline
from fnnc.models.layer import ModelError

_COMMANDS: dict[str, Callable[[], Any]] = {
    "softmax_crossentropy": ops.softmax_crossentropy,
    "sigmoid_binary_crossentropy": ops.sigmoid_binary_crossentropy,
    "categorical_crossentropy": ops.categorical_crossentropy,
    "binary_crossentropy": ops.binary_crossentropy,
    "mse": ops.mse,
    "smooth_l1": ops.smooth_l1,
}


def check(loss: Any) -> None:
    """Raises :class:`ModelError` for a ``loss=`` that is not a loss name, ``None`` or a
    function. A command object (``ops.softmax_crossentropy(trim0=...)``, NNC's way to
    give a loss its parameters) would be called as ``fn(outputs, targets)`` with two
    lists: the error says to wrap it in such a function instead."""
    if isinstance(loss, Command):
        how = "use a loss name, None, or a function (outputs, targets) -> scalar"
        if loss.name in _COMMANDS:
            pick = (
                "[0]"
                if loss.name in ("softmax_crossentropy", "sigmoid_binary_crossentropy")
                else ""
            )
            how = (
                "to give a loss command parameters, wrap it in a function: loss=lambda "
                f"outputs, targets: jnp.mean(ops.{loss.name}(...)(outputs[0], targets[0]){pick})"
            )
        raise ModelError(f"compile: loss={loss} is a command object, not a loss; {how}")
    if loss is None or callable(loss) or loss in _COMMANDS:
        return
    habit = _KERAS_NAMES.get(loss.lower()) if isinstance(loss, str) else None
    raise ModelError(
        f"compile: unknown loss {loss!r}; use one of {sorted(_COMMANDS)} or a "
        "function (outputs, targets) -> scalar" + (f" ({loss!r} is {habit})" if habit else "")
    )


_SPARSE = (
    "categorical_crossentropy for probabilities, softmax_crossentropy for logits "
    "(from_logits=True; fused and stabler); both take integer labels or one-hot targets"
)
_KERAS_NAMES = {  # Keras / PyTorch loss names, lowercased, and what they are here
    "sparse_categorical_crossentropy": _SPARSE,
    "crossentropy": _SPARSE,
    "cross_entropy": _SPARSE,
    "crossentropyloss": "softmax_crossentropy (logits and integer labels)",
    "nll_loss": "categorical_crossentropy of probabilities (not of log-probabilities)",
    "bce": "binary_crossentropy (probabilities)",
    "bcewithlogitsloss": "sigmoid_binary_crossentropy (logits)",
    "mean_squared_error": "mse",
    "mseloss": "mse",
    "huber": "smooth_l1 (beta=1, switched on each sample's L1 distance)",
    "huber_loss": "smooth_l1 (beta=1, switched on each sample's L1 distance)",
    "smoothl1loss": "smooth_l1 (switched on each sample's L1 distance)",
    "mae": "a function: lambda outputs, targets: jnp.mean(jnp.abs(outputs[0] - targets[0]))",
    "mean_absolute_error": (
        "a function: lambda outputs, targets: jnp.mean(jnp.abs(outputs[0] - targets[0]))"
    ),
    "l1loss": "a function: lambda outputs, targets: jnp.mean(jnp.abs(outputs[0] - targets[0]))",
}


def build_loss(
    b: GraphBuilder, loss: Any, outputs: Sequence[Symbol], targets: Sequence[Symbol]
) -> Symbol:
    """The scalar loss symbol for ``outputs`` against ``targets``.

    ``loss=None`` (NNC's ``CMD_NOOP`` loss): the model's first output is the loss
    (averaged to a scalar if it has several elements).
    """
    _check_target_count(loss, targets)
    if loss is None:
        out = outputs[0]
        _check_floating("loss=None: the model's first output", out.dtype, out.shape)
        axes = tuple(range(len(out.shape)))
        mean = b.exec(ops.reduce_mean(axes=axes), out) if axes else out
        return b.exec(ops.reshape(shape=()), mean, name="loss")
    if isinstance(loss, str):
        if not targets:
            raise ModelError(
                f"fit: loss={loss!r} compares the model's first output with targets, but no "
                "targets were given; call model.fit(inputs, targets)"
            )
        out = b.exec(_COMMANDS[loss](), outputs[0], targets[0], name="loss")
        per_sample = out[0] if isinstance(out, tuple) else out
        axes = tuple(range(len(per_sample.shape)))
        mean = b.exec(ops.reduce_mean(axes=axes), per_sample) if axes else per_sample
        return b.exec(ops.reshape(shape=()), mean, name="loss.mean")
    specs = [jax.ShapeDtypeStruct(s.shape, s.dtype) for s in (*outputs, *targets)]
    n = len(outputs)

    def flat(*args: Any) -> Any:
        return call_loss(loss, list(args[:n]), list(args[n:]))

    graph = trace(flat, *specs)
    got = [graph.spec(o) for o in graph.outputs]
    if len(got) != 1 or int(np.prod(got[0].shape)) != 1:
        raise ModelError(
            f"compile: the loss function must return one scalar, got {_shapes(got)}; reduce "
            "it, e.g. with jnp.mean"
        )
    _check_floating("the loss function's value", got[0].dtype, got[0].shape)
    (value,) = inline(b, graph, [*outputs, *targets], prefix="loss")
    return value if value.shape == () else b.exec(ops.reshape(shape=()), value)


def call_loss(loss: Callable[..., Any], outputs: list[Any], targets: list[Any]) -> Any:
    """``loss(outputs, targets)``; an error it raises is a :class:`ModelError` saying how
    a loss function is called, the original as its ``__cause__``. Both places that call
    a loss function use it: ``fit``'s trace and ``score``'s (validation's) eager call."""
    try:
        return loss(outputs, targets)
    except Exception as e:
        raise ModelError(
            f"the loss function {getattr(loss, '__name__', type(loss).__name__)} raised "
            f"{type(e).__name__}: {e}\n  It is called as fn(outputs, targets) with two "
            f"lists of arrays, outputs {_shapes(outputs)} and targets {_shapes(targets)} "
            "(even one of each is a list), and returns one scalar, e.g. "
            "lambda outputs, targets: jnp.mean((outputs[0] - targets[0]) ** 2)"
        ) from e


def _check_floating(what: str, dtype: Any, shape: Any) -> None:
    """A loss is minimised by its gradient: an integer, boolean or complex one has none
    (``jax.grad`` refuses it), and a step would apply zero updates silently."""
    if not is_floating(dtype):
        raise ModelError(
            f"compile: {what} is {np.dtype(dtype).name}{list(shape)}; a loss must be a "
            "real floating-point scalar (an integer, boolean or complex value has no "
            "gradient, so fit would change nothing): compute it in floating point from the "
            "outputs, e.g. jnp.mean((outputs[0] - targets[0]) ** 2); count things with a "
            "metric instead"
        )


def _check_target_count(loss: Any, targets: Sequence[Symbol]) -> None:
    """Refuses targets a loss would ignore: a named loss compares the first output with one
    target, ``loss=None`` takes none (a function takes them all)."""
    if callable(loss) or (loss is not None and not targets):
        return
    takes = 0 if loss is None else 1
    if len(targets) > takes:
        what = "no targets" if loss is None else "1 target (against the model's first output)"
        raise ModelError(
            f"loss={loss!r} takes {what}, but {len(targets)} target(s) were given; pass "
            f"{takes}, or compile with a loss function (outputs, targets) -> scalar, which "
            "gets every target"
        )


def _shapes(values: Sequence[Any]) -> str:
    return "[" + ", ".join(f"{np.dtype(v.dtype).name}{list(v.shape)}" for v in values) + "]"
