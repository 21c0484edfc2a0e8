"""Commands: NNC's ``ccv_nnc_cmd_t`` as frozen, hashable values, and their registry.

A *command* (:class:`Command`) is a name plus hyper-parameters; it holds no arrays,
so graphs that contain commands stay hashable. Everything fnnc knows about a command
lives in one :class:`OpDef` (:mod:`fnnc.core.opdef`, whose names this module
re-exports), created by the :func:`defcommand` decorator next to the command's
reference forward:

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
tuples ``grads`` (one per output, ``None`` where an output has no gradient; all
``None`` is NNC's null gradient, read as ones: see :meth:`OpDef.backward`),
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

from fnnc.core.definition_checks import check_definition
from fnnc.core.opdef import (
    _REGISTRY,
    ALL_INPUTS,
    NOTHING,
    Attributes,
    BackwardNode,
    OpDef,
    Spec,
    Uses,
    is_float,
    lookup,
    ordered_check,
    registry,
    vjp_backward,
)
from fnnc.core.params import FITS, expected_kind, flag_value, freeze, param_fits
from fnnc.errors import CommandError, FnncError, RuleError

__all__ = [  # the definitions' names, re-exported: commands are imported from here
    "ALL_INPUTS",
    "CALL_HOOK",
    "NOTHING",
    "Attributes",
    "BackwardNode",
    "Command",
    "OpDef",
    "Spec",
    "Uses",
    "defcommand",
    "freeze",
    "is_float",
    "lookup",
    "make_command",
    "output_specs",
    "registry",
    "spec_text",
    "vjp_backward",
]

Array = jax.Array


CALL_HOOK: contextvars.ContextVar[Callable[[Command, tuple[Any, ...]], Any] | None] = (
    contextvars.ContextVar("fnnc_command_call_hook", default=None)
)
"""While set (by :func:`fnnc.graph.pattern_functions.commands_as_nodes`), calling a
command goes through it first; ``NotImplemented`` falls back to running it."""


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


def _flag(default: Any, value: Any) -> Any:
    """NNC's int flag ``0`` / ``1`` for a bool hyper-parameter is the bool it means
    (``CMD_SCALED_DOT_PRODUCT_ATTENTION_FORWARD(scale, 1)``, as the layers' ``flag``
    takes it); any other value is kept for :func:`param_fits` to judge."""
    meant = flag_value(value) if type(default) is bool else None
    return value if meant is None else meant


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
    kwargs = {k: _flag(opdef.param_defaults[k], v) for k, v in kwargs.items()}
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
    except Exception as e:
        # the rule choked on its parameters (a user's mistake) or is itself broken (a
        # user's rule): a named error either way, not a trace from inside the rule
        shown = ", ".join(spec_text(s) for s in specs) or "none"
        raise RuleError(
            f"{cmd}: the shape rule of {cmd.name} cannot take the parameters "
            f"{cmd.kwargs!r:.200} with inputs {shown} ({type(e).__name__}: {e}); "
            f"give parameters that fit {cmd.name}{inspect.signature(opdef.forward)}, or "
            "fix the rule if it is yours"
        ) from e
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if not all(hasattr(o, "shape") and hasattr(o, "dtype") for o in outs):
        raise RuleError(
            f"{cmd}: the shape rule of {cmd.name} returned {out!r:.120}; a rule returns "
            "the output's jax.ShapeDtypeStruct(shape, dtype), or a tuple of them for "
            "several outputs (did it forget a return?)"
        )
    return outs


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
        _forget(self._opdef.name)
        return fn

    def __repr__(self) -> str:
        return f"<fnnc command factory {self._opdef.name}>"


def _forget(name: str) -> None:
    """Drops what caches hold of the old definition of command ``name``: the kinds its
    parameters were judged to take, and (by moving the dispatch generation) compiled
    forwards, backends and compiled programs, so nothing runs the stale definition."""
    for key in [k for k in FITS if k[0] == name]:
        del FITS[key]
    # dispatch imports this module; the edge back stays inside the core package.
    from fnnc.core import dispatch

    dispatch._bump()


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
    idempotent: bool | Callable[[Command], bool] = False,
    batch_statistics: bool | Callable[[Command], bool] = False,
    min_inputs: int | None = None,
    display: Callable[[Command], str] | None = None,
    backward_check: Callable[..., str | None] | None = None,
    backward_node: BackwardNode | None = None,
    null_gradient: Callable[..., Sequence[Any]] | None = None,
    replace: bool = False,
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
        backward_check: ``check(cmd, order=1) -> None | reason``: why this command
            value has no backward (e.g. a loop without a trip bound), or none of that
            ``order`` (a gradient's gradient is order 2); ``check(cmd)`` is asked the
            same at every order. The ``backward`` pass asks it when it builds the
            gradient node, so the error comes while differentiating, not later when the
            gradient graph runs.
        backward_node: set only on a command that runs another command's backward
            (``gradient``); see :class:`BackwardNode`.
        null_gradient: ``null_gradient(inputs, outputs, **params) -> grads``: the output
            gradients a backward given none at all (NNC's null gradient) takes instead;
            default ones for each float output (see :meth:`OpDef.backward`).
        replace: replace a command already registered under this name (a notebook cell
            defining it run again; a built-in command too) instead of raising
            :class:`~fnnc.errors.CommandError`. Existing command values and graphs that
            name it run the new definition; its registered backends stay.
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
        flags = dict(
            random=random,
            has_effects=has_effects,
            differentiable=differentiable,
            elementwise=elementwise,
            commutative=commutative,
            idempotent=idempotent,
            batch_statistics=batch_statistics,
        )
        check_definition(cmd_name, family, shape, uses, min_inputs, flags)
        old = _REGISTRY.get(cmd_name)
        if old is not None and not replace:
            where = f"{old.forward.__module__}.{old.forward.__qualname__}"
            builtin = old.forward.__module__.startswith("fnnc.")
            what = "this built-in command everywhere" if builtin else "it (a cell run again)"
            raise CommandError(
                f"command {cmd_name!r} is registered twice (first by {where}); pass "
                f"defcommand(..., replace=True) to replace {what}, or give the new one "
                "another name= (fnnc.ops.registry() lists the names in use)"
            )
        _REGISTRY[cmd_name] = OpDef(
            name=cmd_name,
            family=family,
            forward=forward,
            shape=shape,
            backward_uses=uses,
            attributes=Attributes(**flags),
            param_defaults=defaults,
            num_required=required,
            num_optional=optional,
            variadic=variadic,
            doc=inspect.getdoc(forward) or "",
            min_inputs=max(required, int(variadic)) if min_inputs is None else min_inputs,
            display=display,
            backward_check=ordered_check(backward_check),
            backward_node=backward_node,
            null_gradient=null_gradient,
        )
        if old is not None:
            _forget(cmd_name)
        return _Factory(_REGISTRY[cmd_name])

    return decorate
