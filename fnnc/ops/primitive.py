"""Generic commands: any JAX primitive carried as one node (family ``"generic"``).

:func:`fnnc.graph.trace` maps the primitives it knows to fnnc commands; every other
primitive (``cumsum``, ``erf``, ``sort``, ``cond``, ``while``, ``scan``, a custom
derivative it cannot see through...) becomes one ``primitive`` node. Its
hyper-parameters are the primitive and its equation parameters, each held in an
:class:`Opaque` (hashable, so the graph stays hashable), and the output specs, so the
shape rule needs no arrays. The forward binds the primitive exactly as
``jax.core.eval_jaxpr`` does, so custom derivative rules and sub-jaxprs (branches,
loop bodies) keep their JAX meaning; the backward is derived from ``jax.vjp`` of that
forward.

Attributes are per command, so a primitive whose equation has effects (a debug
callback, I/O) is carried by the twin command ``effectful_primitive``
(``has_effects=True``): DCE keeps it and CSE never merges it.

A primitive may have no operands (``iota``): these commands accept zero inputs.

>>> import jax.numpy as jnp
>>> from jax import lax
>>> from fnnc.ops.primitive import primitive_command
>>> cmd = primitive_command(lax.erf_p, {}, [((2,), jnp.float32)])
>>> cmd(jnp.zeros(2))
Array([0., 0.], dtype=float32)
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.export
import numpy as np
from jax import lax

from fnnc.core.command import Command, Spec, defcommand, make_command
from fnnc.errors import CommandError, DTypeError, FnncError, ShapeError
from fnnc.ops._rules import show

_SHOWN = (bool, int, float, str, type(None), np.dtype)


class Opaque:
    """A hashable holder for a value fnnc cannot inspect (a primitive, equation params).

    Equality and hash go by a fingerprint: hashable parts by value, arrays by bytes,
    anything else (jaxprs, callables without a hash) by identity. The holder keeps the
    value alive, so an identity never refers to a recycled object.

    Attributes:
        value: the held value.
    """

    __slots__ = ("_key", "_label", "value")

    def __init__(self, value: Any, label: str | None = None):
        self.value = value
        self._key = _fingerprint(value)
        self._label = label if label is not None else _label(value)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and self._key == other._key

    def __str__(self) -> str:
        return self._label

    def __repr__(self) -> str:
        return f"Opaque({self._label})"


def _fingerprint(value: Any) -> Hashable:
    if isinstance(value, Mapping):
        return ("map", tuple((k, _fingerprint(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_fingerprint(v) for v in value))
    if isinstance(value, (np.ndarray, jax.Array)):
        arr = np.asarray(value)
        return ("array", arr.shape, arr.dtype.str, arr.tobytes())
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


def _label(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}={_label(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple) and len(value) <= 8:
        return "(" + ",".join(_label(v) for v in value) + ")"
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, _SHOWN) or hasattr(value, "multiple_results"):
        return str(value)
    if hasattr(value, "eqns") or hasattr(value, "jaxpr"):
        return "<jaxpr>"
    return f"<{type(value).__name__}>"


_PRECISION_NAMES = frozenset({"bfloat16", "tensorfloat32", "float32", "default", "high", "highest"})


def bind(prim: Any, params: Mapping[str, Any], args: Sequence[Any]) -> tuple[Any, ...]:
    """Binds ``prim`` to ``args`` as ``jax.core.eval_jaxpr`` binds an equation.

    A dot or convolution traced with no precision of its own takes the matmul precision
    in force where it is bound (fnnc's policy, :func:`fnnc.core.dispatch.matmul_precision_scope`),
    as a ``lax.dot_general`` call would.

    Returns:
        The results as a tuple (one entry for a single-result primitive).
    """
    params = dict(params)
    if "precision" in params and params["precision"] is None:
        ambient = jax.config.jax_default_matmul_precision
        if ambient in _PRECISION_NAMES:
            params["precision"] = (lax.Precision(ambient),) * 2
    out = prim.bind(*args, **prim.get_bind_params(params))
    return tuple(out) if prim.multiple_results else (out,)


def _shape(*specs: Spec, out_specs: Any, **params: Any) -> tuple[Spec, ...]:
    return tuple(Spec(tuple(shape), dtype) for shape, dtype in out_specs)


def _define(name: str, has_effects: bool, doc: str):
    def forward(*inputs, prim, params, out_specs):
        outs = bind(prim.value, params.value, inputs)
        return outs if prim.value.multiple_results else outs[0]

    forward.__name__ = name
    forward.__doc__ = doc
    return defcommand(family="generic", shape=_shape, has_effects=has_effects, min_inputs=0)(
        forward
    )


primitive = _define(
    "primitive",
    False,
    "Any JAX primitive ``prim`` bound with ``params``; outputs as ``out_specs`` says.",
)
effectful_primitive = _define(
    "effectful_primitive",
    True,
    "A JAX primitive with effects (kept by DCE, never merged by CSE); else as ``primitive``.",
)


def primitive_command(
    prim: Any,
    params: Mapping[str, Any],
    out_specs: Iterable[tuple[Sequence[int], Any]],
    *,
    effects: bool = False,
) -> Command:
    """The generic command that binds ``prim`` with ``params``.

    Args:
        prim: a JAX primitive (``jax.extend.core.Primitive``).
        params: its equation parameters (any values; held by identity where unhashable).
        out_specs: ``(shape, dtype)`` per result, as the equation's output avals say.
        effects: the equation has effects; builds ``effectful_primitive``.
    """
    specs = tuple(
        (tuple(int(n) for n in shape), jax.dtypes.canonicalize_dtype(np.dtype(dtype)))
        for shape, dtype in out_specs
    )
    return make_command(
        "effectful_primitive" if effects else "primitive",
        {"prim": Opaque(prim), "params": Opaque(dict(params)), "out_specs": specs},
    )


NO_VJP_ERRORS = (ValueError, TypeError, NotImplementedError)
"""What JAX raises while tracing the VJP of a primitive it cannot reverse: ``ValueError``
(``while_loop``, ``pure_callback`` and ``io_callback``), ``TypeError`` (a ``reduce_window``
whose initial value is differentiated; ``jax.errors.JAXTypeError`` is one),
``NotImplementedError`` (a generic ``reduce``, non-symmetric ``eig`` vectors)."""


# small: a key holds the command, whose params may hold closed jaxprs and their constants
@functools.lru_cache(maxsize=128)
def vjp_problem(cmd: Command, in_specs: tuple[Any, ...], wants: tuple[int, ...]) -> str | None:
    """Why JAX has no reverse-mode derivative of the generic node ``cmd`` (a
    ``primitive`` / ``effectful_primitive``) on inputs ``in_specs`` (``(shape, dtype)``
    pairs) for the inputs ``wants``, or ``None``: the derived backward is traced
    abstractly (``jax.eval_shape``), so a ``while_loop`` or a ``pure_callback`` is
    refused while the gradient node is built, not when the gradient graph runs.

    Only the errors JAX raises for such primitives (:data:`NO_VJP_ERRORS`) are answered
    so; fnnc's own errors and any other exception propagate, as bugs to see, not JAX
    limitations to report."""
    if cmd.name not in ("primitive", "effectful_primitive"):
        return None
    specs = [jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype)) for shape, dtype in in_specs]
    n_out = len(cmd.param("out_specs"))

    def backward(*xs: Any) -> Any:
        return cmd.definition.backward([None] * n_out, xs, (), wants, **cmd.kwargs)

    try:
        jax.eval_shape(backward, *specs)
    except FnncError:
        raise
    except NO_VJP_ERRORS as e:  # JAX's reason
        said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        prim = cmd.param("prim").value
        return (
            f"JAX has no reverse-mode derivative of the primitive {prim} (jax.grad of the "
            f"traced function fails the same way; JAX said: {type(e).__name__}: {said}). "
            "Differentiate with respect to inputs that do not reach it, put "
            "lax.stop_gradient around its inputs, or rewrite it (lax.scan or lax.fori_loop "
            "with static bounds for a while_loop, jax.custom_vjp around a callback)"
        )
    return None


def _vjp_orders(cmd: Command, order: int = 1) -> str | None:
    """Why an ``exported`` node's module cannot be differentiated ``order`` times: a
    module loaded from a file holds only the VJP orders saved with it."""
    module, held = cmd.param("module").value, 0
    while held < order and module.has_vjp():
        module, held = module.vjp(), held + 1
    if held >= order:
        return None
    return (
        f"its StableHLO module holds {held} VJP order(s) and this gradient needs {order}. "
        "A module loaded from a file keeps only the orders its file had, one per gradient "
        "level of the graph that was saved; to differentiate further, take the backward "
        "of the graph as traced (fnnc.graph.trace, before any save/load) and save the "
        "result, or differentiate before saving"
    )


def _exported_shape(*specs: Spec, module: Any, out_specs: Any) -> tuple[Spec, ...]:
    """The output specs, once ``specs`` fit the module's inputs (its ``in_avals``; a
    symbolic size fits any): else JAX's bare error came from ``Exported.call``."""
    avals = module.value.in_avals
    want = ", ".join(show(a) for a in avals) or "none"
    got = ", ".join(show(s) for s in specs) or "none"
    if len(specs) != len(avals):
        raise CommandError(
            f"exported: its module takes {len(avals)} input(s) ({want}), got {len(specs)} "
            f"({got}); pass one array per module input, in order"
        )
    for i, (s, a) in enumerate(zip(specs, avals)):
        sizes = len(s.shape) == len(a.shape) and all(
            not isinstance(d, int) or d == n for d, n in zip(a.shape, s.shape)
        )
        if not sizes or s.dtype != a.dtype:
            error = ShapeError if not sizes else DTypeError
            raise error(
                f"exported: input {i} is {show(s)}, its module takes {show(a)} (inputs "
                f"{want}); a saved module "
                "runs only on the shapes and dtypes it was exported for"
            )
    return _shape(*specs, out_specs=out_specs)


@defcommand(family="generic", shape=_exported_shape, min_inputs=0, backward_check=_vjp_orders)
def exported(*inputs, module, out_specs):
    """A serialized computation (``jax.export.Exported``, StableHLO) as one node.

    The file form of a generic ``primitive`` node: :func:`fnnc.graph.save` exports the
    primitive (with its first-order VJP, so the loaded node is differentiable) and
    loading gives this command, whose forward calls the deserialized module. Running it
    needs no Python code from the file. Under ``jax.vmap`` it calls the module once per
    sample (JAX has no batching rule for one), its gradient too.
    """
    outs = _mapped(module.value)(*inputs)
    return outs[0] if len(outs) == 1 else tuple(outs)


@functools.lru_cache(maxsize=128)
def _mapped(module: jax.export.Exported) -> Any:
    """``module.call`` that ``jax.vmap`` maps too (one call per sample: JAX has no
    batching rule for a ``jax.export`` module, so a loaded graph would not map where
    the traced one did), differentiable as far as the module's VJP orders go."""
    orders, held = 0, module
    while orders < 3 and held.has_vjp():  # a module not from a file has VJPs without end
        orders, held = orders + 1, held.vjp()
    return _per_sample(lambda *xs: tuple(module.call(*xs)), len(module.in_avals), orders)


def _per_sample(f: Any, n: int, orders: int) -> Any:
    """``f`` (of ``n`` arrays, returning a tuple) mapped one sample at a time under
    ``jax.vmap``, with a ``custom_vjp`` whose backward (``jax.vjp`` of ``f``) is mapped
    so too, for ``orders`` levels; past those, JAX's own error says the module holds no
    more."""
    mapped = jax.custom_batching.sequential_vmap(f)

    @jax.custom_vjp
    def g(*xs: Any) -> Any:
        return mapped(*xs)

    def forward(*xs: Any) -> Any:  # differentiated too where g's backward is
        return (_per_sample(f, n, orders - 1) if orders else mapped)(*xs), xs

    def backward(xs: Any, cts: Any) -> Any:
        if orders == 0:
            return jax.vjp(f, *xs)[1](tuple(cts))

        def pullback(*args: Any) -> Any:
            return tuple(jax.vjp(f, *args[:n])[1](tuple(args[n:])))

        return tuple(_per_sample(pullback, n + len(cts), orders - 1)(*xs, *cts))

    g.defvjp(forward, backward)
    return g


def export_command(
    cmd: Command, in_specs: Sequence[Spec], platforms: Sequence[str] | None = None
) -> Command:
    """The ``exported`` twin of a generic ``primitive`` command on inputs ``in_specs``,
    its module lowered for ``platforms`` (JAX's names, e.g. ``("cpu", "cuda")``; default:
    JAX's default backend).

    Raises whatever ``jax.export`` raises for a primitive it cannot serialize (host
    callbacks, or a lowering one of the platforms lacks); callers turn that into their
    own error.
    """
    prim, params = cmd.param("prim").value, cmd.param("params").value

    def f(*xs: Any) -> tuple[Any, ...]:
        return bind(prim, params, xs)

    specs = [Spec(tuple(s.shape), s.dtype) for s in in_specs]
    module = jax.export.export(jax.jit(f), platforms=platforms)(*specs)
    return make_command(
        "exported", {"module": Opaque(module, f"<{prim}>"), "out_specs": cmd.param("out_specs")}
    )
