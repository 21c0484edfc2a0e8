"""Commands: NNC's ``ccv_nnc_cmd_t`` as frozen, hashable values, and their registry.

A *command* (:class:`Command`) is a name plus hyper-parameters; it holds no arrays,
so graphs that contain commands stay hashable. Everything fnnc knows about a command
lives in one :class:`OpDef`, created by the :func:`defcommand` decorator next to the
command's reference forward:

    @defcommand(family="activation", shape=same_shape, uses=Uses(outputs=(0,)))
    def relu(x):
        '''max(x, 0).'''
        return jnp.maximum(x, 0)

    @relu.backward
    def _relu_backward(grads, inputs, outputs):
        (g,), (y,) = grads, outputs
        return (jnp.where(y > 0, g, 0),)

The decorator returns the *factory*: ``relu()`` builds ``Command("relu")``. Keyword-only
parameters of the forward are the command's hyper-parameters
(``gemm(transpose_b=True)``); positional parameters are its inputs, a trailing
``*inputs`` makes it variadic and a positional default of ``None`` makes an input
optional.

Backward convention (NNC's): ``backward(grads, inputs, outputs, **params)`` gets
tuples ``grads`` (one per output, ``None`` where an output has no gradient),
``inputs`` and ``outputs`` and returns one gradient per input, ``None`` for
non-differentiable inputs. A tensor not named in ``backward_uses`` arrives as its
``jax.ShapeDtypeStruct``: its shape is known (to undo broadcasting, say) but its values
are not, so a backward that lies about what it uses fails loudly instead of silently
keeping a tensor alive. Commands
without a hand-written backward derive one from ``jax.vjp`` of the reference.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import numpy as np

from fnnc.core.params import FITS, expected_kind, param_fits
from fnnc.errors import CommandError, FnncError, RuleError, UnknownCommandError

Spec = jax.ShapeDtypeStruct
Array = jax.Array


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
        idempotent: ``f(x, x) == x`` for a two-input command (``min``, ``max``).
        batch_statistics: computes statistics over the batch by reductions (training
            ``batch_norm``: a predicate on the command value); a program with such
            nodes gets another XLA:CPU library set (:mod:`fnnc.graph.cpu_libraries`).
    """

    random: bool = False
    has_effects: bool = False
    differentiable: bool = True
    elementwise: bool = False
    commutative: bool | Callable[[Command], bool] = False
    idempotent: bool = False
    batch_statistics: bool | Callable[[Command], bool] = False

    def is_commutative(self, cmd: Command) -> bool:
        """Whether ``cmd``'s inputs may be reordered."""
        return _holds(self.commutative, cmd)

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
    backward_check: Callable[[Command], str | None] | None = None
    backward_fn: Callable[..., Any] | None = None
    backward_node: BackwardNode | None = None

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
        self, grads: Sequence[Any], inputs: Sequence[Any], outputs: Sequence[Any], **params: Any
    ) -> tuple[Any, ...]:
        """Gradients of the inputs from gradients of the outputs (NNC convention)."""
        if self.backward_fn is not None:
            return tuple(self.backward_fn(tuple(grads), tuple(inputs), tuple(outputs), **params))
        return vjp_backward(self.forward, grads, inputs, **params)


_REGISTRY: dict[str, OpDef] = {}

CALL_HOOK: contextvars.ContextVar[Callable[[Command, tuple[Any, ...]], Any] | None] = (
    contextvars.ContextVar("fnnc_command_call_hook", default=None)
)
"""While set (by :func:`fnnc.graph.pattern_functions.commands_as_nodes`), calling a
command goes through it first; ``NotImplemented`` falls back to running it."""


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


_NAN = float("nan")


def freeze(value: Any) -> Hashable:
    """Makes a hyper-parameter hashable: lists become tuples, dtypes become np.dtype."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        raise CommandError("array hyper-parameters are not allowed; use fnnc.ops.constant")
    if isinstance(value, np.dtype):
        return value
    if isinstance(value, float) and value != value:
        return _NAN  # one NaN object: NaN != NaN, but equal tuples compare items by identity
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value)
    if hasattr(value, "dtype") and not hasattr(value, "shape"):  # jnp.float32 and kin
        return np.dtype(value.dtype)
    try:
        hash(value)
    except TypeError:
        raise CommandError(f"hyper-parameter {value!r} is not hashable") from None
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    """A command value: a registered name and its hyper-parameters.

    Calling a command on arrays runs it eagerly with the backend chosen for the
    current platform:

    >>> import jax.numpy as jnp
    >>> from fnnc import ops
    >>> ops.relu()(jnp.array([-1.0, 2.0]))
    Array([0., 2.], dtype=float32)
    """

    name: str
    params: tuple[tuple[str, Hashable], ...] = ()

    @property
    def definition(self) -> OpDef:
        """The :class:`OpDef` of this command."""
        return lookup(self.name)

    @property
    def kwargs(self) -> dict[str, Any]:
        """Hyper-parameters as a dict."""
        return dict(self.params)

    def param(self, key: str) -> Any:
        """One hyper-parameter by name."""
        for k, v in self.params:
            if k == key:
                return v
        raise CommandError(f"command {self.name} has no hyper-parameter {key!r}")

    def replace(self, **changes: Any) -> Command:
        """A copy with some hyper-parameters changed."""
        return self.definition_factory(**{**self.kwargs, **changes})

    def definition_factory(self, **kwargs: Any) -> Command:
        return make_command(self.name, kwargs)

    def shape(self, *specs: Spec) -> tuple[Spec, ...]:
        """Output specs for input specs, from the shape rule (no arrays needed)."""
        return output_specs(self, specs)

    def __call__(self, *arrays: Any) -> Any:
        hook = CALL_HOOK.get()
        if hook is not None:  # tracing a pattern function: the call becomes one node
            result = hook(self, arrays)
            if result is not NotImplemented:
                return result
        # dispatch imports this module; the edge back stays inside the core package.
        from fnnc.core.dispatch import run_eager

        return run_eager(self, arrays)

    def __str__(self) -> str:
        opdef = _REGISTRY.get(self.name)
        if opdef is not None and opdef.display is not None:
            return opdef.display(self)
        defaults = opdef.param_defaults if opdef is not None else {}
        shown = [f"{k}={_show(v)}" for k, v in self.params if defaults.get(k, _MISSING) != v]
        return f"{self.name}[{', '.join(shown)}]" if shown else self.name


_MISSING = object()


def _show(value: Any) -> str:
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, tuple):
        return "(" + ",".join(_show(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


_AXES = frozenset({"axes", "reduce_axes"})
"""Parameters that list axes: one int given alone is the one-axis tuple."""


def make_command(name: str, kwargs: dict[str, Any]) -> Command:
    """Builds a :class:`Command`, filling defaults and rejecting unknown parameters and
    values of a kind the parameter never takes (see :func:`param_fits`)."""
    opdef = lookup(name)
    unknown = [k for k in kwargs if k not in opdef.param_defaults]
    if unknown:
        raise CommandError(
            f"{name}: unknown hyper-parameter(s) {unknown}; "
            f"expected some of {sorted(opdef.param_defaults)}"
        )
    for key, value in kwargs.items():
        fits = FITS.get((name, key, type(value)))
        if fits is None:
            fits = param_fits(opdef, key, value)
        if not fits:
            raise CommandError(
                f"{name}: hyper-parameter {key!r} is {value!r:.60} ({type(value).__name__}); "
                f"expected {expected_kind(opdef, key)}. Pass e.g. {name}({key}="
                f"{opdef.param_defaults[key]!r}); signature: {name}"
                f"{inspect.signature(opdef.forward)}"
            )
    params = []
    for key, default in opdef.param_defaults.items():
        value = kwargs.get(key, default)
        if key in _AXES and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            value = (int(value),)  # reduce_sum(axes=1) is reduce_sum(axes=(1,)), as in NumPy
        if value is inspect.Parameter.empty:
            raise CommandError(f"{name}: hyper-parameter {key!r} is required")
        params.append((key, freeze(value)))
    return Command(name, tuple(params))


def output_specs(cmd: Command, specs: Sequence[Spec]) -> tuple[Spec, ...]:
    """Runs the shape rule of ``cmd``; always returns a tuple."""
    opdef = cmd.definition
    opdef.check_arity(len(specs))
    try:
        out = opdef.shape(*specs, **cmd.kwargs)
    except FnncError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError) as e:
        # the rule choked on its parameters: a user's mistake, so a named error, not a trace
        shown = ", ".join(spec_text(s) for s in specs) or "none"
        raise RuleError(
            f"{cmd}: the shape rule of {cmd.name} cannot take the parameters "
            f"{cmd.kwargs!r:.200} with inputs {shown} ({type(e).__name__}: {e}); "
            f"give parameters that fit {cmd.name}{inspect.signature(opdef.forward)}"
        ) from e
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def spec_text(spec: Any) -> str:
    """``float32[2, 3]``: a spec (or an array) as messages show it."""
    shape = getattr(spec, "shape", None)
    dtype = getattr(spec, "dtype", None)
    return f"{dtype}{list(shape)}" if shape is not None else repr(spec)


class _Factory:
    """The public constructor of one command, returned by :func:`defcommand`."""

    def __init__(self, opdef: OpDef):
        self._opdef = opdef
        self.__name__ = opdef.name
        self.__qualname__ = opdef.name
        self.__doc__ = opdef.doc
        self.__module__ = opdef.forward.__module__

    def __call__(self, **kwargs: Any) -> Command:
        return make_command(self._opdef.name, kwargs)

    @property
    def definition(self) -> OpDef:
        return _REGISTRY[self._opdef.name]

    def backward(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorator: registers ``fn`` as the hand-written backward of this command."""
        _REGISTRY[self._opdef.name] = dataclasses.replace(self.definition, backward_fn=fn)
        return fn

    def __repr__(self) -> str:
        return f"<fnnc command factory {self._opdef.name}>"


def defcommand(
    *,
    family: str,
    shape: Callable[..., Spec | tuple[Spec, ...]],
    uses: Uses = ALL_INPUTS,
    name: str | None = None,
    random: bool = False,
    has_effects: bool = False,
    differentiable: bool = True,
    elementwise: bool = False,
    commutative: bool | Callable[[Command], bool] = False,
    idempotent: bool = False,
    batch_statistics: bool | Callable[[Command], bool] = False,
    min_inputs: int | None = None,
    display: Callable[[Command], str] | None = None,
    backward_check: Callable[[Command], str | None] | None = None,
    backward_node: BackwardNode | None = None,
) -> Callable[[Callable[..., Any]], _Factory]:
    """Registers a command whose reference forward is the decorated function.

    Args:
        family: NNC family name, e.g. ``"blas"`` or ``"activation"``.
        shape: the shape rule, ``shape(*specs, **params) -> Spec | tuple[Spec, ...]``;
            it raises :class:`fnnc.errors.ShapeError` for inputs that do not fit.
        uses: which forward tensors the backward reads.
        name: registered name; defaults to the function's name.
        random: see :class:`Attributes`.
        has_effects: see :class:`Attributes`.
        differentiable: see :class:`Attributes`.
        elementwise: see :class:`Attributes`.
        commutative: see :class:`Attributes`.
        idempotent: see :class:`Attributes`.
        batch_statistics: see :class:`Attributes`.
        min_inputs: fewest inputs accepted; default the required positional ones, and
            at least one for a variadic command (``ewsum`` of nothing is undefined).
        display: how listings print a command value, when the default
            ``name[param=value, ...]`` would be unreadable.
        backward_check: ``check(cmd) -> None | reason``: why this command value has no
            backward (e.g. a loop without a trip bound). The ``backward`` pass asks it
            when it builds the gradient node, so the error comes while differentiating,
            not later when the gradient graph runs.
        backward_node: set only on a command that runs another command's backward
            (``gradient``); see :class:`BackwardNode`.
    """

    def decorate(forward: Callable[..., Any]) -> _Factory:
        sig = inspect.signature(forward)
        defaults: dict[str, Any] = {}
        required = optional = 0
        variadic = False
        for p in sig.parameters.values():
            if p.kind is p.KEYWORD_ONLY:
                defaults[p.name] = p.default
            elif p.kind is p.VAR_POSITIONAL:
                variadic = True
            elif p.default is p.empty:
                required += 1
            else:
                optional += 1
        cmd_name = name or forward.__name__
        if cmd_name in _REGISTRY:
            raise CommandError(f"command {cmd_name!r} is registered twice")
        _REGISTRY[cmd_name] = OpDef(
            name=cmd_name,
            family=family,
            forward=forward,
            shape=shape,
            backward_uses=uses,
            attributes=Attributes(
                random,
                has_effects,
                differentiable,
                elementwise,
                commutative,
                idempotent,
                batch_statistics,
            ),
            param_defaults=defaults,
            num_required=required,
            num_optional=optional,
            variadic=variadic,
            doc=inspect.getdoc(forward) or "",
            min_inputs=max(required, int(variadic)) if min_inputs is None else min_inputs,
            display=display,
            backward_check=backward_check,
            backward_node=backward_node,
        )
        return _Factory(_REGISTRY[cmd_name])

    return decorate


def is_float(x: Any) -> bool:
    return x is not None and jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)


def vjp_backward(
    forward: Callable[..., Any], grads: Sequence[Any], inputs: Sequence[Any], **params: Any
) -> tuple[Any, ...]:
    """The derived backward: ``jax.vjp`` of the reference over the float inputs."""
    diff = [i for i, x in enumerate(inputs) if is_float(x)]

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
