"""Command definitions: :class:`OpDef` (everything fnnc knows about one command), the
facts passes read about it (:class:`Uses`, :class:`Attributes`, :class:`BackwardNode`)
and the registry that :func:`~fnnc.core.command.defcommand` fills.

A command *value* and the decorator that defines commands are in
:mod:`fnnc.core.command`, which re-exports these names; this module holds what a
definition is, that one what a command is.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from fnnc.errors import CommandError, UnknownCommandError

if TYPE_CHECKING:
    from fnnc.core.command import Command

Spec = jax.ShapeDtypeStruct


@dataclasses.dataclass(frozen=True, slots=True)
class Uses:
    """Which forward tensors a backward reads (NNC's ``backward_uses`` bitmask).

    Attributes:
        inputs: indices of forward inputs the backward reads; ``None`` means all.
        outputs: indices of forward outputs the backward reads.
    """

    inputs: tuple[int, ...] | None = None
    outputs: tuple[int, ...] = ()

    def input_used(self, i: int) -> bool:
        return self.inputs is None or i in self.inputs


ALL_INPUTS = Uses()
NOTHING = Uses(inputs=())


class SpecOnly:
    """A forward tensor a backward gets without its values (not named in ``uses=``):
    its ``shape``, ``dtype``, ``size`` and ``ndim`` only. Reading its values raises
    :class:`CommandError` with ``error``, which says what to add to ``uses=``; a plain
    ``jax.ShapeDtypeStruct`` would be taken by JAX as a constant and fail only when the
    program is lowered, naming no command."""

    __slots__ = ("dtype", "error", "shape")

    def __init__(self, shape: Sequence[int], dtype: Any, error: str = "") -> None:
        self.shape, self.dtype, self.error = tuple(shape), np.dtype(dtype), error

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __jax_array__(self) -> Any:
        raise CommandError(self.error or f"{self!r} has no values")

    __array__ = __jax_array__

    def __repr__(self) -> str:
        return f"SpecOnly({self.dtype.name}{list(self.shape)})"


@dataclasses.dataclass(frozen=True, slots=True)
class Attributes:
    """Facts about a command that passes and kernels read (never name lists in a pass).

    Attributes:
        random: results depend on a random key; never merged by CSE.
        has_effects: never removed by DCE even if its outputs are unused.
        differentiable: has a backward at all.
        elementwise: one output whose every element depends only on the same element
            of the (broadcast) inputs, with no effects: a member of fused chains.
        commutative: the inputs may be given in any order (``True``), or a predicate
            ``commutative(cmd) -> bool`` for commands symmetric only for some
            hyper-parameters (``add``: when ``p == q``).
        idempotent: ``f(x, x) == x`` for a two-input command, in value and in gradient
            (``True``), or a predicate ``idempotent(cmd) -> bool`` for commands where it
            holds only for some hyper-parameters (``min``, ``max``: only with
            ``ties="split"``; NNC's rule gives both operands of a tie the whole gradient,
            so ``max(x, x)`` passes ``2 * g`` back to ``x``).
        batch_statistics: computes statistics over the batch by reductions (training
            ``batch_norm``: a predicate on the command value); a program with such
            nodes gets another XLA:CPU library set (:mod:`fnnc.graph.cpu_libraries`).
    """

    random: bool = False
    has_effects: bool = False
    differentiable: bool = True
    elementwise: bool = False
    commutative: bool | Callable[[Command], bool] = False
    idempotent: bool | Callable[[Command], bool] = False
    batch_statistics: bool | Callable[[Command], bool] = False

    def holds(self, name: str, cmd: Command) -> bool:
        """Whether attribute ``name`` holds for ``cmd`` (a flag, or a predicate of the
        command's parameters such as ``commutative``)."""
        return _holds(getattr(self, name), cmd)

    def is_commutative(self, cmd: Command) -> bool:
        """Whether ``cmd``'s inputs may be reordered."""
        return _holds(self.commutative, cmd)

    def is_idempotent(self, cmd: Command) -> bool:
        """Whether ``cmd(x, x)`` may be replaced by ``x`` (values and gradients)."""
        return _holds(self.idempotent, cmd)

    def has_batch_statistics(self, cmd: Command) -> bool:
        """Whether ``cmd`` reduces over the batch for statistics."""
        return _holds(self.batch_statistics, cmd)


def _holds(attribute: bool | Callable[[Command], bool], cmd: Command) -> bool:
    return attribute(cmd) if callable(attribute) else bool(attribute)


@dataclasses.dataclass(frozen=True)
class BackwardNode:
    """How a command that differentiates another (``gradient``) relates to it.

    Dispatch uses it so that backward nodes choose backends by the forward's backends:
    a forward backend that carries a ``backward`` serves the gradient nodes too.

    Attributes:
        forward_of: ``forward_of(cmd) -> (forward command, its input specs)``.
        run: ``run(rule, *inputs, **params)``: the node's outputs, computing the
            gradients with ``rule(grads, inputs, outputs, wants, **forward_params)``.
    """

    forward_of: Callable[[Command], tuple[Command, tuple[Spec, ...]]]
    run: Callable[..., Any]


@dataclasses.dataclass(frozen=True, eq=False)
class OpDef:
    """Everything about one command: shape rule, reference forward, backward, attributes."""

    name: str
    family: str
    forward: Callable[..., Any]
    shape: Callable[..., Spec | tuple[Spec, ...]]
    backward_uses: Uses
    attributes: Attributes
    param_defaults: dict[str, Any]
    num_required: int
    num_optional: int
    variadic: bool
    doc: str
    min_inputs: int = 0
    display: Callable[[Command], str] | None = None
    backward_check: Callable[[Command, int], str | None] | None = None
    backward_fn: Callable[..., Any] | None = None
    backward_node: BackwardNode | None = None
    null_gradient: Callable[..., Sequence[Any]] | None = None

    def check_arity(self, n: int, where: str = "") -> None:
        """Raises :class:`CommandError` unless ``n`` inputs fit this command."""
        lo = self.min_inputs
        hi = self.num_required + self.num_optional
        if n < lo or (not self.variadic and n > hi):
            want = f"at least {lo}" if self.variadic else (f"{lo}" if lo == hi else f"{lo} to {hi}")
            raise CommandError(
                f"{where or self.name}: expected {want} input(s), got {n}. "
                f"Signature: {self.name}{inspect.signature(self.forward)}"
            )

    def backward(
        self,
        grads: Sequence[Any],
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        wants: Sequence[int] | None = None,
        /,
        **params: Any,
    ) -> tuple[Any, ...]:
        """Gradients of the inputs from gradients of the outputs (NNC convention).

        ``grads`` has one entry per output, ``None`` for an output without a gradient.
        When *every* entry is ``None`` (NNC's null output gradient, ``g = 0`` in
        ``ccv_nnc_cmd_exec``'s inputs) the backward computes the command's own
        derivative: each float output's gradient is taken as ones of that output's
        shape and dtype (a command may say otherwise with ``defcommand(null_gradient=)``:
        ``cmul`` takes complex ones, the two-output losses ones for the loss only). When
        some are given, a ``None`` adds nothing: the ``backward`` pass passes ``None``
        for an output no gradient reaches.

        ``wants`` (positional: commands may have a hyper-parameter of that name) lists
        the inputs whose gradients are asked for; the derived backward differentiates
        only those, a hand-written one may compute the others too.
        """
        if grads and all(g is None for g in grads):
            grads = self.null_gradients(inputs, outputs, len(grads), params)
        if self.backward_fn is None:
            return vjp_backward(self.forward, grads, inputs, wants, **params)
        args = (tuple(grads), tuple(inputs), tuple(outputs))
        try:
            result = self.backward_fn(*args, **params)
        except TypeError as e:
            try:
                inspect.signature(self.backward_fn).bind(*args, **params)
            except TypeError:
                called = "".join(f", {k}=..." for k in params)
                shown = "".join(f", {k}={v!r}" for k, v in self.param_defaults.items())
                want = f", *{shown}) or with **params" if shown else ")"
                raise CommandError(
                    f"{self.name}: its backward {_name(self.backward_fn)} cannot be called "
                    f"as backward(grads, inputs, outputs{called}) ({e}); the hyper-parameters "
                    f"come as keywords: write def backward(grads, inputs, outputs{want}"
                ) from e
            raise
        return self._gradients(result, len(args[1]))

    def null_gradients(
        self, inputs: Sequence[Any], outputs: Sequence[Any], n: int, params: dict[str, Any]
    ) -> tuple[Any, ...]:
        """The ``n`` output gradients NNC's null gradient stands for (see :meth:`backward`):
        the command's ``null_gradient(inputs, outputs, **params)``, else ones for each
        float output, shaped by ``outputs`` or, where those are not given with shapes
        (``(None,)``, ``()``), by the shape rule on the inputs' specs."""
        if self.null_gradient is not None:
            return tuple(self.null_gradient(tuple(inputs), tuple(outputs), **params))
        specs = tuple(outputs)
        if len(specs) != n or not all(hasattr(o, "shape") and hasattr(o, "dtype") for o in specs):
            given = (None if x is None else Spec(tuple(x.shape), x.dtype) for x in inputs)
            out = self.shape(*given, **params)
            specs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        return tuple(jax.numpy.ones(o.shape, o.dtype) if is_float(o) else None for o in specs)

    def run_backward(
        self,
        cmd: Command,
        rule: Callable[..., Any],
        grads: Sequence[Any],
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        wants: Sequence[int] | None = None,
    ) -> tuple[Any, ...]:
        """``rule(grads, inputs, outputs, wants, **cmd.kwargs)`` (NNC's convention, e.g.
        :meth:`backward`) on the forward tensors of a ``cmd`` node as a graph keeps them:
        those ``backward_uses`` names as given (their values), the others as
        :class:`SpecOnly` (given as values or specs), so a rule that reads the values of
        one is a :class:`CommandError` naming ``cmd`` and what to add to ``uses=``."""
        uses = self.backward_uses
        kept = [f"input {i}" for i in range(len(inputs)) if uses.input_used(i)]
        kept += [f"output {i}" for i in sorted(uses.outputs)]
        ins = tuple(
            x if uses.input_used(i) else _spec_only(cmd, uses, "input", i, x, kept)
            for i, x in enumerate(inputs)
        )
        outs = tuple(
            o if i in uses.outputs else _spec_only(cmd, uses, "output", i, o, kept)
            for i, o in enumerate(outputs)
        )
        try:
            return rule(tuple(grads), ins, outs, wants, **cmd.kwargs)
        except (TypeError, ValueError) as e:
            said = str(e)
            if isinstance(e, CommandError) or not ("SpecOnly" in said or "__jax_array__" in said):
                raise
            bare = [f"input {i}" for i in range(len(ins)) if not uses.input_used(i)]
            bare += [f"output {i}" for i in range(len(outs)) if i not in uses.outputs]
            raise CommandError(
                f"{cmd}: its backward used the values of a tensor it gets only as a spec "
                f"(shape and dtype): defcommand(uses=...) is {uses}, so {', '.join(bare)} "
                f"arrive without values ({type(e).__name__}: {said[:100]}). Name the "
                "tensors it reads in defcommand(..., uses=Uses(inputs=..., outputs=...)) "
                f"(all of them: uses=Uses(outputs={tuple(range(len(outs)))})), or read only "
                ".shape/.dtype of those"
            ) from e

    def _gradients(self, result: Any, n: int) -> tuple[Any, ...]:
        """``result`` of the hand-written backward as a tuple of ``n`` gradients, else a
        :class:`CommandError`: a bare array would be split along its first axis, and a
        tuple of the wrong length would pair gradients with the wrong inputs."""
        if isinstance(result, (tuple, list)) and len(result) == n:
            return tuple(result)
        if isinstance(result, (tuple, list)):
            got = f"{len(result)} value(s)"
        elif hasattr(result, "shape") and hasattr(result, "dtype"):
            got = f"a bare array {result.dtype}{list(result.shape)}, not a tuple"
        else:
            got = f"{result!r:.60} ({type(result).__name__})"
        nones = ", ".join(["g"] + ["None"] * (n - 1)) + ("," if n == 1 else "")
        raise CommandError(
            f"{self.name}: its backward {_name(self.backward_fn)} returned {got}; expected "
            f"a tuple with exactly one gradient per input ({n}), None for an input without "
            f"one, e.g. return ({nones})"
        )


def _spec_only(cmd: Command, uses: Uses, kind: str, i: int, x: Any, kept: list[str]) -> SpecOnly:
    """Forward tensor ``kind`` ``i`` (a value or a spec) as the backward gets it when
    ``uses=`` omits it."""
    if kind == "input":
        more = Uses(tuple(sorted({*(uses.inputs or ()), i})), uses.outputs)
    else:
        more = Uses(uses.inputs, tuple(sorted({*uses.outputs, i})))
    shown = f"inputs={more.inputs}, " if more.inputs is not None else ""
    return SpecOnly(
        x.shape,
        x.dtype,
        f"{cmd}: its backward reads the values of {kind} {i}, but the command keeps "
        f"{kept or 'nothing'} for its backward ({uses}), so the backward gets only the "
        f"shape and dtype of {kind} {i}. Add it: defcommand(..., uses=Uses({shown}outputs="
        f"{more.outputs})), or read only .shape/.dtype of {kind} {i}",
    )


def ordered_check(
    check: Callable[..., str | None] | None,
) -> Callable[[Command, int], str | None] | None:
    """``check`` as :attr:`OpDef.backward_check` calls it, ``check(cmd, order)``; a check
    that takes only the command value is asked the same at every order."""
    if check is None:
        return None
    try:
        inspect.signature(check).bind(None, 1)
    except TypeError:
        return lambda cmd, order=1: check(cmd)
    except ValueError:  # no signature to inspect (a builtin): called as written
        pass
    return check


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


_REGISTRY: dict[str, OpDef] = {}


def lookup(name: str) -> OpDef:
    """Returns the :class:`OpDef` registered under ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownCommandError(
            f"unknown command {name!r}.{hint} Known commands are listed by fnnc.ops.registry()."
        ) from None


def registry() -> dict[str, OpDef]:
    """All registered commands by name (a copy, in registration order)."""
    return dict(_REGISTRY)


def is_float(x: Any) -> bool:
    return x is not None and jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)


def vjp_backward(
    forward: Callable[..., Any],
    grads: Sequence[Any],
    inputs: Sequence[Any],
    wants: Sequence[int] | None = None,
    /,
    **params: Any,
) -> tuple[Any, ...]:
    """The derived backward: ``jax.vjp`` of the reference over the float inputs listed
    in ``wants`` (all of them when ``None``); the others are closed over, so an input
    whose derivative JAX lacks (``scatter_mul``'s updates) is never differentiated
    unless asked for, and no work is spent on gradients nobody reads. Inputs not
    differentiated get ``None``."""
    diff = [i for i, x in enumerate(inputs) if is_float(x) and (wants is None or i in wants)]

    def f(*xs: Any) -> Any:
        args = list(inputs)
        for i, x in zip(diff, xs):
            args[i] = x
        return forward(*args, **params)

    out, pullback = jax.vjp(f, *[inputs[i] for i in diff])
    outs = out if isinstance(out, tuple) else (out,)
    cts = tuple(_cotangent(g, o) for g, o in zip(grads, outs))
    got = pullback(cts if isinstance(out, tuple) else cts[0])
    result: list[Any] = [None] * len(inputs)
    for i, g in zip(diff, got):
        result[i] = g
    return tuple(result)


def _cotangent(g: Any, out: Any) -> Any:
    """The cotangent jax.vjp wants for one output: zeros for a missing gradient."""
    if not is_float(out):
        return np.zeros(out.shape, jax.dtypes.float0)
    if g is None:
        return jax.numpy.zeros_like(out)
    return g.astype(out.dtype)
